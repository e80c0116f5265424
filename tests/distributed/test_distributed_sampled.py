"""Label-sharded training with sampled losses (global draw, shared seed) equals one process.

Every rank draws the whole global batch's negatives from the same seeded stream, scores the
rows it owns and the logits are summed over the ranks (tailkit/training/loop.py
``sampled_input``), so after two epochs the layer, the encoder and the learning curve equal one
process's, in float64, for the uniform (shared and per example), in-batch and tree samplers
with sampled softmax and Bamler–Mandt negative sampling; the tree's per-row correction in
validation runs row-sharded (tailkit/evaluation/predict_sharded.py) and gives the same curve.
"""

from __future__ import annotations

import pytest
import torch
from spawn_world import run_world

from tailkit.distributed.world import World
from tailkit.errors import InvalidParameterError
from tailkit.output.optim import RowSparseAdagrad
from tailkit.output.output_layer import OutputLayer
from tailkit.output.shards import shard_layer, whole_layer
from tailkit.plugins.samplers.tree import TreeSampler
from tailkit.registry import make_registry
from tailkit.training.loop import LoopConfig, train

C, BLOCK, N, D = 13, 4, 96, 6

CASES = [
    ({"name": "sampled-softmax", "weighting": "importance"}, {"name": "uniform"}, BLOCK),
    ({"name": "sampled-softmax", "weighting": "constant"}, {"name": "in-batch"}, BLOCK),
    ({"name": "negative-sampling"}, {"name": "uniform", "shared": False}, BLOCK),
    ({"name": "negative-sampling"}, "tree", BLOCK),
    ({"name": "sampled-softmax", "weighting": "importance"}, "tree", BLOCK),
    # one rank owns every label, the others none
    ({"name": "sampled-softmax", "weighting": "importance"}, {"name": "uniform"}, 16),
]


def _data():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=gen, dtype=torch.float64)
    y = (x[:, :2].abs().sum(dim=1) * 4).long() % C
    return x, y, torch.bincount(y, minlength=C).double()


def _sampler(spec, y):
    if spec == "tree":
        sampler = TreeSampler(k=3)
        sampler.fit(_data()[0].float(), y, C)
        return sampler
    sampler = make_registry().build("samplers", spec, "test")
    sampler.fit(None, y, C)
    return sampler


def _run(world: World, loss_spec, sampler_spec, shard: bool, block: int = BLOCK):
    registry = make_registry()
    x, y, counts = _data()
    torch.manual_seed(0)
    encoder = registry.build("models", {"name": "mlp", "hidden": [8], "dim": 4}, "test", D)
    loss = registry.build("losses", loss_spec, "test")
    encoder, loss = encoder.double(), loss.double()
    layer = OutputLayer.for_loss(
        loss, C, encoder.out_dim, generator=torch.Generator().manual_seed(1)
    )
    layer.weight, layer.bias = layer.weight.double(), layer.bias.double()
    if shard:
        layer = shard_layer(layer, world, block)
    result = train(
        cfg=LoopConfig(
            "test", epochs=2, batch_size=24, negatives=5, eval_every=3, checkpoint_every=10**9
        ),
        encoder=encoder,
        layer=layer,
        loss=loss,
        sampler=_sampler(sampler_spec, y),
        optimizer=RowSparseAdagrad(lr=0.1),
        x_train=x,
        y_train=y,
        x_val=x[:40],
        y_val=y[:40],
        class_counts=counts,
        world=world if shard else World(),
    )
    return whole_layer(layer, world) if shard else layer, encoder, result.curve


def _equal_to_one_process(world: World) -> None:
    for loss_spec, sampler_spec, block in CASES:
        layer, encoder, curve = _run(world, loss_spec, sampler_spec, shard=True, block=block)
        ref_layer, ref_encoder, ref_curve = _run(world, loss_spec, sampler_spec, shard=False)
        where = f"{loss_spec}, {sampler_spec}, block {block}, rank {world.rank} of {world.size}"
        close = {"rtol": 1e-9, "atol": 1e-11, "msg": lambda m, where=where: f"{where}: {m}"}
        # the training moved the rows: the comparison is not of two initial layers
        assert not torch.equal(ref_layer.weight, _run_init_weight()), where
        torch.testing.assert_close(layer.weight, ref_layer.weight, **close)
        torch.testing.assert_close(layer.bias, ref_layer.bias, **close)
        ref_state = ref_encoder.state_dict()
        for key, value in encoder.state_dict().items():
            torch.testing.assert_close(value, ref_state[key], **close)
        assert [c["step"] for c in curve] == [c["step"] for c in ref_curve], where
        for c, r in zip(curve, ref_curve, strict=True):
            assert c["loss"] == pytest.approx(r["loss"], rel=1e-9), where
            assert (c["val_accuracy"], c["val_balanced_accuracy"]) == (
                r["val_accuracy"], r["val_balanced_accuracy"]), where  # fmt: skip


def _run_init_weight() -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return OutputLayer(C, 4, generator=gen).weight.double()


@pytest.mark.parametrize("size", [2, 3])
def test_sharded_sampled_training_equals_one_process(tmp_path, size) -> None:
    run_world(tmp_path, _equal_to_one_process, size)


