"""95 % intervals on every scalar test metric: a bootstrap over the test rows.

Every metric evaluate reports is a function of sums over test rows: accuracy and P@k are a
sum of per-row values over the number of rows; PSP@k a ratio of two such sums; ECE a sum over
confidence bins of absolute per-bin sums; coverage@k a count of labels whose sum is positive;
Macro-F1 a mean over labels of ratios of per-label sums; balanced accuracy, the
many/medium/few groups and macro recall@k a mean over labels of per-label hit rates (below).
A bootstrap resample is a vector of row counts. :class:`Resampler` draws the counts of
:data:`RESAMPLES` resamples in fixed blocks of :data:`BLOCK`; per block, the sums of every
per-row value are one matrix product (:class:`Columns`), and the per-label and per-bin sums a
sparse product over (row, group) pairs (:class:`Grouping`; only non-zero weights stored, and
whole ones summed in float32, exact below 2^24): no loop over rows or resamples. With every
count 1 the functions give the reported values (up to summation order), which the tests check.

The counts are Poisson(1) draws, one per row and resample (the Poisson bootstrap; Hanley and
MacGibbon 2006, Chamandy et al. 2012): for the statistics here it has the multinomial
bootstrap's limit, every metric is a ratio that does not need the resample to hold exactly n
rows, and a count is a table lookup of 16 random bits (its distribution is Poisson(1) to
within 2^-16 a value) where drawing n row indices and counting them cost three times as much.

The interval is the percentile bootstrap's (the 2.5th and 97.5th percentiles of the resampled
values): at the test sizes of this field (10^3–10^5 rows) its coverage is what BCa's is, and
BCa's acceleration needs a jackknife, n more evaluations. The counts come from a counter-based
generator (Philox) keyed by :data:`SEED` and the block, the matrix product runs on one BLAS
thread and the sparse products are sequential, so the same inputs give the same bits on any
thread count; and every experiment scored on the same rows gets the same resamples, which is
what a paired comparison needs. A metric with no value in some resample gets its interval from
the others.

A mean over labels of per-label hit rates (:meth:`Metrics.label_mean`) is resampled through
its linear expansion, holding each label's test rows: the value plus the resample's mean of a
per-row residual (each row's hit minus its label's rate, weighted 1/(L n_c), scaled by
√(n_c/(n_c − 1)) so that its variance is the unbiased Σ_c r_c(1 − r_c)/n_c / L²). A one-row
label's own rate tells nothing of its noise: the one-row labels of the set are centred on
their common rate, the tightest bound the rows allow, and a lone one on 1/2, the widest.
Resampling the rows themselves would leave a third of the one-row labels out of each resample,
and the labels that stay (more rows, usually higher recall) pull the mean up: at 10^6 labels
an interval lay wholly above its value. Resampling rows within each label would give a
one-row label no variance at all.

What the interval covers: the sampling of the test set, given the trained model and its test
rows' labels. It does not cover the training seed's variance or another draw of the training
data.
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


def _poisson_table() -> np.ndarray:
    """Poisson(1) counts by 16-bit draw: value k for the draws below 2^16 · P(X ≤ k)."""
    cumulative = np.cumsum(np.exp(-1.0) / np.cumprod(np.r_[1.0, np.arange(1.0, 20.0)]))
    bounds = np.round(cumulative * 2**16)
    return np.searchsorted(bounds, np.arange(2**16), side="right").astype(np.uint8)


_POISSON_1 = _poisson_table()

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
        self._index: dict[bytes, int] = {}
        self._matrix: np.ndarray | None = None

    def add(self, values: np.ndarray) -> int:
        """Register a column; returns its index for :meth:`Sums.column`. A column equal to
        one registered before gets that one's index (on single-label rows P@1, R@1, nDCG@1
        and accuracy are one column): the product's cost is its number of columns."""
        column = np.ascontiguousarray(values, dtype=np.float64).reshape(self.num_rows)
        key = column.tobytes()
        found = self._index.get(key)
        if found is None:
            found = self._index[key] = len(self._values)
            self._values.append(column)
            self._matrix = None
        return found

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
        self._counts32 = np.ascontiguousarray(counts_t, dtype=np.float32)  # exact below 2^24
        self._columns = columns
        self._column_sums: np.ndarray | None = None
        self._gathered: dict[int, np.ndarray] = {}

    def column(self, index: int) -> np.ndarray:
        """(block,) sums of column ``index`` of the :class:`Columns`."""
        if self._column_sums is None:
            assert self._columns is not None
            # one BLAS thread: the GEMM's summation order, and so its bits, then do not depend
            # on the machine's thread count
            with _blas().limit(limits=1, user_api="blas"):
                self._column_sums = self._columns.matrix.T @ self.counts_t
        return self._column_sums[index]

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


