"""The report's pieces: study tables with best values marked, differing settings, plugin
provenance, DVC experiments from `dvc exp show --json`, and the figures' data."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest
from conftest import TINY_PARAMS

from tailkit.params import parse_params
from tailkit.reporting import figures
from tailkit.reporting.runs import Run, describe_data, exp_runs
from tailkit.reporting.summary import group_studies, study_markdown
from tailkit.reporting.tables import comparison_table, plugin_versions, settings_tables


def params_with(**changes):
    raw = copy.deepcopy(TINY_PARAMS)
    for dotted, value in changes.items():
        *path, last = dotted.split("__")
        node = raw
        for key in path:
            node = node[key]
        node[last] = value
    return raw


def metrics(acc: float, ece: float | None = 0.1, seconds: float = 1.0, **extra) -> dict:
    test = {
        "accuracy": acc,
        "balanced_accuracy": acc / 2,
        "many": acc,
        "medium": acc,
        "few": None,
        "top5_accuracy": 1.0,
        "ece": ece,
    }
    return {"test": test, "train": {"seconds": seconds}, **extra}


def row(table: str, name: str) -> list[str]:
    line = next(line for line in table.splitlines() if line.startswith(f"| {name} |"))
    return [cell.strip() for cell in line.strip("|").split("|")]


def test_best_value_of_each_column_is_bold_lower_is_better_for_ece_and_seconds():
    params = parse_params(TINY_PARAMS)
    runs = [
        Run("softmax", "", params, metrics(0.8, ece=0.05, seconds=12.0)),
        Run("sampled", "", params, metrics(0.9, ece=0.20, seconds=3.0)),
        Run("ldam", "", params, metrics(0.9, ece=None, seconds=4.0)),
    ]
    table = comparison_table(runs)
    header = [c.strip() for c in table.splitlines()[0].strip("|").split("|")]
    soft, samp, ldam = (
        dict(zip(header, row(table, n), strict=True)) for n in ("softmax", "sampled", "ldam")
    )
    assert soft["accuracy"] == "80.00" and samp["accuracy"] == "**90.00**"
    assert ldam["accuracy"] == "**90.00**"  # a tie: both best
    assert soft["ECE"] == "**5.00**" and samp["ECE"] == "20.00" and ldam["ECE"] == "–"
    assert soft["train s"] == "12.0" and samp["train s"] == "**3.00**"
    assert soft["few"] == "–"  # a group without classes
    assert samp["method"] == "sampled-softmax, uniform × 8"
    assert ldam["method"] == "ldam (drw_epoch=1) on mlp"


def test_a_multi_label_study_gets_the_xc_columns_and_its_own_legend():
    params = parse_params(TINY_PARAMS)

    def xc(p1: float, psp1: float) -> dict:
        test = {"P@1": p1, "P@3": p1 / 2, "P@5": p1 / 3, "PSP@1": psp1, "PSP@3": psp1 / 2}
        test.update({"PSP@5": psp1 / 3, "macro_recall@5": 0.4, "many": 0.5, "medium": 0.3})
        return {"test": {**test, "few": 0.1, "ece": 0.2}, "train": {"seconds": 2.0}}

    runs = [Run("softmax", "", params, xc(0.8, 0.3)), Run("sampled", "", params, xc(0.7, 0.4))]
    table = comparison_table(runs)
    header = [c.strip() for c in table.splitlines()[0].strip("|").split("|")]
    assert header[2:8] == ["P@1", "P@3", "P@5", "PSP@1", "PSP@3", "PSP@5"]
    assert "accuracy" not in header
    zlpr = dict(zip(header, row(table, "softmax"), strict=True))
    pal = dict(zip(header, row(table, "sampled"), strict=True))
    assert zlpr["P@1"] == "**80.00**" and pal["P@1"] == "70.00"
    assert zlpr["PSP@1"] == "30.00" and pal["PSP@1"] == "**40.00**"
    assert zlpr["macro R@5"] == "**40.00**" and zlpr["few"] == "**10.00**"
    text = study_markdown("a study", runs)
    assert "P@k and PSP@k as the Extreme Classification Repository" in text
    assert "mean per-class accuracy" not in text


def test_settings_table_lists_only_what_differs_and_a_line_of_what_is_shared():
    params = parse_params(TINY_PARAMS)
    runs = [Run(k, "", params, metrics(0.5)) for k in ("softmax", "sampled", "adversarial")]
    text = settings_tables(runs)
    header = [c.strip() for c in text.splitlines()[0].strip("|").split("|")]
    assert header[0] == "experiment"
    assert {"loss.name", "negatives", "sampler", "sampler.k", "loss.reg"} <= set(header)
    assert "optimizer.lr" not in header  # all 0.1: shared
    assert "optimizer.lr=0.1" in text and "optimizer.name=adagrad" in text
    adversarial = dict(zip(header, row(text, "adversarial"), strict=True))
    assert adversarial["sampler.k"] == "4" and adversarial["sampler.name"] == "tree"
    assert dict(zip(header, row(text, "softmax"), strict=True))["sampler.k"] == "–"
    assert settings_tables(runs[:1]) == ""
    seeded = [runs[0], runs[0], runs[1], runs[1], runs[2]]  # each seed run of an experiment
    assert settings_tables(seeded) == text  # one row an experiment, as without the seeds


def test_plugin_versions_groups_components_by_distribution():
    params = parse_params(TINY_PARAMS)
    runs = [
        Run(
            "softmax",
            "",
            params,
            metrics(
                0.5, plugins={"loss": "softmax (tailkit 0.1.0)", "model": "linear (tailkit 0.1.0)"}
            ),
        ),
        Run(
            "sampled",
            "",
            params,
            metrics(
                0.5,
                plugins={
                    "loss": "my-loss (tailkit-plugin-example 0.2.0)",
                    "model": "linear (tailkit 0.1.0)",
                },
            ),
        ),
    ]
    text = plugin_versions(runs)
    assert text == (
        "Plugins: tailkit 0.1.0: softmax, linear; tailkit-plugin-example 0.2.0: my-loss.\n"
    )
    assert "not recorded" in plugin_versions([Run("softmax", "", params, metrics(0.5))])
    peer = {"model": "napkinxc-plt (tailkit 0.1.0)", "napkinxc": "napkinxc 0.7.2"}
    with_tool = [*runs, Run("napkinxc", "", params, metrics(0.5, plugins=peer))]
    assert plugin_versions(with_tool) == (  # the tool a peer drives is no "unknown" plugin
        "Plugins: tailkit 0.1.0: softmax, linear, napkinxc-plt; tailkit-plugin-example 0.2.0: "
        "my-loss; tools: napkinxc 0.7.2.\n"
    )


def exp_entry(rev: str, name: str | None, raw: dict | None, accs: dict[str, float]) -> dict:
    data = None
    if raw is not None:
        data = {
            "rev": rev,
            "params": {"params.yaml": {"data": raw}},
            "metrics": {f"metrics/{k}.json": {"data": metrics(a)} for k, a in accs.items()}
            | {"metrics/sampler/uniform.json": {"data": {"uniform": {"fit_seconds": 0.1}}}},
        }
    return {"rev": rev, "name": name, "data": data, "error": None, "experiments": None}


def test_exp_show_runs_join_the_baseline_study_or_form_their_own():
    base = params_with()
    lr = params_with(experiments__softmax__optimizer={"name": "adagrad", "lr": 0.5})
    dim = params_with(featurize={"rff": {"name": "rff", "dim": 16, "bandwidth": 1.0}})
    accs = {k: 0.5 for k in TINY_PARAMS["experiments"]}
    failed = exp_entry("f" * 40, "broken", base, accs) | {"error": {"msg": "failed"}}
    show = [
        exp_entry("workspace", None, lr, accs | {"softmax": 0.9}),
        exp_entry("a" * 40, "main", base, accs)
        | {
            "experiments": [
                {"name": "lr", "revs": [exp_entry("b" * 40, "lr", lr, accs | {"softmax": 0.9})]},
                {"name": "dim", "revs": [exp_entry("c" * 40, "dim", dim, accs)]},
                {"name": "queued", "revs": [exp_entry("d" * 40, "queued", None, {})]},
                {"name": "broken", "revs": [failed]},
            ]
        },
    ]
    runs = exp_runs(show)
    studies = list(group_studies(runs).values())
    assert len(studies) == 2
    first = [r.name for r in studies[0]]
    # the baseline's runs under their own names, the experiment's one changed run after them;
    # the workspace repeats the experiment and the queued/failed ones have no results
    assert first == [*TINY_PARAMS["experiments"], "lr:softmax"]
    assert [r.name for r in studies[1]] == [f"dim:{k}" for k in TINY_PARAMS["experiments"]]
    assert studies[0][-1].metrics["test"]["accuracy"] == 0.9
    assert "dim=16" in describe_data(studies[1][0].params)
    assert "dim=32" in describe_data(studies[0][0].params)


def test_figures_are_pngs_and_the_same_data_gives_the_same_bytes(tmp_path: Path):
    curve = {c: np.linspace(0, 1, 5) for c in figures.CURVE_COLUMNS}
    curves = {"a": curve, "b": {c: v * 0.9 for c, v in curve.items()}}
    groups = {
        "a": {"many": 0.9, "medium": 0.5, "few": None},
        "b": {"many": 0.8, "medium": 0.6, "few": 0.1},
    }
    bins = {c: np.array([1.0, 2, 3, 4]) for c in figures.CLASS_BIN_COLUMNS}
    classes = {"a": {**bins, "train_count": np.array([0.0, 5, 50, 500])}}
    for name, draw, data in (
        ("curves", figures.learning_curves_figure, curves),
        ("groups", figures.group_accuracy_figure, groups),
        ("classes", figures.class_accuracy_figure, classes),
    ):
        one, two = draw(data, tmp_path / f"{name}-1.png"), draw(data, tmp_path / f"{name}-2.png")
        assert one.read_bytes().startswith(b"\x89PNG")
        assert one.read_bytes() == two.read_bytes()


def test_plot_files_with_the_wrong_header_are_refused(tmp_path: Path):
    path = tmp_path / "x.tsv"
    path.write_text("step\tloss\n1\t2\n")
    with pytest.raises(ValueError, match="not a learning curve"):
        figures.read_curve(path)
    with pytest.raises(ValueError, match="not a per-class plot file"):
        figures.read_class_bins(path)


def _seeded_runs() -> list[Run]:
    """Two experiments, three seeds each, accuracies drawn at random."""
    rng = np.random.default_rng(0)
    runs = []
    for seed in (0, 1, 2):
        params = parse_params(params_with(base__seed=seed))
        runs += [Run(k, "", params, metrics(float(rng.random()))) for k in ("softmax", "sampled")]
    return runs


def test_runs_of_several_seeds_are_one_row_with_mean_and_std():
    runs = _seeded_runs()
    table = comparison_table(runs)
    header = [c.strip() for c in table.splitlines()[0].strip("|").split("|")]
    assert header[:3] == ["experiment", "method", "seeds"]
    assert len(table.splitlines()) == 4  # header, rule, two experiments
    means = {}
    for name in ("softmax", "sampled"):
        cells = dict(zip(header, row(table, name), strict=True))
        acc = np.array([r.metrics["test"]["accuracy"] for r in runs if r.experiment == name])
        expected = f"{100 * acc.mean():.2f} ± {100 * acc.std(ddof=1):.2f}"
        # (with a spread this wide the other row is marked ≈: not told apart from the best)
        shown = cells["accuracy"].strip("*").removesuffix(" ≈")
        assert cells["seeds"] == "3" and shown == expected
        means[name] = (acc.mean(), cells["accuracy"].startswith("**"))
    best = max(means, key=lambda n: means[n][0])
    assert means[best][1] and not means[min(means, key=lambda n: means[n][0])][1]
    # the same runs in another order: the same bits
    assert comparison_table(runs[::-1]).splitlines()[2:] == table.splitlines()[2:][::-1]


def test_a_gap_to_the_best_smaller_than_the_seeds_spread_is_marked():
    """softmax: 0.80 ± 0.10 over its seeds; sampled 0.75 ± 0.01 is within it (marked), while
    0.50 ± 0.01 is not."""

    def runs(other: list[float]) -> list[Run]:
        out = []
        for seed, (a, b) in enumerate(zip([0.7, 0.8, 0.9], other, strict=True)):
            params = parse_params(params_with(base__seed=seed))
            out += [Run("softmax", "", params, metrics(a)), Run("sampled", "", params, metrics(b))]
        return out

    close = comparison_table(runs([0.74, 0.75, 0.76]))
    header = [c.strip() for c in close.splitlines()[0].strip("|").split("|")]
    cells = dict(zip(header, row(close, "sampled"), strict=True))
    assert cells["accuracy"] == "75.00 ± 1.00 ≈"
    assert dict(zip(header, row(close, "softmax"), strict=True))["accuracy"] == "**80.00 ± 10.00**"
    far = comparison_table(runs([0.49, 0.5, 0.51]))
    assert dict(zip(header, row(far, "sampled"), strict=True))["accuracy"] == "50.00 ± 1.00"


def test_the_seed_aggregate_is_numpy_s_mean_and_sample_std_of_every_metric():
    from tailkit.reporting.seeds import seed_aggregate

    runs = _seeded_runs()
    aggregate = seed_aggregate(runs)
    assert list(aggregate) == ["softmax", "sampled"]
    for name, entry in aggregate.items():
        assert entry["seeds"] == [0, 1, 2]
        for key in ("accuracy", "balanced_accuracy", "ece"):
            values = np.array([r.metrics["test"][key] for r in runs if r.experiment == name])
            assert entry[f"test.{key}"]["values"] == values.tolist()
            assert entry[f"test.{key}"]["mean"] == pytest.approx(values.mean(), rel=1e-12)
            assert entry[f"test.{key}"]["std"] == pytest.approx(values.std(ddof=1), rel=1e-12)
        assert "test.few" not in entry  # null for every seed: nothing to average
        assert "train.seconds" not in entry  # time is no quality metric


@pytest.mark.parametrize("suffix", [".parquet", ".csv", ".json"])
def test_the_exported_runs_frame_holds_the_metrics_it_was_read_from(tmp_path, suffix):
    import polars as pl

    from tailkit.reporting.tables import export_runs

    runs = _seeded_runs()
    path = export_runs(runs, tmp_path / f"runs{suffix}")
    frame = {".parquet": pl.read_parquet, ".csv": pl.read_csv, ".json": pl.read_json}[suffix](path)
    assert frame.height == len(runs)
    for run, values in zip(runs, frame.iter_rows(named=True), strict=True):
        assert (values["experiment"], values["seed"]) == (run.experiment, run.params.base.seed)
        for key, value in run.metrics["test"].items():
            assert values[f"test.{key}"] == (None if value is None else pytest.approx(value))
        assert values["train.seconds"] == run.metrics["train"]["seconds"]


def test_an_export_with_an_unknown_suffix_is_refused(tmp_path):
    from tailkit.errors import TailkitError
    from tailkit.reporting.tables import export_runs

    with pytest.raises(TailkitError, match=r"must end in \.parquet, \.csv, \.json"):
        export_runs(_seeded_runs(), tmp_path / "runs.xlsx")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("content", [None, "{not json", "[1, 2]"])
def test_a_missing_or_broken_metrics_file_is_one_line_naming_it_and_its_stage(tmp_path, content):
    from tailkit.errors import DataValidationError
    from tailkit.paths import Layout
    from tailkit.reporting.runs import workspace_runs

    layout = Layout(tmp_path)
    path = layout.metrics_detail("softmax")
    if content is not None:
        path.parent.mkdir(parents=True)
        path.write_text(content)
    with pytest.raises(DataValidationError, match=r"`dvc repro evaluate@softmax`") as caught:
        workspace_runs(parse_params(TINY_PARAMS), layout)
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_runs_differing_only_in_their_seed_are_kept_for_the_mean():
    from tailkit.reporting.runs import distinct

    runs = _seeded_runs()
    assert distinct(runs + runs[:2]) == runs


def test_the_headline_keeps_what_the_tables_show_and_nothing_else():
    """metrics/<exp>.json keeps the headline keys (and a null's reason), nested as in the
    detail file; every column of the comparison tables but time is among them, so a report
    over DVC experiments (which sees only the headline) shows the same table."""
    from tailkit.reporting.tables import COLUMNS, MULTILABEL_COLUMNS
    from tailkit.storage.metrics_file import HEADLINE, headline, null_non_finite

    for column in (*COLUMNS, *MULTILABEL_COLUMNS):
        block, key = column.path
        assert block == "train" or key in HEADLINE[block], column
    detail = {
        "test": {"accuracy": 0.9, "rows": 10, "ece": float("nan"), "few_classes": 3},
        "uncorrected": {"accuracy": 0.8, "log_likelihood": -1.0},
        "ranking": {"P@1": 0.9, "nDCG@3": 0.5},
        "margins": {"few": {"mean": 1.0}},
        "plugins": {"loss": "softmax (tailkit 0.1.0)"},
    }
    assert headline(null_non_finite(detail)) == {
        "test": {"accuracy": 0.9, "ece": None, "ece_null_reason": "nan"},
        "uncorrected": {"accuracy": 0.8},
    }


def test_the_legend_states_the_thresholds_the_runs_were_evaluated_with():
    """A study evaluated with evaluate.groups = {many_above: 50, few_below: 5} says so under
    its table; runs that record none (a DVC experiment's headline) get OLTR's defaults."""
    params = parse_params(TINY_PARAMS)
    custom = metrics(0.5, groups={"many_above": 50, "few_below": 5})
    text = study_markdown("s", [Run("softmax", "", params, custom)])
    assert "classes with > 50, 5–50 and < 5 training rows" in text
    plain = study_markdown("s", [Run("softmax", "", params, metrics(0.5))])
    assert "classes with > 100, 20–100 and < 20 training rows" in plain


def test_exp_runs_carry_the_detail_metrics_their_commit_holds(tmp_path: Path):
    """A DVC experiment's commit holds metrics/detail/<exp>.json (git-tracked): the report of
    experiments reads its intervals and plugins beside the headline exp show gives."""
    import json
    import subprocess

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-c", "user.name=t", "-c", "user.email=t@t", *args],
            cwd=tmp_path,
            check=True,
            capture_output=True,
            text=True,
        )
        return done.stdout.strip()

    git("init", "-q")
    detail = metrics(
        0.5,
        plugins={"loss": "softmax (tailkit 0.1.0)"},
        intervals={"test": {"accuracy": [0.45, 0.55]}},
    )
    path = tmp_path / "metrics" / "detail" / "softmax.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(detail))
    git("add", ".")
    git("commit", "-q", "-m", "results")
    sha = git("rev-parse", "HEAD")
    accs = {k: 0.5 for k in TINY_PARAMS["experiments"]}
    runs = exp_runs([exp_entry(sha, "main", params_with(), accs)], root=tmp_path)
    by_name = {r.experiment: r for r in runs}
    assert by_name["softmax"].metrics["plugins"] == {"loss": "softmax (tailkit 0.1.0)"}
    assert "plugins" not in by_name["sampled"].metrics  # no detail file at that commit
    assert "tailkit 0.1.0: softmax" in plugin_versions(runs)
    assert row(comparison_table(runs), "softmax")[2] == "**50.00 ±5.00**"
    # without the project's root, the headline alone, as before
    plain = exp_runs([exp_entry(sha, "main", params_with(), accs)])
    assert all("plugins" not in r.metrics for r in plain)


def test_exp_runs_keep_each_experiments_seed_runs_for_mean_and_std():
    """A DVC experiment with base.extra_seeds records metrics/<exp>+seed<s>.json beside
    metrics/<exp>.json: `report --exps` shows the experiment's mean ± std over its seeds, not
    seed 0 alone."""
    raw = params_with(base__extra_seeds=[1, 2])
    accs = {k: 0.5 for k in TINY_PARAMS["experiments"]}
    accs |= {"softmax": 0.6, "softmax+seed1": 0.7, "softmax+seed2": 0.8}
    runs = exp_runs([exp_entry("a" * 40, "main", raw, accs)])
    softmax = [r for r in runs if r.experiment == "softmax"]
    assert [r.params.base.seed for r in softmax] == [0, 1, 2]
    assert [r.metrics["test"]["accuracy"] for r in softmax] == [0.6, 0.7, 0.8]
    assert [r.name for r in softmax] == ["softmax"] * 3
    cells = row(comparison_table(runs), "softmax")
    assert cells[2:4] == ["3", "**70.00 ± 10.00**"]  # seeds, then accuracy's mean ± std