def _draws_agree(world: World) -> None:
    """The negatives every rank draws at a step are the same ids (the shared stream)."""
    import torch.distributed as dist

    x, y, _ = _data()
    for spec in ({"name": "uniform"}, {"name": "uniform", "shared": False}, "tree"):
        sampler = _sampler(spec, y)
        gen = torch.Generator().manual_seed(7)
        for _ in range(3):
            ids, log_q = sampler.sample(x[:24], y[:24], 5, gen)
            mine = torch.cat([ids.reshape(-1).double(), log_q.reshape(-1).double()])
            every = [torch.empty_like(mine) for _ in range(world.size)]
            dist.all_gather(every, mine)
            for other in every:
                assert torch.equal(other, mine), spec


def test_every_rank_draws_the_same_negatives(tmp_path) -> None:
    run_world(tmp_path, _draws_agree, 2)


def _refusal(world: World) -> None:
    registry = make_registry()
    x, y, counts = _data()
    loss = registry.build("losses", {"name": "sampled-softmax"}, "test")
    sampler = registry.build("samplers", {"name": "model-based"}, "test")
    sampler.fit(None, y, C)
    encoder = registry.build("models", {"name": "mlp", "hidden": [8], "dim": 4}, "test", D)
    layer = shard_layer(OutputLayer.for_loss(loss, C, 4), world, BLOCK)
    with pytest.raises(InvalidParameterError, match=r"^experiments\.test\.sampler: .*own scores"):
        train(
            cfg=LoopConfig("test", epochs=1, batch_size=24, negatives=3),
            encoder=encoder,
            layer=layer,
            loss=loss,
            sampler=sampler,
            optimizer=RowSparseAdagrad(lr=0.1),
            x_train=x.float(),
            y_train=y,
            x_val=x[:8].float(),
            y_val=y[:8],
            class_counts=counts,
            world=world,
        )


def test_the_model_based_sampler_is_refused_when_sharded(tmp_path) -> None:
    run_world(tmp_path, _refusal, 2)


def _sparse_data():
    from tailkit.sparse import SparseRows

    gen = torch.Generator().manual_seed(3)
    columns, per_row = 300, 5
    indptr = torch.arange(0, N * per_row + 1, per_row)
    cols = torch.stack([torch.randperm(columns, generator=gen)[:per_row].sort().values
                        for _ in range(N)]).reshape(-1)  # fmt: skip
    x = SparseRows(indptr, cols, torch.rand(N * per_row, generator=gen), columns)
    y = cols.view(N, per_row)[:, 0] % C
    return x, y, torch.bincount(y, minlength=C).double()


def _run_sparse(world: World, loss_spec, sampler_spec, shard: bool):
    registry = make_registry()
    x, y, counts = _sparse_data()
    torch.manual_seed(0)
    encoder = registry.build("models", {"name": "sparse-linear", "dim": 4}, "test", x.shape[1])
    loss = registry.build("losses", loss_spec, "test")
    layer = OutputLayer.for_loss(loss, C, 4, generator=torch.Generator().manual_seed(1),
                                 rows=world.label_range(C, BLOCK) if shard else None)  # fmt: skip
    sampler = None
    if sampler_spec is not None:
        sampler = registry.build("samplers", sampler_spec, "test")
        sampler.fit(None, y, C)
    val = torch.arange(40)
    train(
        cfg=LoopConfig("test", epochs=2, batch_size=24, negatives=5, eval_every=4),
        encoder=encoder,
        layer=layer,
        loss=loss,
        sampler=sampler,
        optimizer=RowSparseAdagrad(lr=0.1),
        x_train=x,
        y_train=y,
        x_val=x.index_select(0, val),
        y_val=y[val],
        class_counts=counts,
        world=world if shard else World(),
    )
    return whole_layer(layer, world) if shard else layer, encoder


def _sparse_encoder_equal_to_one_process(world: World) -> None:
    """sparse-linear (an input table with sparse gradients, no dense parameter): every rank
    encodes the whole batch and steps its replica with the summed embedding gradient, so the
    replicas stay identical with no exchange of the table's gradients, and the model is one
    process's up to float rounding."""
    import torch.distributed as dist

    for loss_spec, sampler_spec in (({"name": "softmax"}, None),
                                    ({"name": "sampled-softmax"}, {"name": "uniform"})):  # fmt: skip
        layer, encoder = _run_sparse(world, loss_spec, sampler_spec, shard=True)
        ref_layer, ref_encoder = _run_sparse(world, loss_spec, sampler_spec, shard=False)
        table = encoder.embed.weight.detach()
        every = [torch.empty_like(table) for _ in range(world.size)]
        dist.all_gather(every, table)
        assert all(torch.equal(t, table) for t in every), "the replicas drifted apart"
        close = {"rtol": 1e-4, "atol": 1e-6}
        assert not torch.equal(table, _run_sparse_init(world))  # it trained
        torch.testing.assert_close(table, ref_encoder.embed.weight.detach(), **close)
        torch.testing.assert_close(layer.weight, ref_layer.weight, **close)


def _run_sparse_init(world: World) -> torch.Tensor:
    torch.manual_seed(0)
    x, _, _ = _sparse_data()
    encoder = make_registry().build("models", {"name": "sparse-linear", "dim": 4}, "t", x.shape[1])
    return encoder.embed.weight.detach()


def test_a_sparse_input_encoder_trains_sharded_as_in_one_process(tmp_path) -> None:
    run_world(tmp_path, _sparse_encoder_equal_to_one_process, 2)
