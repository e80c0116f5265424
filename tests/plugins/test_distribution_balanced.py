"""The distribution-balanced loss against an independent float64 implementation of Wu et al.'s
formulas, written entry by entry in numpy, and its gradient by finite differences."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from tailkit.components import FullBatch
from tailkit.plugins.losses.distribution_balanced import DistributionBalanced

COUNTS = np.array([40.0, 12.0, 5.0, 2.0, 1.0, 0.0])  # a zero count is treated as 1
ROWS = 45
LABEL_SETS = [[0], [0, 2], [1, 3, 4], [], [5], [0, 1]]  # one row without a positive


def _reference(z: np.ndarray, sets, counts, rows, a, b, mu, kappa, lam, gamma, bal) -> float:
    n = np.maximum(counts, 1.0)
    total = 0.0
    for i, positives in enumerate(sets):
        repeat = sum(1.0 / n[k] for k in positives)
        for j in range(z.shape[1]):
            t = 1.0 if j in positives else 0.0
            r = math.inf if repeat == 0 else (1.0 / n[j]) / repeat
            w = a + 1.0 / (1.0 + math.exp(-b * (r - mu))) if r != math.inf else a + 1.0
            nu = -kappa * math.log(max(rows / n[j] - 1.0, 1.0 / rows))
            logit = z[i, j] + nu
            if t == 0.0:
                logit, w = lam * logit, w / lam
            p = 1.0 / (1.0 + math.exp(-logit)) if t else 1.0 / (1.0 + math.exp(logit))
            bce = -math.log(p)
            total += bal * w * (1.0 - p) ** gamma * bce
    return total / z.size


def _padded(sets) -> torch.Tensor:
    width = max(len(s) for s in sets)
    return torch.tensor([s + [-1] * (width - len(s)) for s in sets], dtype=torch.int64)


def _loss(**options) -> DistributionBalanced:
    loss = DistributionBalanced(**options)
    loss.train_rows = ROWS
    loss.setup(torch.as_tensor(COUNTS))
    return loss


def _batch(z: torch.Tensor, labels: torch.Tensor) -> FullBatch:
    return FullBatch(
        labels=labels,
        logits=z,
        num_classes=z.shape[1],
        log_prior=torch.zeros(z.shape[1]),
        embeddings=z,
    )


PAPER = {"alpha": 0.1, "beta": 10.0, "mu": 0.2, "kappa": 0.05, "neg_scale": 2.0, "gamma": 2.0,
         "balance": 2.0}  # fmt: skip
SETTINGS = [
    {},  # the paper's defaults
    {"alpha": 0.0, "beta": 3.0, "mu": 0.5, "kappa": 0.2, "neg_scale": 5.0, "gamma": 0.5, "balance": 1.0},
    {"kappa": 0.0, "neg_scale": 1.0, "gamma": 0.0, "balance": 1.0},  # weighted BCE
]  # fmt: skip


@pytest.mark.parametrize("options", SETTINGS)
def test_matches_the_formulas_entry_by_entry(options):
    z = np.random.default_rng(0).normal(scale=3.0, size=(len(LABEL_SETS), COUNTS.size))
    loss = _loss(**options)
    got = loss(_batch(torch.tensor(z), _padded(LABEL_SETS))).item()
    full = {**PAPER, **options}
    want = _reference(
        z, LABEL_SETS, COUNTS, ROWS, full["alpha"], full["beta"], full["mu"], full["kappa"],
        full["neg_scale"], full["gamma"], full["balance"],
    )  # fmt: skip
    assert got == pytest.approx(want, rel=1e-12)
    z32 = loss(_batch(torch.tensor(z, dtype=torch.float32), _padded(LABEL_SETS))).item()
    assert z32 == pytest.approx(want, rel=1e-5)


def test_gradient_matches_finite_differences():
    z = torch.randn(len(LABEL_SETS), COUNTS.size, dtype=torch.float64, requires_grad=True)
    loss = _loss(gamma=1.5)
    labels = _padded(LABEL_SETS)
    assert torch.autograd.gradcheck(lambda x: loss(_batch(x, labels)), (z,))


def test_one_label_a_row_is_the_one_hot_case():
    z = torch.randn(4, COUNTS.size, dtype=torch.float64)
    loss = _loss()
    single = loss(_batch(z, torch.tensor([0, 2, 2, 5])))
    padded = loss(_batch(z, torch.tensor([[0], [2], [2], [5]])))
    assert single.item() == padded.item()


def test_without_n_it_refuses_to_train():
    loss = DistributionBalanced()
    loss.setup(torch.as_tensor(COUNTS))  # evaluation's setup: no train_rows, no loss needed
    with pytest.raises(RuntimeError, match="train_rows"):
        loss(_batch(torch.zeros(1, COUNTS.size), torch.tensor([0])))
