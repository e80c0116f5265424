"""The learning curve's validation schedule: a function of shapes, bounded by its budget."""

from __future__ import annotations

import math

import pytest

from tailkit.training.cadence import (
    MAX_POINTS,
    MIN_ROWS,
    SAMPLED_FACTOR,
    STEP_OVERHEAD,
    plan_validation,
)


def _plan(num_classes, *, sampled=17, steps=None, dim=32, correction=0.0, **kw):
    rows = 2 * num_classes + 500_000  # the million-labels study's shape: ~2.5 rows per label
    steps = steps or math.ceil(rows / 512)
    return (
        plan_validation(
            eval_every=kw.get("eval_every", "auto"),
            val_rows=5000,
            val_budget=0.1,
            available_rows=kw.get("available", 50_000),
            total_steps=steps,
            batch_size=512,
            num_classes=num_classes,
            dim=dim,
            sampled_labels=sampled,
            correction_per_label=correction,
        ),
        steps,
    )


def test_an_integer_eval_every_fixes_the_schedule():
    plan, _ = _plan(1000, eval_every=7, available=300)
    assert (plan.rows, plan.every, plan.rule) == (300, 7, "fixed")


@pytest.mark.parametrize("num_classes", [10**3, 10**4, 10**5, 10**6])
@pytest.mark.parametrize("correction", [0.0, 80.0])
def test_sampled_losses_spend_at_most_the_budget(num_classes, correction):
    plan, steps = _plan(num_classes, correction=correction)
    validations = math.ceil(steps / plan.every)
    spent = validations * plan.rows * num_classes * (32 + correction)
    work = steps * (SAMPLED_FACTOR * 3 * 512 * 17 * 32 + STEP_OVERHEAD)
    # the floor of MIN_ROWS rows, once, is the only way past the budget
    assert spent <= 0.1 * work or (validations == 1 and plan.rows == MIN_ROWS)
    assert plan.every <= steps and 1 <= validations <= MAX_POINTS
    assert MIN_ROWS <= plan.rows <= 5000


def test_large_label_counts_validate_once_small_ones_draw_a_curve():
    big, steps = _plan(10**6)
    assert big.every == steps  # one validation, after the last step
    small, steps = _plan(3875, sampled=257, dim=128, steps=1104)
    assert small.rows == 5000 and math.ceil(steps / small.every) >= 10
    full, steps = _plan(3875, sampled=None, dim=128, steps=1104)
    assert math.ceil(steps / full.every) == MAX_POINTS


def test_the_schedule_is_a_function_of_the_shapes():
    assert _plan(123_457) == _plan(123_457)
    fewer, _ = _plan(10**5, steps=1000)
    more, _ = _plan(10**5, steps=100_000)
    assert math.ceil(100_000 / more.every) >= math.ceil(1000 / fewer.every)
    assert more.rows >= fewer.rows


def test_the_train_stage_follows_and_records_its_schedule(tmp_path):
    """Two runs of train@ with ``eval_every: auto``: the same rows and steps, written down in
    model.json, and the curve has a point exactly at those steps."""
    import copy
    import json

    from conftest import TINY_PARAMS

    from tailkit.params import parse_params
    from tailkit.paths import Layout
    from tailkit.registry import make_registry
    from tailkit.stages import download, featurize, fit_sampler, subsample, train

    raw = copy.deepcopy(TINY_PARAMS)
    raw["train"] = {"epochs": 3, "batch_size": 32, "eval_every": "auto", "val_rows": 300}
    raw["experiments"] = {"sampled": raw["experiments"]["sampled"]}
    params = parse_params(raw, "test-params")
    registry = make_registry()
    records, curves = [], []
    for run in ("a", "b"):
        layout = Layout(tmp_path / run)
        download.run(params, layout, registry)
        subsample.run(params, layout, registry)
        featurize.run(params, layout, registry, "rff")
        fit_sampler.run(params, layout, registry)
        summary = train.run(params, layout, registry, "sampled")
        info = json.loads((layout.model("sampled") / "model.json").read_text())
        records.append(info["validation"])
        lines = layout.curve("sampled").read_text().splitlines()[1:]
        curves.append([int(line.split("\t")[0]) for line in lines])
    assert records[0] == records[1] and curves[0] == curves[1]
    every, steps = records[0]["every"], summary["steps"]
    assert records[0]["rule"].startswith("auto") and records[0]["rows"] <= 300
    expected = [*range(every, steps + 1, every)]
    assert curves[0] == (expected if expected[-1] == steps else [*expected, steps])


def test_checkpoint_interval_keeps_writing_within_its_budget():
    from tailkit.training.cadence import BYTE_WORK, checkpoint_interval, step_work

    assert checkpoint_interval(40, 10**9, 1.0, 0.05) == 40  # a number is taken as it is
    for num_classes in (10**3, 10**4, 10**5, 10**6):
        state = 2 * num_classes * 33 * 4  # weights + bias, and Adagrad's accumulators
        work = step_work(512, num_classes, 32, 17)
        every = checkpoint_interval("auto", state, work, 0.05)
        assert state * BYTE_WORK <= 0.05 * every * work < state * BYTE_WORK + 0.05 * work
    # the million-label study's 264 MB state: thousands of sampled steps apart
    assert checkpoint_interval("auto", 264 * 10**6, step_work(512, 10**6, 32, 17), 0.05) > 5000


def test_auto_checkpoints_are_counted_from_the_state_the_loop_saves(tmp_path):
    """The loop sizes the interval from the very tensors a checkpoint holds (output layer,
    Adagrad's accumulators, encoder, loss), and writes at that interval."""
    import torch

    from tailkit.output.optim import RowSparseAdagrad
    from tailkit.output.output_layer import OutputLayer
    from tailkit.plugins.losses.softmax import SoftmaxCE
    from tailkit.plugins.models.linear import Linear
    from tailkit.training.cadence import BYTE_WORK
    from tailkit.training.checkpoint import Checkpointer
    from tailkit.training.loop import LoopConfig, train

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(400, 6, generator=g), torch.randint(0, 50, (400,), generator=g)
    state = 2 * 50 * 7 * 4  # (50 × 6 weights + 50 biases) and as many accumulators, float32
    work = state * BYTE_WORK / (0.05 * 9)  # chosen so the interval comes out at 9 steps
    ckpt = Checkpointer(tmp_path / "ckpt", "fp", "train@t")
    result = train(
        cfg=LoopConfig(
            "t", epochs=1, batch_size=32, checkpoint_every="auto", step_work=work, eval_every=50
        ),
        encoder=Linear(6),
        layer=OutputLayer(50, 6, generator=g),
        loss=SoftmaxCE(),
        sampler=None,
        optimizer=RowSparseAdagrad(lr=0.1),
        x_train=x,
        y_train=y,
        x_val=x[:50],
        y_val=y[:50],
        class_counts=torch.bincount(y, minlength=50).double(),
        checkpoint=ckpt,
    )
    assert result.checkpoint_every == 9 and result.steps == 13
    assert ckpt.load()["step"] == 9
