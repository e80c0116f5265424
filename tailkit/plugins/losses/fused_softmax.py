"""Per-example softmax cross-entropy on adjusted logits, with its gradient written out.

The prior-adjusted losses (logit adjustment, balanced softmax, ELM's CE term) add a per-class
vector to every row of the (B, C) logits, LDAM subtracts a margin from each row's target logit,
and the class-balanced and DRW losses weight the rows. Done with autograd, each of these is a
(B, C) pass and often a (B, C) tensor kept alive for the backward, on top of what
:func:`torch.nn.functional.cross_entropy` itself keeps; a (B, C) pass is the unit of a
full-softmax step's cost beside its GEMMs. :func:`adjusted_cross_entropy` folds the adjustment
into the one copy the log-softmax needs anyway and writes the backward as softmax − one-hot,
so an adjusted loss costs plain CE plus one (B, C) add.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.autograd.function import once_differentiable

from tailkit.components import FullBatch
from tailkit.distributed.chunked_logits import ChunkedLogits
from tailkit.distributed.ops import scale_gradient, sharded_cross_entropy
from tailkit.plugins.losses.softmax_kernels import cross_entropy_backward, cross_entropy_forward


def _logsumexp_rows_(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(m, log Σ_j exp(a_ij − m)) per row, two (B,) tensors whose sum is torch.logsumexp's
    (rows of −inf give −inf, +inf gives +inf, NaN stays NaN), writing e^(a − m) over ``a``
    itself: torch's logsumexp makes that (B, C) copy on the side, one more full-width tensor
    at the peak. Kept apart, as log-softmax keeps them: a − m − log Σ rounds at the size of
    a − m, where a − (m + log Σ) would round at the size of m (4.7e-4 off at logits of 10^4
    in float32)."""
    top = a.amax(dim=1, keepdim=True)
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    return top.squeeze(1), a.sub_(top).exp_().sum(dim=1).log_()


class _AdjustedCrossEntropy(torch.autograd.Function):
    """ℓ_i = log Σ_j exp(a_ij) − a_{i y_i} with a = f + o (+ s_i at (i, y_i)), per row (B,).

    ∂ℓ_i/∂f_ij = softmax(a_i)_j − [j = y_i]: the offsets and shifts are constants, so the
    gradient of the adjusted logits is the gradient of the logits. Kept for the backward: the
    logits (which the step holds anyway) and, when adjusted, each row's maximum and
    log Σ e^(a − max), two (B,) tensors; the backward writes the softmax into the one (B, C)
    tensor it returns. torch's cross-entropy
    (log-softmax + NLL) held four (B, C) tensors at its peak on CUDA (the logits, the
    log-softmax, NLL's gradient and the log-softmax's: 69.7 GB at B = 4,096, C = 10^6 on an
    H200, where `tailkit plan` counts the logits and their gradient, 36.9 GB with the layer);
    this holds those two (39.0 GB).

    Plain logits take torch's fused log-softmax (a transient) and softmax: forward and
    backward 43 ms on that H200 shape, against 35 ms for F.cross_entropy and 66 ms for the
    elementwise passes that adjusted logits take (82 ms with offsets, against 47 ms for
    F.cross_entropy on logits + offsets with two more (B, C) tensors): memory first, since it
    decides whether a shape fits at all.
    """

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        labels: torch.Tensor,
        offsets: torch.Tensor | None,
        target_shift: torch.Tensor | None,
    ) -> torch.Tensor:
        column = labels.unsqueeze(1)
        lse: tuple[torch.Tensor, torch.Tensor] | None = None
        if offsets is None and target_shift is None:
            picked = torch.log_softmax(logits, dim=1).gather(1, column).squeeze(1)
        else:
            # a fresh tensor either way, never the caller's logits
            adjusted = logits.clone() if offsets is None else logits + offsets
            if target_shift is not None:
                adjusted.scatter_add_(1, column, target_shift.unsqueeze(1))
            target = adjusted.gather(1, column).squeeze(1)
            lse = _logsumexp_rows_(adjusted)
            del adjusted
            picked = (target - lse[0]) - lse[1]
        ctx.save_for_backward(logits, column, offsets, target_shift, *(lse or (None, None)))
        return -picked

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        logits, column, offsets, target_shift, top, log_sum = ctx.saved_tensors
        # A fresh tensor, never the saved ones in place: gradcheck (and retain_graph) run a
        # backward twice.
        if top is None:
            grad_logits = torch.softmax(logits, dim=1)
        else:
            grad_logits = logits.clone() if offsets is None else logits + offsets
            if target_shift is not None:
                grad_logits.scatter_add_(1, column, target_shift.unsqueeze(1))
            grad_logits.sub_(top.unsqueeze(1)).sub_(log_sum.unsqueeze(1)).exp_()
        grad_logits.mul_(grad.unsqueeze(1))
        grad_logits.scatter_add_(1, column, -grad.unsqueeze(1))
        return grad_logits, None, None, None


