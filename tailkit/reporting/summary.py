"""The parts of ``reports/summary.md``: figure captions and legends, one section per study
(comparison table, settings, plugin versions), and the plot data and PNG figures drawn from
the runs' learning curves, groups and per-class bins.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tailkit.errors import DataValidationError
from tailkit.groups import DEFAULT_GROUPS, GroupThresholds
from tailkit.paths import Layout, require
from tailkit.reporting import figures
from tailkit.reporting.paired import Pairing
from tailkit.reporting.runs import Run
from tailkit.reporting.tables import (
    arithmetic_summary,
    comparison_table,
    is_multilabel,
    plugin_versions,
    settings_tables,
)
from tailkit.storage.atomic import atomic_path

FIGURES = {
    "learning-curves.png": "Learning curves: validation accuracy and balanced accuracy",
    "groups.png": "Test accuracy per many/medium/few group",
    "per-class.png": "Per-class test accuracy against training rows",
}
MULTILABEL_FIGURES = {
    "learning-curves.png": "Learning curves: validation P@1 and label-averaged top-1 share",
    "groups.png": "Per-label recall@5 per many/medium/few group",
    "per-class.png": "Per-label recall@5 against training rows",
}


INTERVAL_NOTE = (
    "±: half the width of the 95 % interval of a bootstrap over the test rows (the test "
    "set's sampling, not another training seed's){seeds}. Best of each column in bold."
)
SEEDS_PAIRED = (
    "; for several seeds, of their mean, the rows resampled and the seeds' values on each "
    "resample averaged, so it holds the seeds' disagreement row by row (not a shift common to "
    "all rows), beside the standard deviation over the seeds in metrics/seeds.json"
)
SEEDS_UNPAIRED = "; with several seeds, the standard deviation over them"
PAIRED_NOTE = (
    " ≈: not significantly different from the best: a paired bootstrap over the same test "
    "rows, two-sided, α = 0.05 after Holm's correction over the column's rows."
)
UNPAIRED_NOTE = (
    " ≈: less than a standard deviation over the seeds from the best; other rows are not "
    "tested here (the paired tests need each row's outcomes, which the workspace holds for "
    "its own experiments only: see reports/summary.md)."
)
UNPAIRED_ROWS_NOTE = (
    " †: not paired (its runs scored other test rows than the rest, or their row outcomes are "
    "missing): with several seeds its ± is the standard deviation over them, and ≈ a gap to "
    "the best smaller than that."
)


def marks_note(pairing: Pairing | None) -> str:
    """What the table's ± and marks mean, for a table tested with ``pairing`` (None: the
    rows are not tested)."""
    if pairing is None:
        return INTERVAL_NOTE.format(seeds=SEEDS_UNPAIRED) + UNPAIRED_NOTE
    seeds = SEEDS_PAIRED if pairing.halves else ""
    text = INTERVAL_NOTE.format(seeds=seeds) + PAIRED_NOTE
    return text + UNPAIRED_ROWS_NOTE if pairing.values and pairing.unpaired else text


def legend(
    multilabel: bool,
    thresholds: GroupThresholds = DEFAULT_GROUPS,
    pairing: Pairing | None = None,
) -> str:
    """The sentence under a comparison table, with the study's group thresholds and what its
    marks tested (:func:`marks_note`)."""
    r = thresholds.ranges()
    groups = f"{r['many']}, {r['medium']} and {r['few']} training rows"
    if multilabel:
        return (
            "Test metrics in %; P@k and PSP@k as the Extreme Classification Repository defines "
            "them (PSP: propensity-scored, normalised by the best achievable ranking); macro R@5: "
            "per-label recall of the top 5, averaged over labels; many/medium/few: the same over "
            f"labels carried by {groups}; ECE: of the top-1 label being one of the row's labels; "
            "macro-F1: of the top-5 labels whose probability clears the threshold best on "
            "validation. " + marks_note(pairing)
        )
    return (
        "Test metrics in %; many/medium/few: mean per-class accuracy over classes with "
        f"{groups}; balanced acc.: over all classes; ECE: expected calibration error of the "
        "loss's own probabilities (15 bins; – for a loss without one); macro-F1: of the top "
        "label when its probability clears the threshold best on validation. " + marks_note(pairing)
    )


def thresholds_of(runs: list[Run]) -> GroupThresholds:
    """The group thresholds the runs were evaluated with (``groups`` in their detail metrics;
    the defaults where a run does not record them, as a DVC experiment's headline does not)."""
    recorded = next((r.metrics["groups"] for r in runs if "groups" in r.metrics), None)
    return GroupThresholds(**recorded) if recorded else DEFAULT_GROUPS


DVC_PLOTS_NOTE = (
    "The same curves and bars, one line per experiment, in `dvc plots show` "
    "(`dvc plots diff <rev>` overlays another commit or experiment).\n"
)


def group_studies(runs: list[Run]) -> dict[str, list[Run]]:
    """Runs by the data they were trained on, in first-seen order."""
    studies: dict[str, list[Run]] = {}
    for run in runs:
        studies.setdefault(run.study, []).append(run)
    return studies


def study_markdown(title: str, runs: list[Run], pairing: Pairing | None = None) -> str:
    """A study's section: its table (tested with ``pairing``), legend, settings, plugins."""
    text = legend(is_multilabel(runs), thresholds_of(runs), pairing)
    parts = [f"## {title}\n", comparison_table(runs, pairing=pairing), text + "\n"]
    differing = settings_tables(runs)
    if differing:
        parts += ["### Settings\n", differing]
    parts.append(plugin_versions(runs))
    arithmetic = arithmetic_summary(runs)
    if arithmetic:
        parts.append(arithmetic)
    return "\n".join(parts)


def _read(reader, path: Path, producer: str):
    """``reader(path)``, a missing or malformed file one line naming the stage to re-run (an
    older tailkit wrote some of these files in another form)."""
    try:
        return reader(require(path, producer))
    except DataValidationError:
        raise
    except ValueError as exc:
        raise DataValidationError(f"{exc}; rebuild it with `dvc repro {producer}`") from exc


def write_plot_data(runs: list[Run], layout: Layout) -> dict[str, Any]:
    """``plots/report/{curves,groups}.tsv`` (long format, an ``experiment`` column) and the
    arrays the figures need, read from each experiment's train and evaluate plot files."""
    curves = {
        r.experiment: _read(figures.read_curve, layout.curve(r.experiment), f"train@{r.experiment}")
        for r in runs
    }
    groups = {r.experiment: {g: r.metrics["test"].get(g) for g in figures.GROUPS} for r in runs}
    classes = {
        r.experiment: _read(
            figures.read_class_bins, layout.class_plot(r.experiment), f"evaluate@{r.experiment}"
        )
        for r in runs
    }
    lines = ["experiment\t" + "\t".join(figures.CURVE_COLUMNS)]
    for name, curve in curves.items():
        for i in range(len(curve["step"])):
            values = (f"{curve[c][i]:.6g}" for c in figures.CURVE_COLUMNS)
            lines.append(f"{name}\t" + "\t".join(values))
    with atomic_path(layout.report_plots / "curves.tsv") as tmp:
        tmp.write_text("\n".join(lines) + "\n")
    lines = ["experiment\tgroup\taccuracy"]
    for name, by_group in groups.items():
        lines += [f"{name}\t{g}\t{v:.6g}" for g, v in by_group.items() if v is not None]
    with atomic_path(layout.report_plots / "groups.tsv") as tmp:
        tmp.write_text("\n".join(lines) + "\n")
    return {
        "curves": curves,
        "groups": groups,
        "classes": classes,
        "thresholds": thresholds_of(runs),
    }


def write_figures(data: dict[str, Any], layout: Layout, multilabel: bool = False) -> None:
    with atomic_path(layout.figures / "learning-curves.png") as tmp:
        figures.learning_curves_figure(data["curves"], tmp, multilabel=multilabel)
    for name, draw, key in (
        ("groups.png", figures.group_accuracy_figure, "groups"),
        ("per-class.png", figures.class_accuracy_figure, "classes"),
    ):
        with atomic_path(layout.figures / name) as tmp:
            draw(data[key], tmp, multilabel=multilabel, thresholds=data["thresholds"])
