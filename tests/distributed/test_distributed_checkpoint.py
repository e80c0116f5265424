"""Checkpoints of label-sharded runs: one file per label block, written by the process that owns
it, and a run checkpointed at W processes resumes at any other W with the model, optimiser
state and learning curve of an uninterrupted run (float64, up to the all-reduce's rounding)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from spawn_world import run_world

from tailkit.distributed.world import ONE_PROCESS, World
from tailkit.output.optim import RowSparseAdagrad, RowSparseSGD
from tailkit.output.output_layer import OutputLayer
from tailkit.output.shards import shard_layer, whole_layer
from tailkit.registry import make_registry
from tailkit.training.checkpoint import Checkpointer
from tailkit.training.loop import LoopConfig, train

C, BLOCK, N, D = 13, 4, 96, 6

CASES = {
    "softmax-adagrad": ({"name": "softmax"}, None, "adagrad"),
    "softmax-momentum": ({"name": "softmax"}, None, "sgd"),
    "sampled-uniform": ({"name": "sampled-softmax"}, {"name": "uniform"}, "adagrad"),
}


def _data():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=gen, dtype=torch.float64)
    y = (x[:, :2].abs().sum(dim=1) * 4).long() % C
    return x, y, torch.bincount(y, minlength=C).double()


def _run(world: World, case: str, steps: int, directory: Path | None, block: int = BLOCK):
    """``steps`` steps of ``case`` on ``world`` (ONE_PROCESS: unsharded), checkpointing every
    5 steps into ``directory``; the whole layer, optimiser row state and curve at the end."""
    loss_spec, sampler_spec, optimizer_name = CASES[case]
    registry = make_registry()
    x, y, counts = _data()
    torch.manual_seed(0)
    encoder = registry.build("models", {"name": "mlp", "hidden": [8], "dim": 4}, "t", D).double()
    loss = registry.build("losses", loss_spec, "t").double()
    layer = OutputLayer.for_loss(loss, C, 4, generator=torch.Generator().manual_seed(1))
    layer.weight, layer.bias = layer.weight.double(), layer.bias.double()
    layer = shard_layer(layer, world, block)
    sampler = None
    if sampler_spec is not None:
        sampler = registry.build("samplers", sampler_spec, "t")
        sampler.fit(None, y, C)
    optimizer = (
        RowSparseAdagrad(lr=0.1)
        if optimizer_name == "adagrad"
        else RowSparseSGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)
    )
    result = train(
        cfg=LoopConfig(
            "t",
            epochs=3,
            batch_size=24,
            negatives=5,
            eval_every=5,
            checkpoint_every=5,
            max_steps=steps,
        ),
        encoder=encoder,
        layer=layer,
        loss=loss,
        sampler=sampler,
        optimizer=optimizer,
        x_train=x,
        y_train=y,
        x_val=x[:40],
        y_val=y[:40],
        class_counts=counts,
        checkpoint=None if directory is None else Checkpointer(directory, key="k"),
        world=world,
    )
    tables = {k: whole_layer_rows(v, layer, world) for k, v in optimizer.row_tables().items()}
    curve = [{k: v for k, v in c.items() if k != "seconds"} for c in result.curve]
    return whole_layer(layer, world), encoder.state_dict(), tables, curve


def whole_layer_rows(table: torch.Tensor, layer: OutputLayer, world: World) -> torch.Tensor:
    """A per-row table of a shard, gathered in label order (the optimiser's state)."""
    if not world.sharded:
        return table
    from tailkit.distributed.ops import all_gather_rows

    return all_gather_rows(table, world)[0]


def _assert_same(got, want, where: str) -> None:
    (layer, encoder, tables, curve), (ref_layer, ref_encoder, ref_tables, ref_curve) = got, want
    close = {"rtol": 1e-9, "atol": 1e-11, "msg": lambda m: f"{where}: {m}"}
    torch.testing.assert_close(layer.weight, ref_layer.weight, **close)
    torch.testing.assert_close(layer.bias, ref_layer.bias, **close)
    for key, value in encoder.items():
        torch.testing.assert_close(value, ref_encoder[key], **close)
    assert tables.keys() == ref_tables.keys() and tables, where
    for key, value in tables.items():
        torch.testing.assert_close(value, ref_tables[key], **close)
    assert [c["step"] for c in curve] == [c["step"] for c in ref_curve], where
    for c, r in zip(curve, ref_curve, strict=True):
        assert c["loss"] == pytest.approx(r["loss"], rel=1e-9), where
        assert c["val_accuracy"] == r["val_accuracy"], where


def _resume_across_world_sizes(world: World, root: str) -> None:
    root_path = Path(root)
    for case in CASES:
        reference = _run(ONE_PROCESS, case, 10, None)
        # W processes to step 5 (a checkpoint), then one process from it to step 10
        first = root_path / f"{case}-from-{world.size}"
        _run(world, case, 6, first)
        # one file per process here (the blocks of 4 labels fall inside one 4,096-label block)
        files = sorted(p.name for p in next(first.glob("rows-*")).iterdir())
        assert len(files) == world.size, files
        dist.barrier()
        if world.rank == 0:
            _assert_same(_run(ONE_PROCESS, case, 10, first), reference, f"{case}: W→1")
        dist.barrier()
        # one process to step 5, then W processes from it to step 10
        second = root_path / f"{case}-to-{world.size}"
        if world.rank == 0:
            _run(ONE_PROCESS, case, 6, second)
        dist.barrier()
        _assert_same(_run(world, case, 10, second), reference, f"{case}: 1→W, rank {world.rank}")
        dist.barrier()


@pytest.mark.parametrize("size", [2, 3])
def test_a_sharded_checkpoint_resumes_at_another_world_size(tmp_path, capfd, size) -> None:
    run_world(tmp_path, _resume_across_world_sizes, size, str(tmp_path))
    # each case resumed twice (W→1, 1→W), not trained afresh to the same end
    assert capfd.readouterr().err.count("at step 5") == 2 * len(CASES)


def _bad_block_restarts_every_rank(world: World, root: str) -> None:
    directory = Path(root) / "bad"
    _run(world, "softmax-adagrad", 6, directory)
    dist.barrier()
    if world.rank == 0:  # one rank's block loses a byte: its sha256 no longer matches
        victim = max(next(directory.glob("rows-*")).iterdir())
        victim.write_bytes(victim.read_bytes()[:-1])
    dist.barrier()
    start = shard_layer(OutputLayer(C, 4), world, BLOCK)
    state = Checkpointer(directory, key="k").load(
        label_start=start.label_start,
        label_stop=start.label_start + start.num_classes,
        world=world,
    )
    assert state is None  # every rank, not only the one whose block is bad


def test_a_corrupt_block_makes_every_rank_start_afresh(tmp_path, capfd) -> None:
    run_world(tmp_path, _bad_block_restarts_every_rank, 2, str(tmp_path))
    assert "do not match the sha256" in capfd.readouterr().err


def test_each_row_file_holds_only_its_own_rows(tmp_path) -> None:
    """torch.save writes a tensor's whole storage, so a piece sliced from the table once
    carried every row: at 10^6 labels, 245 files of 264 MB. Each file now holds its block."""
    rows = {"weight": torch.randn(10_000, 16), "bias": torch.randn(10_000)}
    ck = Checkpointer(tmp_path, key="k")
    view = torch.randn(3, 1000)[1]  # a view into a larger storage, in the common state too
    ck.save({"step": 7, "view": view}, rows, block=1024)
    files = sorted((tmp_path / "rows-000000000007").glob("rows-*.pt"))
    assert len(files) == 10  # ⌈10,000 / 1,024⌉
    for f in files:
        assert f.stat().st_size < 1024 * 17 * 4 + 4096  # its rows, plus the zip's overhead
    assert (tmp_path / "state.pt").stat().st_size < 1000 * 4 + 4096
    state = ck.load()
    assert torch.equal(state["rows"]["weight"], rows["weight"]) and torch.equal(state["view"], view)
    assert torch.equal(state["rows"]["bias"], rows["bias"])
