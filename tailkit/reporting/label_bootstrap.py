"""The bootstrap of a mean over labels: resample the labels, then each label's rows.

A frequency bin's or group's value is the mean of a per-label value — recall, or the paired
change of it between two runs — over its labels with test rows. Each plain scheme fails
somewhere this field looks:

- Resampling the test rows: a label with one test row is missing from about a third of the
  resamples and drops out of their mean, and the labels that stay (more rows, usually higher
  recall) pull every resampled mean up — on a 10^6-label study a group's interval lay wholly
  above its own value.
- Resampling rows within each label: a one-row label resampled is that row again, so a group
  of one-row labels gets an interval of zero width.
- Resampling the labels alone: a bin of one label (the head's octaves hold one or two) gets an
  interval of zero width; on A/A pairs every replicate then "found" a change.

So both stages (a two-stage, or cluster-then-within, bootstrap): each resample draws as many
labels as the bin has, with replacement, and then each drawn label's n rows with replacement.
A label's value is (up − down)/n over its rows, each row +1, −1 or 0 (a recall: a hit is +1; a
paired change: +1 where only B ranks the label, −1 where only A does), so redrawing its rows is
two binomial draws. The interval holds how much the labels differ and how noisy each is; it is
somewhat wider than either source alone, which errs on the side of the tests' false
discoveries.

Draws come from Philox keyed by :data:`~tailkit.evaluation.intervals.SEED`, a stream per use,
and the block, in blocks of :data:`~tailkit.evaluation.intervals.BLOCK` resamples: the same
inputs give the same bits on any machine.
"""

from __future__ import annotations

import numpy as np

from tailkit.evaluation.intervals import BLOCK, RESAMPLES, SEED, percentile_interval


def resampled_means(
    rows: np.ndarray,
    up: np.ndarray,
    down: np.ndarray | None,
    stream: int,
    resamples: int = RESAMPLES,
) -> np.ndarray:
    """(resamples,) two-stage bootstrap means of (up − down)/rows over labels (one entry per
    label with rows > 0; ``down`` None: no −1 rows); all NaN without a label. ``stream`` tells
    independent uses apart (a bin, a group)."""
    rows = np.asarray(rows, dtype=np.int64)
    up = np.asarray(up, dtype=np.int64)
    down = np.zeros_like(up) if down is None else np.asarray(down, dtype=np.int64)
    out = np.full(resamples, np.nan)
    count = rows.shape[0]
    if not count:
        return out
    share_up = up / rows
    # P(−1 | not +1): the second binomial's rate among the rows the first did not take, as a
    # ratio of counts (1 − up/rows in floats can round below down/rows and pass 1)
    rest = rows - up
    share_down = np.divide(down, rest, out=np.zeros(count), where=rest > 0)
    for start in range(0, resamples, BLOCK):
        size = min(BLOCK, resamples - start)
        rng = np.random.Generator(np.random.Philox(np.random.SeedSequence([SEED, stream, start])))
        drawn = rng.integers(0, count, size=(size, count))
        n = rows[drawn]
        plus = rng.binomial(n, share_up[drawn])
        minus = rng.binomial(n - plus, share_down[drawn])
        out[start : start + size] = ((plus - minus) / n).mean(axis=1)
    return out


def mean_interval(
    rows: np.ndarray, up: np.ndarray, down: np.ndarray | None, stream: int
) -> tuple[float, float] | None:
    """The 95 % percentile interval of :func:`resampled_means`."""
    return percentile_interval(resampled_means(rows, up, down, stream))
