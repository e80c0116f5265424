"""No value from params.yaml reaches a shell: dvc.yaml's commands are constants, and each stage
command learns its key from DVC_STAGE (tailkit/pipeline/stage_address.py)."""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT, TINY_DECOUPLED, TINY_PARAMS, make_project, run

from tailkit.errors import InvalidParameterError
from tailkit.params import parse_params
from tailkit.pipeline.stage_address import keyed_name, seeded_name, stage_address


def _stages(dvc_yaml: Path) -> dict:
    return yaml.safe_load(dvc_yaml.read_text())["stages"]


def test_no_command_of_dvc_yaml_interpolates_a_value():
    for name, stage in _stages(ROOT / "dvc.yaml").items():
        cmd = stage.get("do", stage)["cmd"]
        assert "${" not in cmd, f"stage {name}: {cmd}"


def test_the_key_comes_from_dvc_stage(monkeypatch):
    monkeypatch.setenv("DVC_STAGE", "train@sampled-uniform")
    assert stage_address() == ("train", "sampled-uniform")
    assert keyed_name("--experiment", {"train": ["softmax", "sampled-uniform"]}) == (
        "sampled-uniform"
    )
    monkeypatch.setenv("DVC_STAGE", "studies/dvc.yaml:featurize@rff")  # a dvc.yaml elsewhere
    assert stage_address() == ("featurize", "rff")
    assert keyed_name("--features", {"featurize": ["rff"]}) == "rff"


def test_a_matrix_key_resolves_among_hyphenated_names(monkeypatch):
    names, seeds = ["a", "a-1", "b-c"], [1, 2, 12]  # a-1-2 is (a-1, 2): 1-2 is no seed
    matrix = {"train-seed": (names, seeds)}
    for name in names:
        for seed in seeds:
            monkeypatch.setenv("DVC_STAGE", f"train-seed@{name}-{seed}")
            got = seeded_name("--experiment", {"train": names}, matrix)
            assert got == (name, seed)
    monkeypatch.setenv("DVC_STAGE", "train@b-c")
    assert seeded_name("--experiment", {"train": names}, matrix) == ("b-c", None)


def test_an_unknown_key_is_refused(monkeypatch):
    matrix = {"train-seed": (["a", "a-1"], [1, 11])}
    monkeypatch.setenv("DVC_STAGE", "train-seed@a-2")
    with pytest.raises(InvalidParameterError, match=r"no \(name, seed\) pair"):
        seeded_name("--experiment", {"train": ["a"]}, matrix)
    monkeypatch.setenv("DVC_STAGE", "train@x; touch PWNED")
    with pytest.raises(InvalidParameterError, match="no such name"):
        keyed_name("--experiment", {"train": ["softmax"]})
    monkeypatch.delenv("DVC_STAGE")
    with pytest.raises(InvalidParameterError, match="--experiment is required"):
        keyed_name("--experiment", {"train": ["softmax"]})


@pytest.mark.parametrize(
    "name",
    ["v1.0", "softmax2\n", "a" * 101, "x; touch PWNED", "seeds", "-lead", ""],
)
def test_names_follow_dvc_rule(name):
    raw = copy.deepcopy(TINY_PARAMS)
    raw["experiments"][name] = raw["experiments"].pop("softmax")
    with pytest.raises(InvalidParameterError) as info:
        parse_params(raw)
    assert "\n" not in str(info.value).strip() and len(str(info.value)) < 400


PLANTED = "; touch {mark}; echo $(touch {mark}x) `touch {mark}y`"


def _hostile_params() -> dict:
    """Every name params.yaml puts into dvc.yaml carries a command."""
    raw = copy.deepcopy(TINY_PARAMS)
    features = "rff" + PLANTED.format(mark="PWNED-features")
    sampler = "uniform" + PLANTED.format(mark="PWNED-sampler")
    experiment = "softmax" + PLANTED.format(mark="PWNED-experiment")
    raw["featurize"] = {features: raw["featurize"]["rff"]}
    raw["samplers"] = {sampler: {"name": "uniform"}}
    raw["experiments"] = {
        experiment: {**raw["experiments"]["softmax"], "features": features},
        "sampled": {**raw["experiments"]["sampled"], "features": features, "sampler": sampler},
    }
    raw["base"]["extra_seeds"] = ["1" + PLANTED.format(mark="PWNED-seed")]
    run_name = "crt" + PLANTED.format(mark="PWNED-decoupled")
    raw["decoupled"] = {run_name: {**TINY_DECOUPLED["crt"], "init_from": experiment}}
    return raw


@pytest.mark.slow
def test_a_planted_command_never_runs(tmp_path):
    project = make_project(tmp_path / "project", TINY_PARAMS)
    run([sys.executable, "-m", "tailkit", "fingerprint", "--quiet"], project)
    run(["git", "add", "-A"], project)
    run(["git", "commit", "-qm", "fingerprints"], project)
    tracked = sorted(p.name for p in (project / "fingerprints").rglob("*.json"))
    (project / "params.yaml").write_text(yaml.safe_dump(_hostile_params(), sort_keys=False))
    listed = run(["dvc", "stage", "list", "--name-only"], project).stdout.split("\n")
    addresses = [a for a in listed if "PWNED" in a]
    assert len(addresses) >= 8, listed  # every templated group renders a hostile stage
    ways = [
        ["dvc", "repro"],
        *(["dvc", "repro", "-s", address] for address in addresses),
        ["dvc", "exp", "run", "--temp"],
        [sys.executable, "-m", "tailkit", "repro", "--jobs", "2"],
    ]
    outputs = []
    for way in ways:
        result = run(way, project, check=False)
        assert result.returncode != 0, way
        outputs.append(result.stdout + result.stderr)
        planted = sorted(p.name for p in tmp_path.rglob("PWNED*"))
        assert not planted, f"{way} ran planted commands: {planted}"
    # plain `dvc repro` stops at tailkit's one line (the fingerprint stage runs first), and
    # the git-tracked fingerprints survive it
    assert "must start with a letter or digit" in outputs[0], outputs[0]
    assert sorted(p.name for p in (project / "fingerprints").rglob("*.json")) == tracked


@pytest.mark.slow
def test_the_name_rule_is_dvcs(tmp_path):
    """Names at the rule's edges render and resolve in DVC itself (stage addresses, params
    keys, files); the ones DVC cannot run are refused by the rule."""
    accepted = ["a", "A_b-9", "9lives", "x" * 100]
    raw = copy.deepcopy(TINY_PARAMS)
    template = raw["experiments"]["softmax"]
    raw["experiments"] = {name: dict(template) for name in accepted}
    parse_params(copy.deepcopy(raw))  # the rule takes them
    project = make_project(tmp_path / "ok", raw)
    listed = run(["dvc", "stage", "list", "--name-only"], project).stdout.split()
    assert all(f"train@{name}" in listed and f"evaluate@{name}" in listed for name in accepted)
    status = run(["dvc", "status", "--json"], project)  # every params key resolves
    assert status.returncode == 0 and "missing" not in status.stdout + status.stderr

    for refused in ("v1.0", "x" * 101, "seeds"):  # DVC nests the dot; a collision; too long
        raw["experiments"] = {refused: dict(template)}
        with pytest.raises(InvalidParameterError):
            parse_params(copy.deepcopy(raw))
