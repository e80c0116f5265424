"""Markdown for a study: its comparison table with the best value of each column in bold, the
settings that differ between its runs (and those they share), and the plugins behind them.

The comparison table is rendered from one polars frame of runs (:func:`runs_frame`: one row per
run, its experiment, source, seed, method and every scalar metric as a dotted column), the
frame ``tailkit report --export`` writes. Runs of one experiment and source that differ only in
their seed are one row of the table, mean ± std over the seeds (:func:`seed_summary`, a
group_by on that frame).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import polars as pl

from tailkit.errors import TailkitError
from tailkit.reporting.paired import ALPHA, Pairing, adjusted_p_values, metric_name
from tailkit.reporting.runs import Run
from tailkit.storage.atomic import atomic_path


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
    # at the threshold best on validation (tailkit/evaluation/thresholds.py)
    Column("macro-F1", ("test", "macro_f1_tuned"), True),
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
    # at the threshold best on validation (tailkit/evaluation/thresholds.py)
    Column("macro-F1", ("test", "macro_f1_tuned"), True),
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


#: The metrics blocks whose scalars become columns of the runs frame.
METRIC_BLOCKS = ("test", "uncorrected", "ranking", "train")
ID_COLUMNS = ("name", "experiment", "source", "study", "seed", "method")


def scalars(block: Any, prefix: str = "") -> dict[str, float | None]:
    """Every number of a metrics block by its dotted key under ``prefix`` (None where the run
    records no value)."""
    out: dict[str, float | None] = {}
    if isinstance(block, dict):
        for key, value in block.items():
            if isinstance(value, dict):
                out.update(scalars(value, f"{prefix}{key}."))
            elif value is None:  # a metric the run has no value for (a group without labels)
                out[f"{prefix}{key}"] = None
            elif isinstance(value, int | float) and not isinstance(value, bool):
                out[f"{prefix}{key}"] = float(value)
    return out


def runs_frame(runs: Sequence[Run]) -> pl.DataFrame:
    """One row per run: ``name`` (as the tables show it), ``experiment``, ``source`` ("" for
    the workspace's own rows, else a DVC experiment or "workspace"), ``study`` (data key),
    ``seed``, ``method``, and every scalar of the metrics blocks as a Float64 column named by
    its path (``test.accuracy``, ``train.seconds``; null where a run lacks it)."""
    rows = [
        {
            b: v
            for block in METRIC_BLOCKS
            for b, v in scalars(r.metrics.get(block), f"{block}.").items()
        }
        for r in runs
    ]
    names = list(dict.fromkeys(k for row in rows for k in row))  # first-seen order
    ids = {
        "name": [r.name for r in runs],
        "experiment": [r.experiment for r in runs],
        "source": [r.source for r in runs],
        "study": [r.study for r in runs],
        "seed": [r.params.base.seed for r in runs],
        "method": [describe_method(r) for r in runs],
    }
    values = {n: pl.Series(n, [row.get(n) for row in rows], dtype=pl.Float64) for n in names}
    schema = {c: pl.Int64 if c == "seed" else pl.String for c in ID_COLUMNS}
    return pl.DataFrame(ids, schema=schema).with_columns(**values)


def mean_std(values: list[float | None]) -> tuple[float | None, float | None]:
    """Mean and sample std (None for one value) of the non-null values; exactly rounded
    sums, so the same seeds give the same bits whatever their order."""
    seen = [v for v in values if v is not None]
    if not seen:
        return None, None
    mean = math.fsum(seen) / len(seen)
    if len(seen) < 2:
        return mean, None
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in seen) / (len(seen) - 1))


def seed_summary(frame: pl.DataFrame, columns: Sequence[str]) -> pl.DataFrame:
    """Per (source, experiment), in first-seen order: ``name``, ``method``, ``seeds`` and for
    each of ``columns`` its mean and ``<column> std`` over the seeds."""
    present = [c for c in columns if c in frame.columns]
    grouped = frame.group_by(["source", "experiment"], maintain_order=True).agg(
        pl.col("name").first(),
        pl.col("method").first(),
        pl.col("seed").n_unique().alias("seeds"),
        *(pl.col(c) for c in present),
    )
    out = grouped.select("name", "method", "seeds")
    for column in present:
        pairs = [mean_std(v) for v in grouped[column].to_list()]
        out = out.with_columns(
            pl.Series(column, [m for m, _ in pairs], dtype=pl.Float64),
            pl.Series(f"{column} std", [s for _, s in pairs], dtype=pl.Float64),
        )
    return out


def _dotted(col: Column) -> str:
    return ".".join(col.path)


def best_values(
    summary: pl.DataFrame, columns: Sequence[Column]
) -> dict[str, tuple[float, float | None, str]]:
    """The best mean of each column over the summary's rows, its std over the seeds (None:
    one seed) and the row's name, for the columns somebody reports."""
    best: dict[str, tuple[float, float | None, str]] = {}
    for col in columns:
        name = _dotted(col)
        if name in summary.columns:
            values = summary[name].drop_nulls()
            if len(values):
                value = cast(float, values.max() if col.higher_is_better else values.min())
                row = summary.filter(pl.col(name) == value).row(0, named=True)
                best[col.header] = (value, row.get(f"{name} std"), row["name"])
    return best


