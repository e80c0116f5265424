"""tailkit/evaluation/intervals.py: every resampled metric is the reported one when each row
counts once; the intervals match closed forms and cover the truth as often as they claim; the
same inputs give the same bits."""

from __future__ import annotations

import numpy as np
import pytest

from tailkit.evaluation import intervals
from tailkit.evaluation.metrics import (
    classification_metrics,
    expected_calibration_error,
    label_recall,
    ranking_metrics,
    shot_groups,
)
from tailkit.evaluation.thresholds import Thresholded, f1_block
from tailkit.groups import GroupThresholds

GROUPS = GroupThresholds(many_above=30, few_below=8)


def once(chosen, name):
    """The metric with every row counted once: the reported value."""
    sums = intervals.Sums(np.ones((chosen.columns.num_rows, 1)), chosen.columns)
    return float(chosen.named[name](sums)[0])


def built(builder, n, *args):
    chosen = intervals.Metrics(n)
    builder(chosen, *args)
    return chosen


def single_label_case(seed=0, n=600, classes=50, k=5):
    rng = np.random.default_rng(seed)
    train_counts = rng.integers(1, 80, classes)
    labels = rng.integers(0, classes, n)
    scores = rng.normal(size=(n, classes)) + 2.5 * np.eye(classes)[labels]
    ranked = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    probs = np.exp(scores) / np.exp(scores).sum(axis=1, keepdims=True)
    top_probs = np.take_along_axis(probs, ranked, axis=1)
    ll = np.log(probs[np.arange(n), labels])
    return labels, ranked, top_probs, ll, train_counts


def test_single_label_metrics_once_are_the_reported_ones():
    labels, ranked, top_probs, ll, counts = single_label_case()
    n = len(labels)
    chosen = built(
        intervals.single_label_metrics, n, ranked, labels, counts, ll, top_probs[:, 0], GROUPS
    )
    reported = classification_metrics(labels, ranked, ll, counts, GROUPS)
    reported["ece"] = expected_calibration_error(top_probs[:, 0], ranked[:, 0] == labels)
    assert set(chosen.named) == {*reported} - {
        "rows",
        "many_classes",
        "medium_classes",
        "few_classes",
    }
    for name in chosen.named:
        assert once(chosen, name) == pytest.approx(reported[name], rel=1e-12, abs=1e-12), name


def test_ranking_and_f1_once_are_the_reported_ones():
    labels, ranked, top_probs, _, counts = single_label_case(seed=1)
    n, num_labels = len(labels), len(counts)
    truth = (np.arange(n + 1), labels)
    q = 1.0 + np.random.default_rng(2).random(num_labels)
    chosen = built(
        intervals.multilabel_metrics, n, ranked, truth, counts, q, None, GROUPS, (1, 3, 5), False
    )
    reported = ranking_metrics(ranked, truth, num_labels, (1, 3, 5), q)
    assert set(chosen.named) == {f"ranking.{key}" for key in reported}
    for key, value in reported.items():
        assert once(chosen, f"ranking.{key}") == pytest.approx(value, rel=1e-12), key
    test = Thresholded.of(ranked[:, :1], top_probs[:, :1], truth, num_labels)
    val = Thresholded.of(ranked[:, :1], top_probs[:, :1] ** 1.1, truth, num_labels)
    values, used = f1_block(test, val, 0.5)
    chosen = built(intervals.f1_metrics, n, test, truth, used)
    assert set(chosen.named) == set(values)
    for name in chosen.named:
        assert once(chosen, name) == pytest.approx(values[name], rel=1e-12), name


def test_multilabel_metrics_once_are_the_reported_ones():
    rng = np.random.default_rng(3)
    n, num_labels, k = 400, 60, 5
    sizes = rng.integers(1, 4, n)
    indptr = np.concatenate([[0], np.cumsum(sizes)])
    indices = np.concatenate([rng.choice(num_labels, s, replace=False) for s in sizes])
    ranked = np.stack([rng.permutation(num_labels)[:k] for _ in range(n)])
    counts = rng.integers(1, 60, num_labels)
    confidence = rng.random(n)
    chosen = built(
        intervals.multilabel_metrics,
        n,
        ranked,
        (indptr, indices),
        counts,
        np.ones(num_labels),
        confidence,
        GROUPS,
        (1, 3, 5),
    )
    recall, support = label_recall(ranked, (indptr, indices), num_labels)
    present = support > 0
    assert once(chosen, f"macro_recall@{k}") == pytest.approx(recall[present].mean(), 1e-12)
    for group, mask in shot_groups(counts, GROUPS).items():
        assert once(chosen, group) == pytest.approx(recall[mask & present].mean(), 1e-12)
    correct = np.array([ranked[i, 0] in indices[indptr[i] : indptr[i + 1]] for i in range(n)])
    assert correct.any()
    assert once(chosen, "ece") == pytest.approx(
        expected_calibration_error(confidence, correct), 1e-12
    )


def test_the_accuracy_interval_is_the_binomial_one():
    rng = np.random.default_rng(4)
    n, p = 5000, 0.8
    labels = np.zeros(n, dtype=np.int64)
    ranked = np.where(rng.random(n) < p, 0, 1)[:, None]
    chosen = built(
        intervals.single_label_metrics, n, ranked, labels, np.array([50, 50]), None, None, GROUPS
    )
    low, high = intervals.Resampler(n).intervals(chosen)["accuracy"]
    observed = (ranked[:, 0] == 0).mean()
    half = 1.959964 * np.sqrt(observed * (1 - observed) / n)
    assert (high - low) / 2 == pytest.approx(half, rel=0.1)
    assert low < observed < high


