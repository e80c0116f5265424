"""LDAM loss with deferred re-weighting (LDAM-DRW) of Cao et al. (NeurIPS 2019), as in the
authors' PyTorch code (kaidic/LDAM-DRW)."""

from __future__ import annotations

from typing import ClassVar, Literal

import torch

from tailkit.components import FullBatch, Loss
from tailkit.plugins.losses.cast_tables import table_like
from tailkit.plugins.losses.class_balanced import (
    NOT_SET_UP,
    class_balanced_weights,
    training_counts,
)
from tailkit.plugins.losses.fused_softmax import batch_cross_entropy
from tailkit.validation import Constraint, Interval


def ldam_margins(counts: torch.Tensor | list[float], max_m: float) -> torch.Tensor:
    """LDAM margins m_j = n_j^{-1/4}, rescaled so that max_j m_j = ``max_m`` (the rarest class).

    Returns float64 (C,) on the device of ``counts``. A zero count is treated as 1, so such a
    class gets the largest margin instead of an infinite one (see :func:`training_counts`).
    """
    m = training_counts(counts).pow(-0.25)
    return m * (max_m / m.max())


class LDAM(Loss):
    """Label-distribution-aware margin loss of Cao et al. (2019), with optional DRW.

    The loss asks the core for cosine logits (``cosine_scale = s``), so ``batch.logits`` holds
    s·z_ij with z_ij = cos(Φ(x_i), w_j) and no bias. With margins m_j
    (:func:`ldam_margins`, built in :meth:`setup`) the per-example loss is::

        ℓ_i = CE(s·(z_i − m_{y_i} e_{y_i}), y_i),

    i.e. s·m_{y_i} is subtracted from the true-class logit only, then softmax cross-entropy.

    Deferred re-weighting: from the 0-based epoch ``drw_epoch`` on (LDAM-DRW switches it on
    with the first lr decay), example i is weighted by the class-balanced w_{y_i}, w_j =
    (1 − β)/(1 − β^{n_j}) normalised to Σ_j w_j = C; before it, and always when ``drw_epoch``
    is None, every weight is 1.

    ``reduction="mean"`` is PyTorch's *weighted* mean Σ_i w_{y_i} ℓ_i / Σ_i w_{y_i}, as in
    ``F.cross_entropy(weight=...)`` of the reference (the plain batch mean when unweighted);
    ``"sum"`` is Σ_i w_{y_i} ℓ_i. Confidence is the softmax of the scaled logits (the default).
    """

    constraints: ClassVar[dict[str, Constraint]] = {
        "max_m": Interval(0, None),
        "s": Interval(0, None, closed="neither"),
        "drw_epoch": Interval(0, None),
        "beta": Interval(0, 1, closed="left"),
    }

    def __init__(
        self,
        *,
        max_m: float = 0.5,
        s: float = 30.0,
        drw_epoch: int | None = None,
        beta: float = 0.9999,
        reduction: Literal["mean", "sum"] = "mean",
    ) -> None:
        super().__init__()
        self.max_m = max_m
        self.s = s
        self.drw_epoch = drw_epoch
        self.beta = beta
        self.reduction = reduction
        # The margins live in cosine space, so the core must build the normalised layer.
        self.cosine_scale = s
        self.shardable = True  # the margin moves one logit: batch_cross_entropy does it
        self.chunkable = True  # so do chunked logits' row statistics
        # Derived from the training counts in setup(), never saved: a checkpoint loaded after
        # setup() must not overwrite them with another split's tables.
        self.register_buffer("margins", None, persistent=False)
        self.register_buffer("class_weights", None, persistent=False)
        self.register_buffer("scaled_margins", None, persistent=False)  # −s·m_j, the shift

    def setup(self, class_counts: torch.Tensor) -> None:
        self.margins = ldam_margins(class_counts, self.max_m)
        self.scaled_margins = self.margins * -self.s
        self.class_weights = class_balanced_weights(class_counts, self.beta)

    def reweighting(self, epoch: int) -> bool:
        """Whether the class-balanced weights apply at this 0-based epoch."""
        return self.drw_epoch is not None and epoch >= self.drw_epoch

    def forward(self, batch: FullBatch) -> torch.Tensor:
        logits = batch.logits
        if self.margins is None:
            raise RuntimeError(f"{type(self).__name__}: {NOT_SET_UP}")
        if batch.num_classes != self.margins.numel():
            raise ValueError(
                f"{type(self).__name__}: logits have {batch.num_classes} classes but setup() "
                f"saw counts for {self.margins.numel()}"
            )
        labels = batch.labels.long()
        # The logits already carry s, so the margin must too: s·z − s·m = s·(z − m). The
        # product is taken in float64 before the cast, as the tables are.
        shift = table_like(self, "scaled_margins", logits)[labels]
        per_example = batch_cross_entropy(batch, target_shift=shift)
        if not self.reweighting(batch.epoch):
            return per_example.sum() if self.reduction == "sum" else per_example.mean()
        w = table_like(self, "class_weights", per_example)[labels]
        total = (w * per_example).sum()
        return total if self.reduction == "sum" else total / w.sum()

    def extra_repr(self) -> str:
        return (
            f"max_m={self.max_m:g}, s={self.s:g}, drw_epoch={self.drw_epoch}, "
            f"beta={self.beta:g}, reduction={self.reduction!r}"
        )