def _number(col: Column, value: float) -> str:
    if col.percent:
        return f"{100 * value:.2f}"
    # seconds: two decimals below 10 s, so a quick run does not show as 0.0
    return f"{value:.2f}" if abs(value) < 10 else f"{value:.1f}"


#: After a value not told apart from the column's best: by the paired test (single-seed
#: rows scored on the same test rows, :mod:`tailkit.reporting.paired`), else a gap smaller
#: than the spread over the seeds.
WITHIN_SPREAD = "≈"
#: After the name of a single-seed row that could not be paired with the others.
UNPAIRED = "†"


@dataclass(frozen=True)
class Cell:
    """One value of the comparison table as both renderings show it."""

    text: str  # the number with its ± (no marks)
    value: float | None
    best: bool = False
    tie: bool = False  # not told apart from the column's best (:data:`WITHIN_SPREAD`)
    p_value: float | None = None  # Holm-adjusted, paired against the best


@dataclass(frozen=True)
class TableRow:
    name: str
    method: str
    seeds: int
    unpaired: bool
    cells: tuple[Cell, ...]


def _cell(
    col: Column,
    value: float | None,
    std: float | None,
    best: dict[str, tuple[float, float | None, str]],
    half: float | None = None,
    p_value: float | None = None,
) -> Cell:
    if value is None:
        return Cell("–", None)
    text = _number(col, value)
    if std is not None:
        text += f" ± {_number(col, std)}"
    elif half is not None:
        text += f" ±{_number(col, half)}"
    if col.header not in best:
        return Cell(text, value)
    top, top_std, _ = best[col.header]
    if value == top:
        return Cell(text, value, best=True)
    if p_value is not None:  # paired with the best: Holm-adjusted p of the difference
        return Cell(text, value, tie=p_value >= ALPHA, p_value=p_value)
    # A gap smaller than either run's standard deviation over its seeds: not told apart.
    spread = max(s for s in (std, top_std, 0.0) if s is not None)
    return Cell(text, value, tie=abs(value - top) < spread)


def markdown_cell(cell: Cell) -> str:
    if cell.best:
        return f"**{cell.text}**"
    return f"{cell.text} {WITHIN_SPREAD}" if cell.tie else cell.text


def interval_halves(runs: Sequence[Run]) -> dict[str, dict[str, float]]:
    """Per row name, half the width of each metric's 95 % interval (``intervals`` in the
    detail metrics, tailkit/evaluation/intervals.py), by its dotted path."""
    out: dict[str, dict[str, float]] = {}
    for run in runs:
        found = run.metrics.get("intervals")
        if not isinstance(found, dict):
            continue
        halves = out.setdefault(run.name, {})
        for block in ("test", "ranking"):
            for key, interval in (found.get(block) or {}).items():
                if isinstance(interval, list) and len(interval) == 2:
                    halves[f"{block}.{key}"] = (interval[1] - interval[0]) / 2
    return out


def column_p_values(
    summary: pl.DataFrame,
    columns: Sequence[Column],
    best: dict[str, tuple[float, float | None, str]],
    pairing: Pairing,
) -> dict[str, dict[str, float]]:
    """Per column header, each paired row's Holm-adjusted p-value against the best row."""
    others = [name for name in summary["name"].to_list() if name in pairing.values]
    out: dict[str, dict[str, float]] = {}
    for col in columns:
        metric = metric_name(col.path)
        if metric is None or col.header not in best:
            continue
        top = best[col.header][2]
        rows = [name for name in others if name != top]
        out[col.header] = adjusted_p_values(pairing.values, metric, top, rows)
    return out


