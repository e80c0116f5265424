"""``tailkit exps``: the project's DVC experiments as one short table.

``dvc exp show`` prints a column for every key of params.yaml and every metric of every
experiment: with the default's seven experiments that is hundreds of columns, most the same on
every row. This view reads the same ``dvc exp show --json`` and prints one row per tailkit
experiment a DVC experiment changed (and the baseline's, for reference): which DVC experiment
(``baseline`` for the commit, ``workspace`` for uncommitted results), which of params.yaml's
experiments, the settings it changed against the baseline's same experiment, then the study's
headline columns — a dozen columns whatever the number of params.

The values are each run's own; no test marks them, because two DVC experiments are trained
and scored at different commits (``tailkit report --exps`` tabulates them by study, and
``tailkit compare A B`` tests two of them label by label on the same test rows).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tailkit.reporting.runs import WORKSPACE, Run
from tailkit.reporting.tables import Column, columns_for, metric

BASELINE = "baseline"


@dataclass(frozen=True)
class ExpRow:
    exp: str  # the DVC experiment, BASELINE or "workspace"
    experiment: str
    changed: str
    values: tuple[float | None, ...]


def changed_settings(run: Run, baseline: Run | None) -> str:
    """``key=value, …`` of the settings ``run`` has that ``baseline`` has not (or has
    otherwise); "new experiment" where the baseline has no such experiment."""
    if baseline is None:
        return "new experiment"
    mine, theirs = run.settings, baseline.settings
    keys = sorted(
        k for k in mine.keys() | theirs.keys() if repr(mine.get(k)) != repr(theirs.get(k))
    )
    if not keys:
        return "–"
    return ", ".join(f"{k}={mine.get(k, '–')}" for k in keys)


def exp_rows(runs: Sequence[Run], columns: Sequence[Column]) -> list[ExpRow]:
    """The baseline's runs, then each DVC experiment's and the workspace's, in ``runs``'
    order (:func:`tailkit.reporting.runs.exp_runs` already drops a run that repeats one)."""
    baseline: dict[str, Run] = {}
    for run in runs:
        if not run.source:
            baseline.setdefault(run.experiment, run)
    out = []
    for run in runs:
        changed = "–" if not run.source else changed_settings(run, baseline.get(run.experiment))
        values = tuple(metric(run.metrics, c.path) for c in columns)
        out.append(ExpRow(run.source or BASELINE, run.experiment, changed, values))
    return out


def _shown(column: Column, value: Any) -> str:
    if value is None:
        return "–"
    return f"{100 * value:.2f}" if column.percent else f"{value:.1f}"


def exps_table(runs: Sequence[Run]) -> str:
    """The markdown table of :func:`exp_rows` with the study's headline columns."""
    if not runs:
        return "No experiments: `dvc exp run` one, or `dvc repro` the baseline.\n"
    columns = columns_for(runs)
    head = ["exp", "experiment", "changed", *(c.header for c in columns)]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---|" + "---:|" * len(columns)]
    for row in exp_rows(runs, columns):
        cells = [_shown(c, v) for c, v in zip(columns, row.values, strict=True)]
        exp = row.exp if row.exp != WORKSPACE else "workspace"
        lines.append(f"| {exp} | {row.experiment} | {row.changed} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
