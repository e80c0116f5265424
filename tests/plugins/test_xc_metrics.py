"""Extreme Classification ranking metrics against the worked vector of datasets-metrics.md §2.3
and an independent per-row loop written from the pyxclib definitions (§2.1, §2.2)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tailkit.evaluation.metrics import (
    inverse_propensity,
    ranking_metrics,
    topk_labels,
)
from tailkit.plugins.datasets.xc import PROPENSITY_CONSTANTS

SCORES = np.array(
    [
        [0.9, 0.8, 0.1, 0, 0, 0],
        [0.2, 0.7, 0, 0, 0, 0.6],
        [0.5, 0, 0, 0.4, 0.3, 0],
        [0.1, 0.2, 0.3, 0, 0, 0],
    ]
)
TRUE = [[0, 2], [1, 5], [3], []]
EXPECTED = {  # §2.3, k = 1, 2, 3
    "P": [0.5, 0.5, 0.4167],
    "nDCG": [0.5, 0.5610, 0.6377],
    "R": [0.25, 0.625, 0.75],
    # R-precision, by hand: hits in the top k over min(k, |y|), a label-less row 0
    "RP": [0.5, 0.625, 0.75],
    "PSP": [0.5096, 0.8035, 1.0],
    "PSnDCG": [0.5096, 0.7084, 0.8045],
    "coverage": [0.4, 0.8, 1.0],
}


def test_worked_vector():
    q = inverse_propensity(np.array([8, 6, 3, 1, 1, 1]), 10, 0.55, 1.5)
    assert q.tolist() == pytest.approx([1.6251, 1.7119, 1.9428, 2.3026, 2.3026, 2.3026], abs=1e-4)
    got = ranking_metrics(topk_labels(SCORES, 3), TRUE, 6, ks=(1, 2, 3), inv_propensity=q)
    for name, values in EXPECTED.items():
        assert [got[f"{name}@{k}"] for k in (1, 2, 3)] == pytest.approx(values, abs=5e-5), name


def test_inverse_propensity_checks_from_the_reference():
    n = 15539  # EURLex-4K, A = 0.55, B = 1.5
    q = inverse_propensity(np.array([1, 0, 10, 1000]), n, *PROPENSITY_CONSTANTS["EURLex-4K"])
    assert q.tolist() == pytest.approx([9.6511, 12.4575, 4.7373, 1.3203], abs=1e-4)
    assert q[0] == pytest.approx(math.log(n), rel=1e-12)  # a label seen once: ln N exactly
    with pytest.raises(ValueError, match="num_train"):
        inverse_propensity(np.array([1]), 0)


def test_ties_go_to_the_lower_label_id():
    scores = np.array([[0.5, 0.7, 0.7, 0.5, 0.7]])
    assert topk_labels(scores, 4).tolist() == [[1, 2, 4, 0]]


def loop_metrics(ranked, true, q, k):
    """pyxclib's definitions, one row at a time."""
    n = len(true)
    p = nd = r = ps_num = ps_den = psn_num = psn_den = 0.0
    covered, present = set(), set()
    for row, labels in zip(ranked, true, strict=True):
        labels = set(labels)
        present |= labels
        top = [int(v) for v in row[:k]]
        hit = [v >= 0 and v in labels for v in top]
        p += sum(hit) / k
        r += sum(hit) / max(len(labels), 1)
        dcg = sum(h / math.log2(j + 2) for j, h in enumerate(hit))
        idcg = sum(1 / math.log2(j + 2) for j in range(min(k, len(labels)))) or 1.0
        nd += dcg / idcg
        covered |= {v for v, h in zip(top, hit, strict=True) if h}
        gains = [q[v] if h else 0.0 for v, h in zip(top, hit, strict=True)]
        best = sorted((q[v] for v in labels), reverse=True)[:k]
        ps_num += sum(gains) / k
        ps_den += sum(best) / k
        psn_num += sum(g / math.log2(j + 2) for j, g in enumerate(gains)) / idcg
        psn_den += sum(g / math.log2(j + 2) for j, g in enumerate(best)) / idcg
    return {
        f"P@{k}": p / n,
        f"nDCG@{k}": nd / n,
        f"R@{k}": r / n,
        f"coverage@{k}": len(covered) / len(present) if present else 0.0,
        f"PSP@{k}": ps_num / ps_den,
        f"PSnDCG@{k}": psn_num / psn_den,
    }


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_against_a_per_row_loop(seed):
    rng = np.random.default_rng(seed)
    n, labels, width = 60, 25, 7
    true = [rng.choice(labels, rng.integers(0, 6), replace=False).tolist() for _ in range(n)]
    # Coarse scores make plenty of ties; some rows have fewer than `width` predictions.
    ranked = topk_labels(rng.integers(0, 4, (n, labels)).astype(float), width)
    ranked[rng.random(n) < 0.2, 4:] = -1
    counts = rng.integers(0, 50, labels)
    q = inverse_propensity(counts, 500)
    got = ranking_metrics(ranked, true, labels, ks=(1, 3, 5, 7), inv_propensity=q)
    for k in (1, 3, 5, 7):
        for name, value in loop_metrics(ranked, true, q, k).items():
            assert got[name] == pytest.approx(value, rel=1e-12, abs=1e-12), name


def test_csr_truth_equals_lists_and_single_label_p_at_1_is_accuracy():
    rng = np.random.default_rng(5)
    y = rng.integers(0, 10, 40)
    scores = rng.normal(size=(40, 10))
    ranked = topk_labels(scores, 5)
    from_lists = ranking_metrics(ranked, [[v] for v in y], 10)
    csr = (np.arange(41), y)
    assert ranking_metrics(ranked, csr, 10) == from_lists
    accuracy = float((scores.argmax(1) == y).mean())
    assert from_lists["P@1"] == pytest.approx(accuracy) == from_lists["R@1"]
    top5 = float((ranked == y[:, None]).any(1).mean())
    assert from_lists["R@5"] == pytest.approx(top5)
    assert from_lists["P@5"] == pytest.approx(top5 / 5)


def test_rows_without_labels_count_as_zero():
    ranked = np.array([[0, 1], [1, 0]])
    full = ranking_metrics(ranked, [[0], []], 2, ks=(1, 2))
    assert full["P@1"] == 0.5 and full["nDCG@2"] == 0.5 and full["R@2"] == 0.5
    empty = ranking_metrics(ranked, [[], []], 2, ks=(1, 2))
    assert empty["P@2"] == 0.0 and empty["coverage@2"] == 0.0


def test_bad_shapes_are_reported():
    with pytest.raises(ValueError, match="rows of true labels"):
        ranking_metrics(np.zeros((3, 2), dtype=int), [[0], [1]], 2, ks=(1,))
    with pytest.raises(ValueError, match="k = 5"):
        ranking_metrics(np.zeros((2, 2), dtype=int), [[0], [1]], 2, ks=(5,))
