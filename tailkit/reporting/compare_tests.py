"""The tests behind ``tailkit compare``: which changes between two runs are beyond chance.

Both runs scored the same test rows (the same data key), so every test is paired:

- **Per frequency bin and group**: the change of the mean per-label recall, with the 95 %
  percentile interval and the p-value of a paired bootstrap over the test rows that holds each
  label's rows (the summary table's means over labels; :mod:`tailkit.evaluation.intervals`
  says why not the rows alone), and Benjamini–Hochberg q-values across all the bins and
  groups together.
- **Per label**: McNemar's exact test on the (row, label) pairs of that label — b pairs only
  run A ranks within the top j, c only run B; under "no change" b is Binomial(b + c, ½), so the
  two-sided p is min(1, 2 · P(X ≤ min(b, c))). A label with fewer than
  :data:`MIN_DISCORDANT` discordant pairs cannot reach p < 0.05 whatever happens (the smallest
  p of n pairs is 2⁻ⁿ⁺¹), so it is not tested: the test is exact given b + c, so leaving such
  labels out keeps every p-value valid and spends the false-discovery budget only on labels
  that can show something (Tarone 1990). Benjamini–Hochberg q-values run across the labels
  tested, and the output says how many were.

The tests need each run's row outcomes (:mod:`tailkit.evaluation.outcomes`) and a recall
metric (recall@j, j up to the ranking's width); without them compare prints its changes
untested and says why.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from tailkit.evaluation.intervals import Metrics, Resampler, percentile_interval
from tailkit.evaluation.outcomes import Outcomes
from tailkit.reporting.paired import bootstrap_p

#: Discordant pairs a label needs before its exact test can reach p < 0.05 (2 · 2⁻⁶ < 0.05).
MIN_DISCORDANT = 6
Q_LEVEL = 0.05


@dataclass(frozen=True)
class PairHits:
    """Each (row, true label) pair of the test rows and whether each run ranks the label
    within its top j."""

    labels: np.ndarray  # (P,) label of each pair
    rows: np.ndarray  # (P,) row of each pair
    a: np.ndarray  # (P,) bool
    b: np.ndarray  # (P,) bool
    num_rows: int


def recall_depth(metric: str, width: int) -> int | None:
    """j of a ``recall@j`` metric the outcomes can test (None: another metric, or j beyond the
    ranking's width)."""
    if not metric.startswith("recall@"):
        return None
    depth = int(metric.removeprefix("recall@"))
    return depth if 1 <= depth <= width else None


def pair_hits(a: Outcomes, b: Outcomes, depth: int) -> PairHits:
    indptr, labels = a.truth
    rows = np.repeat(np.arange(a.num_rows), np.diff(indptr))

    def hits(ranked: np.ndarray) -> np.ndarray:
        return (ranked[rows, :depth] == labels[:, None]).any(axis=1)

    return PairHits(labels, rows, hits(a.ranked), hits(b.ranked), a.num_rows)


def benjamini_hochberg(p_values: np.ndarray) -> np.ndarray:
    """BH q-values of the defined entries of ``p_values`` (scipy's), NaN where p is NaN (not
    tested: not counted among the tests either)."""
    from scipy import stats  # here: its import (0.4 s) is paid only where a test runs

    q = np.full(p_values.shape[0], np.nan)
    tested = ~np.isnan(p_values)
    if tested.any():
        q[tested] = stats.false_discovery_control(p_values[tested], method="bh")
    return q


def label_tests(pairs: PairHits) -> pl.DataFrame:
    """Per label with a pair: ``a_only``, ``b_only`` (discordant pairs), and for those with at
    least :data:`MIN_DISCORDANT` of them McNemar's exact ``p`` and its BH ``q`` (null
    otherwise)."""
    from scipy import stats

    present, local = np.unique(pairs.labels, return_inverse=True)
    a_only = np.bincount(local, pairs.a & ~pairs.b, present.shape[0]).astype(np.int64)
    b_only = np.bincount(local, pairs.b & ~pairs.a, present.shape[0]).astype(np.int64)
    discordant = a_only + b_only
    testable = discordant >= MIN_DISCORDANT
    p = np.full(present.shape[0], np.nan)
    smaller = np.minimum(a_only, b_only)[testable]
    p[testable] = np.minimum(1.0, 2 * stats.binom.cdf(smaller, discordant[testable], 0.5))
    q = benjamini_hochberg(p)
    return pl.DataFrame(
        {
            "label": present.astype(np.int64),
            "a_only": a_only,
            "b_only": b_only,
            "p": p,
            "q": q,
        }
    ).with_columns(pl.col("p", "q").fill_nan(None))


def key_tests(pairs: PairHits, keys: dict[str, np.ndarray]) -> pl.DataFrame:
    """Per key (``keys``: name → boolean mask over label ids): the change of the mean per-label
    recall (B − A), its 95 % interval and p-value in a paired bootstrap over the test rows that
    holds each label's rows (the table's means over labels:
    :meth:`tailkit.evaluation.intervals.Metrics.label_mean`), and the BH q-value across the
    keys."""
    present, local = np.unique(pairs.labels, return_inverse=True)
    change = pairs.b.astype(np.float64) - pairs.a.astype(np.float64)
    metrics = Metrics(pairs.num_rows)
    for key, mask in keys.items():
        metrics.named[key] = metrics.label_mean(pairs.rows, local, change, mask[present], True)
    resampled = Resampler(pairs.num_rows).values(metrics)
    low, high, p = [], [], []
    for key in keys:
        bounds = percentile_interval(resampled[key]) or (np.nan, np.nan)
        low.append(bounds[0])
        high.append(bounds[1])
        p.append(bootstrap_p(resampled[key]))
    p_values = np.asarray(p)
    q = benjamini_hochberg(p_values)
    return pl.DataFrame(
        {"key": list(keys), "change_low": low, "change_high": high, "p": p_values, "q": q}
    ).with_columns(pl.col("change_low", "change_high", "p", "q").fill_nan(None))
