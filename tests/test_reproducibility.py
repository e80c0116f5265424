"""Reruns you can trust, end to end in a scratch git + DVC repo:

* a fresh clone of the committed result, rebuilt by ``dvc repro`` with an empty cache, gives
  byte-identical artifacts and quality metrics, tree sampler included: only the timing files
  differ, in ``git status`` and in dvc.lock's hashes, and a second ``dvc repro`` runs no
  stage but the fingerprint;
* editing one built-in loss's source marks exactly the experiments that use it; editing a
  third-party plugin's installed source does the same for its experiments; installing an
  unrelated plugin marks nothing; a docstring edit in the report's code re-runs only the report;
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, TINY_PARAMS, make_project, run

pytestmark = pytest.mark.slow

from tailkit.paths import carries_time as _carries_time


def _plugin(site: Path, name: str, loss: str, doc: str) -> Path:
    """Build and pip-install (into ``site``) a throwaway distribution registering ``loss``."""
    src = site.parent / f"{name}-src"
    package = src / name
    package.mkdir(parents=True)
    (src / "pyproject.toml").write_text(
        f"""[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.1.0"

[project.entry-points.tailkit]
{name} = "{name}"

[tool.setuptools]
packages = ["{name}"]
"""
    )
    (package / "__init__.py").write_text(
        f'''"""{doc}"""

import torch.nn.functional as F

from tailkit import FullBatch, Loss, hookimpl


class PlainCE(Loss):
    """Softmax cross-entropy, from a third-party distribution."""

    def forward(self, batch: FullBatch):
        return F.cross_entropy(batch.logits, batch.labels)


@hookimpl
def register_losses(register):
    register("{loss}", PlainCE)
'''
    )
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation"]
    run([*pip, "--target", str(site), str(src)], ROOT)
    return site / name / "__init__.py"


def _snapshot(project: Path) -> dict[str, str]:
    out = {}
    for top in ("data", "metrics", "plots", "reports", "fingerprints"):
        for path in sorted((project / top).rglob("*")):
            rel = path.relative_to(project).as_posix()
            if path.is_file() and not rel.startswith(("data/raw/", "data/checkpoints/")):
                out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def _lock_hashes(text: str) -> dict[tuple[str, str], str]:
    """``{(stage, path): hash}`` of every dep and out in a dvc.lock."""
    out = {}
    for stage, entry in yaml.safe_load(text)["stages"].items():
        for item in [*entry.get("deps", []), *entry.get("outs", [])]:
            out[(stage, item["path"])] = item.get("md5") or item.get("hash") or ""
    return out


def _stages_run(output: str) -> list[str]:
    return [line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage")]


@pytest.fixture(scope="module")
def sites(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("plugins")
    used = _plugin(base / "site-used", "tk_throwaway", "throwaway-ce", "A plugin in use.")
    _plugin(base / "site-other", "tk_unrelated", "unrelated-ce", "A plugin nobody uses.")
    return used.parents[1], base / "site-other"


def test_reruns_are_byte_identical_and_code_edits_rerun_exactly_their_experiments(sites, tmp_path):
    used_site, other_site = sites
    env = {"PYTHONPATH": str(used_site)}
    params = copy.deepcopy(TINY_PARAMS)
    params["samplers"] = {"tree": {"name": "tree", "k": 4}}
    params["featurize"]["wide"] = {"name": "rff", "dim": 48, "bandwidth": 1.0}
    experiments = params["experiments"]
    params["experiments"] = {
        "softmax": experiments["softmax"],
        "adversarial": experiments["adversarial"],
        "plugged": {**experiments["softmax"], "loss": {"name": "throwaway-ce"}},
        "softmax-wide": {**experiments["softmax"], "features": "wide"},
    }
    project = make_project(tmp_path / "project", params)

    first = run(["dvc", "repro"], project, **env)
    assert "fingerprint" in _stages_run(first.stdout)
    assert "metrics/timings/train/softmax.json" in _snapshot(project)

    def changed_after_fingerprint(**extra: str) -> set[str]:
        run(["dvc", "repro", "fingerprint"], project, **(env | extra))
        return set(json.loads(run(["dvc", "status", "--json"], project, **(env | extra)).stdout))

    assert changed_after_fingerprint() == {"fingerprint"}  # it always runs, and changes nothing

    # a built-in loss: its experiments, no others, and the report, whose page lists each
    # experiment's code fingerprint
    loss_file = project / "tailkit" / "plugins" / "losses" / "negative_sampling.py"
    original = loss_file.read_text()
    loss_file.write_text(original + "\n# an edit\n")
    assert changed_after_fingerprint() == {
        "fingerprint",
        "train@adversarial",
        "evaluate@adversarial",
        "report",
    }
    loss_file.write_text(original)
    assert changed_after_fingerprint() == {"fingerprint"}

    # a third-party plugin's installed source counts the same
    plugin_file = used_site / "tk_throwaway" / "__init__.py"
    original = plugin_file.read_text()
    plugin_file.write_text(original + "\n# an edit\n")
    assert changed_after_fingerprint() == {
        "fingerprint",
        "train@plugged",
        "evaluate@plugged",
        "report",
    }
    plugin_file.write_text(original)

    # installing an unrelated plugin marks nothing, and a repro runs no experiment
    both = {"PYTHONPATH": os.pathsep.join([str(used_site), str(other_site)])}
    assert changed_after_fingerprint(**both) == {"fingerprint"}
    assert _stages_run(run(["dvc", "repro"], project, **both).stdout) == ["fingerprint"]

    # a docstring in the tables' code re-runs what imports it only: the report and the seeds'
    # aggregate (whose output it leaves as it was)
    tables = project / "tailkit" / "reporting" / "tables.py"
    tables.write_text(tables.read_text().replace('"""', '"""Edited. ', 1))
    assert changed_after_fingerprint() == {"fingerprint", "seeds", "report"}
    ran = _stages_run(run(["dvc", "repro"], project, **env).stdout)
    assert ran == ["fingerprint", "seeds", "report"]

    # one feature set's options re-run that set and the experiments on it; the sampler is
    # refitted (fit-sampler@<key> reads every set) to the same bytes, so the tree's experiment
    # stays
    spec = yaml.safe_load((project / "params.yaml").read_text())
    spec["featurize"]["wide"]["bandwidth"] = 0.5
    (project / "params.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    assert set(_stages_run(run(["dvc", "repro"], project, **env).stdout)) == {
        "fingerprint",
        "featurize@wide",
        "fit-sampler@tree",
        "train@softmax-wide",
        "evaluate@softmax-wide",
        "seeds",  # its metrics moved, so the aggregate over seeds is rebuilt
        "report",
    }

    # a fresh clone of the committed state: clean apart from the timing files
    run(["git", "add", "-A"], project)
    run(["git", "commit", "-qm", "results"], project)
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(project), str(clone)], check=True)
    run(["dvc", "repro"], clone, **env)
    status = run(["git", "status", "--porcelain"], clone).stdout.splitlines()
    dirty = sorted(line[3:] for line in status)
    assert all(_carries_time(path) or path == "dvc.lock" for path in dirty), dirty
    assert _stages_run(run(["dvc", "repro"], clone, **env).stdout) == ["fingerprint"]
    assert set(json.loads(run(["dvc", "status", "--json"], clone, **env).stdout)) == {"fingerprint"}
    # the lock differs from the committed one only in the hashes of time-carrying files
    committed = _lock_hashes(run(["git", "show", "HEAD:dvc.lock"], clone).stdout)
    rebuilt = _lock_hashes((clone / "dvc.lock").read_text())
    assert committed.keys() == rebuilt.keys()
    moved = sorted({p for (_, p), h in committed.items() if rebuilt[(_, p)] != h})
    assert moved and all(_carries_time(p) for p in moved), moved
    # every artifact a later stage reads and every quality metric was rebuilt to its bytes
    outputs = {p for _, p in committed}
    for path in (
        "data/split",
        "data/features/rff",
        "data/sampler/tree",
        "data/models/adversarial",
        "data/models/plugged",
        "metrics/adversarial.json",
        "metrics/sampler/tree.json",
        "plots/classes/softmax.tsv",
    ):
        assert path in outputs and path not in moved, path
    # tests and commands leave the clone as they found it
    run([str(Path(sys.executable).parent / "tailkit"), "list", "losses"], clone, **env)
    assert run(["git", "status", "--porcelain"], clone).stdout.splitlines() == status
