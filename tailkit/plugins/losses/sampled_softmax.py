"""Sampled softmax with optional log-Q (importance) correction."""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import torch
from torch.autograd.function import once_differentiable

from tailkit.components import Loss, SampledBatch
from tailkit.evaluation.correction import CorrectsAtPrediction
from tailkit.plugins.losses.sampled_softmax_kernels import (
    sampled_softmax_backward,
    sampled_softmax_forward,
)
from tailkit.plugins.losses.weighting import Weighting, log_weights
from tailkit.validation import Constraint, Interval


class SampledSoftmax(CorrectsAtPrediction, Loss):
    """Sampled softmax cross-entropy over the positive and m sampled negatives.

    Per example, with positive logit f_y, negatives j = 1..m drawn from q (``neg_log_q`` is
    log q_j for one draw) and accidental hits (a negative equal to y) removed::

        ℓ = log(1 + Σ_{j not a hit} w_j · exp(f_j − f_y))
          = logsumexp([f_y, f_j + log w_j ...]) − f_y

    ``weighting`` (see :mod:`tailkit.plugins.losses.weighting` for the implicit loss of each):

    - ``"importance"``: w_j = 1 / (m q_j), i.e. negative logits become f_j − log(m q_j) (the
      log-Q correction). (1/m) Σ_j exp(f_j)/q_j is an unbiased estimate of the partition sum, so
      the loss tends to the full softmax CE as m grows (Rawat et al. 2021).
    - ``"constant"``: w_j = 1, no correction. Its implicit loss is a softmax over logits shifted
      by log(m q_j); with non-uniform q the learned scores are biased by −log q, which
      ``correct_at_prediction`` can undo (in-batch q ≈ π: an implicit logit adjustment).
    - ``"relative"``: w_{yj} = (π_j/π_y)^τ / (m q_j): the implicit loss is the logit-adjusted
      softmax with τ whatever q is (our reading of Rawat et al.'s relative weighting).
    - ``"self-normalized"``: w_j = (1/q_j) / Σ_{k∈N} 1/q_k, self-normalised importance weights.

    ``positive_correction=True`` also subtracts log(m q_y) from the positive logit (``pos_log_q``),
    as TensorFlow's ``sampled_softmax_loss`` with ``subtract_log_q`` does; it is applied whatever
    the weighting. Hits get exactly zero weight (the logit is set to −inf, not nudged by a small
    constant). log q is treated as a constant: no gradient flows into it.

    ``reduction="mean"`` divides the sum over the batch by B; ``"sum"`` does not.

    ``correct_at_prediction=True`` makes :meth:`adjust_scores` add log q(y|x) from the sampler
    to the scores at prediction time (the Bayes-optimal correction for ``"constant"``).

    float32 logits on the CPU take compiled kernels for the loss and its gradient
    (:mod:`~tailkit.plugins.losses.sampled_softmax_kernels`); float64 and CUDA take the torch
    ops of :meth:`adjusted_logits`. Both compute the same terms.
    """

    constraints: ClassVar[dict[str, Constraint]] = {"tau": Interval(0, None)}

    def __init__(
        self,
        *,
        weighting: Weighting = "importance",
        tau: float = 1.0,
        positive_correction: bool = False,
        correct_at_prediction: bool = False,
        reduction: Literal["mean", "sum"] = "mean",
    ) -> None:
        super().__init__()
        self.weighting = weighting
        self.tau = tau
        self.positive_correction = positive_correction
        self.correct_at_prediction = correct_at_prediction
        self.reduction = reduction

    def adjusted_logits(self, batch: SampledBatch) -> torch.Tensor:
        """The (B, 1 + m) logits the softmax runs over: column 0 is the positive, hits are −inf."""
        pos, neg = batch.pos_logits, batch.neg_logits
        log_m = math.log(neg.shape[1])
        owned = False  # whether `neg` is our own temporary, safe to mask in place
        # The sampler's q is a fixed proposal; as in TF, no gradient goes through it.
        log_w = log_weights(self.weighting, batch, neg, tau=self.tau)
        if log_w is not None:
            neg = neg + log_w
            owned = True
        if self.positive_correction:
            pos = pos - (batch.pos_log_q.detach().to(pos) + log_m)
        # −inf gives exp(·) == 0 exactly in every dtype and a zero gradient through
        # masked_fill; a tiny additive constant is a no-op in float32 (keras-rs #206).
        # In place when `neg` is our own temporary: one B×m allocation fewer per step
        # (the subtraction's backward does not need its output).
        hits = batch.hits.to(torch.bool)
        neg = (
            neg.masked_fill_(hits, float("-inf")) if owned else neg.masked_fill(hits, float("-inf"))
        )
        return torch.cat([pos.unsqueeze(1), neg], dim=1)

    def forward(self, batch: SampledBatch) -> torch.Tensor:
        if _compiled_path(batch):
            per_example = self._compiled(batch)
        else:
            logits = self.adjusted_logits(batch)
            # The positive column is always finite, so logsumexp never sees an all −inf row.
            per_example = torch.logsumexp(logits, dim=1) - logits[:, 0]
        return per_example.sum() if self.reduction == "sum" else per_example.mean()

    def _compiled(self, batch: SampledBatch) -> torch.Tensor:
        """Per-example losses (B,) from the compiled kernels: the same terms as
        :meth:`adjusted_logits` and ``logsumexp``, without their (B, 1 + m) temporaries."""
        pos, neg = batch.pos_logits, batch.neg_logits
        log_w = log_weights(self.weighting, batch, neg, tau=self.tau)
        if log_w is None:
            log_w = neg.new_zeros(1, neg.shape[1])
        elif log_w.dim() < 2 or log_w.shape[0] == 1:
            log_w = log_w.reshape(1, -1).expand(1, neg.shape[1])
        else:
            log_w = log_w.expand_as(neg)
        if self.positive_correction:
            pos = pos - (batch.pos_log_q.detach().to(pos) + math.log(neg.shape[1]))
        per_example: torch.Tensor = _CompiledSampledSoftmax.apply(
            pos.contiguous(),
            neg.contiguous(),
            log_w.detach().to(neg.dtype).contiguous(),
            batch.hits.to(torch.bool).contiguous(),
        )
        return per_example

    @property
    def uses_log_q(self) -> bool:
        return self.weighting != "constant"  # every other weighting divides by q

    def extra_repr(self) -> str:
        return (
            f"weighting={self.weighting!r}, tau={self.tau:g}, positive_correction={self.positive_correction}, "
            f"correct_at_prediction={self.correct_at_prediction}, reduction={self.reduction!r}"
        )


