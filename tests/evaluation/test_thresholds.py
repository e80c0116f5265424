"""Micro- and Macro-F1 of thresholded rankings (tailkit.evaluation.thresholds) against a hand
computed vector and scikit-learn's f1_score."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.metrics import f1_score

from tailkit.evaluation.thresholds import GRID, Thresholded, best_thresholds, f1_block

# Three rows, four labels, top 2 with probabilities. Row 0's label 2 is never ranked (a false
# negative at every threshold), row 2 has no true label, label 3 is never true.
RANKED = np.array([[0, 1], [1, 2], [3, 0]])
PROBS = np.array([[0.9, 0.4], [0.6, 0.55], [0.3, 0.2]])
TRUTH = (np.array([0, 2, 3, 3]), np.array([0, 2, 1]))  # {0, 2}, {1}, {}


@pytest.mark.parametrize(
    ("threshold", "micro", "macro"),
    [
        # predicted (0,0) TP, (1,1) TP, (1,2) FP; FN: (0,2). Labels 0, 1: F1 1; 2: 0.
        (0.5, 4 / 6, 2 / 3),
        # + (0,1) FP: label 1 has F1 2/3; micro 2·2 / (2·2 + 2 + 1)
        (0.35, 4 / 7, (1 + 2 / 3 + 0) / 3),
        # + (2,3) FP: label 3 joins the average with F1 0; micro 2·2 / (2·2 + 3 + 1)
        (0.25, 4 / 8, (1 + 2 / 3 + 0 + 0) / 4),
        # nothing predicted: only the true labels 0, 1, 2 count, each with F1 0
        (0.95, 0.0, 0.0),
    ],
)
def test_hand_computed_vector(threshold, micro, macro) -> None:
    split = Thresholded.of(RANKED, PROBS, TRUTH, 4)
    assert split.f1(threshold) == pytest.approx((micro, macro), abs=1e-12)


def _indicator(pairs: list[tuple[int, int]], rows: int, labels: int) -> np.ndarray:
    out = np.zeros((rows, labels), dtype=int)
    for i, j in pairs:
        out[i, j] = 1
    return out


@pytest.mark.parametrize("seed", range(5))
def test_multi_label_f1_equals_scikit_learn(seed: int) -> None:
    rng = np.random.default_rng(seed)
    rows, labels, k = 40, 12, 4
    ranked = np.stack([rng.permutation(labels)[:k] for _ in range(rows)])
    probs = np.sort(rng.random((rows, k)), axis=1)[:, ::-1]
    sets = [np.flatnonzero(rng.random(labels) < 0.15) for _ in range(rows)]
    indptr = np.cumsum([0] + [len(s) for s in sets])
    split = Thresholded.of(ranked, probs, (indptr, np.concatenate(sets)), labels)
    y_true = _indicator([(i, j) for i, s in enumerate(sets) for j in s], rows, labels)
    for threshold in (0.0, 0.3, 0.5, 0.8):
        picked = [
            (i, ranked[i, j]) for i in range(rows) for j in range(k) if probs[i, j] >= threshold
        ]
        y_pred = _indicator(picked, rows, labels)
        present = np.flatnonzero(y_true.any(axis=0) | y_pred.any(axis=0))
        micro, macro = split.f1(threshold)
        expected_micro = f1_score(y_true, y_pred, average="micro", zero_division=0)
        expected_macro = f1_score(y_true, y_pred, labels=present, average="macro", zero_division=0)
        assert micro == pytest.approx(expected_micro, abs=1e-12)
        assert macro == pytest.approx(expected_macro, abs=1e-12)


def test_single_label_top1_at_threshold_zero_is_scikit_learn_multiclass_f1() -> None:
    rng = np.random.default_rng(3)
    y = rng.integers(0, 9, 200)
    top1 = np.where(rng.random(200) < 0.6, y, rng.integers(0, 9, 200))
    split = Thresholded.of(top1[:, None], rng.random((200, 1)), (np.arange(201), y), 9)
    micro, macro = split.f1(0.0)
    assert micro == pytest.approx((top1 == y).mean(), abs=1e-12)  # one label per row: accuracy
    # multiclass f1_score averages over unique_labels(y_true, y_pred), as Macro-F1 does here
    assert macro == pytest.approx(f1_score(y, top1, average="macro"), abs=1e-12)


def test_the_tuned_threshold_is_the_best_on_validation_and_is_applied_to_test() -> None:
    rng = np.random.default_rng(7)
    y = rng.integers(0, 5, 300)
    right = rng.random(300) < 0.7
    top1 = np.where(right, y, (y + 1) % 5)
    # wrong answers come with low probabilities: a threshold above them helps
    probs = np.where(right, rng.uniform(0.3, 1.0, 300), rng.uniform(0.0, 0.4, 300))[:, None]
    val = Thresholded.of(top1[:, None], probs, (np.arange(301), y), 5)
    micro_t, macro_t = best_thresholds(val)
    curve = [val.f1(float(t)) for t in GRID]
    assert val.f1(micro_t)[0] == max(c[0] for c in curve)
    assert val.f1(macro_t)[1] == max(c[1] for c in curve)
    first_best = next(t for t, c in zip(GRID, curve, strict=True) if c[0] == val.f1(micro_t)[0])
    assert micro_t == first_best  # the lowest of equal thresholds
    assert 0.0 < micro_t <= 0.4
    values, used = f1_block(val, val, 0.5)
    assert used == {
        "predicted": "top-1",
        "threshold": 0.5,
        "micro_tuned": micro_t,
        "macro_tuned": macro_t,
    }
    assert values == {
        "micro_f1": val.f1(0.5)[0],
        "macro_f1": val.f1(0.5)[1],
        "micro_f1_tuned": val.f1(micro_t)[0],
        "macro_f1_tuned": val.f1(macro_t)[1],
    }
    assert "micro_f1_tuned" not in f1_block(val, None, 0.5)[0]


def test_padding_is_never_predicted() -> None:
    split = Thresholded.of(
        np.array([[2, -1]]), np.array([[0.9, 0.9]]), (np.array([0, 1]), np.array([2])), 3
    )
    assert split.f1(0.5) == (1.0, 1.0)
