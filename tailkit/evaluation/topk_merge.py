"""The top-k and log-sum-exp of every label from each rank's over its own labels."""

from __future__ import annotations

import torch
import torch.distributed as dist

from tailkit.distributed.world import World
from tailkit.evaluation.topk import rank_topk


def _gathered(x: torch.Tensor, world: World) -> list[torch.Tensor]:
    parts = [torch.empty_like(x) for _ in range(world.size)]
    dist.all_gather(parts, x.contiguous(), group=world.group)
    return parts


def merge_topk(
    scores: torch.Tensor, ids: torch.Tensor, k: int, world: World
) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best (score, global id) of each row over all ranks, from each rank's own k best
    (n, k); ranked as one process ranks them: higher score first, equal scores to the lower
    label id, empty slots (id −1) last. The same on every rank."""
    if not world.sharded:
        return rank_topk(scores, ids, k)
    return rank_topk(
        torch.cat(_gathered(scores, world), dim=1), torch.cat(_gathered(ids, world), dim=1), k
    )


def merge_logsumexp(lse: torch.Tensor, world: World) -> torch.Tensor:
    """log Σ exp over all ranks of each rank's per-row log-sum-exp (n,), combined in rank order
    (the same bits on every rank, whatever the backend's reduction order)."""
    if not world.sharded:
        return lse
    return torch.logsumexp(torch.stack(_gathered(lse, world), dim=1), dim=1)
