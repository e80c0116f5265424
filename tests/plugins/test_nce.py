"""The NCE baseline of Bamler & Mandt: against an independent formula, gradients, its optimum."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest
import torch
from test_losses import SEEDS, SHAPES, np_softplus, random_sampled, to_input

from tailkit.components import Sampler
from tailkit.evaluation.correction import PredictionContext
from tailkit.plugins.losses.nce import NCE


def np_nce(pos, neg, pos_log_q, neg_log_q, hits, *, reg, mask_hits, reduction) -> float:
    b, n = neg.shape
    log_q = np.broadcast_to(neg_log_q, (b, n))
    per = []
    for i in range(b):
        value = np_softplus(pos_log_q[i] - pos[i]) + reg * pos[i] ** 2
        for j in range(n):
            if mask_hits and hits[i, j]:
                continue
            value += (np_softplus(neg[i, j] - log_q[i, j]) + reg * neg[i, j] ** 2) / n
        per.append(value)
    return float(np.sum(per) if reduction == "sum" else np.mean(per))


@pytest.mark.parametrize("mask_hits", [False, True])
@pytest.mark.parametrize("shared", [True, False])
def test_nce_matches_numpy(mask_hits: bool, shared: bool) -> None:
    for seed, (b, m), reduction, reg in itertools.product(
        SEEDS, SHAPES, ["sum", "mean"], [0.0, 1e-3, 0.5]
    ):
        arrays = random_sampled(seed, b, m, shared=shared, with_hits=True)
        loss = NCE(reg=reg, reduction=reduction, mask_hits=mask_hits)
        expected = np_nce(**arrays, reg=reg, mask_hits=mask_hits, reduction=reduction)
        got = loss(to_input(arrays, conditional=True)).item()
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-12)


def test_nce_uses_log_q_even_for_an_unconditional_sampler() -> None:
    arrays = random_sampled(3, 4, 6, shared=True, with_hits=False)
    a = NCE()(to_input(arrays, conditional=False)).item()
    b = NCE()(to_input(arrays, conditional=True)).item()
    assert a == b


def test_gradcheck_nce() -> None:
    arrays = random_sampled(2, 4, 5, shared=False, with_hits=True)
    batch = to_input(arrays, conditional=True, requires_grad=True)
    loss = NCE(reg=0.3)

    def f(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
        return loss(replace(batch, pos_logits=pos, neg_logits=neg))

    assert torch.autograd.gradcheck(f, (batch.pos_logits, batch.neg_logits))


def test_nce_optimum_is_the_data_log_probability() -> None:
    """With one input, labels ~ p and noise ~ q, the population minimiser of the (unregularised)
    loss is ξ_y = log p_y: NCE self-normalises, which is why no prediction-time correction."""
    p = torch.tensor([0.6, 0.25, 0.1, 0.05], dtype=torch.float64)
    q = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    xi = torch.zeros(4, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([xi], max_iter=200, tolerance_grad=1e-12, tolerance_change=1e-15)

    def expected_loss() -> torch.Tensor:
        # E_{y~p}[softplus(log q_y − ξ_y)] + E_{y'~q}[softplus(ξ_y' − log q_y')]
        data = (p * torch.nn.functional.softplus(q.log() - xi)).sum()
        noise = (q * torch.nn.functional.softplus(xi - q.log())).sum()
        return data + noise

    def closure() -> torch.Tensor:
        opt.zero_grad()
        value = expected_loss()
        value.backward()
        return value

    opt.step(closure)
    torch.testing.assert_close(xi.detach(), p.log(), atol=1e-6, rtol=0)
    assert not NCE().adjusts_scores


def test_nce_corrects_at_prediction_only_when_asked() -> None:
    class Fixed(Sampler):
        conditional = True

        def log_prob(self, x, labels):
            return torch.full((x.shape[0], labels.shape[-1]), -2.0)

    scores = torch.zeros(3, 4)
    ctx = PredictionContext(log_prior=torch.zeros(4), sampler=Fixed())
    x, ids = torch.zeros(3, 2), torch.arange(4)
    assert torch.equal(NCE().adjust_scores(scores, x, ids, ctx), scores)
    corrected = NCE(correct_at_prediction=True)
    assert corrected.adjusts_scores
    assert torch.equal(corrected.adjust_scores(scores, x, ids, ctx), torch.full((3, 4), -2.0))
