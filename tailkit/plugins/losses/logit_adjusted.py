"""Logit adjustment (Menon et al., ICLR 2021) and balanced softmax (Ren et al., NeurIPS 2020)."""

from __future__ import annotations

from typing import ClassVar, Literal

import torch

from tailkit.components import FullBatch, Loss, ScoreContext
from tailkit.plugins.losses.cast_tables import table_like
from tailkit.plugins.losses.fused_softmax import batch_cross_entropy
from tailkit.plugins.losses.softmax import pick_all_labels
from tailkit.validation import Constraint, Interval

#: The ε of the Google code, added *after* the power: log(π^τ + 1e-12).
PRIOR_EPS = 1e-12


def prior_offsets(class_counts: torch.Tensor, tau: float) -> torch.Tensor:
    """log(π^τ + 1e-12) per class, π = n_y / Σ n from the training counts (float64)."""
    counts = class_counts.to(torch.float64)
    pi = counts / counts.sum()
    return torch.log(pi.pow(tau) + PRIOR_EPS)


class _NeedsSetup(Loss):
    """A full-mode loss with a per-class offset table built once by :meth:`setup`.

    The table is kept in float64, so float64 checks are exact, and cast to the logits' dtype
    once (:func:`table_like`), not per step."""

    offsets: torch.Tensor  # a buffer, registered in __init__
    shardable = True  # cross-entropy of offset logits (fused_softmax.batch_cross_entropy)
    chunkable = True  # the same, from chunked logits' row statistics
    reduction: Literal["mean", "sum"]

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("offsets", torch.empty(0), persistent=False)

    def _offsets(self, like: torch.Tensor) -> torch.Tensor:
        if self.offsets.numel() == 0:
            raise RuntimeError(f"{type(self).__name__}: call setup(class_counts) before use")
        return table_like(self, "offsets", like)

    def _reduce(self, per_example: torch.Tensor) -> torch.Tensor:
        return per_example.sum() if self.reduction == "sum" else per_example.mean()

    def _cross_entropy(self, batch: FullBatch, offsets: torch.Tensor | None) -> torch.Tensor:
        """Per row: CE of ``f + offsets`` with one label a row, PAL-N over a row's labels with
        several (each positive's term adjusted by its own prior, as Menon et al.'s and Ren et
        al.'s derivations extend to the pick-all-labels reduction)."""
        if batch.labels.ndim == 1:
            return batch_cross_entropy(batch, offsets=offsets)
        return pick_all_labels(batch, offsets)


class LogitAdjusted(_NeedsSetup):
    """Logit-adjusted softmax cross-entropy, in its two modes.

    ``adjustment="loss"`` (the LA loss): per example ``CE(f + log(π^τ + 1e-12), y)``, i.e.
    log[1 + Σ_{y'≠y} (π_{y'}/π_y)^τ e^{f_{y'} − f_y}]: a pairwise margin that favours rare
    labels. The adjustment is a training device only; prediction uses the raw logits.

    ``adjustment="posthoc"``: train with plain CE and predict with f − log(π^τ + 1e-12)
    (:meth:`adjust_scores`), the argmax of the balanced posterior p(y|x)/π_y ("PC softmax").
    Evaluation then also reports the unadjusted scores under ``uncorrected``.

    Multi-label rows (``batch.labels`` (B, k), −1 padded) take the pick-all-labels reduction
    PAL-N of the ``softmax`` loss on the adjusted logits: ``(1/|P|) Σ_{j∈P} CE(f + log π^τ, j)``
    over the row's labels P, π the labels' share of the training (row, label) pairs.

    π = n_y / N comes from the training counts handed to :meth:`setup` (the Google code reads it
    from a file); the ε = 1e-12 is added after the power, as there, so a label with no training
    row gets a finite offset log(1e-12). τ defaults to 1. ``reduction="mean"`` divides the sum
    over the batch by B (the reference's batch mean); ``"sum"`` does not.
    """

    constraints: ClassVar[dict[str, Constraint]] = {"tau": Interval(0, None)}
    multilabel = True

    def __init__(
        self,
        *,
        tau: float = 1.0,
        adjustment: Literal["loss", "posthoc"] = "loss",
        reduction: Literal["mean", "sum"] = "mean",
    ) -> None:
        super().__init__()
        self.tau = tau
        self.adjustment = adjustment
        self.reduction = reduction

    def setup(self, class_counts: torch.Tensor) -> None:
        self.offsets = prior_offsets(class_counts, self.tau).to(class_counts.device)

    def forward(self, batch: FullBatch) -> torch.Tensor:
        offsets = self._offsets(batch.logits) if self.adjustment == "loss" else None
        return self._reduce(self._cross_entropy(batch, offsets))

    def adjust_scores(
        self,
        scores: torch.Tensor,
        x: torch.Tensor,
        label_ids: torch.Tensor,
        ctx: ScoreContext,
    ) -> torch.Tensor:
        if self.adjustment != "posthoc":
            return scores
        return scores - self._offsets(scores).index_select(0, label_ids.to(self.offsets.device))

    @property
    def adjusts_scores(self) -> bool:
        return self.adjustment == "posthoc"

    def extra_repr(self) -> str:
        return f"tau={self.tau:g}, adjustment={self.adjustment!r}, reduction={self.reduction!r}"


class BalancedSoftmax(_NeedsSetup):
    """Balanced softmax cross-entropy: per example ``CE(f + log n_y, y)`` with raw counts n_y.

    log n_y = log π_y + log N, and a constant shift changes no softmax, so this is the LA loss
    with τ = 1 without its ε: a label with no training row gets −inf (it is never a target, and
    its softmax term is exactly 0). Prediction uses the raw logits (BalancedMetaSoftmax issue
    #13). Multi-label rows take PAL-N on the adjusted logits, as the logit-adjusted loss
    does. ``reduction="mean"`` divides by B; ``"sum"`` does not.
    """

    multilabel = True

    def __init__(self, *, reduction: Literal["mean", "sum"] = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def setup(self, class_counts: torch.Tensor) -> None:
        self.offsets = class_counts.to(torch.float64).log()

    def forward(self, batch: FullBatch) -> torch.Tensor:
        return self._reduce(self._cross_entropy(batch, self._offsets(batch.logits)))

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"