def comparison_rows(
    runs: Sequence[Run],
    columns: Sequence[Column],
    pairing: Pairing | None = None,
) -> list[TableRow]:
    """One row per experiment and source: its value ±half the width of its 95 % bootstrap
    interval (for several seeds paired by ``pairing``, the interval of their mean over
    resampled rows; unpaired, the mean ± the std over the seeds), the best value of each
    column marked, and a tie for the values not told apart from it: by the paired test of
    ``pairing`` (:func:`tailkit.reporting.paired.study_pairing`) where both rows have one,
    else by the spread over the seeds. ``unpaired``: a row ``pairing`` could not pair."""
    summary = seed_summary(runs_frame(runs), [_dotted(c) for c in columns])
    best = best_values(summary, columns)
    halves = interval_halves(runs)
    tested = column_p_values(summary, columns, best, pairing) if pairing else {}
    unpaired = pairing.unpaired if pairing and pairing.values else set()
    out = []
    for row in summary.iter_rows(named=True):
        name = row["name"]
        half = halves.get(name, {}) if row["seeds"] == 1 else {}
        # several seeds, paired: the interval of the seeds' mean over resampled rows
        seeds_half = pairing.halves.get(name) if pairing else None
        cells = []
        for c in columns:
            std = row.get(f"{_dotted(c)} std")
            shown_half = half.get(_dotted(c))
            metric = metric_name(c.path)
            if seeds_half is not None and metric in seeds_half:
                std, shown_half = None, seeds_half[metric]
            p_value = tested.get(c.header, {}).get(name)
            cells.append(_cell(c, row.get(_dotted(c)), std, best, shown_half, p_value))
        out.append(TableRow(name, row["method"], row["seeds"], name in unpaired, tuple(cells)))
    return out


def comparison_table(
    runs: Sequence[Run],
    columns: Sequence[Column] | None = None,
    pairing: Pairing | None = None,
) -> str:
    """:func:`comparison_rows` as markdown: the best value of each column in bold,
    :data:`WITHIN_SPREAD` after the values not told apart from it, :data:`UNPAIRED` after the
    name of a row that could not be paired; a seeds column where any row has several."""
    columns = columns_for(runs) if columns is None else columns
    rows = comparison_rows(runs, columns, pairing)
    several = any(r.seeds > 1 for r in rows)
    head = ["experiment", "method", *(["seeds"] if several else []), *(c.header for c in columns)]
    lines = ["| " + " | ".join(head) + " |", "|---|---|" + "---:|" * (len(head) - 2)]
    for row in rows:
        seeds = [str(row.seeds)] if several else []
        cells = [markdown_cell(c) for c in row.cells]
        shown = f"{row.name} {UNPAIRED}" if row.unpaired else row.name
        lines.append(f"| {shown} | {row.method} | " + " | ".join(seeds + cells) + " |")
    return "\n".join(lines) + "\n"


EXPORT_SUFFIXES = (".parquet", ".csv", ".json")


def export_runs(runs: Sequence[Run], path: Path) -> Path:
    """Write :func:`runs_frame` to ``path`` (.parquet, .csv or .json by its suffix)."""
    frame = runs_frame(runs)
    suffix = path.suffix.lower()
    if suffix not in EXPORT_SUFFIXES:
        raise TailkitError(
            f"report --export {path}: the file must end in {', '.join(EXPORT_SUFFIXES)}"
        )
    with atomic_path(path) as tmp:
        if suffix == ".parquet":
            frame.write_parquet(tmp, compression="zstd", statistics=False)
        elif suffix == ".csv":
            frame.write_csv(tmp)
        else:
            frame.write_json(tmp)
    return path


def _with_options(spec: dict[str, Any]) -> str:
    options = {k: v for k, v in spec.items() if k != "name"}
    if not options:
        return spec["name"]
    return f"{spec['name']} (" + ", ".join(f"{k}={v}" for k, v in options.items()) + ")"


