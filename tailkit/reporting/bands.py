"""Per-frequency-bin recall with its 95 % interval: the bands of the study page's per-bin figure.

A bin's value is the mean per-label recall@j (accuracy of the class for one label per row, j = 1)
over the bin's labels, as ``plots/classes/<experiment>.tsv`` has it; its interval is the
percentile interval of that mean over the bootstrap of the test rows that the table's ± and the
paired tests use (:class:`tailkit.evaluation.intervals.Resampler`). Runs scored on the same rows
share each resample's draws, so the bands cost one set of draws and one sparse product per run.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from tailkit.evaluation.intervals import Grouping, Resampler, percentile_interval, ratio
from tailkit.evaluation.outcomes import Outcomes
from tailkit.evaluation.per_class import PLOT_BINS_PER_OCTAVE, frequency_bin
from tailkit.reporting.compare_tests import pair_hits


def _bin_means(recall: np.ndarray, bins: np.ndarray, size: int) -> np.ndarray:
    """(labels, block) recalls → (bins, block): the mean over each bin's labels that are
    defined in that resample (a label none of whose rows was drawn is left out)."""
    defined = ~np.isnan(recall)
    blocks = recall.shape[1]
    index = np.repeat(bins[:, None], blocks, axis=1) * blocks + np.arange(blocks)
    total = np.bincount(index[defined], recall[defined], size * blocks)
    count = np.bincount(index[defined], minlength=size * blocks)
    return ratio(total, count.astype(np.float64)).reshape(size, blocks)


def bin_bands(
    outcomes: Mapping[str, Outcomes],
    train_counts: np.ndarray,
    depth: int,
    per_octave: int = PLOT_BINS_PER_OCTAVE,
) -> dict[str, dict[int, tuple[float, float]]]:
    """Per experiment, per frequency bin (:func:`~tailkit.evaluation.per_class.frequency_bin`)
    with test rows, the 95 % interval of its mean per-label recall@``depth``. The runs must
    have scored the same test rows (one data key)."""
    if not outcomes:
        return {}
    keys = {o.data_key for o in outcomes.values()}
    if len(keys) > 1:
        raise ValueError(f"bin_bands: outcomes of different test rows ({sorted(keys)})")
    first = next(iter(outcomes.values()))
    prepared = {}
    for name, found in outcomes.items():
        pairs = pair_hits(found, found, min(depth, found.ranked.shape[1]))
        present, local = np.unique(pairs.labels, return_inverse=True)
        grouping = Grouping(pairs.rows, local, present.shape[0], pairs.num_rows)
        bins = frequency_bin(np.asarray(train_counts)[present], per_octave)
        prepared[name] = (grouping.weighted(), grouping.weighted(pairs.a), bins)
    size = 1 + max(int(p[2].max(initial=0)) for p in prepared.values())
    values: dict[str, list[np.ndarray]] = {name: [] for name in prepared}
    for sums in Resampler(first.num_rows).blocks():
        for name, (support, hits, bins) in prepared.items():
            recall = ratio(sums.grouped(hits), sums.grouped(support))
            values[name].append(_bin_means(recall, bins, size))
    out: dict[str, dict[int, tuple[float, float]]] = {}
    for name, parts in values.items():
        resampled = np.concatenate(parts, axis=1)
        seen = np.unique(prepared[name][2])
        out[name] = {
            int(b): bounds
            for b in seen
            if (bounds := percentile_interval(resampled[b])) is not None
        }
    return out