def mean_over(values: np.ndarray) -> np.ndarray:
    """(columns, block) → (block,): the mean over the columns that are defined."""
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
            bits = np.random.Philox(np.random.SeedSequence([self.seed, start]))
            words = bits.random_raw(-(-size * n // 4)).view(np.uint16)[: size * n]
            # drawn row-major as (rows, block): the layout the products read, no transpose
            yield Sums(_POISSON_1[words].reshape(n, size), columns)

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

    def label_mean(
        self,
        rows: np.ndarray,
        labels: np.ndarray,
        values: np.ndarray,
        kept: np.ndarray | None,
        change: bool = False,
    ) -> Metric:
        """The resampled mean over labels of each label's mean value: (row, label) pairs with
        ``labels`` numbered 0…L−1, each pair's value (1 where the label was found, 0 where
        not; with ``change`` a paired change, +1, −1 or 0) and the labels that count
        (``kept``, by label number; None: all) — through its linear expansion (module
        docstring). NaN in every resample when no kept label has a row."""
        labels = np.asarray(labels, dtype=np.int64)
        values = np.asarray(values, dtype=np.float64)
        size = int(labels.max()) + 1 if labels.size else 0
        support = np.bincount(labels, minlength=size)
        rate = np.bincount(labels, weights=values, minlength=size) / np.maximum(support, 1)
        chosen = support > 0 if kept is None else (support > 0) & np.asarray(kept, dtype=bool)
        if not chosen.any():
            return lambda s: np.full(s.counts_t.shape[1], np.nan)
        value = float(rate[chosen].mean())
        center = rate.copy()
        scale = np.sqrt(support / np.maximum(support - 1, 1))
        single = chosen & (support == 1)
        singles = int(single.sum())
        if singles > 1:
            center[single] = rate[single].mean()
            scale[single] = np.sqrt(singles / (singles - 1))
        else:  # a lone one-row label: a rate's widest noise, r(1 − r) ≤ 1/4; a change's, δ²
            center[single], scale[single] = (0.0 if change else 0.5), 1.0
        weight = np.where(chosen, scale / (chosen.sum() * np.maximum(support, 1)), 0.0)
        residual = weight[labels] * (values - center[labels])
        index = self.columns.add(
            np.bincount(rows, weights=residual, minlength=self.columns.num_rows)
        )
        ones, n = self._ones, self.columns.num_rows
        low = -1.0 if change else 0.0
        return lambda s: np.clip(value + n * s.column(index) / s.column(ones), low, 1.0)


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
    true_count = metrics.columns.add(np.diff(truth[0]))

    def micro(threshold: float) -> Metric:
        """2 TP / (2 TP + FP + FN) of sums over all labels: sums of per-row counts."""
        predicted = probabilities >= threshold
        row_counts = [
            np.bincount(rank_rows, weights=mask, minlength=n)
            for mask in (predicted & hits, predicted & ~hits)
        ]
        tp, fp = (metrics.columns.add(count) for count in row_counts)

        def metric(s: Sums) -> np.ndarray:
            total = s.column(tp) + s.column(fp) + s.column(true_count)
            return np.where(total > 0, 2 * s.column(tp) / np.maximum(total, 1), 0.0)

        return metric

    def macro(threshold: float) -> Metric:
        if threshold not in weighted:
            predicted = probabilities >= threshold
            weighted[threshold] = (
                ranked_groups.weighted(predicted & hits),
                ranked_groups.weighted(predicted & ~hits),
            )
        tp_w, fp_w = weighted[threshold]

        def metric(s: Sums) -> np.ndarray:
            tp, fp = s.grouped(tp_w), s.grouped(fp_w)
            denominator = tp + fp + s.grouped(true)  # 2 TP + FP + FN, FN = true − TP
            return np.nan_to_num(mean_over(ratio(2 * tp, denominator)), nan=0.0)

        return metric

    metrics.named["micro_f1"] = micro(thresholds["threshold"])
    metrics.named["macro_f1"] = macro(thresholds["threshold"])
    if "micro_tuned" in thresholds:
        metrics.named["micro_f1_tuned"] = micro(thresholds["micro_tuned"])
        metrics.named["macro_f1_tuned"] = macro(thresholds["macro_tuned"])


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
    rows = np.arange(n)
    named = metrics.named
    named["accuracy"] = metrics.mean(correct)
    named["top5_accuracy"] = metrics.mean((ranked[:, :5] == labels[:, None]).any(axis=1))
    named["balanced_accuracy"] = metrics.label_mean(rows, local, correct, None)
    for group, mask in shot_groups(train_counts, groups).items():
        named[group] = metrics.label_mean(rows, local, correct, mask[present])
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

    # tailkit.evaluation.metrics.label_recall: a true label is found when ranked
    ranked_true = (ranked[rows] == np.asarray(indices, dtype=np.int64)[:, None]).any(axis=1)
    named[f"macro_recall@{width}"] = metrics.label_mean(rows, local, ranked_true, None)
    for group, mask in shot_groups(train_counts, groups).items():
        named[group] = metrics.label_mean(rows, local, ranked_true, mask[present])
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
