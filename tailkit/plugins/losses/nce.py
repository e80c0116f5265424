"""Noise-contrastive estimation with a fixed base distribution, the Bamler–Mandt NCE baseline."""

from __future__ import annotations

from typing import ClassVar, Literal

import torch
import torch.nn.functional as F

from tailkit.components import Loss, LossInput
from tailkit.validation import Constraint, Interval


class NCE(Loss):
    """NCE against the sampler's q (Gutmann & Hyvärinen 2010), as Bamler & Mandt's baseline.

    The model's score ξ is trained as the logit of a data-vs-noise classifier whose noise
    log-odds are log q(y|x). Per example, with n negatives drawn from q::

        softplus(log q_pos − ξ_pos) + (1/n) Σ_j softplus(ξ_neg_j − log q_neg_j)
          + λ [ ξ_pos² + (1/n) Σ_j ξ_neg_j² ]

    This is the reference code's form (main_model/supervised_nce_model.py) with its log
    normaliser c fixed at 0: one noise sample per data point (noise ratio 1), averaged over the
    n draws to lower the variance. Its optimum is σ(ξ − log q) = p/(p + q), i.e. ξ_y(x) =
    log p(y|x) itself (NCE self-normalises), so ξ alone is used at prediction: the paper's NCE
    "uses the base distribution only during training"; no prediction-time adjustment. The
    regulariser acts on the raw scores (λ = ``reg``, no factor ½); no gradient flows into q.

    Unlike negative sampling, NCE needs log q even for an unconditional proposal.
    ``reduction="sum"`` (the reference's) sums over the batch; ``"mean"`` divides by B.
    """

    mode = "sampled"
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

    def forward(self, batch: LossInput) -> torch.Tensor:
        pos, neg = batch.pos_logits, batch.neg_logits
        if pos is None or neg is None:
            raise ValueError("NCE needs batch.pos_logits (B,) and batch.neg_logits (B, m)")
        if batch.pos_log_q is None or batch.neg_log_q is None:
            raise ValueError("NCE needs batch.pos_log_q and batch.neg_log_q from the sampler")
        n = neg.shape[1]
        pos_lq = batch.pos_log_q.detach().to(pos)
        neg_lq = batch.neg_log_q.detach().to(neg)
        neg_terms = F.softplus(neg - neg_lq) + self.reg * neg.square()
        if self.mask_hits and batch.hits is not None:
            neg_terms = torch.where(batch.hits.to(torch.bool), 0.0, neg_terms)
        per_example = F.softplus(pos_lq - pos) + self.reg * pos.square() + neg_terms.sum(dim=1) / n
        return per_example.sum() if self.reduction == "sum" else per_example.mean()

    def extra_repr(self) -> str:
        return f"reg={self.reg:g}, reduction={self.reduction!r}, mask_hits={self.mask_hits}"
