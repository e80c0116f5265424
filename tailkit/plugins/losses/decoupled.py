"""Decoupled (one-vs-all) losses, over all labels or over sampled negatives (Rawat et al. 2021)."""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F

from tailkit.components import FullBatch, Loss, SampledBatch
from tailkit.distributed.chunked_logits import ChunkedLogits
from tailkit.evaluation.correction import CorrectsAtPrediction
from tailkit.plugins.losses.weighting import Weighting, log_weights
from tailkit.validation import Constraint, Interval

MarginLoss = Literal["logistic", "hinge"]


def _positive_term(margin_loss: MarginLoss, f: torch.Tensor) -> torch.Tensor:
    """φ(f_y): softplus(−f) (logistic) or max(0, 1 − f) (hinge)."""
    return F.softplus(-f) if margin_loss == "logistic" else F.relu(1 - f)


def _negative_term(margin_loss: MarginLoss, f: torch.Tensor) -> torch.Tensor:
    """ϕ(−f_{y'}): softplus(f) (logistic) or max(0, 1 + f) (hinge)."""
    return F.softplus(f) if margin_loss == "logistic" else F.relu(1 + f)


class _Decoupled(Loss):
    def __init__(self, margin_loss: MarginLoss, reduction: Literal["mean", "sum"]) -> None:
        super().__init__()
        self.margin_loss = margin_loss
        self.reduction = reduction

    def initial_bias(self, num_classes: int) -> float:
        # σ(b) = 1/C: a logistic one-vs-all model starts at the label prior of a uniform guess
        # instead of C − 1 confident false positives (as Cui et al. initialise sigmoid losses).
        if self.margin_loss == "logistic" and num_classes > 1:
            return -math.log(num_classes - 1)
        return 0.0

    def confidence(self, top_scores: torch.Tensor, log_partition: torch.Tensor):
        # The logistic loss is calibrated per label (σ(f) estimates p(y|x)); the hinge is not.
        return torch.sigmoid(top_scores) if self.margin_loss == "logistic" else None

    def _reduce(self, per_example: torch.Tensor) -> torch.Tensor:
        return per_example.sum() if self.reduction == "sum" else per_example.mean()


class Decoupled(_Decoupled):
    """One-vs-all decoupled loss over all C labels: φ(f_y) + Σ_{y'≠y} ϕ(−f_{y'}).

    ``margin_loss="logistic"``: φ(v) = ϕ(v) = log(1 + e^{−v}), i.e. the sum of the C binary
    logistic losses (computed as Σ_j softplus(f_j) − f_y, one pass over the logits);
    ``"hinge"``: max(0, 1 − f_y) + Σ_{y'≠y} max(0, 1 + f_{y'}). The output biases start at
    −log(C − 1) for the logistic loss. ``reduction="mean"`` divides the sum over the batch by B.

    Multi-label rows (``batch.labels`` (B, k), −1 padded) take every label of the row as a
    positive: Σ_{j∈P} φ(f_j) + Σ_{j∉P} ϕ(−f_j), with the logistic margin the binary relevance
    (one-vs-all BCE) baseline of extreme classification; a row without labels has negatives
    only.
    """

    multilabel = True
    chunkable = True  # a sum of per-label terms (ChunkedLogits.label_sums)

    def __init__(
        self,
        *,
        margin_loss: MarginLoss = "logistic",
        reduction: Literal["mean", "sum"] = "mean",
    ) -> None:
        super().__init__(margin_loss, reduction)

    def forward(self, batch: FullBatch) -> torch.Tensor:
        logits = batch.logits
        labels = batch.labels.long()
        if isinstance(logits, ChunkedLogits):  # each label's term, one chunk at a time
            margin = self.margin_loss

            def term(z: torch.Tensor, t: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
                both = torch.where(t > 0, _positive_term(margin, z), _negative_term(margin, z))
                return both.sum(dim=1)

            return self._reduce(logits.label_sums(labels, term))
        ids = labels.unsqueeze(1) if labels.ndim == 1 else labels
        present = ids >= 0
        f_y = logits.gather(1, ids.clamp(min=0))
        everything = _negative_term(self.margin_loss, logits).sum(dim=1)
        # Σ_{y'∉P} ϕ(−f_{y'}) = Σ_all − Σ_P ϕ(−f_y); for the logistic loss
        # softplus(−f) − softplus(f) = −f, so a positive needs no extra transcendental.
        if self.margin_loss == "logistic":
            swap = -f_y
        else:
            swap = _positive_term(self.margin_loss, f_y) - _negative_term(self.margin_loss, f_y)
        per_example = everything + torch.where(present, swap, 0.0).sum(dim=1)
        return self._reduce(per_example)

    def extra_repr(self) -> str:
        return f"margin_loss={self.margin_loss!r}, reduction={self.reduction!r}"


class SampledDecoupled(CorrectsAtPrediction, _Decoupled):
    """Sampled decoupled loss: φ(f_y) + Σ_{j∈N} w_{yj} ϕ(−f_j) over m sampled negatives.

    Accidental hits (a negative equal to y) contribute exactly zero. ``weighting`` is one of
    :mod:`tailkit.plugins.losses.weighting`: with ``"importance"`` (w = 1/(m q_j)) the implicit
    loss is the full decoupled loss; with ``"constant"`` (w = 1) label y' is penalised
    m·q_{y'} times, so the optimum of the logistic loss is f = logit p − log(m q): adding
    log q back at prediction (``correct_at_prediction=True``) is Bamler & Mandt's correction.
    ``"relative"`` multiplies the importance weight by (π_j/π_y)^τ. ``reduction="mean"``
    divides the sum over the batch by B.
    """

    constraints: ClassVar[dict[str, Constraint]] = {"tau": Interval(0, None)}

    def __init__(
        self,
        *,
        margin_loss: MarginLoss = "logistic",
        weighting: Weighting = "importance",
        tau: float = 1.0,
        correct_at_prediction: bool = False,
        reduction: Literal["mean", "sum"] = "mean",
    ) -> None:
        super().__init__(margin_loss, reduction)
        self.weighting = weighting
        self.tau = tau
        self.correct_at_prediction = correct_at_prediction

    def forward(self, batch: SampledBatch) -> torch.Tensor:
        pos, neg = batch.pos_logits, batch.neg_logits
        terms = _negative_term(self.margin_loss, neg)
        log_w = log_weights(self.weighting, batch, neg, tau=self.tau)
        if log_w is not None:
            terms = terms * log_w.exp()
        # A select, not a 0/1 product: a hit's term is exactly zero even if it is inf.
        terms = torch.where(batch.hits.to(torch.bool), 0.0, terms)
        return self._reduce(_positive_term(self.margin_loss, pos) + terms.sum(dim=1))

    @property
    def uses_log_q(self) -> bool:
        return self.weighting != "constant"  # every other weighting divides by q

    def extra_repr(self) -> str:
        return (
            f"margin_loss={self.margin_loss!r}, weighting={self.weighting!r}, tau={self.tau:g}, "
            f"correct_at_prediction={self.correct_at_prediction}, reduction={self.reduction!r}"
        )
