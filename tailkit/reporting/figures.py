"""The report's PNG figures (matplotlib, headless): learning curves, accuracy per many/medium/
few group, and per-class accuracy against the training count.

Each function takes plain data (so tests and notebooks can call it) and writes one PNG. The
same data goes to ``plots/report/*.tsv`` for ``dvc plots show``/``diff``; the PNGs are what
``reports/summary.md`` embeds, readable on any Git host.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np

from tailkit.evaluation.per_class import PLOT_COLUMNS as CLASS_BIN_COLUMNS
from tailkit.groups import DEFAULT_GROUPS, GROUPS, GroupThresholds

CURVE_COLUMNS = ("step", "seconds", "loss", "val_accuracy", "val_balanced_accuracy")


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colors(n: int) -> list:
    cmap = pyplot().get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def save_figure(fig, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    # No timestamp in the PNG metadata: the same data gives the same bytes.
    fig.savefig(out, format="png", dpi=100, metadata={"Software": None})
    pyplot().close(fig)
    return out


def read_curve(path: Path) -> dict[str, np.ndarray]:
    """A ``plots/train/<experiment>.tsv`` learning curve as arrays by column."""
    lines = path.read_text().splitlines()
    header = lines[0].split("\t") if lines else []
    if tuple(header) != CURVE_COLUMNS:
        raise ValueError(f"{path}: not a learning curve (expected columns {CURVE_COLUMNS})")
    values = np.array([[float(v) for v in line.split("\t")] for line in lines[1:]], ndmin=2)
    values = values.reshape(-1, len(CURVE_COLUMNS))
    return {name: values[:, i] for i, name in enumerate(CURVE_COLUMNS)}


#: Axis words for single-label studies and for multi-label ones (whose curve columns hold P@1
#: and the label-averaged top-1 share, and whose per-class values are recall@5).
AXES = {
    False: {
        "curves": ("validation accuracy", "balanced accuracy"),
        "groups": "test accuracy (%)",
        "classes": "test accuracy of the class (%)",
    },
    True: {
        "curves": ("validation P@1", "label-averaged top-1 share"),
        "groups": "per-label recall@5 (%)",
        "classes": "recall@5 of the label (%)",
    },
}


def learning_curves_figure(
    curves: Mapping[str, Mapping[str, np.ndarray]], out: Path, multilabel: bool = False
) -> Path:
    """Validation accuracy and balanced accuracy (P@1 and the label-averaged top-1 share for
    multi-label rows) against wall-clock seconds and against step, one line per experiment
    (2 × 2 panels)."""
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5), sharey="row")
    colors = _colors(len(curves))
    words = AXES[multilabel]["curves"]
    for row, (column, label) in enumerate(
        zip(("val_accuracy", "val_balanced_accuracy"), words, strict=True)
    ):
        for col, x in enumerate(("seconds", "step")):
            ax = axes[row][col]
            for color, (name, curve) in zip(colors, curves.items(), strict=True):
                ax.plot(curve[x], 100 * curve[column], label=name, color=color, linewidth=1.4)
            ax.set_xlabel("training seconds" if x == "seconds" else "step")
            ax.set_ylabel(f"{label} (%)")
            ax.grid(alpha=0.3)
    axes[0][1].legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    return save_figure(fig, out)


def group_accuracy_figure(
    groups: Mapping[str, Mapping[str, float | None]],
    out: Path,
    multilabel: bool = False,
    thresholds: GroupThresholds = DEFAULT_GROUPS,
) -> Path:
    """Grouped bars: test accuracy of each many/medium/few group (mean per-class accuracy;
    mean per-label recall@5 for multi-label rows), one bar per experiment; a group with no
    classes is left empty."""
    plt = pyplot()
    names = list(groups)
    width = 0.8 / max(len(names), 1)
    fig, ax = plt.subplots(figsize=(max(7, 1.1 * len(names) + 4), 4.2))
    x = np.arange(len(GROUPS))
    for i, (name, color) in enumerate(zip(names, _colors(len(names)), strict=True)):
        heights = [groups[name].get(g) for g in GROUPS]
        values = [np.nan if h is None else 100 * h for h in heights]
        ax.bar(x - 0.4 + (i + 0.5) * width, values, width, label=name, color=color)
    ranges = thresholds.ranges()
    ax.set_xticks(x, [f"{g} ({ranges[g]})" for g in GROUPS])
    ax.set_ylabel(AXES[multilabel]["groups"])
    ax.set_xlabel("classes by training rows")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(fig, out)


def read_class_bins(path: Path) -> dict[str, np.ndarray]:
    """The columns of a ``plots/classes/<experiment>.tsv`` (per-class results per frequency
    bin, :mod:`tailkit.evaluation.per_class`)."""
    lines = path.read_text().splitlines()
    if not lines or lines[0].split("\t") != list(CLASS_BIN_COLUMNS):
        raise ValueError(f"{path}: not a per-class plot file (header {lines[:1]})")
    table = np.array([line.split("\t") for line in lines[1:]], dtype=np.float64, ndmin=2)
    table = table.reshape(-1, len(CLASS_BIN_COLUMNS))
    return {name: table[:, i] for i, name in enumerate(CLASS_BIN_COLUMNS)}


def class_accuracy_figure(
    classes: Mapping[str, Mapping[str, np.ndarray]],
    out: Path,
    multilabel: bool = False,
    thresholds: GroupThresholds = DEFAULT_GROUPS,
) -> Path:
    """Mean per-class test accuracy (recall@5 of a label for multi-label rows) within each
    quarter-octave bin of the training count (log x), one line per experiment, each point's
    area growing with the labels it averages, and the many/medium/few boundaries marked."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.8))
    largest = max(
        (float(b["labels"].max()) for b in classes.values() if b["labels"].size), default=1
    )
    for (name, bins), color in zip(classes.items(), _colors(len(classes)), strict=True):
        seen = bins["train_count"] > 0  # labels never seen in training have no place on log x
        x, y = bins["train_count"][seen], 100 * bins["accuracy"][seen]
        ax.plot(x, y, label=name, color=color, linewidth=1.2)
        sizes = 4 + 60 * np.sqrt(bins["labels"][seen] / largest)
        ax.scatter(x, y, s=sizes, color=color, alpha=0.7, linewidths=0)
    for boundary in (thresholds.few_below, thresholds.many_above):
        ax.axvline(boundary, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xscale("log")
    ax.set_xlabel("training rows of the class (log scale)")
    ax.set_ylabel(AXES[multilabel]["classes"])
    ax.set_ylim(-2, 102)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return save_figure(fig, out)
