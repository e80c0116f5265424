"""Full softmax cross-entropy."""

from __future__ import annotations

from typing import Literal

import torch

from tailkit.components import FullBatch, Loss
from tailkit.distributed.chunked_logits import ChunkedLogits
from tailkit.distributed.ops import pick, row_logsumexp
from tailkit.plugins.losses.fused_softmax import batch_cross_entropy


class SoftmaxCE(Loss):
    """Full softmax cross-entropy over all C labels.

    Per example ``log Σ_j exp(f_j) − f_y`` on ``batch.logits`` (B, C), computed by
    :func:`~tailkit.plugins.losses.fused_softmax.batch_cross_entropy` (log-sum-exp, so stable
    for large logits; no (B, C) tensor beyond the logits and their gradient).
    ``reduction="mean"`` divides the sum over the batch by B; ``"sum"`` does not.
    No prediction-time adjustment.

    Multi-label rows (``batch.labels`` (B, k), −1 padded) take the normalised pick-all-labels
    reduction PAL-N of Menon et al. (2019, "Multilabel reductions: what is my loss
    optimising?"): ``(1/|P|) Σ_{j∈P} (log Σ_l exp(f_l) − f_j)`` over the row's labels P, the
    cross-entropy against the uniform distribution on P, whose minimiser ranks labels by their
    marginal probability (consistent for precision@k). A row without labels adds 0 but still
    counts in B. With one label per row it is the single-label loss.
    """

    multilabel = True
    shardable = True  # CE through batch_cross_entropy; PAL-N's log-softmax picks as below
    chunkable = True  # the same two, from chunked logits' row statistics

    def __init__(self, *, reduction: Literal["mean", "sum"] = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, batch: FullBatch) -> torch.Tensor:
        labels = batch.labels.long()
        per_example = batch_cross_entropy(batch) if labels.ndim == 1 else pick_all_labels(batch)
        return per_example.sum() if self.reduction == "sum" else per_example.mean()

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"


def pick_all_labels(batch: FullBatch, offsets: torch.Tensor | None = None) -> torch.Tensor:
    """PAL-N per row: ``(1/|P|) Σ_{j∈P} (log Σ_l exp(s_l) − s_j)`` over the row's labels P
    (``batch.labels`` (B, k), −1 padded; 0 for a row without labels) on s = the batch's logits
    + ``offsets`` (the (C,) table of every label, a constant; none by default), of every label,
    of this process's shard or label chunk by chunk."""
    labels = batch.labels.long()
    present = labels >= 0
    logits = batch.logits
    if isinstance(logits, ChunkedLogits):
        lse, picked = logits.softmax_stats(labels, offsets=offsets)
        log_p = picked - lse.unsqueeze(1)
    else:
        if offsets is not None:  # this process's labels of the (C,) table
            logits = logits + offsets.detach()[batch.label_start : batch.label_stop]
        if batch.whole:
            log_p = torch.log_softmax(logits, dim=1).gather(1, labels.clamp(min=0))
        else:
            lse = row_logsumexp(logits, batch.world).unsqueeze(1)
            log_p = pick(logits, labels, batch.label_start, batch.world) - lse
    sizes = present.sum(dim=1, keepdim=True).clamp(min=1)
    return -(torch.where(present, log_p, 0.0) / sizes).sum(dim=1)
