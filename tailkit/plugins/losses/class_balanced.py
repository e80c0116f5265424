"""Class-balanced loss of Cui et al. (CVPR 2019): effective-number weights on softmax, sigmoid or
sigmoid focal losses, as in the authors' TensorFlow code (richardaecn/class-balanced-loss)."""

from __future__ import annotations

import math
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F

from tailkit.components import FullBatch, Loss
from tailkit.distributed.chunked_logits import ChunkedLogits
from tailkit.plugins.losses.cast_tables import table_like
from tailkit.plugins.losses.fused_binary import binary_row_losses
from tailkit.plugins.losses.fused_softmax import batch_cross_entropy
from tailkit.plugins.losses.targets import multi_hot
from tailkit.validation import Constraint, Interval

NOT_SET_UP = "call setup(class_counts) first: the per-class tables are built there"


def training_counts(counts: torch.Tensor | list[float], name: str = "class_counts") -> torch.Tensor:
    """``counts`` as a float64 (C,) tensor, checked to be finite and ≥ 0, with every zero
    replaced by 1.

    A class absent from the training split never appears as a target, so what it gets does not
    enter a training loss; treating its count as 1 (a rare class) keeps every margin and weight
    finite, where n = 0 would give an infinite margin n^{-1/4} and a 0/0 weight.
    """
    n = torch.as_tensor(counts, dtype=torch.float64)
    if n.ndim != 1 or n.numel() == 0:
        raise ValueError(f"{name} must be a non-empty 1-D tensor; got shape {tuple(n.shape)}")
    if not bool(torch.isfinite(n).all()) or bool((n < 0).any()):
        raise ValueError(f"{name} must be finite and non-negative; got {n.tolist()}")
    return n.clamp(min=1.0)


def class_balanced_weights(counts: torch.Tensor | list[float], beta: float) -> torch.Tensor:
    """Effective-number weights w_j = (1 − β)/(1 − β^{n_j}), normalised so that Σ_j w_j = C.

    Returns float64 (C,) on the device of ``counts``. β = 0 gives all ones; β → 1 approaches
    inverse frequency. A zero count is treated as 1 (see :func:`training_counts`).
    """
    if not 0.0 <= beta < 1.0:
        raise ValueError(f"beta must be in [0, 1); got {beta!r}")
    n = training_counts(counts)
    log_beta = torch.tensor(beta, dtype=torch.float64, device=n.device).log()
    # 1 − β^n as −expm1(n log β): exact for β near 1, where 1 − β^n would cancel; log 0 = −inf
    # makes β = 0 come out as 1 − 0 = 1 for every n ≥ 1.
    w = (1.0 - beta) / -torch.expm1(n * log_beta)
    return w * (n.numel() / w.sum())