def describe_method(run: Run) -> str:
    """``sampled-softmax (weighting=importance), uniform × 256`` — the row's method in words."""
    settings = run.params.resolved(run.experiment)
    if settings.loss is None:  # a model that trains itself: the tool and its options
        return _with_options(settings.model)
    how = settings.decoupled
    if how is not None:  # a second stage: `cRT (softmax) on ce`, `τ-norm on ce`
        name = {"crt": "cRT", "tau-norm": "τ-norm", "lws": "LWS"}[how["classifier"]]
        if how["classifier"] != "tau-norm":
            name += f" ({_with_options(settings.loss)}, {settings.row_sampling})"
        return f"{name} on {how['init_from']}"
    text = _with_options(settings.loss)
    if settings.model["name"] != "linear":
        text += f" on {settings.model['name']}"
    key = settings.sampler
    if key == "none":
        return text
    sampler = run.params.samplers[key]["name"]
    # A sampler that draws no number of negatives (in-batch: the batch's other labels) runs
    # with negatives 0; the count is shown only when there is one.
    negatives = settings.negatives
    return f"{text}, {sampler} × {negatives}" if negatives else f"{text}, {sampler}"


def _show(value: Any) -> str:
    return "–" if value is None else str(value)


def differing_settings(runs: Sequence[Run]) -> list[str]:
    """The settings keys (sorted) whose values are not the same in every run of ``runs``."""
    flat = [r.settings for r in runs]
    keys = sorted({k for f in flat for k in f})
    return [k for k in keys if len({repr(f.get(k)) for f in flat}) > 1]


def settings_tables(runs: Sequence[Run]) -> str:
    """A table of the settings that differ between ``runs`` (one column each; an experiment's
    seed runs, which share its settings, give one row) and a line of those they share; empty
    for a single run."""
    if len(runs) < 2:
        return ""
    flat = [r.settings for r in runs]
    keys = sorted({k for f in flat for k in f})
    differ = differing_settings(runs)
    # a key some runs lack (`loss`: None for a model that trains itself, flattened to
    # `loss.name` for a loop model) is no shared setting
    shared = [k for k in keys if k not in differ and all(k in f for f in flat)]
    out = []
    if differ:
        out.append("| experiment | " + " | ".join(differ) + " |")
        out.append("|---|" + "---|" * len(differ))
        rows = [
            f"| {run.name} | " + " | ".join(_show(f.get(k)) for k in differ) + " |"
            for run, f in zip(runs, flat, strict=True)
        ]
        out += list(dict.fromkeys(rows))  # an experiment's seeds share its settings: once
        out.append("")
    if shared:
        common = ", ".join(f"{k}={_show(flat[0][k])}" for k in shared)
        out.append(f"Shared by all: {common}.")
    return "\n".join(out) + "\n"


def plugin_versions(runs: Sequence[Run]) -> str:
    """``tailkit 0.1.0: geonames, rff, linear, softmax, …`` — which installed distribution
    supplied the components behind the numbers (recorded by train in each metrics file)."""
    by_distribution: dict[str, list[str]] = {}
    tools: list[str] = []  # the external tools a peer model drives: "napkinxc 0.7.2"
    for run in runs:
        for key, provenance in (run.metrics.get("plugins") or {}).items():
            if key == "arithmetic":  # not a plugin: the machine's part (arithmetic_summary)
                continue
            name, found, origin = provenance.partition(" (")
            if not found:
                if provenance not in tools:
                    tools.append(provenance)
                continue
            names = by_distribution.setdefault(origin.rstrip(")"), [])
            if name not in names:
                names.append(name)
    if not by_distribution:
        return "Plugins: not recorded (metrics from before tailkit recorded them).\n"
    parts = [f"{dist}: {', '.join(names)}" for dist, names in sorted(by_distribution.items())]
    if tools:
        parts.append(f"tools: {', '.join(sorted(tools))}")
    return "Plugins: " + "; ".join(parts) + ".\n"


def arithmetic_summary(runs: Sequence[Run]) -> str:
    """``Arithmetic: portable (x86-64-v3) on cpu.`` — how the bits behind the numbers were
    made (tailkit/native/arithmetic.py), per experiment where they differ; empty for metrics
    from before tailkit recorded it."""
    seen: dict[str, list[str]] = {}
    for run in runs:
        record = (run.metrics.get("plugins") or {}).get("arithmetic")
        if not isinstance(record, dict):
            continue
        where = record.get("target") or record.get("cpu") or "unknown CPU"
        label = f"{record.get('mode', 'unknown')} ({where}) on {record.get('device', 'cpu')}"
        seen.setdefault(label, []).append(run.name)
    if not seen:
        return ""
    if len(seen) == 1:
        return f"Arithmetic: {next(iter(seen))}.\n"
    parts = [f"{label}: {', '.join(names)}" for label, names in sorted(seen.items())]
    return "Arithmetic: " + "; ".join(parts) + ".\n"
