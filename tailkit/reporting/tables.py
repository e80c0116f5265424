"""Markdown for a study: its comparison table with the best value of each column in bold, the
settings that differ between its runs (and those they share), and the plugins behind them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tailkit.reporting.runs import Run


@dataclass(frozen=True)
class Column:
    header: str
    path: tuple[str, ...]  # into the metrics JSON
    higher_is_better: bool
    percent: bool = True


COLUMNS = (
    Column("accuracy", ("test", "accuracy"), True),
    Column("balanced acc.", ("test", "balanced_accuracy"), True),
    Column("many", ("test", "many"), True),
    Column("medium", ("test", "medium"), True),
    Column("few", ("test", "few"), True),
    Column("top-5", ("test", "top5_accuracy"), True),
    Column("ECE", ("test", "ece"), False),
    Column("train s", ("train", "seconds"), False, percent=False),
)
#: A study of multi-label rows (the XC datasets) has no accuracy: the repository's P@k and
#: PSP@k, and the macro-averaged per-label recall of the top 5 overall and per group.
MULTILABEL_COLUMNS = (
    *(Column(f"P@{k}", ("test", f"P@{k}"), True) for k in (1, 3, 5)),
    *(Column(f"PSP@{k}", ("test", f"PSP@{k}"), True) for k in (1, 3, 5)),
    Column("macro R@5", ("test", "macro_recall@5"), True),
    Column("many", ("test", "many"), True),
    Column("medium", ("test", "medium"), True),
    Column("few", ("test", "few"), True),
    Column("ECE", ("test", "ece"), False),
    Column("train s", ("train", "seconds"), False, percent=False),
)


def is_multilabel(runs: Sequence[Run]) -> bool:
    """Whether the runs' test metrics are those of multi-label rows (P@k, no accuracy)."""
    tests = [r.metrics.get("test") or {} for r in runs]
    return any("P@1" in t and "accuracy" not in t for t in tests)


def columns_for(runs: Sequence[Run]) -> tuple[Column, ...]:
    return MULTILABEL_COLUMNS if is_multilabel(runs) else COLUMNS


def metric(metrics: dict[str, Any], path: Sequence[str]) -> float | None:
    value: Any = metrics
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value if isinstance(value, int | float) and not isinstance(value, bool) else None


def best_values(runs: Sequence[Run], columns: Sequence[Column] = COLUMNS) -> dict[str, float]:
    """The best value of each column over ``runs`` (columns nobody reports are absent)."""
    best = {}
    for col in columns:
        values = [v for r in runs if (v := metric(r.metrics, col.path)) is not None]
        if values:
            best[col.header] = max(values) if col.higher_is_better else min(values)
    return best


def _cell(col: Column, value: float | None, best: dict[str, float]) -> str:
    if value is None:
        return "–"
    if col.percent:
        text = f"{100 * value:.2f}"
    else:  # seconds: two decimals below 10 s, so a quick run does not show as 0.0
        text = f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"
    return f"**{text}**" if value == best.get(col.header) else text


def _with_options(spec: dict[str, Any]) -> str:
    options = {k: v for k, v in spec.items() if k != "name"}
    if not options:
        return spec["name"]
    return f"{spec['name']} (" + ", ".join(f"{k}={v}" for k, v in options.items()) + ")"


def describe_method(run: Run) -> str:
    """``sampled-softmax (weighting=importance), uniform × 256`` — the row's method in words."""
    settings = run.params.resolved(run.experiment)
    if settings["loss"] is None:  # a model that trains itself: the tool and its options
        return _with_options(settings["model"])
    text = _with_options(settings["loss"])
    if settings["model"]["name"] != "linear":
        text += f" on {settings['model']['name']}"
    key = settings["sampler"]
    if key == "none":
        return text
    sampler = run.params.samplers[key]["name"]
    return (
        f"{text}, {sampler}"
        if sampler == "in-batch"
        else f"{text}, {sampler} × {settings['negatives']}"
    )


def comparison_table(runs: Sequence[Run], columns: Sequence[Column] | None = None) -> str:
    columns = columns_for(runs) if columns is None else columns
    best = best_values(runs, columns)
    lines = [
        "| experiment | method | " + " | ".join(c.header for c in columns) + " |",
        "|---|---|" + "---:|" * len(columns),
    ]
    for run in runs:
        cells = [_cell(c, metric(run.metrics, c.path), best) for c in columns]
        lines.append(f"| {run.name} | {describe_method(run)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _show(value: Any) -> str:
    return "–" if value is None else str(value)


def settings_tables(runs: Sequence[Run]) -> str:
    """A table of the settings that differ between ``runs`` (one column each) and a line of
    those they share; empty for a single run."""
    if len(runs) < 2:
        return ""
    flat = [r.settings for r in runs]
    keys = sorted({k for f in flat for k in f})
    differ = [k for k in keys if len({repr(f.get(k)) for f in flat}) > 1]
    # a key some runs lack (`loss`: None for a model that trains itself, flattened to
    # `loss.name` for a loop model) is no shared setting
    shared = [k for k in keys if k not in differ and all(k in f for f in flat)]
    out = []
    if differ:
        out.append("| experiment | " + " | ".join(differ) + " |")
        out.append("|---|" + "---|" * len(differ))
        for run, f in zip(runs, flat, strict=True):
            out.append(f"| {run.name} | " + " | ".join(_show(f.get(k)) for k in differ) + " |")
        out.append("")
    if shared:
        common = ", ".join(f"{k}={_show(flat[0][k])}" for k in shared)
        out.append(f"Shared by all: {common}.")
    return "\n".join(out) + "\n"


def plugin_versions(runs: Sequence[Run]) -> str:
    """``tailkit 0.1.0: geonames, rff, linear, softmax, …`` — which installed distribution
    supplied the components behind the numbers (recorded by train in each metrics file)."""
    by_distribution: dict[str, list[str]] = {}
    for run in runs:
        for provenance in (run.metrics.get("plugins") or {}).values():
            name, _, origin = provenance.partition(" (")
            names = by_distribution.setdefault(origin.rstrip(")") or "unknown", [])
            if name not in names:
                names.append(name)
    if not by_distribution:
        return "Plugins: not recorded (metrics from before tailkit recorded them).\n"
    parts = [f"{dist}: {', '.join(names)}" for dist, names in sorted(by_distribution.items())]
    return "Plugins: " + "; ".join(parts) + ".\n"