def _compiled_path(batch: SampledBatch) -> bool:
    """float32 (B, m) negatives on the CPU take the compiled kernels; float64 (the reference
    tests' precision) and CUDA take torch."""
    neg = batch.neg_logits
    return (
        neg.device.type == "cpu"
        and neg.dtype == torch.float32
        and batch.pos_logits.dtype == torch.float32
        and neg.ndim == 2
    )


class _CompiledSampledSoftmax(torch.autograd.Function):
    """ℓ_i = log(e^(p_i) + Σ_{j not a hit} e^(f_ij + w_ij)) − p_i per row (B,), from
    :mod:`~tailkit.plugins.losses.sampled_softmax_kernels`; the weights and hits are constants.
    Keeps the row log-sum-exps (B,) for the backward, not a (B, 1 + m) softmax."""

    @staticmethod
    def forward(
        ctx: Any, pos: torch.Tensor, neg: torch.Tensor, log_w: torch.Tensor, hits: torch.Tensor
    ) -> torch.Tensor:
        rows = neg.shape[0]
        lse = torch.empty(rows, dtype=torch.float64)
        loss = torch.empty(rows, dtype=torch.float32)
        sampled_softmax_forward(
            pos.numpy(), neg.numpy(), log_w.numpy(), hits.numpy(), lse.numpy(), loss.numpy()
        )
        ctx.save_for_backward(pos, neg, log_w, hits, lse)
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None, None]:
        pos, neg, log_w, hits, lse = ctx.saved_tensors
        grad_pos, grad_neg = torch.empty_like(pos), torch.empty_like(neg)
        sampled_softmax_backward(
            pos.numpy(),
            neg.numpy(),
            log_w.numpy(),
            hits.numpy(),
            lse.numpy(),
            grad.to(torch.float32).contiguous().numpy(),
            grad_pos.numpy(),
            grad_neg.numpy(),
        )
        return grad_pos, grad_neg, None, None
