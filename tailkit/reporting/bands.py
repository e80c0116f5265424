"""Per-frequency-bin recall with its 95 % interval: the bands of the study page's per-bin figure.

A bin's value is the mean per-label recall@j (accuracy of the class for one label per row, j = 1)
over the bin's labels with test rows, as ``plots/classes/<experiment>.tsv`` has it; its interval
is the bootstrap over the test rows that holds each label's rows, as the summary table's means
over labels have it and ``tailkit compare`` tests a bin's change
(:meth:`tailkit.evaluation.intervals.Metrics.label_mean`).
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tailkit.evaluation.intervals import Metrics, Resampler, percentile_interval
from tailkit.evaluation.outcomes import Outcomes
from tailkit.evaluation.per_class import PLOT_BINS_PER_OCTAVE, frequency_bin
from tailkit.reporting.compare_tests import pair_hits


def bin_bands(
    outcomes: Mapping[str, Outcomes],
    train_counts: np.ndarray,
    depth: int,
    per_octave: int = PLOT_BINS_PER_OCTAVE,
) -> dict[str, dict[int, tuple[float, float]]]:
    """Per experiment, per frequency bin (:func:`~tailkit.evaluation.per_class.frequency_bin`)
    with test rows, the 95 % interval of its mean per-label recall@``depth``."""
    out: dict[str, dict[int, tuple[float, float]]] = {}
    for name, found in outcomes.items():
        pairs = pair_hits(found, found, min(depth, found.ranked.shape[1]))
        present, local = np.unique(pairs.labels, return_inverse=True)
        bins = frequency_bin(np.asarray(train_counts)[present], per_octave)
        metrics = Metrics(pairs.num_rows)
        for b in np.unique(bins):
            metrics.named[str(b)] = metrics.label_mean(pairs.rows, local, pairs.a, bins == b)
        out[name] = {}
        for b, values in Resampler(pairs.num_rows).values(metrics).items():
            bounds = percentile_interval(values)
            if bounds is not None:
                out[name][int(b)] = bounds
    return out
