"""Mean ± std over the training seeds of every metric of every experiment: what
``metrics/seeds.json`` holds (the ``seeds`` stage), from the same runs frame as the report's
tables, so the two agree to the bit.

Per experiment: ``seeds`` (the training seeds, ``base.seed`` first), ``split_seed`` and, for
every scalar metric of its ``test``, ``uncorrected``, ``ranking`` and ``train`` blocks (dotted,
``test.accuracy``), the per-seed ``values`` (null where a seed's run has none), their ``mean``
and sample standard deviation ``std`` (null for one seed), as :func:`tables.seed_summary`
computes them. Times are left out: they are no quality metric.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tailkit.reporting.runs import Run
from tailkit.reporting.tables import ID_COLUMNS, mean_std, runs_frame

#: Per-seed numbers that are not quality metrics (the seeds themselves) or not a pure function
#: of the inputs (time).
LEFT_OUT = ("train.seed", "train.split_seed", "train.seconds", "train.examples_per_second")


def seed_aggregate(runs: Sequence[Run]) -> dict[str, Any]:
    """``{experiment: {"seeds": [...], "split_seed": s, "<block>.<metric>": {"mean", "std",
    "values"}}}`` in the runs' order."""
    frame = runs_frame(runs)
    columns = [c for c in frame.columns if c not in ID_COLUMNS and c not in LEFT_OUT]
    out: dict[str, Any] = {}
    for experiment in dict.fromkeys(frame["experiment"].to_list()):
        rows = frame.filter(frame["experiment"] == experiment)
        entry: dict[str, Any] = {"seeds": rows["seed"].to_list()}
        if "train.split_seed" in rows.columns:
            split = rows["train.split_seed"].drop_nulls().unique().to_list()
            entry["split_seed"] = int(split[0]) if len(split) == 1 else None
        for column in columns:
            values = rows[column].to_list()
            if all(v is None for v in values):
                continue
            mean, std = mean_std(values)
            entry[column] = {"mean": mean, "std": std, "values": values}
        out[experiment] = entry
    return out
