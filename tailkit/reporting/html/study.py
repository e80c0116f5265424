"""``reports/index.html``: the study page, built from what the report already reads.

It holds everything summary.md has — the experiments table with the same cells and marks
(:func:`tailkit.reporting.tables.comparison_rows`), its legend, each experiment's settings (on
a click, not a 20-column table) and the plugins and code fingerprints behind it — and every
figure the PNGs show, drawn from data in the page: learning curves, the many/medium/few
groups with their 95 % intervals, per-frequency-bin accuracy with bootstrap bands
(:mod:`tailkit.reporting.bands`), and the sampler fits.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from tailkit.evaluation.per_class import PLOT_BINS_PER_OCTAVE
from tailkit.groups import GROUPS
from tailkit.params import Params
from tailkit.paths import Layout
from tailkit.reporting.bands import bin_bands
from tailkit.reporting.figures import AXES
from tailkit.reporting.html.page import render
from tailkit.reporting.paired import Pairing, read_paired
from tailkit.reporting.runs import Run, describe_data
from tailkit.reporting.summary import legend, thresholds_of
from tailkit.reporting.tables import (
    arithmetic_summary,
    columns_for,
    comparison_rows,
    differing_settings,
    plugin_versions,
    settings_tables,
)
from tailkit.storage.atomic import atomic_path

CURVE_METRICS = ("val_accuracy", "val_balanced_accuracy")
BINS_NOTE = (
    "Each point: the mean over a quarter-octave bin of labels (by training rows) of the "
    "per-label value; the band: its 95 % interval in a bootstrap over the test rows that "
    "holds each label's rows (as the table's means over labels, and as tailkit compare tests "
    "a bin's change). Hover a point for the bin's labels and test rows; click a name in the "
    "legend to hide its line."
)


def _shown(value: Any) -> Any:
    return value if value is None or isinstance(value, str | int | float | bool) else str(value)


def _fingerprints(layout: Layout, experiment: str) -> dict[str, str]:
    """The experiment's components and the first 12 hex digits of their code's hash."""
    path = layout.fingerprints / "experiments" / f"{experiment}.json"
    if not path.is_file():
        return {}
    record = json.loads(path.read_text())
    out = {}
    for part, found in sorted(record.items()):
        if isinstance(found, dict) and "sha256" in found:
            out[part] = (
                f"{found.get('name', '?')} {found.get('version', '')} · {found['sha256'][:12]}"
            )
    return out


def _bins(
    classes: Mapping[str, Mapping[str, np.ndarray]], bands: Mapping[str, Mapping[int, tuple]]
) -> dict[str, dict[str, Any]]:
    out = {}
    for name, table in classes.items():
        low_count = np.asarray(table["count_low"])
        # the bin of each row: its lower edge is 2^((b − 1)/s) (bin 0: count 0)
        keys = np.where(
            low_count > 0,
            1 + np.rint(PLOT_BINS_PER_OCTAVE * np.log2(np.maximum(low_count, 1e-12))),
            0,
        ).astype(int)
        found = bands.get(name, {})
        out[name] = {
            "train_count": table["train_count"],
            "value": table["accuracy"],
            "low": [found.get(int(k), (None, None))[0] for k in keys],
            "high": [found.get(int(k), (None, None))[1] for k in keys],
            "labels": table["labels"].astype(int),
            "test_rows": table["test_rows"].astype(int),
        }
    return out


def _groups(runs: Sequence[Run], axis: str) -> dict[str, Any]:
    series = []
    seen = set()
    for run in runs:
        if run.name in seen:
            continue
        seen.add(run.name)
        test = run.metrics.get("test") or {}
        intervals = (run.metrics.get("intervals") or {}).get("test") or {}
        bounds = [intervals.get(g) or [None, None] for g in GROUPS]
        series.append(
            {
                "name": run.name,
                "values": [test.get(g) for g in GROUPS],
                "low": [b[0] for b in bounds],
                "high": [b[1] for b in bounds],
            }
        )
    return {"names": list(GROUPS), "series": series, "axis": axis}


def study_bands(
    runs: Sequence[Run], layout: Layout, train_counts: np.ndarray, multilabel: bool
) -> tuple[dict[str, dict[int, tuple[float, float]]], list[str]]:
    """Per experiment with row outcomes on the study's test rows, its per-bin intervals; and
    the data keys of the outcomes found."""
    outcomes = {}
    for run in runs:
        if run.source or run.experiment in outcomes:
            continue
        found = read_paired(layout.outcomes(run.experiment), f"evaluate@{run.experiment}")
        if found is not None:
            outcomes[run.experiment] = found
    keys = sorted({o.data_key for o in outcomes.values()})
    return bin_bands(outcomes, train_counts, 5 if multilabel else 1), keys


def study_page(
    title: str,
    study: str,
    size: str,
    runs: Sequence[Run],
    pairing: Pairing | None,
    plot_data: Mapping[str, Any],
    bands: Mapping[str, Mapping[int, tuple]],
    data_keys: Sequence[str],
    legend: str,
    shared: str,
    layout: Layout,
    multilabel: bool,
) -> str:
    """The page's HTML. ``plot_data``: what :func:`~tailkit.reporting.summary.write_plot_data`
    returns; ``legend``: the table's legend; ``shared``: the settings all runs share."""
    columns = columns_for(runs)
    rows = comparison_rows(runs, columns, pairing)
    axes: dict[str, Any] = dict(AXES[multilabel])
    differing = differing_settings(runs)
    details = {}
    for run in runs:
        if run.name not in details:
            details[run.name] = {
                "settings": {k: _shown(v) for k, v in sorted(run.settings.items())},
                "differing": [k for k in differing if k in run.settings],
                "fingerprints": {} if run.source else _fingerprints(layout, run.experiment),
            }
    samplers = {}
    for key in sorted({str(r.settings.get("sampler")) for r in runs} - {"None", "none"}):
        path = layout.sampler_metrics(key)
        if path.is_file():
            samplers[key] = json.loads(path.read_text())
    provenance = [plugin_versions(runs).strip()]
    if arithmetic := arithmetic_summary(runs).strip():
        provenance.append(arithmetic)
    if data_keys:
        provenance.append(f"Test rows' data key: {', '.join(data_keys)}.")
    provenance.append(
        "The same tables in reports/summary.md; the raw files under metrics/ and plots/."
    )
    data = {
        "title": title,
        "study": study,
        "size": size.strip(),
        "legend": legend,
        "shared": shared,
        "table": {
            "columns": [
                {"header": c.header, "key": ".".join(c.path), "higher": c.higher_is_better}
                for c in columns
            ],
            "several": any(r.seeds > 1 for r in rows),
            "rows": [
                {
                    "name": r.name,
                    "method": r.method,
                    "seeds": r.seeds,
                    "unpaired": r.unpaired,
                    "cells": [
                        {
                            "text": c.text,
                            "value": c.value,
                            "best": c.best,
                            "tie": c.tie,
                            "p": c.p_value,
                        }
                        for c in r.cells
                    ],
                }
                for r in rows
            ],
        },
        "details": details,
        "curves": {
            name: {k: curve[k] for k in ("step", "seconds", *CURVE_METRICS)}
            for name, curve in plot_data["curves"].items()
        },
        "curve_metrics": list(zip(CURVE_METRICS, axes["curves"], strict=True)),
        "groups_title": "Per-label recall@5 per group" if multilabel else "Accuracy per group",
        "groups_axis": axes["groups"],
        "groups": _groups(runs, axes["groups"]),
        "bins_title": axes["classes"].replace(" (%)", "") + " by training rows",
        "bins_axis": axes["classes"],
        "bins": _bins(plot_data["classes"], bands),
        "bins_note": BINS_NOTE,
        "samplers": samplers,
        "provenance": provenance,
    }
    return render("study", f"tailkit study: {title}", data)


#: The study's page, beside summary.md.
PAGE = "index.html"


def write_study_page(
    params: Params,
    layout: Layout,
    runs: list[Run],
    pairing: Pairing,
    data: dict[str, Any],
    meta: dict[str, Any],
    size: str,
) -> Path:
    """``reports/index.html`` beside summary.md, from the same runs and plot data
    (:func:`~tailkit.reporting.summary.write_plot_data`'s ``data``)."""
    multilabel = bool(meta.get("multilabel"))
    bands, data_keys = study_bands(runs, layout, meta["train_counts"], multilabel)
    shared = next(
        (line for line in settings_tables(runs).splitlines() if line.startswith("Shared by all")),
        "",
    )
    page = study_page(
        title=str(meta["dataset"]["name"]),
        study=describe_data(params),
        size=size,
        runs=runs,
        pairing=pairing,
        plot_data=data,
        bands=bands,
        data_keys=data_keys,
        legend=legend(multilabel, thresholds_of(runs), pairing),
        shared=shared,
        layout=layout,
        multilabel=multilabel,
    )
    out = layout.report.with_name(PAGE)
    with atomic_path(out) as tmp:
        tmp.write_text(page)
    return out
