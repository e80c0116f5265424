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

from tailkit.evaluation.metrics import FEW_BELOW, MANY_ABOVE

GROUPS = ("many", "medium", "few")
GROUP_TITLES = {
    "many": f"many (> {MANY_ABOVE})",
    "medium": f"medium ({FEW_BELOW}–{MANY_ABOVE})",
    "few": f"few (< {FEW_BELOW})",
}
CURVE_COLUMNS = ("step", "seconds", "loss", "val_accuracy", "val_balanced_accuracy")


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colors(n: int) -> list:
    cmap = _pyplot().get_cmap("tab10" if n <= 10 else "tab20")
    return [cmap(i % cmap.N) for i in range(n)]


def _save(fig, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    # No timestamp in the PNG metadata: the same data gives the same bytes.
    fig.savefig(out, format="png", dpi=100, metadata={"Software": None})
    _pyplot().close(fig)
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
    plt = _pyplot()
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
    return _save(fig, out)


def group_accuracy_figure(
    groups: Mapping[str, Mapping[str, float | None]], out: Path, multilabel: bool = False
) -> Path:
    """Grouped bars: test accuracy of each many/medium/few group (mean per-class accuracy;
    mean per-label recall@5 for multi-label rows), one bar per experiment; a group with no
    classes is left empty."""
    plt = _pyplot()
    names = list(groups)
    width = 0.8 / max(len(names), 1)
    fig, ax = plt.subplots(figsize=(max(7, 1.1 * len(names) + 4), 4.2))
    x = np.arange(len(GROUPS))
    for i, (name, color) in enumerate(zip(names, _colors(len(names)), strict=True)):
        heights = [groups[name].get(g) for g in GROUPS]
        values = [np.nan if h is None else 100 * h for h in heights]
        ax.bar(x - 0.4 + (i + 0.5) * width, values, width, label=name, color=color)
    ax.set_xticks(x, [GROUP_TITLES[g] for g in GROUPS])
    ax.set_ylabel(AXES[multilabel]["groups"])
    ax.set_xlabel("classes by training rows")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, out)


def read_class_accuracy(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(training counts, accuracies) from a ``plots/classes/<experiment>.tsv``."""
    lines = path.read_text().splitlines()
    if not lines or lines[0] != "class\ttrain_count\ttest_count\taccuracy":
        raise ValueError(f"{path}: not a per-class accuracy file")
    table = np.array([line.split("\t") for line in lines[1:]], dtype=np.float64, ndmin=2)
    table = table.reshape(-1, 4)
    return table[:, 1], table[:, 3]


def binned_accuracy(
    counts: np.ndarray, accuracy: np.ndarray, bins: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Mean per-class accuracy within each count bin [bins[i], bins[i+1]); empty bins are
    dropped. Returns (geometric bin centres, means)."""
    which = np.digitize(counts, bins) - 1
    valid = (which >= 0) & (which < len(bins) - 1)
    total = np.bincount(which[valid], weights=accuracy[valid], minlength=len(bins) - 1)
    n = np.bincount(which[valid], minlength=len(bins) - 1)
    centres = np.sqrt(bins[:-1] * bins[1:])
    keep = n > 0
    return centres[keep], total[keep] / n[keep]


def class_accuracy_figure(
    classes: Mapping[str, tuple[np.ndarray, np.ndarray]], out: Path, multilabel: bool = False
) -> Path:
    """Per-class test accuracy (recall@5 of a label for multi-label rows) against the class's
    training count (log x): each class a faint dot, each experiment a line through the mean
    over log-spaced count bins, with the many/medium/few boundaries marked."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.8))
    low = min((c[c > 0].min() for c, _ in classes.values() if (c > 0).any()), default=1.0)
    high = max((c.max() for c, _ in classes.values() if c.size), default=10.0)
    bins = np.geomspace(max(low, 1.0), max(high, 2.0) * 1.0001, 16)
    for (name, (counts, accuracy)), color in zip(
        classes.items(), _colors(len(classes)), strict=True
    ):
        ax.scatter(counts, 100 * accuracy, s=2, alpha=0.08, color=color, linewidths=0)
        centres, means = binned_accuracy(counts, accuracy, bins)
        ax.plot(centres, 100 * means, marker="o", markersize=3, label=name, color=color)
    for boundary in (FEW_BELOW, MANY_ABOVE):
        ax.axvline(boundary, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xscale("log")
    ax.set_xlabel("training rows of the class (log scale)")
    ax.set_ylabel(AXES[multilabel]["classes"])
    ax.set_ylim(-2, 102)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return _save(fig, out)
