"""Shared fixtures: a scratch DVC project that runs the real pipeline on tiny params."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).parents[1]
BIN = Path(sys.executable).parent

TINY_PARAMS = {
    "base": {"seed": 0, "device": "cpu", "extra_seeds": []},
    "dataset": {
        "name": "synthetic",
        "num_classes": 30,
        "num_examples": 3000,
        "dim": 6,
        "zipf_exponent": 1.0,
        "noise": 0.2,
        "seed": 0,
    },
    "subsample": {"profile": "natural", "val_fraction": 0.15, "test_fraction": 0.15},
    "featurize": {"rff": {"name": "rff", "dim": 32, "bandwidth": 1.0}},
    "samplers": {
        "uniform": {"name": "uniform"},
        "in-batch": {"name": "in-batch"},
        "tree": {"name": "tree", "k": 4},
    },
    "train": {"epochs": 2, "batch_size": 128, "eval_every": 10, "val_rows": 300},
    "evaluate": {"batch_size": 256, "label_chunk": 7},
    "experiments": {
        "softmax": {
            "loss": {"name": "softmax"},
            "sampler": "none",
            "features": "rff",
            "optimizer": {"name": "adagrad", "lr": 0.1},
        },
        "sampled": {
            "loss": {"name": "sampled-softmax"},
            "sampler": "uniform",
            "features": "rff",
            "negatives": 8,
            "optimizer": {"name": "adagrad", "lr": 0.1},
        },
        "adversarial": {
            "loss": {"name": "negative-sampling", "reg": 0.001},
            "sampler": "tree",
            "features": "rff",
            "negatives": 4,
            "optimizer": {"name": "adagrad", "lr": 0.1},
        },
        # An encoder with parameters, the cosine layer and per-class loss state, end to end.
        "ldam": {
            "loss": {"name": "ldam", "drw_epoch": 1},
            "model": {"name": "mlp", "hidden": [16], "dim": 8},
            "sampler": "none",
            "features": "rff",
            "optimizer": {"name": "adagrad", "lr": 0.1},
        },
        "dro-lt": {
            "loss": {"name": "dro-lt"},
            "model": {"name": "mlp", "hidden": [16], "dim": 8},
            "sampler": "none",
            "features": "rff",
            "optimizer": {"name": "adagrad", "lr": 0.1},
        },
    },
}
# Kang et al.'s classifier re-training on softmax's frozen encoder: the tiny project's
# second-stage stages (kept apart: tests that keep a subset of the experiments drop it).
TINY_DECOUPLED = {"crt": {"init_from": "softmax", "classifier": "crt", "epochs": 1}}


class _GivenDataset:
    def __init__(self, raw) -> None:
        self.raw = raw

    def load(self, path):
        return self.raw


class StandInRegistry:
    """Hands a stage a dataset whose ``load`` returns the given RawData (bad data a real
    dataset plugin would refuse to build); every other component comes from the real
    registry."""

    def __init__(self, raw) -> None:
        from tailkit.registry import make_registry

        self.raw, self.real = raw, make_registry()

    def build(self, kind, spec, key, *runtime):
        if kind == "datasets":
            return _GivenDataset(self.raw)
        return self.real.build(kind, spec, key, *runtime)

    def components(self, kind):
        return self.real.components(kind)


def tool_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        DVC_NO_ANALYTICS="1",
        DVC_STUDIO_OFFLINE="true",
        GIT_AUTHOR_NAME="test",
        GIT_AUTHOR_EMAIL="test@example.invalid",
        GIT_COMMITTER_NAME="test",
        GIT_COMMITTER_EMAIL="test@example.invalid",
    )
    env.update(extra)
    return env


def run(cmd: list[str], cwd: Path, check: bool = True, **env: str) -> subprocess.CompletedProcess:
    result = subprocess.run(
        cmd, cwd=cwd, env=tool_env(**env), capture_output=True, text=True, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"{' '.join(cmd)} exited {result.returncode}\n{result.stdout}\n{result.stderr}"
        )
    return result


def prepare_stages(params, layout, registry, feature_set: str) -> None:
    """Run download, subsample, featurize ``feature_set`` and fit-sampler in-process: the
    inputs every train stage of ``params`` reads, without DVC."""
    from tailkit.stages import download, featurize, fit_sampler, subsample

    download.run(params, layout, registry)
    subsample.run(params, layout, registry)
    featurize.run(params, layout, registry, feature_set)
    fit_sampler.run(params, layout, registry)


def make_project(path: Path, params: dict) -> Path:
    """A git + DVC repo holding our dvc.yaml, the package sources it depends on, and params."""
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "dvc.yaml", path / "dvc.yaml")
    shutil.copy(ROOT / ".dvcignore", path / ".dvcignore")  # __pycache__ (numba's too) is not a dep
    shutil.copytree(
        ROOT / "tailkit", path / "tailkit", ignore=shutil.ignore_patterns("__pycache__")
    )
    (path / ".gitignore").write_text("/data/\n__pycache__/\n")
    (path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    run(["git", "init", "-q", "-b", "main"], path)
    run(["dvc", "init", "-q"], path)
    run(["dvc", "config", "core.analytics", "false"], path)
    shutil.copytree(ROOT / ".dvc" / "plots", path / ".dvc" / "plots")  # the plot templates
    run(["git", "add", "-A"], path)
    run(["git", "commit", "-qm", "init"], path)
    return path


@pytest.fixture(scope="session")
def tiny_project(tmp_path_factory) -> Path:
    """The tiny pipeline, reproduced once per session and committed."""
    params = {**TINY_PARAMS, "decoupled": TINY_DECOUPLED}
    path = make_project(tmp_path_factory.mktemp("project"), params)
    run(["dvc", "repro"], path)
    run(["git", "add", "-A"], path)
    run(["git", "commit", "-qm", "repro"], path)
    return path


@pytest.fixture(autouse=True)
def _private_catalog_cache(tmp_path_factory, monkeypatch):
    """In-process CLI calls keep the component catalog in a folder of the test session's, so a
    test that patches the plugins in can never leave its records in the user's cache."""
    from tailkit import catalog

    folder = tmp_path_factory.getbasetemp() / "catalog-cache"
    monkeypatch.setattr(catalog, "cache_dir", lambda: folder)


@pytest.fixture(autouse=True)
def _seeded_global_generator():
    """Every test starts from the same state of torch's global generator: a test that draws
    from it (``torch.rand`` without a generator) then gets the same numbers whichever tests ran
    before it. Without this, the float32-against-float64 tests of the fused losses drew
    weights that depended on the test order, and one order put an error just past its
    tolerance."""
    import torch

    torch.manual_seed(0)


#: Tests over a second each (tests/slow_tests.txt): `make test-fast` skips them with the
#: end-to-end runs marked slow in their files.
SLOW_TESTS = Path(__file__).with_name("slow_tests.txt")


def pytest_collection_modifyitems(config, items):
    listed = {
        line.strip()
        for line in SLOW_TESTS.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for item in items:
        if item.nodeid in listed:
            item.add_marker(pytest.mark.slow)
