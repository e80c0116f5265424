"""Collective operations with autograd, the pieces a label-sharded loss is made of.

In a sharded full-mode step every rank holds the embeddings of the whole global batch (gathered
by :func:`gather_rows`) and the logits of its own labels only, ``L_r`` (B, C_r), columns
``label_start`` … ``label_start + C_r − 1``. A loss that reduces over labels (a softmax's
normaliser, a sum of per-label terms) combines its per-rank parts with the operations below.
Each returns the same value on every rank, so every rank runs the same loss downstream and its
chain rule already gives ∂loss/∂L_r on its own: their backward is local, with no communication
(the backward of torch.distributed.nn's all-reduce would all-reduce again and count the
gradient W times). At W = 1 they are the plain single-process operations.

Sums over ranks are all-reduced in float as the backend orders them (gloo and NCCL repeat the
same order at a fixed W), so values equal one process's up to float rounding; a value that
only one rank holds (``pick``) is exact.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from tailkit.distributed.world import World


def _all_reduce(x: torch.Tensor, world: World, op: Any = None) -> torch.Tensor:
    """``x`` reduced over the ranks (a fresh tensor; SUM unless ``op``)."""
    out = x.clone()
    if world.sharded:
        dist.all_reduce(out, op=dist.ReduceOp.SUM if op is None else op, group=world.group)
    return out


def finite_or_zero(top: torch.Tensor) -> torch.Tensor:
    """Rows' maxima as the shift of a log-sum-exp: 0 where a maximum is ±inf, so that a row
    whose every logit is −inf gets lse −inf instead of NaN from −inf − (−inf)."""
    return torch.where(torch.isfinite(top), top, torch.zeros_like(top))


class _LogSumExp(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, world: World) -> torch.Tensor:
        rows = logits.shape[0]
        local_max = (
            logits.amax(dim=1)
            if logits.shape[1]
            else logits.new_full((rows,), float("-inf"))  # a rank without labels
        )
        top = _all_reduce(local_max, world, dist.ReduceOp.MAX)
        shift = finite_or_zero(top)
        total = _all_reduce(torch.exp(logits - shift.unsqueeze(1)).sum(dim=1), world)
        lse = total.log_().add_(shift)
        ctx.save_for_backward(logits, lse)
        return lse

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        logits, lse = ctx.saved_tensors
        return torch.exp(logits - lse.unsqueeze(1)).mul_(grad.unsqueeze(1)), None


def row_logsumexp(logits: torch.Tensor, world: World) -> torch.Tensor:
    """log Σ_j exp(L_ij) over every label of every rank, per row (B,); the gradient with
    respect to this rank's logits is the softmax restricted to its labels."""
    out: torch.Tensor = _LogSumExp.apply(logits, world)
    return out


class _Pick(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, logits: torch.Tensor, ids: torch.Tensor, label_start: int, world: World
    ) -> torch.Tensor:
        flat = ids.reshape(ids.shape[0], -1)
        local = flat - label_start
        owned = (flat >= 0) & (local >= 0) & (local < logits.shape[1])
        column = torch.where(owned, local, torch.zeros_like(local))
        if logits.shape[1]:
            mine = logits.gather(1, column).masked_fill_(~owned, 0.0)
        else:
            mine = logits.new_zeros(flat.shape)
        ctx.save_for_backward(column, owned)
        ctx.width = logits.shape[1]
        return _all_reduce(mine, world).view(ids.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        column, owned = ctx.saved_tensors
        g = grad.reshape(column.shape).masked_fill(~owned, 0.0)
        out = g.new_zeros(column.shape[0], ctx.width)
        if ctx.width:
            out.scatter_add_(1, column, g)
        return out, None, None, None


def pick(logits: torch.Tensor, ids: torch.Tensor, label_start: int, world: World) -> torch.Tensor:
    """The logits of labels ``ids`` ((B,) or (B, k), global ids, −1 padding gives 0), from the
    rank that owns each: the same tensor on every rank."""
    out: torch.Tensor = _Pick.apply(logits, ids, label_start, world)
    return out


class _RowSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, partial: torch.Tensor, world: World) -> torch.Tensor:
        return _all_reduce(partial, world)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


def sum_over_ranks(partial: torch.Tensor, world: World) -> torch.Tensor:
    """Σ over the ranks of each rank's ``partial`` (a per-row sum over its labels, say); the
    gradient of each rank's part is the incoming gradient itself."""
    out: torch.Tensor = _RowSum.apply(partial, world)
    return out


