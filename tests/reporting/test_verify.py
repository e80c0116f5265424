"""``tailkit verify [REV]``: per experiment, identical, within tolerance with the likely cause,
or different (the only verdict that fails), read from dvc.lock, the metrics and provenance."""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from click.testing import CliRunner
from conftest import run

from tailkit.cli import cli

PORTABLE = {
    "mode": "portable",
    "target": "x86-64-v3",
    "machine": "x86_64",
    "device": "cpu",
    "libraries": {"torch": "2.13.0+cpu", "numpy": "2.4.6"},
}


def write(root: Path, balanced: float, arithmetic: dict, model_md5: str = "aa") -> None:
    metrics = {"test": {"accuracy": 0.9393, "balanced_accuracy": balanced}}
    (root / "metrics" / "detail").mkdir(parents=True, exist_ok=True)
    (root / "metrics" / "softmax.json").write_text(json.dumps(metrics))
    detail = {**metrics, "plugins": {"loss": "softmax (tailkit 0.1.0)", "arithmetic": arithmetic}}
    (root / "metrics" / "detail" / "softmax.json").write_text(json.dumps(detail))
    lock = {
        "schema": "2.0",
        "stages": {
            "train@softmax": {
                "outs": [
                    {"path": "data/models/softmax", "md5": model_md5},
                    {"path": "metrics/timings/train/softmax.json", "md5": str(balanced)},
                ]
            },
            "evaluate@softmax": {"outs": [{"path": "metrics/softmax.json", "md5": str(balanced)}]},
        },
    }
    (root / "dvc.lock").write_text(yaml.safe_dump(lock))


def project(tmp_path: Path) -> Path:
    root = tmp_path / "study"
    root.mkdir()
    params = {"base": {"seed": 0}, "experiments": {"softmax": {"loss": {"name": "softmax"}}}}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    write(root, 0.8042892531089574, PORTABLE)
    run(["git", "init", "-q"], root)
    run(["git", "add", "-A"], root)
    run(["git", "commit", "-qm", "baseline"], root)
    return root


def verify(root: Path, *args: str):
    return CliRunner().invoke(cli, ["verify", *args, "--params", str(root / "params.yaml")])


def test_an_identical_rerun_is_identical(tmp_path):
    root = project(tmp_path)
    result = verify(root)
    assert result.exit_code == 0, result.output
    assert result.output == "softmax: identical\n"


def test_a_native_rerun_is_within_tolerance_and_names_the_mode(tmp_path):
    root = project(tmp_path)
    native = {**PORTABLE, "mode": "native", "cpu": "AMD EPYC"}
    del native["target"]
    write(root, 0.8042212813851946, native, model_md5="bb")
    result = verify(root, "HEAD")
    assert result.exit_code == 0, result.output
    line = result.output.strip()
    assert line.startswith("softmax: within tolerance; largest change test.balanced_accuracy")
    assert "0.804289 → 0.804221" in line
    assert "portable → native arithmetic" in line


def test_other_libraries_with_the_same_numbers_are_named(tmp_path):
    root = project(tmp_path)
    newer = {**PORTABLE, "libraries": {"torch": "2.14.0+cpu", "numpy": "2.4.6"}}
    write(root, 0.8042892531089574, newer)
    result = verify(root)
    assert result.exit_code == 0
    assert "same metrics" in result.output
    assert "other library versions (torch 2.13.0+cpu → 2.14.0+cpu)" in result.output


def test_a_changed_experiment_differs_and_fails(tmp_path):
    root = project(tmp_path)
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["experiments"]["softmax"]["loss"] = {"name": "logit-adjusted"}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    write(root, 0.8234, PORTABLE, model_md5="cc")
    result = verify(root)
    assert result.exit_code == 1
    line = result.output.strip()
    assert line.startswith("softmax: DIFFERS; test.balanced_accuracy 0.804289 → 0.8234")
    assert "its settings in params.yaml changed" in line
    assert "arithmetic" not in line.split("likely cause:")[1]


def test_an_unknown_revision_is_one_line(tmp_path):
    root = project(tmp_path)
    result = verify(root, "no-such-rev")
    assert result.exit_code != 0
    assert result.output.strip().splitlines() == [
        f"Error: verify: 'no-such-rev' is not a git revision of {root.resolve()}"
    ]
