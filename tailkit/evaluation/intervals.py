"""95 % intervals on every scalar test metric: a bootstrap over the test rows.

Every metric evaluate reports is a function of sums over test rows: accuracy and P@k are a
sum of per-row values over the number of rows; PSP@k a ratio of two such sums; balanced
accuracy, the many/medium/few groups, macro recall@k and Macro-F1 a mean over labels of
ratios of per-label sums; ECE a sum over confidence bins of absolute per-bin sums; coverage@k
a count of labels whose sum is positive. A bootstrap resample is a vector of row counts
(rows drawn with replacement, n of them). :class:`Resampler` draws the counts of
:data:`RESAMPLES` resamples in fixed blocks of :data:`BLOCK`; per block, the sums of every
per-row value are one matrix product (:class:`Columns`), and the per-label and per-bin sums a
gather and a segmented sum over (row, group) pairs sorted once (:class:`Grouping`; only
non-zero weights stored, and whole ones summed in float32, exact below 2^24): no loop over
rows or resamples. With every count 1 the functions give the reported values (up to summation order),
which the tests check.

The interval is the percentile bootstrap's (the 2.5th and 97.5th percentiles of the resampled
values): at the test sizes of this field (10^3–10^5 rows) its coverage is what BCa's is, and
BCa's acceleration needs a jackknife, n more evaluations. The resamples come from a
counter-based generator (Philox) keyed by :data:`SEED` and the block, the matrix product runs
on one BLAS thread and the segmented sums are sequential, so the same inputs give the same
bits on any thread count; and every
experiment scored on the same rows gets the same resamples, which is what a paired comparison
needs. A resample in which a group or label has no row leaves it out of that resample's mean,
as the metric leaves out a class absent from the test split; a metric with no value in some
resample gets its interval from the others.

What the interval covers: the sampling of the test set, given the trained model. It does not
cover the training seed's variance or another draw of the training data.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp
from threadpoolctl import ThreadpoolController

from tailkit.evaluation.metrics import propensity_gains, ranked_hits, shot_groups
from tailkit.evaluation.thresholds import Thresholded
from tailkit.groups import GroupThresholds

RESAMPLES = 1000
#: Resamples drawn and scored at once: fixed, so that the bits do not depend on the machine.
BLOCK = 50
SEED = 56
LEVEL = 0.95
#: Confidence bins of the ECE (tailkit.evaluation.metrics.expected_calibration_error).
ECE_BINS = 15

#: A metric under a block of resamples: the block's :class:`Sums` → (block,) values (NaN where
#: undefined in a resample).
Metric = Callable[["Sums"], np.ndarray]


@functools.cache
def _blas() -> ThreadpoolController:
    """The loaded BLAS libraries, inspected once: threadpool_limits reads /proc/self/maps and
    every library's symbols on each call (milliseconds, more than a block's product)."""
    return ThreadpoolController()


class Columns:
    """Per-row values whose resampled sums all come from one matrix product per block."""

    def __init__(self, num_rows: int) -> None:
        self.num_rows = num_rows
        self._values: list[np.ndarray] = []
        self._matrix: np.ndarray | None = None

    def add(self, values: np.ndarray) -> int:
        """Register a column; returns its index for :meth:`Sums.column`."""
        self._values.append(np.asarray(values, dtype=np.float64).reshape(self.num_rows))
        self._matrix = None
        return len(self._values) - 1

    @property
    def matrix(self) -> np.ndarray:
        if self._matrix is None:
            self._matrix = np.ascontiguousarray(np.stack(self._values, axis=1))
        return self._matrix


class Grouping:
    """(row, group) pairs, each resample's per-group sums of a weight on them one sparse
    product: a (groups × rows) CSR matrix of the weights by the (rows × block) counts, whose
    inner loop adds contiguous rows of the block."""

    def __init__(self, rows: np.ndarray, groups: np.ndarray, size: int, num_rows: int) -> None:
        self.rows = np.asarray(rows, dtype=np.int64)
        self.groups = np.asarray(groups, dtype=np.int64)
        self.size, self.num_rows = size, num_rows

    def weighted(self, weights: np.ndarray | None = None) -> sp.csr_matrix:
        """The (groups × rows) matrix of ``weights`` (one per pair; 1 by default), holding
        only the non-zero ones (a hit or false-positive mask is mostly zeros: stored, each
        would cost a multiply-add per resample)."""
        if weights is None:
            data, rows, groups = np.ones(self.rows.shape[0]), self.rows, self.groups
        else:
            data = np.asarray(weights, dtype=np.float64)
            kept = data != 0
            data, rows, groups = data[kept], self.rows[kept], self.groups[kept]
        # counts of rows (whole weights) are exact in float32, which halves the bytes the
        # products move; a fractional weight (ECE's gap) keeps float64
        whole = not data.size or (
            np.array_equal(data, np.round(data)) and np.abs(data).max() < 2**24
        )
        kind = np.float32 if whole else np.float64
        return sp.csr_matrix((data.astype(kind), (groups, rows)), shape=(self.size, self.num_rows))


class Sums:
    """The resampled sums of one block of resamples (``counts_t``: (rows, block), each
    resample's count of each row)."""

    def __init__(self, counts_t: np.ndarray, columns: Columns | None = None) -> None:
        # rows first: a sparse (groups × rows) product then adds contiguous rows of the block
        self.counts_t = np.ascontiguousarray(counts_t, dtype=np.float64)
        self._counts32 = self.counts_t.astype(np.float32)  # exact: counts are below 2^24
        self._columns = columns
        self._column_sums: np.ndarray | None = None
        self._gathered: dict[int, np.ndarray] = {}
        self._memo: dict[int, np.ndarray] = {}

    def column(self, index: int) -> np.ndarray:
        """(block,) sums of column ``index`` of the :class:`Columns`."""
        if self._column_sums is None:
            assert self._columns is not None
            # one BLAS thread: the GEMM's summation order, and so its bits, then do not depend
            # on the machine's thread count
            with _blas().limit(limits=1, user_api="blas"):
                self._column_sums = self._columns.matrix.T @ self.counts_t
        return self._column_sums[index]

    @property
    def rows(self) -> np.ndarray:
        return self.counts_t.sum(axis=0)

    def memo(self, key: object, compute: Callable[[], np.ndarray]) -> np.ndarray:
        """``compute()`` once per block for ``key`` (per-label recalls that several metrics
        average over different labels)."""
        found = self._memo.get(id(key))
        if found is None:
            found = self._memo[id(key)] = compute()
        return found

    def grouped(self, matrix: sp.csr_matrix) -> np.ndarray:
        """(groups, block): each resample's per-group sums, ``matrix`` from
        :meth:`Grouping.weighted` (computed once per block)."""
        key = id(matrix)
        if key not in self._gathered:
            counts = self._counts32 if matrix.dtype == np.float32 else self.counts_t
            self._gathered[key] = np.asarray(matrix @ counts, dtype=np.float64)
        return self._gathered[key]


def ratio(numerator: np.ndarray, denominator: np.ndarray) -> np.ndarray:
    """numerator / denominator, NaN where the denominator is not positive."""
    out = np.full(np.broadcast(numerator, denominator).shape, np.nan)
    np.divide(numerator, denominator, out=out, where=denominator > 0)
    return out


def mean_over(values: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
    """(columns, block) → (block,): the mean over the columns (of ``mask``) that are defined."""
    if mask is not None:
        values = values[mask]
    defined = ~np.isnan(values)
    count = defined.sum(axis=0)
    total = np.where(defined, values, 0.0).sum(axis=0)
    return np.where(count > 0, total / np.maximum(count, 1), np.nan)


class Resampler:
    """The bootstrap of ``num_rows`` test rows: :meth:`intervals` of named metrics."""

    def __init__(self, num_rows: int, resamples: int = RESAMPLES, seed: int = SEED) -> None:
        self.num_rows, self.resamples, self.seed = num_rows, resamples, seed

    def blocks(self, columns: Columns | None = None):
        """Each block's :class:`Sums`, in order; the last block may be smaller."""
        n = self.num_rows
        for start in range(0, self.resamples, BLOCK):
            size = min(BLOCK, self.resamples - start)
            rng = np.random.Generator(np.random.Philox(np.random.SeedSequence([self.seed, start])))
            draws = rng.integers(0, n, size=(size, n))
            counts_t = np.empty((n, size))
            for j in range(size):  # a bincount per resample: cheaper than one over n · size keys
                counts_t[:, j] = np.bincount(draws[j], minlength=n)
            yield Sums(counts_t, columns)

    def values(self, metrics: Metrics) -> dict[str, np.ndarray]:
        """Each metric's value in every resample, (resamples,)."""
        out: dict[str, list[np.ndarray]] = {name: [] for name in metrics.named}
        for sums in self.blocks(metrics.columns):
            for name, metric in metrics.named.items():
                out[name].append(np.asarray(metric(sums), dtype=np.float64))
        return {name: np.concatenate(parts) for name, parts in out.items()}

    def intervals(self, metrics: Metrics) -> dict[str, list[float] | None]:
        """``{name: [low, high]}``: the percentile interval at :data:`LEVEL`; None where the
        metric is undefined in every resample."""
        out: dict[str, list[float] | None] = {}
        for name, values in self.values(metrics).items():
            found = percentile_interval(values)
            out[name] = None if found is None else list(found)
        return out


def percentile_interval(values: np.ndarray) -> tuple[float, float] | None:
    """The 2.5th and 97.5th percentiles (at :data:`LEVEL`) of resampled ``values``, NaN
    entries (resamples where the metric is undefined) left out; None when all are NaN."""
    defined = values[~np.isnan(values)]
    if not defined.size:
        return None
    tail = (1.0 - LEVEL) / 2
    low, high = np.quantile(defined, [tail, 1.0 - tail])
    return float(low), float(high)


class Metrics:
    """Named metrics over one set of test rows, with the per-row columns they share."""

    def __init__(self, num_rows: int) -> None:
        self.columns = Columns(num_rows)
        self.named: dict[str, Metric] = {}
        self._ones = self.columns.add(np.ones(num_rows))

    def mean(self, values: np.ndarray) -> Metric:
        """The resampled mean of a per-row value."""
        index, ones = self.columns.add(values), self._ones
        return lambda s: s.column(index) / s.column(ones)

    def ratio(self, numerator: np.ndarray, denominator: np.ndarray) -> Metric:
        """The resampled ratio of two per-row sums."""
        top, bottom = self.columns.add(numerator), self.columns.add(denominator)
        return lambda s: ratio(s.column(top), s.column(bottom))


def _mean_of_group(recall: Metric, mask: np.ndarray) -> Metric:
    """The mean of the per-label ``recall`` over the labels of one many/medium/few group."""
    return lambda s: mean_over(recall(s), mask)


def _ece(metrics: Metrics, correct: np.ndarray, confidence: np.ndarray) -> Metric:
    """ECE (tailkit.evaluation.metrics.expected_calibration_error): per-bin sums of
    correct − confidence."""
    confidence = np.clip(np.asarray(confidence, dtype=np.float64), 0.0, 1.0)
    which = np.minimum((confidence * ECE_BINS).astype(np.int64), ECE_BINS - 1)
    n = confidence.shape[0]
    gap = Grouping(np.arange(n), which, ECE_BINS, n).weighted(
        np.asarray(correct, dtype=np.float64) - confidence
    )
    ones = metrics.columns.add(np.ones(confidence.shape[0]))
    return lambda s: np.abs(s.grouped(gap)).sum(axis=0) / s.column(ones)


def f1_metrics(
    metrics: Metrics,
    test: Thresholded,
    truth: tuple[np.ndarray, np.ndarray],
    thresholds: dict[str, Any],
) -> None:
    """The F1 entries of the test block (tailkit.evaluation.thresholds.f1_block), at the
    thresholds it used; ``truth`` the rows' true labels as a CSR pair (indptr, indices)."""
    n = test.ranked.shape[0]
    true_rows = np.repeat(np.arange(n), np.diff(truth[0]))
    true_labels = np.asarray(truth[1], dtype=np.int64)
    valid = test.ranked >= 0
    rank_rows = np.broadcast_to(np.arange(n)[:, None], test.ranked.shape)[valid]
    rank_labels = test.ranked[valid]
    used = np.unique(np.concatenate([true_labels, rank_labels]))
    size = used.shape[0]
    true = Grouping(true_rows, np.searchsorted(used, true_labels), size, n).weighted()
    ranked_groups = Grouping(rank_rows, np.searchsorted(used, rank_labels), size, n)
    hits, probabilities = test.hits[valid], test.probabilities[valid]

    weighted: dict[float, tuple[sp.csr_matrix, sp.csr_matrix]] = {}

    def f1(threshold: float, which: str) -> Metric:
        if threshold not in weighted:  # micro and macro at one threshold share their sums
            predicted = probabilities >= threshold
            weighted[threshold] = (
                ranked_groups.weighted(predicted & hits),
                ranked_groups.weighted(predicted & ~hits),
            )
        tp_w, fp_w = weighted[threshold]

        def metric(s: Sums) -> np.ndarray:
            tp, fp = s.grouped(tp_w), s.grouped(fp_w)
            denominator = tp + fp + s.grouped(true)  # 2 TP + FP + FN, FN = true − TP
            if which == "micro":
                total = denominator.sum(axis=0)
                return np.where(total > 0, 2 * tp.sum(axis=0) / np.maximum(total, 1), 0.0)
            return np.nan_to_num(mean_over(ratio(2 * tp, denominator)), nan=0.0)

        return metric

    metrics.named["micro_f1"] = f1(thresholds["threshold"], "micro")
    metrics.named["macro_f1"] = f1(thresholds["threshold"], "macro")
    if "micro_tuned" in thresholds:
        metrics.named["micro_f1_tuned"] = f1(thresholds["micro_tuned"], "micro")
        metrics.named["macro_f1_tuned"] = f1(thresholds["macro_tuned"], "macro")


def single_label_metrics(
    metrics: Metrics,
    ranked: np.ndarray,
    labels: np.ndarray,
    train_counts: np.ndarray,
    log_likelihood: np.ndarray | None,
    confidence: np.ndarray | None,
    groups: GroupThresholds,
) -> None:
    """The ``test`` block of single-label rows (tailkit.evaluation.metrics)."""
    n = labels.shape[0]
    labels = np.asarray(labels, dtype=np.int64)
    correct = ranked[:, 0] == labels
    present, local = np.unique(labels, return_inverse=True)
    classes = Grouping(np.arange(n), local, present.shape[0], n)
    support, hit_w = classes.weighted(), classes.weighted(correct)

    def recall(s: Sums) -> np.ndarray:
        return s.memo(hit_w, lambda: ratio(s.grouped(hit_w), s.grouped(support)))

    named = metrics.named
    named["accuracy"] = metrics.mean(correct)
    named["top5_accuracy"] = metrics.mean((ranked[:, :5] == labels[:, None]).any(axis=1))
    named["balanced_accuracy"] = lambda s: mean_over(recall(s))
    for group, mask in shot_groups(train_counts, groups).items():
        named[group] = _mean_of_group(recall, mask[present])
    if log_likelihood is not None:
        named["log_likelihood"] = metrics.mean(log_likelihood)
    if confidence is not None:
        named["ece"] = _ece(metrics, correct, confidence)


def multilabel_metrics(
    metrics: Metrics,
    ranked: np.ndarray,
    truth: tuple[np.ndarray, np.ndarray],
    train_counts: np.ndarray,
    inv_propensity: np.ndarray,
    confidence: np.ndarray | None,
    groups: GroupThresholds,
    ks: tuple[int, ...],
    test_block: bool = True,
) -> None:
    """The ``ranking`` metrics (tailkit.evaluation.metrics.ranking_metrics), keyed
    ``ranking.<name>``, and with ``test_block`` the ``test`` block of multi-label rows."""
    ranked = np.asarray(ranked, dtype=np.int64)
    n, width = ranked.shape
    indptr, indices = truth
    sizes = np.diff(indptr)
    rows = np.repeat(np.arange(n), sizes)
    hits = ranked_hits(ranked, (indptr, indices), train_counts.shape[0])
    discount = 1.0 / np.log2(np.arange(2, width + 2))
    ideal = np.cumsum(discount)
    gains, best_top = propensity_gains(ranked, hits, (indptr, indices), inv_propensity)
    # labels renumbered to the true ones that occur (a hit is a true label): no C columns
    present, local = np.unique(indices, return_inverse=True)
    support = Grouping(rows, local, present.shape[0], n).weighted()
    hit_rows, hit_ranks = np.nonzero(hits)
    hit_groups = Grouping(
        hit_rows, np.searchsorted(present, ranked[hit_rows, hit_ranks]), present.shape[0], n
    )
    found_pairs = hit_groups.weighted()
    named = metrics.named
    for k in ks:
        found = hits[:, :k].sum(axis=1)
        norm = ideal[np.clip(np.minimum(k, sizes) - 1, 0, None)]
        dcg = (hits[:, :k] * discount[:k]).sum(axis=1)
        named[f"ranking.P@{k}"] = metrics.mean(found / k)
        named[f"ranking.nDCG@{k}"] = metrics.mean(dcg / norm)
        named[f"ranking.R@{k}"] = metrics.mean(found / np.maximum(sizes, 1))
        named[f"ranking.RP@{k}"] = metrics.mean(found / np.maximum(np.minimum(sizes, k), 1))
        within = hit_groups.weighted(hit_ranks < k)

        def coverage(s: Sums, within=within) -> np.ndarray:
            true = (s.grouped(support) > 0).sum(axis=0).astype(np.float64)
            return ratio((s.grouped(within) > 0).sum(axis=0).astype(np.float64), true)

        named[f"ranking.coverage@{k}"] = coverage
        named[f"ranking.PSP@{k}"] = metrics.ratio(
            gains[:, :k].sum(axis=1), best_top[:, :k].sum(axis=1)
        )
        ps_dcg = (gains[:, :k] * discount[:k]).sum(axis=1) / norm
        ideal_dcg = (best_top[:, :k] * discount[:k]).sum(axis=1) / norm
        named[f"ranking.PSnDCG@{k}"] = metrics.ratio(ps_dcg, ideal_dcg)
        if test_block:
            named[f"P@{k}"], named[f"PSP@{k}"] = named[f"ranking.P@{k}"], named[f"ranking.PSP@{k}"]
    if not test_block:
        return

    def recall(s: Sums) -> np.ndarray:  # tailkit.evaluation.metrics.label_recall
        return s.memo(found_pairs, lambda: ratio(s.grouped(found_pairs), s.grouped(support)))

    named[f"macro_recall@{width}"] = lambda s: mean_over(recall(s))
    for group, mask in shot_groups(train_counts, groups).items():
        named[group] = _mean_of_group(recall, mask[present])
    if confidence is not None:
        named["ece"] = _ece(metrics, hits[:, 0], confidence)


def metric_set(
    ranked: np.ndarray,
    probabilities: np.ndarray | None,
    log_likelihood: np.ndarray | None,
    truth: tuple[np.ndarray, np.ndarray],
    single: bool,
    train_counts: np.ndarray,
    inv_propensity: np.ndarray,
    groups: GroupThresholds,
    f1_thresholds: dict[str, Any] | None,
) -> Metrics:
    """Every scalar of evaluate's ``test`` and ``ranking`` blocks (``ranking.<name>``) as
    resampleable metrics, from each test row's ranking (N, k; −1 pads), the probabilities of
    the ranked labels and the true label's log-likelihood (None where the model gives none),
    the true labels as a CSR pair and the F1 thresholds evaluate chose (None: no F1)."""
    ks = tuple(k for k in (1, 3, 5) if k <= ranked.shape[1])
    confidence = None if probabilities is None else probabilities[:, 0]
    chosen = Metrics(len(truth[0]) - 1)
    multilabel_metrics(
        chosen, ranked, truth, train_counts, inv_propensity, confidence, groups, ks, not single
    )
    if single:
        single_label_metrics(
            chosen, ranked, truth[1], train_counts, log_likelihood, confidence, groups
        )
    if f1_thresholds is not None and probabilities is not None:
        width = 1 if single else ranked.shape[1]
        thresholded = Thresholded.of(
            ranked[:, :width], probabilities[:, :width], truth, len(train_counts)
        )
        f1_metrics(chosen, thresholded, truth, f1_thresholds)
    return chosen
