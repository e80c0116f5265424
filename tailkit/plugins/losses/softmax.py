"""Full softmax cross-entropy."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from tailkit.components import Loss, LossInput


class SoftmaxCE(Loss):
    """Full softmax cross-entropy over all C labels.

    Per example ``log Σ_j exp(f_j) − f_y`` on ``batch.logits`` (B, C), computed by
    :func:`torch.nn.functional.cross_entropy` (log-sum-exp, so stable for large logits).
    ``reduction="mean"`` divides the sum over the batch by B; ``"sum"`` does not.
    No prediction-time adjustment.
    """

    mode = "full"

    def __init__(self, *, reduction: Literal["mean", "sum"] = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, batch: LossInput) -> torch.Tensor:
        if batch.logits is None:
            raise ValueError("SoftmaxCE needs batch.logits (B, C): it is a full-mode loss")
        return F.cross_entropy(batch.logits, batch.labels.long(), reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"
