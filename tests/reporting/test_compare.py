"""`tailkit compare`: per-class differences against an independent numpy computation, and its
refusals (different data, unknown names and revisions, missing files) as one line each."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import polars as pl
import pytest
from click.testing import CliRunner
from conftest import tool_env

from tailkit.cli import cli
from tailkit.errors import DataValidationError, TailkitError
from tailkit.evaluation.per_class import per_class_frame, write_per_class
from tailkit.paths import Layout
from tailkit.reporting.compare import (
    Side,
    Source,
    compare,
    load_side,
    parse_source,
    render,
)

LABELS = 4000


def _pair(seed: int = 0, key_b: str = "k"):
    """Two per-class frames of the same labels; recalls in thirds, so that many are tied."""
    rng = np.random.default_rng(seed)
    counts = np.minimum(rng.zipf(1.4, LABELS) - 1, 5000)
    counts[rng.random(LABELS) < 0.05] = 0
    counts[(counts >= 64) & (counts < 128)] = 200  # an empty octave in the middle
    support = np.where(rng.random(LABELS) < 0.7, counts // 4 + rng.integers(0, 2, LABELS), 0)
    labels = pl.DataFrame(
        {
            "label": np.arange(LABELS, dtype=np.int64),
            "name": [f"n{j}" for j in range(LABELS)],
            "train_count": counts,
            "val_count": counts // 8,
            "test_count": support,
        }
    )

    def side(name: str, key: str) -> Side:
        recall = np.where(support > 0, rng.integers(0, 4, LABELS) / 3, np.nan)
        results = {
            "support": support,
            "recall@1": recall,
            "recall@k": recall,
            "precision@1": recall,
        }
        frame = per_class_frame(labels, results, 5)
        meta = {"tailkit.data_key": key, "tailkit.k": "5", "tailkit.multilabel": "false"}
        return Side(Source(name, name, None), frame, meta)

    return side("a", "k"), side("b", key_b), counts, support


def _numpy_summary(a, b, mask, support):
    sel = mask & (support > 0)
    diff = b[sel] - a[sel]
    return {
        "labels": int(sel.sum()),
        "test_rows": int(support[sel].sum()),
        "a": a[sel].mean(),
        "b": b[sel].mean(),
        "change": b[sel].mean() - a[sel].mean(),
        "improved": int((diff > 0).sum()),
        "worsened": int((diff < 0).sum()),
        "same": int((diff == 0).sum()),
    }


def _assert_row(row: dict, expected: dict):
    for key, value in expected.items():
        assert row[key] == pytest.approx(value, abs=1e-12), key


def test_bin_and_group_changes_equal_numpy_with_empty_bins_and_ties():
    a, b, counts, support = _pair()
    result = compare(a, b)
    ra, rb = a.frame["recall@1"].to_numpy(), b.frame["recall@1"].to_numpy()
    edges = np.concatenate([[0, 1], 2 ** np.arange(1, 14)])
    which = np.searchsorted(edges, counts, side="right") - 1
    expected_bins = [
        (int(edges[i]), int(edges[i + 1]), _numpy_summary(ra, rb, which == i, support))
        for i in range(len(edges) - 1)
        if ((which == i) & (support > 0)).any()
    ]
    rows = result.bins.to_dicts()
    assert [(r["count_low"], r["count_high"]) for r in rows] == [e[:2] for e in expected_bins]
    assert not any(r["count_low"] == 64 for r in rows)  # the empty octave has no row
    for row, (_, _, expected) in zip(rows, expected_bins, strict=True):
        _assert_row(row, expected)
    groups = {r["group"]: r for r in result.groups.to_dicts()}
    assert list(groups) == ["many", "medium", "few", "all"]
    masks = {
        "many": counts > 100,
        "medium": (counts >= 20) & (counts <= 100),
        "few": counts < 20,
        "all": np.ones(LABELS, bool),
    }
    for group, mask in masks.items():
        _assert_row(groups[group], _numpy_summary(ra, rb, mask, support))
    assert groups["all"]["same"] > 0 and groups["all"]["improved"] > 0  # ties were exercised


def test_gains_and_losses_are_sorted_with_ties_broken_by_test_rows_then_id():
    a, b, _, support = _pair(1)
    result = compare(a, b, top=50)
    change = b.frame["recall@1"].to_numpy() - a.frame["recall@1"].to_numpy()
    present = np.flatnonzero(support > 0)
    key = sorted(present, key=lambda j: (-change[j], -support[j], j))
    gained = [j for j in key if change[j] > 0][:50]
    lost = [j for j in sorted(present, key=lambda j: (change[j], -support[j], j)) if change[j] < 0]
    assert result.gained["label"].to_list() == gained
    assert result.lost["label"].to_list() == lost[:50]


def test_every_format_is_deterministic_and_the_json_holds_the_tables():
    a, b, _, _ = _pair(2)
    first, second = compare(a, b, top=5), compare(a, b, top=5)
    for fmt in ("md", "csv", "json", "parquet"):
        assert render(first, fmt) == render(second, fmt), fmt
    body = json.loads(render(first, "json"))
    assert body["metric"] == "recall@1" and len(body["gained"]) == 5
    assert body["groups"][-1]["group"] == "all"
    csv = pl.read_csv(render(first, "csv").encode())
    assert set(csv["table"].unique()) == {"bin", "group", "gained", "lost"}
    assert "| group | labels |" in render(first, "md")


def test_different_data_is_refused_naming_both_keys():
    a, b, _, _ = _pair(3, key_b="other")
    with pytest.raises(DataValidationError, match="different data") as caught:
        compare(a, b)
    assert "k and other" in str(caught.value) and "\n" not in str(caught.value)


def test_an_unknown_metric_names_the_columns_there_are():
    a, b, _, _ = _pair(4)
    with pytest.raises(TailkitError, match=r"no .recall@3. column .*recall@5"):
        compare(a, b, metric="recall@3")


def test_sources_parse_and_unknown_experiments_suggest_a_name():
    known = ["softmax", "logit-adjusted"]
    assert parse_source("softmax", known) == Source("softmax", "softmax", None)
    assert parse_source("softmax@HEAD~1", known) == Source("softmax@HEAD~1", "softmax", "HEAD~1")
    assert parse_source("slow-lr:softmax", known).rev == "slow-lr"
    with pytest.raises(TailkitError, match="did you mean 'softmax'"):
        parse_source("sofmax", known)
    with pytest.raises(TailkitError, match="is not EXP"):
        parse_source("softmax@", known)


def test_a_missing_table_names_the_file_and_the_stage(tmp_path):
    with pytest.raises(DataValidationError, match=r"per_class.parquet: missing; run `dvc repro "):
        load_side(tmp_path, Source("x", "x", None))


def test_an_unknown_revision_is_one_line(tmp_path):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True, env=tool_env())
    (tmp_path / "f").write_text("x")
    subprocess.run(["git", "add", "f"], cwd=tmp_path, check=True, env=tool_env())
    subprocess.run(["git", "commit", "-qm", "f"], cwd=tmp_path, check=True, env=tool_env())
    with pytest.raises(TailkitError, match="unknown revision 'no-such-rev'"):
        load_side(tmp_path, Source("x@no-such-rev", "x", "no-such-rev"))


@pytest.mark.slow
def test_an_output_missing_from_the_cache_names_dvc_pull(tmp_path):
    """At an old revision the table is a DVC output whose bytes this clone's cache lacks (no
    remote pulled): the message says so and names the fix, not "does not exist"."""
    import shutil

    from conftest import run

    table = "data/evaluation/x/per_class.parquet"
    run(["git", "init", "-q"], tmp_path)
    run(["dvc", "init", "-q"], tmp_path)
    run(["dvc", "stage", "add", "-q", "-n", "evaluate", "-o", table,
         f"mkdir -p data/evaluation/x && echo rows > {table}"], tmp_path)  # fmt: skip
    run(["dvc", "repro", "-q"], tmp_path)
    run(["git", "add", "-A"], tmp_path)
    run(["git", "commit", "-qm", "evaluated"], tmp_path)
    shutil.rmtree(tmp_path / ".dvc" / "cache")
    with pytest.raises(DataValidationError) as info:
        load_side(tmp_path, Source("x@HEAD", "x", "HEAD"))
    assert str(info.value) == (
        f"compare: x@HEAD: {table} is a DVC output at HEAD that is not in the local cache; "
        "`dvc pull` (or `dvc fetch`) gets it from a remote, or `dvc repro evaluate@x` at that "
        "revision rebuilds it"
    )


def test_the_command_prints_one_error_line_and_writes_its_outputs(tmp_path, monkeypatch):
    a, b, _, _ = _pair(5)
    layout = Layout(tmp_path)
    for side in (a, b):
        path = layout.per_class(side.source.experiment)
        write_per_class(path, side.frame, side.source.experiment, 5, "k", multilabel=False)
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    done = runner.invoke(cli, ["compare", "a@", "b"])
    assert done.exit_code == 2 and done.output.count("\n") == 1 and "Error:" in done.output
    done = runner.invoke(cli, ["compare", "a", "b", "--format", "parquet"])
    assert done.exit_code == 2 and "needs --out" in done.output
    out = tmp_path / "cmp.parquet"
    done = runner.invoke(cli, ["compare", "a", "b", "--format", "parquet", "--out", str(out)])
    assert done.exit_code == 0, done.output
    assert pl.read_parquet(out)["table"].to_list()[-1] == "lost"
    assert (tmp_path / "reports" / "compare" / "a--b.png").read_bytes().startswith(b"\x89PNG")
    page = tmp_path / "cmp.html"
    done = runner.invoke(cli, ["compare", "a", "b", "--no-figure", "--html", str(page)])
    assert done.exit_code == 0, done.output
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and '"b":"b"' in text and '"tested":false' in text


def test_labels_with_few_test_rows_are_left_out_of_the_lists_and_counted():
    a, b, _, support = _pair(1)
    result = compare(a, b, top=10_000, min_support=3)
    change = b.frame["recall@1"].to_numpy() - a.frame["recall@1"].to_numpy()
    listed = set(result.gained["label"].to_list()) | set(result.lost["label"].to_list())
    assert listed == {int(j) for j in np.flatnonzero((support >= 3) & (change != 0))}
    unlisted = int(np.count_nonzero((support > 0) & (support < 3) & (change != 0)))
    assert result.unlisted == unlisted > 0
    assert f"{unlisted:,} labels that changed have fewer than 3 test rows" in render(result, "md")
    everything = compare(a, b, top=10_000)  # the default lists every label with a test row
    assert everything.unlisted == 0
    assert result.groups.equals(everything.groups)  # the counts keep every label
