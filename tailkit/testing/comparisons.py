"""Two runs' per-class tables and row outcomes on generated data, for tests and benchmarks of
``tailkit compare`` and its page at any number of labels.

Test rows draw their label from a Zipf-like distribution over ``labels`` labels (training
counts follow it); each run ranks the true label first with probability ``hit`` (B with
``boost`` more on the labels of ``planted``), else a random label, then the next labels.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import polars as pl

from tailkit.evaluation.outcomes import Outcomes
from tailkit.evaluation.per_class import per_class_frame, per_label_results
from tailkit.reporting.compare import Side, Source

#: Names that search must find by a part (``"harbour"`` in ``"label 17 harbour"``).
WORDS = ("harbour", "glacier", "meadow", "canyon", "delta", "summit", "lagoon", "prairie")


def label_name(label: int) -> str:
    return f"label {label} {WORDS[label % len(WORDS)]}"


@dataclass(frozen=True)
class GeneratedComparison:
    sides: tuple[Side, Side]
    outcomes: tuple[Outcomes, Outcomes]
    truth: np.ndarray  # (rows,) each test row's label


def generated_comparison(
    labels: int,
    rows: int,
    seed: int = 0,
    planted: np.ndarray | None = None,
    hit: float = 0.6,
    boost: float = 0.25,
    named: bool = True,
    k: int = 5,
) -> GeneratedComparison:
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, labels + 1) ** 0.9
    weights /= weights.sum()
    truth = rng.choice(labels, size=rows, p=weights)
    counts = np.maximum(np.round(weights * rows * 12), 0).astype(np.int64)

    def ranking(lift: np.ndarray | None) -> np.ndarray:
        p = np.full(rows, hit)
        if lift is not None:
            p[np.isin(truth, lift)] += boost
        right = rng.random(rows) < p
        top = np.where(right, truth, (truth + 1 + rng.integers(0, labels - 1, rows)) % labels)
        return np.stack([(top + j) % labels for j in range(k)], axis=1)

    table = pl.DataFrame(
        {
            "label": np.arange(labels, dtype=np.int64),
            "name": [label_name(j) for j in range(labels)]
            if named
            else list(map(str, range(labels))),
            "train_count": counts,
            "val_count": counts // 8,
            "test_count": np.bincount(truth, minlength=labels),
        }
    )
    pair = (np.arange(rows + 1), truth)
    sides, outcomes = [], []
    for name, ranked in (("a", ranking(None)), ("b", ranking(planted))):
        frame = per_class_frame(table, per_label_results(ranked, pair, labels), k)
        meta = {"tailkit.data_key": "k", "tailkit.k": str(k), "tailkit.multilabel": "false"}
        sides.append(Side(Source(name, name, None), frame, meta))
        outcomes.append(Outcomes(name, "k", np.arange(rows), pair, True, ranked, None, None))
    return GeneratedComparison((sides[0], sides[1]), (outcomes[0], outcomes[1]), truth)
