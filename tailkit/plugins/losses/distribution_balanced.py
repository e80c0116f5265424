"""Distribution-balanced loss of Wu et al. (ECCV 2020), for multi-label rows on a long tail,
as the authors' code computes it (wutong16/DistributionBalancedLoss, ``reweight_func=
'rebalance'`` with focal and logit regularisation, their default settings).

On logits z (B, C) and 0/1 targets t (a row may have several positives, or none), with n_j
the training count of label j and N the training rows:

* **re-balanced weights.** r_ij = (1/n_j) / Σ_{k: t_ik = 1} 1/n_k, the ratio of the class-level
  to the instance-level sampling probability, smoothed to w_ij = α + σ(β (r_ij − μ)) — for
  positives and negatives alike; a row with no positive has r = ∞, so w = α + 1;
* **negative-tolerant regularisation.** Each logit is shifted by the class bias
  ν_j = −κ log(N/n_j − 1), a scaled log-odds prior; a negative's logit is then scaled by λ
  and its weight divided by λ, so a negative's term is (1/λ) log(1 + e^{λ z}): the loss lets
  go of negatives sooner than binary cross-entropy does;
* **focal modulation.** ℓ_ij = b · w_ij · (1 − p_ij)^γ · BCE_ij, with BCE on the regularised
  logit and p_ij = e^{−BCE_ij} (σ(z) for a positive, 1 − σ(z) for a negative);

and the loss is the mean of ℓ over the B × C entries. Defaults are the paper's: α = 0.1,
β = 10, μ = 0.2 (the code's ``map_param``), κ = 0.05, λ = 2, γ = 2, b = 2.

ν shifts the logits in training only, as in the reference: prediction ranks the raw scores,
and a label's confidence is σ(score). N comes from the core (``train_rows``, set before
:meth:`setup`); at evaluation, where no loss is computed, it is not needed. A label seen in
every training row would have ν = +∞; its N/n_j − 1 is floored at 1/N (ν finite, large).
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F

from tailkit.components import FullBatch, Loss
from tailkit.distributed.chunked_logits import ChunkedLogits
from tailkit.plugins.losses.class_balanced import NOT_SET_UP, training_counts
from tailkit.plugins.losses.targets import multi_hot
from tailkit.validation import Constraint, Interval


class DistributionBalanced(Loss):
    """Distribution-balanced loss (Wu et al., ECCV 2020): re-balanced weights, negative-tolerant
    regularisation and focal modulation of per-label sigmoid losses, for label lists.

    Options:
        alpha: floor of the smoothed re-balancing weight
        beta: steepness of the smoothing sigmoid
        mu: threshold of the smoothing sigmoid
        kappa: scale of the class-prior logit bias (0: none)
        neg_scale: lambda, the negatives' logit scale (1: plain BCE on negatives)
        gamma: focal exponent (0: no modulation)
        balance: the focal term's constant factor
    """

    multilabel = True
    chunkable = True  # a sum of per-label terms (ChunkedLogits.label_sums)
    constraints: ClassVar[dict[str, Constraint]] = {
        "alpha": Interval(0, None),
        "beta": Interval(0, None, closed="neither"),
        "kappa": Interval(0, None),
        "neg_scale": Interval(0, None, closed="neither"),
        "gamma": Interval(0, None),
        "balance": Interval(0, None, closed="neither"),
    }

    def __init__(
        self,
        *,
        alpha: float = 0.1,
        beta: float = 10.0,
        mu: float = 0.2,
        kappa: float = 0.05,
        neg_scale: float = 2.0,
        gamma: float = 2.0,
        balance: float = 2.0,
    ) -> None:
        super().__init__()
        self.alpha, self.beta, self.mu = alpha, beta, mu
        self.kappa, self.neg_scale = kappa, neg_scale
        self.gamma, self.balance = gamma, balance
        # derived from the training counts in setup(), never saved
        self.register_buffer("inverse_counts", None, persistent=False)
        self.register_buffer("prior_bias", None, persistent=False)

    def setup(self, class_counts: torch.Tensor) -> None:
        n = training_counts(class_counts)
        self.inverse_counts = 1.0 / n
        if self.train_rows is not None:
            rows = float(self.train_rows)
            odds = (rows / n - 1.0).clamp(min=1.0 / rows)
            self.prior_bias = -self.kappa * torch.log(odds)

    def confidence(
        self, top_scores: torch.Tensor, log_partition: torch.Tensor
    ) -> torch.Tensor | None:
        return torch.sigmoid(top_scores)

    def forward(self, batch: FullBatch) -> torch.Tensor:
        if self.inverse_counts is None or self.prior_bias is None:
            raise RuntimeError(f"{type(self).__name__}: set train_rows, then {NOT_SET_UP}")
        logits = batch.logits
        if not batch.whole:
            raise ValueError(f"{type(self).__name__} needs the logits of every label")
        inverse = self.inverse_counts.to(logits.dtype)
        bias = self.prior_bias.to(logits.dtype)
        labels = batch.labels.long()
        ids = labels.unsqueeze(1) if labels.ndim == 1 else labels
        # Σ over the row's labels of 1/n_k, from the labels alone (∞ for a row with none)
        present = ids >= 0
        per_row = torch.where(present, inverse[ids.clamp(min=0)], 0.0).sum(dim=1, keepdim=True)
        rows, columns = logits.shape

        def term(z: torch.Tensor, t: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
            return self._terms(z, t, inverse[lo:hi], bias[lo:hi], per_row).sum(dim=1)

        if isinstance(logits, ChunkedLogits):  # each label's term, one chunk at a time
            return logits.label_sums(labels, term).sum() / (rows * columns)
        targets = multi_hot(batch.labels, columns, logits.dtype)
        return self._terms(logits, targets, inverse, bias, per_row).mean()

    def _terms(
        self,
        logits: torch.Tensor,
        targets: torch.Tensor,
        inverse: torch.Tensor,
        bias: torch.Tensor,
        per_row: torch.Tensor,
    ) -> torch.Tensor:
        """Each entry's re-balanced, negative-tolerant focal BCE, for the labels whose
        1/n and prior bias are ``inverse`` and ``bias`` (per_row: Σ_P 1/n_k, (B, 1))."""
        # w = α + σ(β (r − μ)), r = (1/n_j) / Σ_{positives} 1/n_k
        ratio = inverse / per_row
        weight = self.alpha + torch.sigmoid(self.beta * (ratio - self.mu))
        z = logits + bias
        negative = 1.0 - targets
        z = z * (negative * self.neg_scale + targets)
        weight = weight * (negative / self.neg_scale + targets)
        bce = F.binary_cross_entropy_with_logits(z, targets, reduction="none")
        # (1 − p)^γ with p = e^{−BCE}: −expm1 keeps 1 − p accurate where p is near 1
        modulator = (-torch.expm1(-bce)).pow(self.gamma) if self.gamma else 1.0
        return self.balance * weight * modulator * bce

    def extra_repr(self) -> str:
        return (
            f"alpha={self.alpha:g}, beta={self.beta:g}, mu={self.mu:g}, kappa={self.kappa:g}, "
            f"neg_scale={self.neg_scale:g}, gamma={self.gamma:g}, balance={self.balance:g}"
        )
