"""Paired tests behind the comparison table's marks: is a row's value told apart from the best?

Every experiment of a study scores the same test rows, so two experiments are compared on
the same resamples of those rows (a paired bootstrap, Dror et al. 2018 §3): each
experiment's row outcomes (:mod:`tailkit.evaluation.outcomes`) give every metric in each of
the :data:`~tailkit.evaluation.intervals.RESAMPLES` resamples that evaluate's intervals use
(the same counter-based draws, so the same resamples for every experiment of the same size),
and the difference of a row to the column's best in each resample is the bootstrap
distribution of the difference. Its two-sided p-value is twice the smaller share of resamples
on either side of zero — the duality with the percentile interval of the difference: p < α
exactly when that 1 − α interval excludes zero. The ``+1`` of :func:`bootstrap_p` keeps a
p-value from being 0 when no resample crosses zero.

A column tests its best against each other row, several tests at once, so the p-values are
adjusted by Holm's step-down method (Holm 1979; it controls the family-wise error rate at α
under any dependence between the tests, which rows scored on the same test rows have) and a
row is marked :data:`~tailkit.reporting.tables.WITHIN_SPREAD` when its adjusted p-value is at
least :data:`ALPHA`: not significantly different from the best.

What this covers: the sampling of the test set, given the trained models. Two runs that
differ only in their training seed may still differ beyond it; several seeds
(``base.extra_seeds``) measure that.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tailkit.evaluation.intervals import Metrics, Resampler, metric_set, percentile_interval
from tailkit.evaluation.metrics import split_inverse_propensity
from tailkit.evaluation.outcomes import Outcomes, read_outcomes
from tailkit.groups import DEFAULT_GROUPS, GroupThresholds
from tailkit.params import SEED_RUN
from tailkit.paths import Layout
from tailkit.reporting.runs import WORKSPACE, Run

ALPHA = 0.05


def holm(p_values: Sequence[float] | np.ndarray) -> np.ndarray:
    """Holm's adjusted p-values, in the order given: the i-th smallest (from 0) of m times
    (m − i), made non-decreasing in that order and capped at 1."""
    p = np.asarray(p_values, dtype=np.float64)
    m = p.shape[0]
    order = np.argsort(p, kind="stable")
    scaled = np.minimum(1.0, np.maximum.accumulate(p[order] * (m - np.arange(m))))
    out = np.empty(m)
    out[order] = scaled
    return out


def bootstrap_p(differences: np.ndarray) -> float:
    """Two-sided p-value of "no difference" from a paired bootstrap's resampled differences
    (NaN entries, resamples in which a metric is undefined, left out): twice the smaller of
    (#{d ≤ 0} + 1) / (B + 1) and (#{d ≥ 0} + 1) / (B + 1), at most 1; NaN without any."""
    d = differences[~np.isnan(differences)]
    if not d.size:
        return float("nan")
    below, above = int((d <= 0).sum()), int((d >= 0).sum())
    return float(min(1.0, 2 * (min(below, above) + 1) / (d.size + 1)))


def metric_name(path: Sequence[str]) -> str | None:
    """The name :func:`~tailkit.evaluation.intervals.metric_set` gives the metric at ``path``
    in the metrics file (None: not a metric of the test rows, such as train seconds)."""
    if len(path) != 2 or path[0] not in ("test", "ranking"):
        return None
    return path[1] if path[0] == "test" else ".".join(path)


def outcome_metrics(
    outcomes: Outcomes, train_counts: np.ndarray, meta: dict[str, Any], detail: dict[str, Any]
) -> Metrics:
    """Every metric evaluate reports, resampleable, from ``outcomes``, the split's ``meta``
    and the group and F1 thresholds evaluate used (from its detail metrics ``detail``)."""
    recorded = detail.get("groups")
    return metric_set(
        outcomes.ranked,
        outcomes.probabilities,
        outcomes.log_likelihood,
        outcomes.truth,
        outcomes.single,
        train_counts,
        split_inverse_propensity(train_counts, meta, outcomes.single),
        GroupThresholds(**recorded) if recorded else DEFAULT_GROUPS,
        detail.get("f1_thresholds"),
    )


def resampled_values(
    outcomes: Outcomes,
    names: Iterable[str],
    train_counts: np.ndarray,
    meta: dict[str, Any],
    detail: dict[str, Any],
) -> dict[str, np.ndarray]:
    """Each of ``names`` in every bootstrap resample of ``outcomes``' rows (names the
    experiment does not have are left out; :func:`outcome_metrics`)."""
    metrics = outcome_metrics(outcomes, train_counts, meta, detail)
    wanted = set(names)
    metrics.named = {k: v for k, v in metrics.named.items() if k in wanted}
    return Resampler(outcomes.num_rows).values(metrics)


def adjusted_p_values(
    values: dict[str, dict[str, np.ndarray]], name: str, best: str, others: Sequence[str]
) -> dict[str, float]:
    """Holm-adjusted p-values of each of ``others`` against ``best`` on metric ``name``,
    from each row's resampled values (``values[row][name]``); rows without them are left
    out, and so is a row whose p-value is undefined."""
    reference = values.get(best, {}).get(name)
    if reference is None:
        return {}
    tested, raw = [], []
    for row in others:
        mine = values.get(row, {}).get(name)
        if mine is None:
            continue
        p = bootstrap_p(mine - reference)
        if not np.isnan(p):
            tested.append(row)
            raw.append(p)
    if not tested:
        return {}
    return dict(zip(tested, (float(p) for p in holm(raw)), strict=True))


def read_paired(path: Path, stage: str) -> Outcomes | None:
    """The outcomes at ``path``, None where evaluate has not written them (metrics from before
    tailkit kept them): such a row is shown unpaired."""
    return read_outcomes(path, stage) if path.exists() else None


@dataclass
class Pairing:
    """What a study's table tests with: each paired row's resampled values by metric name
    (for a row of several seeds, each resample's mean over the seeds), the half-widths of the
    95 % intervals of the rows of several seeds, and the rows that could not be paired
    (scored on other test rows, or no outcomes in the workspace)."""

    values: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    halves: dict[str, dict[str, float]] = field(default_factory=dict)
    unpaired: set[str] = field(default_factory=set)


def _output(run: Run, first: bool) -> tuple[str, str]:
    """The output name of ``run`` (``<experiment>+seed<s>`` for a seed run: every run of a
    row but its first, as :func:`tailkit.reporting.runs.workspace_runs` lists them) and the
    stage that writes it."""
    decoupled = "-decoupled" if run.params.experiment(run.experiment).decoupled else ""
    if first:
        return run.experiment, f"evaluate{decoupled}@{run.experiment}"
    seed = run.params.base.seed
    return (
        f"{run.experiment}{SEED_RUN}{seed}",
        f"evaluate{decoupled}-seed@{run.experiment}-{seed}",
    )


def seed_mean(values: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Each resample's mean over the seeds' values (a seed without the metric is left out of
    it; NaN where none has it)."""
    out = {}
    for name in dict.fromkeys(k for v in values for k in v):
        stacked = np.stack([v[name] for v in values if name in v])
        defined = ~np.isnan(stacked)
        total = np.where(defined, stacked, 0.0).sum(axis=0)
        count = defined.sum(axis=0)
        out[name] = np.where(count > 0, total / np.maximum(count, 1), np.nan)
    return out


def half_width(values: np.ndarray) -> float | None:
    """Half the width of the percentile interval of resampled ``values``
    (:func:`~tailkit.evaluation.intervals.percentile_interval`; None when no resample defines
    it)."""
    found = percentile_interval(values)
    return None if found is None else (found[1] - found[0]) / 2


def study_pairing(
    runs: Sequence[Run], names: Iterable[str], layout: Layout, meta: dict[str, Any]
) -> Pairing:
    """The resampled ``names`` of every row of the workspace's runs (an experiment and its
    seeds) whose runs all have outcomes on the test rows most rows share; the rows that do
    not are unpaired. A row of several seeds gets each resample's mean over its seeds —
    the rows resampled, then the seeds' values on them averaged — and its intervals."""
    rows: dict[str, list[Run]] = {}
    for run in runs:
        rows.setdefault(run.name, []).append(run)
    read: dict[str, list[Outcomes]] = {}
    for name, group in rows.items():
        if any(run.source not in ("", WORKSPACE) for run in group):
            continue
        found = [read_paired(layout.outcomes(o), s) for o, s in _outputs(group)]
        if all(o is not None for o in found):
            read[name] = [o for o in found if o is not None]
    keys = Counter(o.data_key for found in read.values() for o in found)
    shared = keys.most_common(1)[0][0] if keys else None
    counts = np.asarray(meta["train_counts"])
    wanted = list(names)
    pairing = Pairing()
    for name, group in rows.items():
        scored = read.get(name)
        if scored is None or any(o.data_key != shared for o in scored):
            pairing.unpaired.add(name)
            continue
        per_seed = [
            resampled_values(o, wanted, counts, meta, run.metrics)
            for o, run in zip(scored, group, strict=True)
        ]
        pairing.values[name] = seed_mean(per_seed)
        if len(per_seed) > 1:
            halves = {k: half_width(v) for k, v in pairing.values[name].items()}
            pairing.halves[name] = {k: h for k, h in halves.items() if h is not None}
    return pairing


def _outputs(group: Sequence[Run]) -> list[tuple[str, str]]:
    return [_output(run, i == 0) for i, run in enumerate(group)]