def compiled_ce_rows(
    logits: torch.Tensor, labels: torch.Tensor, offsets: torch.Tensor, shift: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The compiled CE forward on float32 CPU tensors: per-row loss (B,) float32 and log-sum-exp
    (B,) float64, with ``offsets`` (C,) on every row and ``shift`` (B,) on each label entry."""
    rows = logits.shape[0]
    lse = torch.empty(rows, dtype=torch.float64)
    loss = torch.empty(rows, dtype=torch.float32)
    cross_entropy_forward(
        logits.numpy(), offsets.numpy(), labels.numpy(), shift.numpy(), lse.numpy(), loss.numpy()
    )
    return loss, lse


def compiled_ce_gradient(
    logits: torch.Tensor,
    labels: torch.Tensor,
    offsets: torch.Tensor,
    shift: torch.Tensor,
    lse: torch.Tensor,
    grad_rows: torch.Tensor,
) -> torch.Tensor:
    """The compiled CE backward: the logits' gradient for per-row incoming gradients (B,), from
    :func:`compiled_ce_rows`' log-sum-exps, in one fresh (B, C) tensor."""
    grad_logits = torch.empty_like(logits)
    cross_entropy_backward(
        logits.numpy(),
        offsets.numpy(),
        labels.numpy(),
        shift.numpy(),
        lse.numpy(),
        grad_rows.to(torch.float32).contiguous().numpy(),
        grad_logits.numpy(),
    )
    return grad_logits


class _CompiledCrossEntropy(torch.autograd.Function):
    """The same loss and gradient as :class:`_AdjustedCrossEntropy` for float32 logits on the
    CPU, from the compiled kernels of :mod:`~tailkit.plugins.losses.softmax_kernels`: keeps the
    row log-sum-exps (B,) instead of a (B, C) log-softmax, and writes the gradient in one pass.
    """

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        labels: torch.Tensor,
        offsets: torch.Tensor,
        target_shift: torch.Tensor,
    ) -> torch.Tensor:
        loss, lse = compiled_ce_rows(logits, labels, offsets, target_shift)
        ctx.save_for_backward(logits, labels, offsets, target_shift, lse)
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        logits, labels, offsets, target_shift, lse = ctx.saved_tensors
        return (
            compiled_ce_gradient(logits, labels, offsets, target_shift, lse, grad),
            None,
            None,
            None,
        )


def compiled_path(logits: torch.Tensor) -> bool:
    """Whether :func:`adjusted_cross_entropy` (and the one-vs-all and pull kernels beside it)
    takes the compiled kernels: float32 (B, C) logits on the CPU. float64 (the reference tests'
    precision; the kernels' arithmetic is float32, to a few ulps), CUDA and chunked logits
    (which never exist whole) take torch."""
    return (
        isinstance(logits, torch.Tensor)
        and logits.device.type == "cpu"
        and logits.dtype == torch.float32
        and logits.ndim == 2
    )


def check_label_range(labels: torch.Tensor, width: int, loss: str) -> None:
    """A one-line IndexError for a label outside [0, width): the compiled kernels index without
    bounds checks, where torch's gather would raise the same way."""
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= width):
        raise IndexError(f"{loss}: a label is outside [0, {width})")


def _compiled_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    offsets: torch.Tensor | None,
    target_shift: torch.Tensor | None,
) -> torch.Tensor:
    rows, width = logits.shape
    check_label_range(labels, width, "cross-entropy")
    offsets = (
        logits.new_zeros(width)
        if offsets is None
        else offsets.detach().to(logits.dtype).contiguous()
    )
    shift = (
        logits.new_zeros(rows)
        if target_shift is None
        else target_shift.detach().to(logits.dtype).contiguous()
    )
    loss: torch.Tensor = _CompiledCrossEntropy.apply(
        logits.contiguous(), labels.long().contiguous(), offsets, shift
    )
    return loss


def adjusted_cross_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    offsets: torch.Tensor | None = None,
    target_shift: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-example cross-entropy (B,) of ``logits + offsets``, each row's target logit moved by
    ``target_shift``; ``F.cross_entropy(adjusted, labels, reduction="none")`` in value and
    gradient, without its (B, C) temporaries.

    ``logits`` (B, C); ``labels`` (B,) int64; ``offsets`` (C,) added to every row (a constant:
    it gets no gradient); ``target_shift`` (B,) added to logit (i, y_i) only (also constant).
    Both must already have the logits' dtype and device. The caller reduces (mean, sum, a
    weighted sum) with ordinary autograd on the (B,) result.
    """
    if compiled_path(logits):
        return _compiled_cross_entropy(logits, labels, offsets, target_shift)
    if offsets is not None:
        offsets = offsets.detach()
    if target_shift is not None:
        target_shift = target_shift.detach()
    loss: torch.Tensor = _AdjustedCrossEntropy.apply(logits, labels, offsets, target_shift)
    return loss


def batch_cross_entropy(
    batch: FullBatch,
    *,
    offsets: torch.Tensor | None = None,
    target_shift: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`adjusted_cross_entropy` of a full-mode batch (B,), on the whole label range or, in
    a label-sharded run, on this process's shard of it (``offsets`` is then still the (C,) table
    of every label: the shard's slice is taken here). Chunked logits
    (:class:`~tailkit.distributed.chunked_logits.ChunkedLogits`) give the same value from their
    row statistics, label chunk by chunk."""
    labels = batch.labels.long()
    if isinstance(batch.logits, ChunkedLogits):
        lse, picked = batch.logits.softmax_stats(labels, offsets=offsets, target_shift=target_shift)
        return lse - picked
    if batch.whole:
        return adjusted_cross_entropy(
            batch.logits, labels, offsets=offsets, target_shift=target_shift
        )
    if offsets is not None:
        offsets = offsets[batch.label_start : batch.label_stop]
    return sharded_cross_entropy(
        batch.logits,
        labels,
        batch.label_start,
        batch.world,
        offsets=offsets,
        target_shift=target_shift,
    )


def replicated_embeddings(batch: FullBatch) -> torch.Tensor:
    """The batch's embeddings for a term computed from them alone (ELM's pull, DRO-LT's
    prototype term): in a label-sharded run every rank computes such a term in full, so its
    gradient is scaled by 1/W to reach the rows once in all (:func:`tailkit.distributed.ops.
    gather_rows`)."""
    z = batch.embeddings
    return scale_gradient(z, 1.0 / batch.world.size) if batch.world.sharded else z
