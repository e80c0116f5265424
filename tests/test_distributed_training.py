"""Label-sharded training (train(..., world=...)) at W = 2 and 3 gloo processes equals one
process: same layer rows, encoder weights and learning curve after a few epochs, in float64."""

from __future__ import annotations

import pytest
import torch
from spawn_world import run_world

from tailkit.distributed.layer import shard_layer, whole_layer
from tailkit.distributed.world import World
from tailkit.errors import InvalidParameterError
from tailkit.registry import make_registry
from tailkit.training.loop import LoopConfig, train
from tailkit.training.optim import RowSparseAdagrad
from tailkit.training.output_layer import OutputLayer

C, BLOCK, N, D = 13, 4, 96, 6


def _data():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(N, D, generator=gen, dtype=torch.float64)
    y = (x[:, :2].abs().sum(dim=1) * 4).long() % C
    return x, y, torch.bincount(y, minlength=C).double()


def _run(world: World, spec: dict, shard: bool):
    registry = make_registry()
    x, y, counts = _data()
    torch.manual_seed(0)
    encoder = registry.build("models", {"name": "mlp", "hidden": [8], "dim": 4}, "test", D)
    loss = registry.build("losses", spec, "test")
    encoder, loss = encoder.double(), loss.double()
    gen = torch.Generator().manual_seed(1)
    layer = OutputLayer.for_loss(loss, C, encoder.out_dim, generator=gen)
    layer.weight, layer.bias = layer.weight.double(), layer.bias.double()
    if shard:
        layer = shard_layer(layer, world, BLOCK)
    result = train(
        cfg=LoopConfig("test", epochs=2, batch_size=24, eval_every=4, checkpoint_every=10**9),
        encoder=encoder,
        layer=layer,
        loss=loss,
        sampler=None,
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
    for spec in ({"name": "softmax"}, {"name": "logit-adjusted"}, {"name": "elm"},
                 {"name": "ldam", "drw_epoch": 1}):  # fmt: skip
        layer, encoder, curve = _run(world, spec, shard=True)
        ref_layer, ref_encoder, ref_curve = _run(world, spec, shard=False)
        where = f"{spec['name']}, rank {world.rank} of {world.size}"
        close = {"rtol": 1e-9, "atol": 1e-11, "msg": lambda m, where=where: f"{where}: {m}"}
        torch.testing.assert_close(layer.weight, ref_layer.weight, **close)
        torch.testing.assert_close(layer.bias, ref_layer.bias, **close)
        ref_state = ref_encoder.state_dict()
        for key, value in encoder.state_dict().items():
            torch.testing.assert_close(value, ref_state[key], **close)
        assert [c["step"] for c in curve] == [c["step"] for c in ref_curve]
        for c, r in zip(curve, ref_curve, strict=True):
            assert c["loss"] == pytest.approx(r["loss"], rel=1e-9), where
            assert (c["val_accuracy"], c["val_balanced_accuracy"]) == (
                r["val_accuracy"], r["val_balanced_accuracy"]), where  # fmt: skip


@pytest.mark.parametrize("size", [2, 3])
def test_sharded_training_equals_one_process(tmp_path, size) -> None:
    run_world(tmp_path, _equal_to_one_process, size)


def _refusals(world: World) -> None:
    registry = make_registry()
    x, y, counts = _data()
    for spec, match in (
        ({"name": "cb-focal", "loss_type": "focal"}, "CBFocal|cannot reduce over a label shard"),
    ):
        loss = registry.build("losses", spec, "test")
        encoder = registry.build("models", {"name": "mlp", "hidden": [8], "dim": 4}, "test", D)
        layer = shard_layer(OutputLayer.for_loss(loss, C, 4), world, BLOCK)
        with pytest.raises(InvalidParameterError, match=match):
            train(
                cfg=LoopConfig("test", epochs=1, batch_size=24),
                encoder=encoder,
                layer=layer,
                loss=loss,
                sampler=None,
                optimizer=RowSparseAdagrad(lr=0.1),
                x_train=x.float(),
                y_train=y,
                x_val=x[:8].float(),
                y_val=y[:8],
                class_counts=counts,
                world=world,
            )


def test_a_loss_that_cannot_shard_is_refused(tmp_path) -> None:
    run_world(tmp_path, _refusals, 2)
