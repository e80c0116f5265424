"""Every built-in full-mode loss that says it is ``shardable`` gives, on a label shard at W = 2
and 3, one process's value and gradients: for the logits' rows (the shard's output-layer rows),
for each rank's own embedding rows (through the gathered batch) and for the loss's own
parameters, over two steps (ELM's memory and DRO-LT's prototypes carry state)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from spawn_world import run_world

from tailkit.components import FullBatch
from tailkit.distributed.ops import gather_rows
from tailkit.distributed.world import World
from tailkit.registry import make_registry
from tailkit.training.loop import log_prior_from_counts

C, BLOCK, B, D = 13, 4, 12, 5

SHARDABLE = {
    "softmax": {"name": "softmax"},
    "softmax-multilabel": {"name": "softmax"},
    "logit-adjusted": {"name": "logit-adjusted"},
    "logit-adjusted-posthoc": {"name": "logit-adjusted", "adjustment": "posthoc"},
    "balanced-softmax": {"name": "balanced-softmax"},
    "ldam": {"name": "ldam"},
    "ldam-drw": {"name": "ldam", "drw_epoch": 0},
    "cb-softmax": {"name": "cb-focal", "loss_type": "softmax"},
    "elm": {"name": "elm"},
    "elm-memory": {"name": "elm", "positives": "memory", "memory_size": 2},
    "dro-lt": {"name": "dro-lt"},
    "dro-lt-head-up": {"name": "dro-lt", "ce_weighting": "head-up"},
}


def _logits(z: torch.Tensor, w: torch.Tensor, b: torch.Tensor, cosine: float | None):
    if cosine is None:
        return z @ w.t() + b
    return (F.normalize(z, dim=-1) * cosine) @ F.normalize(w, dim=-1).t()


def _one_loss(world: World, name: str) -> None:
    registry = make_registry()
    gen = torch.Generator().manual_seed(0)
    counts = torch.randint(1, 40, (C,), generator=gen).double()
    counts[3] = 0  # balanced softmax: a label without rows, offset −inf
    w_all = torch.randn(C, D, generator=gen, dtype=torch.float64)
    b_all = torch.randn(C, generator=gen, dtype=torch.float64)
    steps = []
    for _ in range(2):
        z = torch.randn(B, D, generator=gen, dtype=torch.float64)
        labels = torch.randint(0, C, (B,), generator=gen)
        labels[labels == 3] = 4
        if name == "softmax-multilabel":
            labels = torch.stack([labels, (labels + 5) % C, torch.full_like(labels, -1)], 1)
            labels[labels == 3] = 4
            labels[0] = -1  # a row without labels
        steps.append((z, labels))
    start, stop = world.label_range(C, BLOCK)
    rows = torch.arange(B).tensor_split(world.size)[world.rank]
    losses = []
    for _ in range(2):
        torch.manual_seed(0)  # a loss that draws its init draws the same
        loss = registry.build("losses", SHARDABLE[name], "test").double()
        loss.setup(counts)
        losses.append(loss)
    sharded, whole = losses
    assert sharded.shardable
    for epoch, (z, labels) in enumerate(steps):
        common = {"labels": labels, "log_prior": log_prior_from_counts(counts), "epoch": epoch}
        mine = z[rows].clone().requires_grad_()
        w = w_all[start:stop].clone().requires_grad_()
        b = b_all[start:stop].clone().requires_grad_()
        gathered = gather_rows(mine, world)
        batch = FullBatch(
            logits=_logits(gathered, w, b, sharded.cosine_scale),
            embeddings=gathered,
            num_classes=C,
            label_start=start,
            world=world,
            **common,
        )
        value = sharded(batch)
        value.backward()
        z_ref = z.clone().requires_grad_()
        w_ref, b_ref = w_all.clone().requires_grad_(), b_all.clone().requires_grad_()
        ref_batch = FullBatch(
            logits=_logits(z_ref, w_ref, b_ref, whole.cosine_scale),
            embeddings=z_ref,
            num_classes=C,
            **common,
        )
        expected = whole(ref_batch)
        expected.backward()
        where = f"{name}, step {epoch}, rank {world.rank} of {world.size}"
        close = {"rtol": 1e-10, "atol": 1e-12, "msg": lambda m, where=where: f"{where}: {m}"}
        torch.testing.assert_close(value, expected, **close)
        torch.testing.assert_close(w.grad, w_ref.grad[start:stop], **close)
        if sharded.cosine_scale is None:
            torch.testing.assert_close(b.grad, b_ref.grad[start:stop], **close)
        torch.testing.assert_close(mine.grad, z_ref.grad[rows], **close)
        for (key, p), q in zip(sharded.named_parameters(), whole.parameters(), strict=True):
            assert (p.grad is None) == (q.grad is None), f"{where}: {key}"
            if p.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, **close)
                p.grad, q.grad = None, None


def _every_loss(world: World) -> None:
    for name in SHARDABLE:
        _one_loss(world, name)


@pytest.mark.parametrize("size", [2, 3])
def test_each_shardable_loss_equals_one_process(tmp_path, size) -> None:
    run_world(tmp_path, _every_loss, size)


def test_the_losses_that_cannot_shard_say_so() -> None:
    registry = make_registry()
    for spec in (
        {"name": "cb-focal", "loss_type": "focal"},
        {"name": "cb-focal", "loss_type": "sigmoid"},
        {"name": "multilabel-ce"},
        {"name": "decoupled"},
    ):
        assert not registry.build("losses", spec, "test").shardable, spec
