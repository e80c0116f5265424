"""Nothing tailkit reads from disk is unpickled, and a killed run resumes to the same bytes.

Each planted file is a pickle whose payload would create a marker file when unpickled; the
test first proves that it does (so the test can fail), then asserts that tailkit refuses the
file with a one-line error naming it, exits non-zero, and the marker never appears.
"""

from __future__ import annotations

import io
import os
import pickle
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import BIN, run, tool_env

from tailkit.training.checkpoint import Checkpointer

pytestmark = pytest.mark.slow


class _Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (exec, (f"open({str(self.marker)!r}, 'w').close()",))


def _planted(marker: Path, torch_format: bool) -> bytes:
    """A pickle (plain, or in torch.save's zip layout) that creates ``marker`` when loaded."""
    payload = {"layer": _Payload(marker), "key": "x"}
    if not torch_format:
        return pickle.dumps(payload)
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


def _prove_it_runs(tmp_path: Path) -> None:
    probe = tmp_path / "probe"
    pickle.loads(_planted(probe, torch_format=False))
    assert probe.exists(), "the planted payload must run when unpickled, or the test proves nothing"


@pytest.fixture
def project(tiny_project, tmp_path) -> Path:
    """A private copy of the reproduced tiny project (outputs included)."""
    copy = tmp_path / "project"
    shutil.copytree(tiny_project, copy, symlinks=True)
    return copy


@pytest.mark.parametrize(
    ("target", "command", "torch_format"),
    [
        ("data/models/softmax/model.safetensors", ["evaluate", "--experiment", "softmax"], False),
        ("data/models/softmax/model.safetensors", ["evaluate", "--experiment", "softmax"], True),
        ("data/sampler/tree/state.safetensors", ["evaluate", "--experiment", "adversarial"], False),
        ("data/sampler/tree/state.safetensors", ["train", "--experiment", "adversarial"], True),
        ("data/checkpoints/softmax/state.pt", ["train", "--experiment", "softmax"], True),
        ("data/checkpoints/softmax/state.pt", ["train", "--experiment", "softmax"], False),
    ],
)
def test_a_planted_pickle_is_refused_and_never_runs(
    project, tmp_path, target, command, torch_format
):
    _prove_it_runs(tmp_path)
    marker = tmp_path / "marker"
    path = project / target
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_planted(marker, torch_format))
    outputs = {p: p.read_bytes() for p in (project / "data" / "models").rglob("*") if p.is_file()}
    done = run([str(BIN / "python"), "-m", "tailkit", *command, "--quiet"], project, check=False)
    assert done.returncode != 0
    assert not marker.exists()
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and target in lines[0], done.stderr
    assert "Traceback" not in done.stderr
    # nothing was replaced: the models on disk are the ones from before
    after = {p: p.read_bytes() for p in (project / "data" / "models").rglob("*") if p.is_file()}
    assert after == outputs


def test_a_checkpoint_from_other_code_is_ignored_with_a_notice(tmp_path, capsys):
    Checkpointer(tmp_path / "c", key="old-code").save({"step": 3})
    assert Checkpointer(tmp_path / "c", key="new-code", owner="train@x").load() is None
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("train@x: ignoring checkpoint")
    assert Checkpointer(tmp_path / "c", key="old-code").load()["step"] == 3


def _slow_params(project: Path) -> None:
    """One longer experiment that checkpoints often, so a kill lands mid-run."""
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["experiments"]["slow"] = {
        "loss": {"name": "sampled-softmax"},
        "sampler": "tree",
        "features": "rff",
        "negatives": 4,
        "optimizer": {"name": "adagrad", "lr": 0.1},
        "epochs": 60,
    }
    params["train"]["checkpoint_every"] = 40
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


def test_kill_9_during_training_then_dvc_repro_resumes_to_the_same_model_bytes(project):
    _slow_params(project)
    run(["dvc", "repro", "train@slow"], project)
    model = project / "data" / "models" / "slow"
    reference = {p.name: p.read_bytes() for p in model.iterdir()}
    curve = (project / "plots" / "train" / "slow.tsv").read_text()

    checkpoint = project / "data" / "checkpoints" / "slow" / "state.pt"
    proc = subprocess.Popen(
        ["dvc", "repro", "--force", "train@slow"],
        cwd=project,
        env=tool_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the kill takes the trainer too
    )
    deadline = time.monotonic() + 300
    while not checkpoint.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert checkpoint.exists(), "no checkpoint appeared before the run ended"
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait() == -signal.SIGKILL
    assert checkpoint.exists()

    done = run(["dvc", "repro", "train@slow"], project)
    assert "resuming from" in done.stderr + done.stdout
    assert {p.name: p.read_bytes() for p in model.iterdir()} == reference
    strip = [line.split("\t")[:1] + line.split("\t")[2:] for line in curve.splitlines()]
    resumed = (project / "plots" / "train" / "slow.tsv").read_text().splitlines()
    assert [line.split("\t")[:1] + line.split("\t")[2:] for line in resumed] == strip
    assert not checkpoint.exists()  # a finished run clears its checkpoint
