"""PNG figures from the evaluation's plot files (matplotlib, headless)."""

from __future__ import annotations

from pathlib import Path

from tailkit.groups import GROUPS


def read_cdf(path: Path) -> tuple[list[float], list[float]]:
    """(margins, cumulative fractions) from a ``margins-<group>.tsv`` of the evaluate stage."""
    lines = path.read_text().splitlines()
    if not lines or lines[0] != "margin\tcdf":
        raise ValueError(f"{path}: not a margin CDF file (expected the header 'margin\\tcdf')")
    pairs = [line.split("\t") for line in lines[1:]]
    return [float(m) for m, _ in pairs], [float(c) for _, c in pairs]


def margin_cdf_figure(experiments: dict[str, Path], out: Path, title: str = "") -> Path:
    """One panel per many/medium/few group, one CDF line per experiment (ELM figure 3 style).

    ``experiments`` maps a name to its ``plots/eval/<experiment>`` directory. A margin > 0 is a
    correct top-1 prediction, so each curve's height at 0 is the group's error rate. The x axis
    frames the 2–98 % range of all curves.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8), sharey=True)
    for ax, group in zip(axes, GROUPS, strict=True):
        lo, hi = float("inf"), float("-inf")
        for name, directory in experiments.items():
            path = directory / f"margins-{group}.tsv"
            margins, cdf = read_cdf(path) if path.exists() else ([], [])
            if margins:  # a group without margins has a header-only file
                ax.plot(margins, cdf, label=name, linewidth=1.4)
                # Frame the 2–98 % range: a few extreme rows would squash every curve.
                inner = [m for m, c in zip(margins, cdf, strict=True) if 0.02 <= c <= 0.98]
                lo, hi = min(lo, *inner, 0.0), max(hi, *inner, 0.0)
        if lo < hi:
            pad = 0.05 * (hi - lo)
            ax.set_xlim(lo - pad, hi + pad)
        ax.axvline(0.0, color="grey", linewidth=0.8, linestyle=":")
        ax.set_title(
            {"many": "head (> 100)", "medium": "torso (20–100)", "few": "tail (< 20)"}[group]
        )
        ax.set_xlabel("logit margin γ(x, y)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("fraction of test rows ≤ γ")
    for ax in reversed(axes):  # the last panel with a curve (a group may have none)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="lower right")
            break
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
