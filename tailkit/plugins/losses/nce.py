"""Noise-contrastive estimation with a fixed base distribution, the Bamler–Mandt NCE baseline."""

from __future__ import annotations

from typing import Literal

import torch
import torch.nn.functional as F

from tailkit.components import SampledBatch
from tailkit.evaluation.correction import CorrectsAtPrediction
from tailkit.plugins.losses.negative_sampling import NegativeSampling


class NCE(CorrectsAtPrediction, NegativeSampling):
    """NCE against the sampler's q (Gutmann & Hyvärinen 2010), as Bamler & Mandt's baseline.

    The model's score ξ is trained as the logit of a data-vs-noise classifier whose noise
    log-odds are log q(y|x). Per example, with n negatives drawn from q::

        softplus(log q_pos − ξ_pos) + (1/n) Σ_j softplus(ξ_neg_j − log q_neg_j)
          + λ [ ξ_pos² + (1/n) Σ_j ξ_neg_j² ]

    This is the reference code's form (main_model/supervised_nce_model.py) with its log
    normaliser c fixed at 0: one noise sample per data point (noise ratio 1), averaged over the
    n draws to lower the variance. Its optimum is σ(ξ − log q) = p/(p + q), i.e. ξ_y(x) =
    log p(y|x) itself (NCE self-normalises), so ξ alone is used at prediction: the paper's NCE
    "uses the base distribution only during training" (``correct_at_prediction=False``).

    The catch with a conditional q such as the tree: a label that q never proposes near x and
    that is not x's label gets no gradient there, so its score stays at its initial value
    (≈ 0), above the log p < 0 of every trained label, and top-1 accuracy collapses. The
    reference code as wired (train.py maps ``supervised_nce`` to the negative-sampling model
    class) adds log p_n(y|x) at evaluation, which hides this; ``correct_at_prediction=True``
    reproduces that behaviour. The
    regulariser acts on the raw scores (λ = ``reg``, no factor ½); no gradient flows into q.

    Unlike negative sampling, NCE needs log q even for an unconditional proposal.
    ``reduction="sum"`` (the reference's) sums over the batch; ``"mean"`` divides by B.
    """

    def __init__(
        self,
        *,
        reg: float = 1e-3,
        reduction: Literal["sum", "mean"] = "sum",
        mask_hits: bool = True,
        correct_at_prediction: bool = False,
    ) -> None:
        super().__init__(reg=reg, reduction=reduction, mask_hits=mask_hits)
        self.correct_at_prediction = correct_at_prediction

    def log_q(self, batch: SampledBatch, pos: torch.Tensor, neg: torch.Tensor):
        """NCE needs log q whether or not the sampler is conditional."""
        return batch.pos_log_q.detach().to(pos), batch.neg_log_q.detach().to(neg)

    def terms(self, pos, neg, pos_lq, neg_lq) -> tuple[torch.Tensor, torch.Tensor]:
        pos_term = F.softplus(pos_lq - pos) + self.reg * pos.square()
        return pos_term, F.softplus(neg - neg_lq) + self.reg * neg.square()

    def extra_repr(self) -> str:
        return (
            f"reg={self.reg:g}, reduction={self.reduction!r}, mask_hits={self.mask_hits}, "
            f"correct_at_prediction={self.correct_at_prediction}"
        )