def all_gather_rows(
    rows: torch.Tensor, world: World, sizes: list[int] | None = None
) -> tuple[torch.Tensor, list[int]]:
    """Every rank's ``rows`` stacked in rank order (ranks may hold different numbers, each
    padded to the largest for the collective), and how many each rank gave; no autograd.
    ``sizes``, when every rank knows them (a training step's split of the global batch), saves
    the collective that would tell them."""
    if not world.sharded:
        return rows.clone(), [rows.shape[0]]
    if sizes is None:
        counts = torch.tensor([rows.shape[0]])
        all_counts = [torch.zeros_like(counts) for _ in range(world.size)]
        dist.all_gather(all_counts, counts, group=world.group)
        sizes = [int(c) for c in all_counts]
    padded = rows.new_zeros(max(sizes), *rows.shape[1:])
    padded[: rows.shape[0]] = rows
    parts = [torch.empty_like(padded) for _ in range(world.size)]
    dist.all_gather(parts, padded, group=world.group)
    return torch.cat([p[:n] for p, n in zip(parts, sizes, strict=True)]), sizes


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, rows: torch.Tensor, world: World, sizes: list[int] | None
    ) -> torch.Tensor:
        gathered, sizes = all_gather_rows(rows, world, sizes)
        start = sum(sizes[: world.rank])
        ctx.span, ctx.world = (start, start + rows.shape[0]), world
        return gathered

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        start, stop = ctx.span
        grad = _all_reduce(grad.contiguous(), ctx.world)  # a copy in one process
        return grad[start:stop].clone(), None, None


def gather_rows(rows: torch.Tensor, world: World, sizes: list[int] | None = None) -> torch.Tensor:
    """Every rank's ``rows`` stacked in rank order (ranks may hold different numbers of rows).

    Backward: each rank's gradient with respect to the gathered rows is its own part (its
    labels' logits) of the global loss's, so they are summed over the ranks, and each rank
    keeps the slice of its own rows. A term that every rank computes in full from the gathered
    rows (a replicated term, such as ELM's pull) is then counted once per rank: scale it by
    1/W (:func:`scale_gradient`). ``sizes``: every rank's row count, when all know them."""
    out: torch.Tensor = _GatherRows.apply(rows, world, sizes)
    return out


class _SumGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, world: World) -> torch.Tensor:
        ctx.world = world
        return x.view_as(x)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_reduce(grad.contiguous(), ctx.world), None


def sum_gradient(rows: torch.Tensor, world: World) -> torch.Tensor:
    """``rows`` itself, computed alike on every rank (a replicated encoder's embeddings of the
    whole batch); its gradient, each rank's part of the global loss's, is summed over the
    ranks on the way back, so every replica of the encoder gets the whole gradient and takes
    the same step without exchanging its parameters' gradients. As with :func:`gather_rows`,
    a term every rank computes in full from these rows is counted once per rank: scale it by
    1/W."""
    out: torch.Tensor = _SumGradient.apply(rows, world)
    return out


class _ScaleGradient(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, factor: float) -> torch.Tensor:
        ctx.factor = factor
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad * ctx.factor, None


def scale_gradient(x: torch.Tensor, factor: float) -> torch.Tensor:
    """``x`` itself, its gradient multiplied by ``factor`` on the way back."""
    out: torch.Tensor = _ScaleGradient.apply(x, factor)
    return out


def sharded_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    label_start: int,
    world: World,
    *,
    offsets: torch.Tensor | None = None,
    target_shift: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-example cross-entropy (B,) of the adjusted logits of this rank's labels: the value and
    gradient of :func:`tailkit.plugins.losses.fused_softmax.adjusted_cross_entropy` on the whole
    label range, with ``offsets`` (this rank's slice, C_r) added to every row and
    ``target_shift`` (B,) to each row's label entry (on the rank that owns it)."""
    adjusted = logits if offsets is None else logits + offsets.detach()
    if target_shift is not None:
        local = labels - label_start
        owned = (local >= 0) & (local < logits.shape[1])
        if bool(owned.any()):
            rows = owned.nonzero().squeeze(1)
            if adjusted is logits:  # never write into the caller's logits
                adjusted = logits.clone()
            shift = target_shift.detach()[rows].to(adjusted.dtype)
            adjusted.index_put_((rows, local[rows]), shift, accumulate=True)
    return row_logsumexp(adjusted, world) - pick(adjusted, labels, label_start, world)
