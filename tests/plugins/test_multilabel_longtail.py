"""Logit adjustment and balanced softmax on multi-label rows: the pick-all-labels reduction
(PAL-N) of the adjusted logits, checked against a float64 numpy implementation written from
the formula, by gradient check, and against the single-label and unadjusted cases."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tailkit.plugins.losses.logit_adjusted import BalancedSoftmax, LogitAdjusted
from tailkit.plugins.losses.softmax import SoftmaxCE
from tailkit.testing.batches import full_batch

C = 7
COUNTS = torch.tensor([50.0, 20, 9, 5, 3, 2, 1], dtype=torch.float64)
# three rows: two labels, one label, none (padded with -1)
LABELS = torch.tensor([[0, 4, -1], [6, -1, -1], [-1, -1, -1]])


def _numpy_pal_n(logits: np.ndarray, labels: np.ndarray, offsets: np.ndarray) -> float:
    """mean over rows of (1/|P|) Σ_{j∈P} (log Σ_l exp(f_l + o_l) − f_j − o_j); 0 for no P."""
    total = 0.0
    for f, row in zip(logits, labels, strict=True):
        s = f + offsets
        lse = np.log(np.sum(np.exp(s - s.max()))) + s.max()
        positives = [j for j in row if j >= 0]
        if positives:
            total += sum(lse - s[j] for j in positives) / len(positives)
    return total / len(logits)


def _logits(dtype=torch.float64) -> torch.Tensor:
    return torch.randn(3, C, generator=torch.Generator().manual_seed(3), dtype=dtype) * 2


@pytest.mark.parametrize("tau", [0.5, 1.0, 2.0])
def test_logit_adjusted_pal_n_matches_numpy(tau):
    loss = LogitAdjusted(tau=tau)
    loss.setup(COUNTS)
    logits = _logits()
    pi = COUNTS.numpy() / COUNTS.numpy().sum()
    expected = _numpy_pal_n(logits.numpy(), LABELS.numpy(), np.log(pi**tau + 1e-12))
    got = loss(full_batch(logits=logits, labels=LABELS)).item()
    assert got == pytest.approx(expected, rel=1e-12)


def test_balanced_softmax_pal_n_matches_numpy_and_skips_unseen_labels():
    counts = COUNTS.clone()
    counts[5] = 0  # no training pair: log n = -inf, never a target, no softmax mass
    loss = BalancedSoftmax()
    loss.setup(counts)
    logits = _logits()
    with np.errstate(divide="ignore"):
        offsets = np.log(counts.numpy())
    expected = _numpy_pal_n(logits.numpy(), LABELS.numpy(), offsets)
    value = loss(full_batch(logits=logits.requires_grad_(), labels=LABELS))
    assert value.item() == pytest.approx(expected, rel=1e-12)
    value.backward()
    assert torch.isfinite(logits.grad).all() and torch.all(logits.grad[:, 5] == 0)


def test_pal_n_gradients_check():
    for loss in (LogitAdjusted(tau=1.0), BalancedSoftmax()):
        loss.setup(COUNTS)
        logits = _logits().requires_grad_()
        torch.autograd.gradcheck(
            lambda z, loss=loss: loss(full_batch(logits=z, labels=LABELS)), (logits,)
        )


def test_tau_zero_is_softmax_pal_n_and_one_label_rows_are_single_label():
    la = LogitAdjusted(tau=0.0)
    la.setup(COUNTS)
    logits = _logits()
    # τ = 0: every offset is log(1 + 1e-12), a constant shift: PAL-N of the raw logits
    softmax = SoftmaxCE()(full_batch(logits=logits, labels=LABELS))
    assert la(full_batch(logits=logits, labels=LABELS)).item() == pytest.approx(softmax.item())
    la = LogitAdjusted(tau=1.0)
    la.setup(COUNTS)
    single = torch.tensor([2, 6, 0])
    one_each = la(full_batch(logits=logits, labels=single.unsqueeze(1)))
    assert one_each.item() == pytest.approx(la(full_batch(logits=logits, labels=single)).item())


def test_posthoc_trains_plain_pal_n():
    la = LogitAdjusted(tau=1.0, adjustment="posthoc")
    la.setup(COUNTS)
    logits = _logits()
    softmax = SoftmaxCE()(full_batch(logits=logits, labels=LABELS))
    assert la(full_batch(logits=logits, labels=LABELS)).item() == softmax.item()
    assert la.multilabel and BalancedSoftmax.multilabel