def test_the_balanced_accuracy_interval_is_the_delta_methods():
    rng = np.random.default_rng(5)
    classes = 40
    support = rng.integers(20, 200, classes)
    labels = np.repeat(np.arange(classes), support)
    recall_true = rng.uniform(0.3, 0.95, classes)
    correct = rng.random(labels.size) < recall_true[labels]
    ranked = np.where(correct, labels, (labels + 1) % classes)[:, None]
    chosen = built(
        intervals.single_label_metrics,
        labels.size,
        ranked,
        labels,
        np.full(classes, 50),
        None,
        None,
        GROUPS,
    )
    low, high = intervals.Resampler(labels.size).intervals(chosen)["balanced_accuracy"]
    r = np.bincount(labels, weights=correct) / support
    half = 1.959964 * np.sqrt((r * (1 - r) / support).sum()) / classes
    assert (high - low) / 2 == pytest.approx(half, rel=0.15)


def test_the_intervals_cover_the_truth_as_often_as_they_claim():
    """200 test sets drawn from one model of known accuracy: the 95 % interval holds it in
    between 90 % and 99 % of them (a binomial 200-draw band around 95 %)."""
    rng = np.random.default_rng(6)
    n, p, covered = 400, 0.7, 0
    for _ in range(200):
        ranked = np.where(rng.random(n) < p, 0, 1)[:, None]
        chosen = built(
            intervals.single_label_metrics,
            n,
            ranked,
            np.zeros(n, dtype=np.int64),
            np.array([50, 50]),
            None,
            None,
            GROUPS,
        )
        low, high = intervals.Resampler(n, resamples=300).intervals(chosen)["accuracy"]
        covered += low <= p <= high
    assert 0.90 <= covered / 200 <= 0.99


def test_the_same_inputs_give_the_same_bits_and_a_group_absent_everywhere_is_none():
    labels, ranked, top_probs, ll, counts = single_label_case(seed=7)
    counts = np.full_like(counts, 5)  # every class few: many and medium have no class
    chosen = built(
        intervals.single_label_metrics,
        len(labels),
        ranked,
        labels,
        counts,
        ll,
        top_probs[:, 0],
        GROUPS,
    )
    first = intervals.Resampler(len(labels)).intervals(chosen)
    assert first == intervals.Resampler(len(labels)).intervals(chosen)
    assert first["many"] is None and first["medium"] is None
    assert first["few"] == first["balanced_accuracy"]


def test_the_counts_are_poisson_one_to_within_the_tables_resolution():
    from scipy.stats import poisson

    table = intervals._POISSON_1
    assert table.shape == (2**16,) and table.dtype == np.uint8
    shares = np.bincount(table, minlength=12) / 2**16
    assert np.abs(shares - poisson.pmf(np.arange(12), 1.0)).max() <= 2**-16
    counts = next(intervals.Resampler(20_000).blocks()).counts_t
    assert counts.shape == (20_000, intervals.BLOCK)
    assert counts.mean() == pytest.approx(1.0, abs=0.01)
    assert counts.var() == pytest.approx(1.0, abs=0.02)


def test_a_mean_over_one_row_labels_stays_on_its_value_and_keeps_their_noise():
    """2,000 one-row labels right 30 % of the time beside 500 labels of 40 rows right 90 %:
    resampling rows would leave a third of the one-row labels out of each resample and lift
    the mean to about 0.47, above an interval around the value 0.42. The interval is the
    value's, with the half-width of the unbiased variance of the labels of several rows and
    the pooled one of the one-row labels."""
    rng = np.random.default_rng(8)
    singles, heads, rows_each = 2000, 500, 40
    labels = np.r_[np.arange(singles), np.repeat(np.arange(singles, singles + heads), rows_each)]
    correct = rng.random(labels.size) < np.where(labels < singles, 0.3, 0.9)
    ranked = np.where(correct, labels, labels + 1)[:, None]
    chosen = built(
        intervals.single_label_metrics,
        labels.size,
        ranked,
        labels,
        np.full(singles + heads + 1, 50),
        None,
        None,
        GROUPS,
    )
    value = once(chosen, "balanced_accuracy")
    low, high = intervals.Resampler(labels.size).intervals(chosen)["balanced_accuracy"]
    assert low < value < high
    rate = np.bincount(labels, weights=correct) / np.bincount(labels)
    single = rate[:singles].mean()
    head = rate[singles:]
    variance = (
        singles * single * (1 - single) * singles / (singles - 1)
        + (head * (1 - head) / (rows_each - 1)).sum()
    ) / (singles + heads) ** 2
    assert (high - low) / 2 == pytest.approx(1.959964 * np.sqrt(variance), rel=0.1)


def test_a_mean_over_labels_of_few_rows_covers_its_truth():
    """200 test sets of 300 labels with one to four rows each (true recalls 0.2–0.9): the
    balanced accuracy's interval holds the mean true recall in 90–99 % of them."""
    rng = np.random.default_rng(9)
    classes, covered = 300, 0
    recall = rng.uniform(0.2, 0.9, classes)
    for _ in range(200):
        labels = np.repeat(np.arange(classes), rng.integers(1, 5, classes))
        correct = rng.random(labels.size) < recall[labels]
        chosen = built(
            intervals.single_label_metrics,
            labels.size,
            np.where(correct, labels, (labels + 1) % classes)[:, None],
            labels,
            np.full(classes, 50),
            None,
            None,
            GROUPS,
        )
        found = intervals.Resampler(labels.size, resamples=300).intervals(chosen)
        low, high = found["balanced_accuracy"]
        covered += low <= recall.mean() <= high
    assert 0.90 <= covered / 200 <= 0.99
