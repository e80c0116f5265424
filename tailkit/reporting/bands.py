"""Per-frequency-bin recall with its 95 % interval: the bands of the study page's per-bin figure.

A bin's value is the mean per-label recall@j (accuracy of the class for one label per row, j = 1)
over the bin's labels with test rows, as ``plots/classes/<experiment>.tsv`` has it; its interval
is the two-stage bootstrap of that mean over the bin's labels and their rows
(:mod:`tailkit.reporting.label_bootstrap` says why), as ``tailkit compare`` tests a bin's change.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tailkit.evaluation.outcomes import Outcomes
from tailkit.evaluation.per_class import PLOT_BINS_PER_OCTAVE, frequency_bin
from tailkit.reporting.compare_tests import pair_hits
from tailkit.reporting.label_bootstrap import mean_interval


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
        seen = np.bincount(local, minlength=present.shape[0])
        hits = np.bincount(local, pairs.a, present.shape[0]).astype(np.int64)
        bins = frequency_bin(np.asarray(train_counts)[present], per_octave)
        out[name] = {}
        for b in np.unique(bins):
            # the bin is the stream: every experiment's band of a bin draws the same labels
            chosen = bins == b
            bounds = mean_interval(seen[chosen], hits[chosen], None, int(b))
            if bounds is not None:
                out[name][int(b)] = bounds
    return out