class ClassBalancedLoss(Loss):
    """Class-balanced loss of Cui et al. (2019), with the reductions of their TensorFlow code.

    Each example i is weighted by α_i = w_{y_i}, w_j = (1 − β)/(1 − β^{n_j}) normalised to
    Σ_j w_j = C (:func:`class_balanced_weights`, built once in :meth:`setup`). On logits z (B, C)
    and one-hot targets t_ic = [c = y_i]:

    * ``softmax``: (1/B) Σ_i α_i CE_i, with CE_i = log Σ_j exp(z_ij) − z_{i y_i};
    * ``sigmoid``: (1/B) Σ_{i,c} α_i BCE(z_ic, t_ic), BCE(z, t) = softplus(z) − t·z;
    * ``focal``: (1/B) Σ_{i,c} α_i M_ic BCE(z_ic, t_ic), M = (1 − p_t)^γ, p_t = σ(z) for
      t = 1 and 1 − σ(z) for t = 0.

    ``reduction="mean"`` is the *batch* mean above (TensorFlow's sum over non-zero weights,
    which is B when every α_i > 0), not PyTorch's weighted mean Σ α_i ℓ_i / Σ α_i that LDAM-DRW
    uses; ``"sum"`` drops the 1/B.

    The modulator is computed as M = exp(−γ softplus(ζz)), ζ = 2t − 1, which equals (1 − p_t)^γ
    for every z; the reference's exp(−γtz − γ log1p(e^{−z})) becomes 0 instead of ≈ 1 when
    t = 1 and z < −88 in float32. γ = 0 gives M = 1 exactly (the sigmoid loss).

    The sigmoid and focal variants start the output bias at −log(C − 1), so σ(b) = 1/C (the
    reference's last-layer init), and report σ(score) as a label's confidence.

    Multi-label rows (``batch.labels`` (B, k), −1 padded; sigmoid and focal only) take the
    per-label form Wu et al. (ECCV 2020) give the class-balanced baseline (their
    ``CB_mode='by_class'``): every entry of column c weighted by w_c,
    (1/B) Σ_{i,c} w_c M_ic BCE(z_ic, t_ic) with t the row's 0/1 label set. The softmax variant
    takes one label per row.
    """

    multilabel = True  # the sigmoid and focal variants; __init__ says so per instance

    constraints: ClassVar[dict[str, Constraint]] = {
        "beta": Interval(0, 1, closed="left"),
        "gamma": Interval(0, None),
    }

    def __init__(
        self,
        *,
        loss_type: Literal["softmax", "sigmoid", "focal"] = "focal",
        beta: float = 0.9999,
        gamma: float = 1.0,
        reduction: Literal["mean", "sum"] = "mean",
    ) -> None:
        super().__init__()
        self.loss_type = loss_type
        self.beta = beta
        self.gamma = gamma
        self.reduction = reduction
        # Derived from the training counts in setup(), never saved: a checkpoint loaded after
        # setup() must not overwrite them with another split's tables.
        self.register_buffer("class_weights", None, persistent=False)
        # the sigmoid and focal row sums are not reduced over a label shard (yet)
        self.shardable = loss_type == "softmax"
        # softmax: batch_cross_entropy, weighted per row; sigmoid and focal: per-label sums
        self.chunkable = True
        self.multilabel = loss_type != "softmax"

    def setup(self, class_counts: torch.Tensor) -> None:
        self.class_weights = class_balanced_weights(class_counts, self.beta)

    def initial_bias(self, num_classes: int) -> float:
        if self.loss_type == "softmax" or num_classes < 2:
            # One class has no negatives to calibrate against; −log 0 would be +inf.
            return 0.0
        return -math.log(num_classes - 1)

    def confidence(
        self, top_scores: torch.Tensor, log_partition: torch.Tensor
    ) -> torch.Tensor | None:
        if self.loss_type == "softmax":
            return super().confidence(top_scores, log_partition)
        return torch.sigmoid(top_scores)

    def forward(self, batch: FullBatch) -> torch.Tensor:
        logits = batch.logits
        if self.class_weights is None:
            raise RuntimeError(f"{type(self).__name__}: {NOT_SET_UP}")
        if batch.num_classes != self.class_weights.numel():
            raise ValueError(
                f"{type(self).__name__}: logits have {batch.num_classes} classes but setup() "
                f"saw counts for {self.class_weights.numel()}"
            )
        labels = batch.labels.long()
        if isinstance(logits, ChunkedLogits) and self.loss_type != "softmax":
            return self._chunked(logits, labels)
        if labels.ndim == 2:
            return self._label_sets(logits, labels)
        alpha = table_like(self, "class_weights", logits)[labels]
        if self.loss_type == "softmax":
            per_example = batch_cross_entropy(batch)
        else:
            # t = 0: BCE = softplus(z), M = σ(z)^γ; t = 1: BCE = softplus(−z), M = e^{−γ sp(z)}.
            gamma = self.gamma if self.loss_type == "focal" else 0.0
            # What the reduction below sends each row, formed as autograd forms it (the
            # quotient's 1 / B, then × α_i), so that the kernels write the gradient at once.
            step = torch.ones((), dtype=alpha.dtype, device=alpha.device)
            if self.reduction == "mean":
                step = step / labels.numel()
            per_example = binary_row_losses(logits, labels, gamma, expected_grad=step * alpha)
        total = (alpha * per_example).sum()
        return total if self.reduction == "sum" else total / labels.numel()

    def _chunked(self, logits: ChunkedLogits, labels: torch.Tensor) -> torch.Tensor:
        """The sigmoid and focal forms on chunked logits, one chunk of labels at a time: the
        per-row weight α_{y_i} with one label a row, the per-label w_c with label lists."""
        weights = table_like(self, "class_weights", logits.z)
        gamma = self.gamma if self.loss_type == "focal" else 0.0
        by_label = labels.ndim == 2

        def term(z: torch.Tensor, t: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
            bce = F.binary_cross_entropy_with_logits(z, t, reduction="none")
            if gamma:
                bce = bce * torch.exp(-gamma * F.softplus((2.0 * t - 1.0) * z))
            return (bce * weights[lo:hi]).sum(dim=1) if by_label else bce.sum(dim=1)

        per_row = logits.label_sums(labels, term)
        total = per_row.sum() if by_label else (weights[labels] * per_row).sum()
        return total if self.reduction == "sum" else total / labels.shape[0]

    def _label_sets(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The per-label form for rows of several labels (class docstring)."""
        if self.loss_type == "softmax":
            raise ValueError("cb-focal with loss_type softmax takes one label per row")
        targets = multi_hot(labels, logits.shape[1], logits.dtype)
        bce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
        if self.loss_type == "focal" and self.gamma:
            # M = exp(−γ softplus(ζ z)), ζ = 2t − 1: (1 − p_t)^γ without underflow to 0
            bce = bce * torch.exp(-self.gamma * F.softplus((2.0 * targets - 1.0) * logits))
        weighted = bce * table_like(self, "class_weights", logits)
        total = weighted.sum()
        return total if self.reduction == "sum" else total / labels.shape[0]

    def extra_repr(self) -> str:
        out = f"loss_type={self.loss_type!r}, beta={self.beta:g}"
        if self.loss_type == "focal":
            out += f", gamma={self.gamma:g}"
        return out + f", reduction={self.reduction!r}"
