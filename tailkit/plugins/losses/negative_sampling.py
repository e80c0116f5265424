"""Bamler & Mandt (ICLR 2020) binary negative-sampling loss with the bias-corrected regulariser."""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
import torch.nn.functional as F

from tailkit.components import Loss, SampledBatch, ScoreContext
from tailkit.validation import Constraint, Interval


class NegativeSampling(Loss):
    """Binary negative-sampling loss of Bamler & Mandt (2020), as in their reference code.

    Per example, with positive score ξ_pos, n sampled negatives ξ_neg_j and lp = log p_n::

        softplus(−ξ_pos) + (1/n) Σ_j softplus(ξ_neg_j)
          + λ [ (ξ_pos + lp_pos)² + (1/n) Σ_j (ξ_neg_j + lp_neg_j)² ]

    λ (``reg``) multiplies the plain square: there is no factor 1/2. The log normaliser c of the
    paper is 0, as in the reference code. lp is ``pos_log_q`` / ``neg_log_q`` when the sampler is
    conditional (``batch.sampler_conditional``) and 0 otherwise, matching the reference's
    uniform and frequency baselines; no gradient flows into lp.

    ``mask_hits=True``: a negative equal to the row's label contributes zero to both the
    likelihood and the regulariser; the average still divides by n.

    ``reduction="sum"`` (the reference's choice) sums over the batch; ``"mean"`` divides by B.

    At prediction :meth:`adjust_scores` removes the sampling bias, ξ + log p_n(y|x) (for an
    unconditional sampler log q(y); a constant for uniform q).
    """

    constraints: ClassVar[dict[str, Constraint]] = {"reg": Interval(0, None)}

    def __init__(
        self,
        *,
        reg: float = 1e-3,
        reduction: Literal["sum", "mean"] = "sum",
        mask_hits: bool = True,
    ) -> None:
        super().__init__()
        self.reg = reg
        self.reduction = reduction
        self.mask_hits = mask_hits

    def forward(self, batch: SampledBatch) -> torch.Tensor:
        pos, neg = batch.pos_logits, batch.neg_logits
        pos_term, neg_terms = self.terms(pos, neg, *self.log_q(batch, pos, neg))
        if self.mask_hits:
            # Selecting instead of multiplying by a 0/1 mask keeps a hit's term exactly zero
            # even if it overflowed to inf.
            neg_terms = torch.where(batch.hits.to(torch.bool), 0.0, neg_terms)
        per_example = pos_term + neg_terms.sum(dim=1) / neg.shape[1]
        return per_example.sum() if self.reduction == "sum" else per_example.mean()

    def log_q(self, batch: SampledBatch, pos: torch.Tensor, neg: torch.Tensor):
        """lp of the positive and the negatives: log q when the sampler is conditional, else 0
        (the reference's uniform and frequency baselines). Never a gradient into q."""
        if not batch.sampler_conditional:
            return 0.0, 0.0
        # p_n is a fixed auxiliary model here; the main loss must not train it.
        return batch.pos_log_q.detach().to(pos), batch.neg_log_q.detach().to(neg)

    def terms(self, pos, neg, pos_lq, neg_lq) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-example positive terms (B,) and per-negative terms (B, m), before masking."""
        pos_term = F.softplus(-pos) + self.reg * (pos + pos_lq).square()
        return pos_term, F.softplus(neg) + self.reg * (neg + neg_lq).square()

    def adjust_scores(
        self,
        scores: torch.Tensor,
        x: torch.Tensor,
        label_ids: torch.Tensor,
        ctx: ScoreContext,
    ) -> torch.Tensor:
        return ctx.add_log_q(scores, x, label_ids)

    @property
    def adjusts_scores(self) -> bool:
        return True

    @property
    def uses_log_q(self) -> bool:
        return True  # + log q at prediction (and NCE's noise log-odds in training)

    def extra_repr(self) -> str:
        return f"reg={self.reg:g}, reduction={self.reduction!r}, mask_hits={self.mask_hits}"
