"""``tailkit plan``: per-process bytes of a label-sharded run, from the code that allocates them."""

from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from tailkit.cli import cli
from tailkit.distributed.world import shard_range
from tailkit.output.optim import RowSparseAdagrad, RowSparseSGD
from tailkit.output.output_layer import OutputLayer
from tailkit.training.plan import plan


def _held(layer: OutputLayer, optimizer) -> tuple[int, int]:
    layer_bytes = sum(t.numel() * t.element_size() for t in layer.state_dict().values())
    opt_bytes = sum(t.numel() * t.element_size() for t in optimizer.row_tables().values())
    return layer_bytes, opt_bytes


@pytest.mark.parametrize(
    ("optimizer", "cls"), [("adagrad", RowSparseAdagrad), ("sgd", RowSparseSGD)]
)
def test_the_plan_counts_what_a_real_shard_allocates(optimizer, cls) -> None:
    """At a size that fits, the planned bytes equal those of a real layer and optimiser built
    for the widest shard (float32), and the widest shard is shard_range's."""
    c, d, w, block = 50_000, 24, 3, 4096
    p = plan(c, d, w, optimizer=optimizer, block=block)
    widest = max(b - a for a, b in (shard_range(c, r, w, block) for r in range(w)))
    assert p.labels_per_rank == widest == 50_000 - 8 * 4096  # 13 blocks: 4, 4 and 5 (short)
    layer = OutputLayer(widest, d)
    opt = cls(lr=0.1, **({"momentum": 0.9} if optimizer == "sgd" else {}))
    opt.attach(layer, [])
    assert (p.layer_bytes, p.optimizer_bytes) == _held(layer, opt)
    assert p.layer_bytes == widest * (d + 1) * 4


def test_the_plan_halves_per_process_with_twice_the_processes_and_bf16_halves_again() -> None:
    one, two = (plan(1_000_000, 512, w, label_chunk=None) for w in (1, 2))
    assert two.layer_bytes == pytest.approx(one.layer_bytes / 2, rel=0.01)
    assert two.activation_bytes == pytest.approx(one.activation_bytes / 2, rel=0.01)
    # chunked (the default at this size), a step holds one chunk whatever W is
    assert plan(1_000_000, 512, 1).activation_bytes == plan(1_000_000, 512, 2).activation_bytes
    assert one.sent_bytes_per_step == 0 < two.sent_bytes_per_step
    half = plan(1_000_000, 512, 2, dtype="bf16")
    assert half.layer_bytes * 2 == two.layer_bytes
    # sampled mode: activations no longer grow with C
    sampled = plan(10_000_000, 512, 8, negatives=1024)
    assert sampled.activation_bytes == 2 * 4096 * 1025 * 4
    assert plan(100_000_000, 512, 8, negatives=1024).activation_bytes == sampled.activation_bytes


def test_the_plan_builds_nothing_it_counts() -> None:
    """10^8 labels × 512 would be 205 GB on the CPU: the plan takes no memory to say so."""
    p = plan(100_000_000, 512, 1)
    assert p.layer_bytes == 100_000_000 * 513 * 4


def test_tailkit_plan_prints_text_and_json() -> None:
    runner = CliRunner()
    text = runner.invoke(cli, ["plan", "--num-classes", "10000000", "--dim", "512", "--nproc", "8"])
    assert text.exit_code == 0, text.output
    assert "labels per process (largest shard): 1,253,376" in text.output
    out = runner.invoke(
        cli, ["plan", "--num-classes", "1000", "--dim", "8", "--negatives", "4", "--json"]
    )
    record = json.loads(out.output)
    assert record["negatives"] == 4 and record["nproc"] == 1
    assert record["total_bytes"] == (
        record["layer_bytes"] + record["optimizer_bytes"] + record["activation_bytes"]
    )
    bad = runner.invoke(cli, ["plan", "--num-classes", "0", "--dim", "8"])
    assert bad.exit_code == 2 and "num-classes" in bad.output
    assert torch.get_default_dtype() == torch.float32


def test_a_step_larger_than_the_machine_is_refused_in_one_line() -> None:
    """negatives: 2^31 − 1 at B = 512 plans terabytes of logits: refused naming the setting
    and the plan that says so, before torch is asked for them; a step that fits passes."""
    from tailkit.errors import InvalidParameterError
    from tailkit.training.plan import check_step_fits

    cpu = torch.device("cpu")
    setting = {"num_classes": 3875, "dim": 128, "batch_size": 512, "nproc": 1, "device": cpu}
    with pytest.raises(InvalidParameterError) as info:
        check_step_fits("experiments.sampled", negatives=2**31 - 1, label_chunk="auto", **setting)
    said = str(info.value)
    assert "\n" not in said and said.startswith("experiments.sampled: a training step needs ~")
    assert "--negatives 2147483647" in said and "lower negatives or batch_size" in said
    check_step_fits("experiments.sampled", negatives=256, label_chunk="auto", **setting)
    # a full step at 10^7 labels held whole (4 TB at this batch), but chunked it plans the layer
    big = {**setting, "num_classes": 10**7, "batch_size": 2**17}
    with pytest.raises(InvalidParameterError, match="lower batch_size or label_chunk"):
        check_step_fits("experiments.full", negatives=None, label_chunk=None, **big)
