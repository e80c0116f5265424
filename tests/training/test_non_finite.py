"""Nothing non-finite is saved or resumed from: a loss whose value stays finite while its
gradient is NaN (the hostile probe's plugin loss) stops training with one line."""

from __future__ import annotations

import pytest
import torch
from test_training import _run

from tailkit.errors import TrainingDivergedError
from tailkit.pipeline.artifacts import save_model
from tailkit.plugins.losses.softmax import SoftmaxCE
from tailkit.storage.atomic import atomic_dir
from tailkit.training.checkpoint import Checkpointer
from tailkit.training.finite import first_non_finite

STEPS = 30  # _run: three epochs of ten batches


class NaNGradientFrom(SoftmaxCE):
    """Softmax CE plus a term whose value is 0 and whose gradient is NaN, from the 1-based step
    ``start`` on: the untaken branch of a torch.where still back-propagates 0 × NaN."""

    def __init__(self, start: int) -> None:
        super().__init__()
        self.start = start

    def forward(self, batch):
        value = super().forward(batch)
        if batch.step + 1 < self.start:
            return value
        never = torch.zeros_like(batch.logits, dtype=torch.bool)
        return value + torch.where(never, torch.sqrt(batch.logits - 1e9), 0.0).sum()


def test_the_probe_loss_is_finite_with_a_nan_gradient():
    logits = torch.randn(4, 5, requires_grad=True)
    never = torch.zeros_like(logits, dtype=torch.bool)
    value = torch.where(never, torch.sqrt(logits - 1e9), 0.0).sum()
    value.backward()
    assert value.item() == 0.0 and torch.isnan(logits.grad).all()


def test_a_nan_gradient_on_the_last_step_saves_no_model(tmp_path):
    checkpoint = Checkpointer(tmp_path / "ckpt", key="k")
    with pytest.raises(TrainingDivergedError) as info:
        _run(NaNGradientFrom(STEPS), checkpoint=checkpoint)
    message = str(info.value)
    assert message.startswith("experiments.t: layer.weight is not finite after step 30")
    assert "no model was saved" in message and "\n" not in message
    state = checkpoint.load()  # the checkpoints written before it, at steps 7 … 28, are sound
    assert state is not None and state["step"] == 28


def test_no_checkpoint_is_written_after_a_nan_gradient(tmp_path):
    checkpoint = Checkpointer(tmp_path / "ckpt", key="k")
    with pytest.raises(TrainingDivergedError, match="after step 14; no checkpoint was written"):
        _run(NaNGradientFrom(14), checkpoint=checkpoint)  # _run checkpoints every 7 steps
    state = checkpoint.load()
    assert state is not None and state["step"] == 7  # the last sound one stays


def test_a_non_finite_checkpoint_is_never_resumed(tmp_path, capsys):
    checkpoint = Checkpointer(tmp_path / "ckpt", key="k")
    rows = {"layer.weight": torch.ones(6, 3), "layer.bias": torch.zeros(6)}
    rows["layer.weight"][4, 1] = float("nan")
    checkpoint.save({"step": 500, "encoder": {"w": torch.ones(2)}}, rows)
    assert checkpoint.load() is None
    err = capsys.readouterr().err
    assert "ignoring checkpoint" in err and "non-finite layer.weight" in err
    checkpoint.save({"step": 500, "encoder": {"w": torch.tensor([1.0, float("inf")])}}, None)
    assert checkpoint.load() is None
    assert "non-finite encoder.w" in capsys.readouterr().err


def test_save_model_refuses_a_non_finite_model_and_leaves_nothing(tmp_path):
    weights = {"layer": {"weight": torch.ones(3, 2)}, "encoder": {"w": torch.ones(2)}}
    weights["encoder"]["w"][1] = float("-inf")
    target = tmp_path / "models" / "x"
    refused = pytest.raises(TrainingDivergedError, match=r"encoder\.w is not finite \(after 9 ")
    with refused, atomic_dir(target) as tmp:
        save_model(tmp, weights, {"experiment": "x", "steps": 9})
    assert not target.exists() and list((tmp_path / "models").iterdir()) == []


def test_first_non_finite_tells_overflow_from_nan():
    big = torch.full((4,), 3e38)  # finite elements whose float32 sum overflows
    assert first_non_finite(
        {"a": big, "b": [torch.ones(2), torch.tensor([0.0, float("nan")])]}
    ) == ("b[1]")
    assert first_non_finite({"a": big, "n": torch.arange(3), "s": "text"}) is None
