"""The command line: plugins/list output, and bad input rejected on one line with no leftovers."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner
from conftest import TINY_PARAMS, run

from tailkit.cli import cli


def test_plugins_prints_json_of_builtin_plugins():
    result = CliRunner().invoke(cli, ["plugins"])
    assert result.exit_code == 0
    plugins = {p["name"]: p for p in json.loads(result.output)}
    assert sorted(plugins["tailkit.samplers"]["registered"]["samplers"]) == [
        "in-batch",
        "model-based",
        "tree",
        "uniform",
        "unigram",
    ]
    assert sorted(plugins["tailkit.losses"]["registered"]["losses"]) == sorted(
        [
            "softmax",
            "sampled-softmax",
            "negative-sampling",
            "nce",
            "logit-adjusted",
            "balanced-softmax",
            "decoupled",
            "sampled-decoupled",
            "ldam",
            "cb-focal",
            "elm",
            "dro-lt",
            "multilabel-ce",
            "distribution-balanced",
            "nway-mclass",
        ]
    )
    assert sorted(plugins["tailkit.models"]["registered"]["models"]) == [
        "linear",
        "mlp",
        "resnet32",
        "sparse-linear",
        "sparse-mlp",
    ]
    assert plugins["tailkit.losses"]["distribution"] == "tailkit"
    assert plugins["tailkit.losses"]["version"]


@pytest.mark.parametrize("kind", ["losses", "samplers", "datasets", "featurizers", "models"])
def test_list_prints_name_and_description(kind):
    result = CliRunner().invoke(cli, ["list", kind])
    assert result.exit_code == 0
    lines = result.output.strip().splitlines()
    assert lines and all(len(line.split()) >= 2 for line in lines)


def _params(tmp_path, **changes):
    params = copy.deepcopy(TINY_PARAMS)
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        node = params
        for key in parents:
            node = node[key]
        node[last] = value
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    return tmp_path


def _fails_cleanly(tmp_path, command, expected):
    result = run([sys.executable, "-m", "tailkit", *command], tmp_path, check=False)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith("Error: ") and expected in lines[0], lines[0]
    return lines[0]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("changes", "expected"),
    [
        (
            {"dataset__name": "cifar-11"},
            "dataset.name: unknown dataset 'cifar-11' (did you mean 'cifar10'?); available:",
        ),
        ({"train__batch_size": "big"}, "train.batch_size: got 'big' (str); expected an integer"),
        ({"train__epochs": -1}, "train.epochs: got -1.0; expected a value in the range (0, inf)"),
        ({"subsample__imbalance_ratio": 0.5}, "subsample.imbalance_ratio: got 0.5"),
        ({"subsample__typo": 1}, "subsample: unknown key 'typo'; allowed keys are"),
        ({"dataset__num_classes": 1}, "dataset.num_classes: got 1"),
    ],
)
def test_bad_params_fail_on_one_line_without_output(tmp_path, changes, expected):
    _params(tmp_path, **changes)
    _fails_cleanly(tmp_path, ["download"], expected)
    assert not (tmp_path / "data").exists()


@pytest.mark.slow
def test_a_vanishing_class_fails_subsample_and_writes_nothing(tmp_path):
    _params(tmp_path, subsample__profile="exp", subsample__imbalance_ratio=10000)
    run([sys.executable, "-m", "tailkit", "download", "--quiet"], tmp_path)
    _fails_cleanly(tmp_path, ["subsample"], "imbalance_ratio=10000")
    assert not (tmp_path / "data" / "split").exists()
    # no temporary leftovers; the download's lock file (beside data/raw, no output's part) stays
    assert sorted(p.name for p in (tmp_path / "data").iterdir()) == [".raw.lock", "raw"]


@pytest.mark.slow
def test_unknown_loss_in_an_experiment_names_the_key(tmp_path):
    _params(tmp_path, experiments__sampled__loss={"name": "focal"})
    _fails_cleanly(
        tmp_path,
        ["train", "--experiment", "sampled"],
        "experiments.sampled.loss.name: unknown loss 'focal' (did you mean 'cb-focal'?); available:",
    )


@pytest.mark.slow
def test_a_stage_run_before_its_inputs_exist_names_the_missing_file(tmp_path):
    _params(tmp_path)
    _fails_cleanly(
        tmp_path,
        ["evaluate", "--experiment", "softmax"],
        "data/features/rff/meta.json: missing; run `dvc repro featurize@rff` first",
    )


@pytest.mark.slow
def test_featurize_names_the_feature_sets_it_knows(tmp_path):
    _params(tmp_path)
    run([sys.executable, "-m", "tailkit", "download", "--quiet"], tmp_path)
    run([sys.executable, "-m", "tailkit", "subsample", "--quiet"], tmp_path)
    _fails_cleanly(
        tmp_path,
        ["featurize", "--features", "cells"],
        "params.yaml: featurize: no feature set 'cells'; defined: rff",
    )
    assert not (tmp_path / "data" / "features").exists()
    run([sys.executable, "-m", "tailkit", "featurize", "--features", "rff", "--quiet"], tmp_path)
    assert sorted(p.name for p in (tmp_path / "data" / "features").iterdir()) == ["rff"]


@pytest.mark.slow
def test_a_drawing_sampler_needs_negatives(tmp_path):
    _params(tmp_path, experiments__sampled__negatives=0)
    _fails_cleanly(
        tmp_path,
        ["train", "--experiment", "sampled"],
        "experiments.sampled.negatives: got 0; sampler 'uniform' draws",
    )


def test_options_prints_each_option_with_type_default_and_range():
    """Issue 15 item 7: `tailkit options KIND NAME`."""
    result = CliRunner().invoke(cli, ["options", "samplers", "tree"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].startswith("tree: ") and lines[0].endswith("[tailkit.samplers]")
    rows = [x for x in lines[1:] if x.startswith("  ") and not x.startswith("      ")]
    options = {line.split()[0]: line for line in rows}
    assert list(options) == ["k", "reg", "split_rule", "frequency_reg", "max_rounds"]
    assert "an integer" in options["k"] and "default 16" in options["k"]
    assert options["k"].endswith("in the range [1, 1024]")
    assert "one of 'paper', 'reference'" in options["split_rule"]
    assert "default paper" in options["split_rule"]
    assert "default false" in options["frequency_reg"]
    typo = CliRunner().invoke(cli, ["options", "losses", "softmx"])
    assert typo.exit_code == 2
    assert "unknown loss 'softmx' (did you mean 'softmax'?)" in typo.output


def test_info_commands_read_a_cached_catalog_without_importing_components(tmp_path):
    """Issue 15 item 6: `list`, `plugins`, `options` start in well under a second because the
    info records are cached outside the project; the cache follows the installed code."""
    probe = (
        "import sys; from tailkit.catalog import load_catalog; c = load_catalog(); "
        "print(len(c.components), 'torch' in sys.modules)"
    )
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    first, second = (
        subprocess.run(
            [sys.executable, "-c", probe], check=True, env=env, capture_output=True, text=True
        )
        for _ in range(2)
    )
    count = first.stdout.split()[0]
    assert first.stdout.split() == [count, "True"]  # built: every component imported
    assert second.stdout.split() == [count, "False"]  # read back: nothing imported
    assert len(list((tmp_path / "tailkit").glob("catalog-*.json"))) == 1


def test_the_catalog_key_follows_files_plugins_and_settings(tmp_path, monkeypatch):
    from tailkit import catalog

    source = tmp_path / "plugin.py"
    source.write_text("x = 1\n")
    monkeypatch.setattr(catalog, "_package_files", lambda top: iter([source]))
    key = catalog.catalog_key()
    assert catalog.catalog_key() == key
    source.write_text("x = 22\n")  # an edit changes the size (and the mtime)
    edited = catalog.catalog_key()
    assert edited != key
    monkeypatch.setenv("TAILKIT_LOAD_PLUGINS", "tailkit.losses")
    assert catalog.catalog_key() != edited


def test_evaluate_summary_names_the_metrics_the_data_has() -> None:
    """Single-label data prints accuracy; multi-label data, which has none, P@k and PSP@5
    (the CLI once raised KeyError 'accuracy' after a multi-label evaluate had written its
    metrics)."""
    from tailkit.cli import evaluate_summary

    single = {"accuracy": 0.93948, "balanced_accuracy": 0.80214, "few": 0.7}
    assert evaluate_summary("softmax", single) == (
        "evaluate@softmax: accuracy 0.9395, balanced 0.8021"
    )
    multi = {"P@1": 0.5538, "P@3": 0.3763, "P@5": 0.2820, "PSP@5": 0.10705, "few": 0.003}
    assert evaluate_summary("ns", multi) == "evaluate@ns: P@1 0.5538, P@5 0.2820, PSP@5 0.1071"


def test_subsample_counts_rows_and_calls_label_pairs_pairs(tmp_path, monkeypatch):
    """A multi-label split's label counts sum to (row, label) pairs, not rows: the line says
    rows as rows and pairs as pairs."""
    params = copy.deepcopy(TINY_PARAMS)
    params["dataset"] = {"name": "synthetic-xc", "num_labels": 40, "num_features": 60,
                         "num_train": 300, "num_test": 100}  # fmt: skip
    params["subsample"] = {"val_fraction": 0.2}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(cli, ["download"]).exit_code == 0
    result = CliRunner().invoke(cli, ["subsample"])
    assert result.exit_code == 0, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith("subsample: 240 train / 60 val / 100 test rows, 40 classes (")
    pairs = int(line.split("(")[1].split()[0].replace(",", ""))
    assert pairs > 240 and line.endswith(f"({pairs:,} (row, label) pairs in train)")
