"""The bootstrap of a mean over labels: resample the labels, not the rows.

A frequency bin's or group's value is the mean of a per-label value (recall, or B − A's change
of it) over its labels with test rows. Resampling the test rows instead fails where it matters
most, the tail: a label with one test row is missing from about a third of the row resamples
and drops out of their mean, and the labels that stay (more rows, usually higher recall) pull
every resampled mean up — on a 10^6-label study a group's interval lay wholly above its own
value. Resampling rows within each label does not help either: a label's one row resampled is
that row again, so a group of one-row labels would get an interval of zero width and any change
there would look certain. The labels are the units of the mean, so they are what is resampled:
each resample draws as many labels as the group has, with replacement, and averages their
values (a paired comparison draws the same labels for both runs by resampling the per-label
change). The interval then holds both the rows' noise and how much the labels differ; it is
the standard error of a mean of L values, √(var/L), that a reader expects of a macro average.

Draws come from Philox keyed by :data:`~tailkit.evaluation.intervals.SEED`, a stream per use,
and the block, in blocks of :data:`~tailkit.evaluation.intervals.BLOCK` resamples: the same
inputs give the same bits on any machine.
"""

from __future__ import annotations

import numpy as np

from tailkit.evaluation.intervals import BLOCK, RESAMPLES, SEED, percentile_interval


def resampled_means(values: np.ndarray, stream: int, resamples: int = RESAMPLES) -> np.ndarray:
    """(resamples,) means of ``values`` (one per label; NaN ones left out first) over labels
    drawn with replacement, as many as there are; all NaN where no label has a value.
    ``stream`` tells independent uses apart (a bin, a group, a run)."""
    defined = np.asarray(values, dtype=np.float64)
    defined = defined[~np.isnan(defined)]
    out = np.full(resamples, np.nan)
    count = defined.shape[0]
    if not count:
        return out
    for start in range(0, resamples, BLOCK):
        size = min(BLOCK, resamples - start)
        key = np.random.SeedSequence([SEED, stream, start])
        rng = np.random.Generator(np.random.Philox(key))
        out[start : start + size] = defined[rng.integers(0, count, size=(size, count))].mean(axis=1)
    return out


def mean_interval(values: np.ndarray, stream: int) -> tuple[float, float] | None:
    """The 95 % percentile interval of :func:`resampled_means`."""
    return percentile_interval(resampled_means(values, stream))
