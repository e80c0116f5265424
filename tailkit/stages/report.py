"""Stage ``report``: one Markdown table comparing every experiment, in ``reports/summary.md``.

Rows are experiments (in params order); columns are test accuracy, balanced accuracy, the
many/medium/few-shot accuracies and training seconds. The best value of each column is bold.
"""

from __future__ import annotations

import json
from typing import Any

from tailkit.atomic import atomic_path
from tailkit.evaluation.metrics import FEW_BELOW, MANY_ABOVE
from tailkit.params import NO_SAMPLER, Params
from tailkit.paths import Layout, require
from tailkit.stages.subsample import read_meta

COLUMNS = (  # (header, path in metrics json, higher is better)
    ("accuracy", ("test", "accuracy"), True),
    ("balanced acc.", ("test", "balanced_accuracy"), True),
    ("many", ("test", "many"), True),
    ("medium", ("test", "medium"), True),
    ("few", ("test", "few"), True),
    ("train s", ("train", "seconds"), False),
)


def _get(metrics: dict[str, Any], path: tuple[str, ...]) -> float | None:
    value: Any = metrics
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def _describe(params: Params, name: str) -> str:
    exp = params.experiment(name)
    loss = exp.loss["name"]
    extra = {k: v for k, v in exp.loss.items() if k != "name"}
    if extra:
        loss += " (" + ", ".join(f"{k}={v}" for k, v in extra.items()) + ")"
    if exp.sampler == NO_SAMPLER:
        return loss
    sampler = params.samplers[exp.sampler]["name"]
    return f"{loss}, {sampler} × {exp.negatives}" if sampler != "in-batch" else f"{loss}, {sampler}"


def build_table(params: Params, layout: Layout) -> str:
    rows = {}
    for name in params.experiments:
        path = require(layout.metrics(name), f"evaluate@{name}")
        rows[name] = json.loads(path.read_text())
    best = {}
    for header, path, higher in COLUMNS:
        values = [v for m in rows.values() if (v := _get(m, path)) is not None]
        if values:
            best[header] = max(values) if higher else min(values)

    def cell(header: str, value: float | None) -> str:
        if value is None:
            return "–"
        text = f"{value:.1f}" if header == "train s" else f"{100 * value:.2f}"
        return f"**{text}**" if value == best.get(header) else text

    lines = [
        "| experiment | method | " + " | ".join(h for h, _, _ in COLUMNS) + " |",
        "|---|---|" + "---:|" * len(COLUMNS),
    ]
    for name, m in rows.items():
        cells = [cell(h, _get(m, p)) for h, p, _ in COLUMNS]
        lines.append(f"| {name} | {_describe(params, name)} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run(params: Params, layout: Layout) -> str:
    meta = read_meta(layout.features)
    counts = meta["train_counts"]
    table = build_table(params, layout)
    dataset = meta["dataset"]["name"]
    text = (
        f"# tailkit summary: {dataset}\n\n"
        f"{meta['num_classes']} classes, {sum(counts)} training rows "
        f"(profile {meta['subsample']['profile']}); test metrics in %, best in bold. "
        f"Many/medium/few: classes with > {MANY_ABOVE}, {FEW_BELOW}–{MANY_ABOVE} and "
        f"< {FEW_BELOW} training rows (mean per-class accuracy).\n\n" + table
    )
    with atomic_path(layout.report) as tmp:
        tmp.write_text(text)
    return text
