"""The weights w of a sampled loss's negatives (Rawat et al., ICML 2021), as log w.

A sampled loss draws m negatives N from a proposal q and weights each one:
sampled softmax log[1 + Σ_{j∈N} w_{yj} e^{f_j − f_y}], sampled decoupled
φ(f_y) + Σ_{j∈N} w_{yj} ϕ(−f_j). Its expectation over N is an *implicit loss* in which label
y' carries the factor m·q_{y'}·w_{yy'} (algorithms.md §2.2). The choices:

``importance``  w = 1/(m q_j): the factor is 1, the implicit loss is the full loss (unbiased
                in the limit; Jensen makes the sampled softmax under-estimate it for small m).
``constant``    w = 1: the factor is m q_{y'}. Uniform q only rescales the loss; in-batch
                q ≈ π adds log(m π_{y'}) to every negative logit, an implicit logit adjustment on
                the negative side that helps the tail.
``relative``    w_{yy'} = (π_{y'}/π_y)^τ / (m q_j): importance weights times the pairwise
                label-relative margin ρ_{yy'} = (π_{y'}/π_y)^τ, so the implicit loss is the
                logit-adjusted loss whatever q is: sampling bias removed, labelling bias
                handled explicitly. This is our reading of Rawat et al.'s "relative weighting":
                the review in seeds/000 writes the weights as w_{yy'}, depending on the positive
                as well as the negative, and the paper's stated aim is one loss that tackles the
                sampling bias and the labelling bias at once. The paper body was not available
                to us (algorithms.md §2.2, §14 item 1).
``self-normalized``  w_j = (1/q_j) / Σ_{k∈N} (1/q_k) over the non-hit draws: the other
                reading of §2.2 (self-normalised importance sampling). Its implicit loss is the
                full softmax with every negative shifted by −log(C − 1): the ranking of the full
                loss, on a smaller scale.

Weights depend only on q, π and the labels: they carry no gradient.
"""

from __future__ import annotations

import math
from typing import Literal

import torch

from tailkit.components import SampledBatch

Weighting = Literal["importance", "constant", "relative", "self-normalized"]
WEIGHTINGS: tuple[str, ...] = ("importance", "constant", "relative", "self-normalized")


def log_weights(
    weighting: Weighting,
    batch: SampledBatch,
    neg: torch.Tensor,
    *,
    tau: float = 1.0,
) -> torch.Tensor | None:
    """log w for the negatives of ``batch``, broadcastable to ``neg`` (B, m); None for constant.

    ``neg`` is the (B, m) negative-logit tensor (for its shape, dtype and device).
    """
    if weighting == "constant":
        return None
    log_q = batch.neg_log_q.detach().to(neg)
    m = neg.shape[1]
    if weighting == "importance":
        return -(log_q + math.log(m))
    if weighting == "self-normalized":
        inverse = (-log_q).expand_as(neg).masked_fill(batch.hits.to(torch.bool), float("-inf"))
        # A row whose draws are all hits has no weights to normalise; its terms are masked anyway.
        norm = torch.logsumexp(inverse, dim=1, keepdim=True).clamp_min(torch.finfo(neg.dtype).min)
        return inverse - norm
    if weighting == "relative":
        log_pi = batch.log_prior.detach().to(neg)
        log_w = -(log_q + math.log(m))
        if tau == 0:  # 0·(−inf) would be NaN for a label with no training row
            return log_w
        margin = log_pi[batch.neg_ids] - log_pi[batch.labels].unsqueeze(1)
        return tau * margin + log_w
    raise ValueError(f"unknown weighting {weighting!r}; expected one of {', '.join(WEIGHTINGS)}")
