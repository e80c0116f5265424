"""A separately installed third-party plugin: listed by `tailkit plugins`, usable in a pipeline."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest
from conftest import ROOT, TINY_PARAMS, make_project, run

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def plugin_site(tmp_path_factory) -> Path:
    """The example plugin pip-installed into its own directory (the venv stays untouched)."""
    site = tmp_path_factory.mktemp("site")
    run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(site),
            str(ROOT / "examples" / "tailkit-plugin-example"),
        ],
        ROOT,
    )
    return site


def test_plugins_lists_the_installed_example(plugin_site, tmp_path):
    out = run(
        [sys.executable, "-m", "tailkit", "plugins"], tmp_path, PYTHONPATH=str(plugin_site)
    ).stdout
    example = {p["name"]: p for p in json.loads(out)}["example"]
    assert example["distribution"] == "tailkit-plugin-example"
    assert example["version"] == "0.1.0"
    assert example["registered"] == {"losses": ["label-smoothing"], "samplers": ["mixture"]}


def test_a_pipeline_uses_the_plugin_loss_and_sampler(plugin_site, tmp_path):
    params = copy.deepcopy(TINY_PARAMS)
    params["samplers"] = {"mix": {"name": "mixture", "beta": 0.5}}
    params["experiments"] = {
        "smoothed": {
            "loss": {"name": "label-smoothing", "epsilon": 0.1},
            "sampler": "none",
            "features": "rff",
            "optimizer": {"name": "adagrad", "lr": 0.1},
        },
        "mixed": {
            "loss": {"name": "sampled-softmax"},
            "sampler": "mix",
            "features": "rff",
            "negatives": 8,
            "optimizer": {"name": "adagrad", "lr": 0.1},
        },
    }
    project = make_project(tmp_path / "project", params)
    run(["dvc", "repro"], project, PYTHONPATH=str(plugin_site))
    for name in ("smoothed", "mixed"):
        metrics = json.loads((project / "metrics" / f"{name}.json").read_text())
        assert metrics["test"]["accuracy"] > 3 / 30
    info = json.loads((project / "data" / "models" / "mixed" / "model.json").read_text())
    assert info["plugins"]["sampler"] == "mixture (tailkit-plugin-example 0.1.0)"
    # the plugin's source is what the experiment depends on, like a built-in's
    code = json.loads((project / "fingerprints" / "experiments" / "mixed.json").read_text())
    assert code["sampler"]["distribution"] == "tailkit-plugin-example"
    assert "tailkit_plugin_example/__init__.py" in code["sampler"]["files"]
