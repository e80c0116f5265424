"""What the 95 % intervals cost evaluate, at the default's size and at 10^6 labels.

    python benchmarks/bench_intervals.py [--repeats 3] [--json out.json]

- **Default**: the committed ``softmax`` experiment's row outcomes
  (``data/evaluation/softmax/rows.parquet``, 23,479 test rows, 3,875 classes), every metric of
  its test and ranking blocks with the F1 thresholds it used; the ratio to its evaluate
  stage's committed time (``metrics/timings/evaluate/softmax.json``; target: at most 5 %).
- **10^6 labels**: the shape of ``examples/studies/million-labels.yaml`` — 71,507 single-label
  test rows over 10^6 classes, a Zipf label distribution, a top-5 ranking with probabilities
  (target: at most 10 s). Synthetic outcomes: the cost depends on the shapes, not the model.

Medians over ``--repeats``; one machine, one run (±40 % on shared machines).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from tailkit.evaluation.intervals import Resampler
from tailkit.evaluation.outcomes import Outcomes, read_outcomes
from tailkit.reporting.paired import outcome_metrics
from tailkit.storage.splits import read_meta

ROOT = Path(__file__).parents[1]


def seconds(outcomes: Outcomes, counts, meta, detail, repeats: int) -> tuple[float, int]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        metrics = outcome_metrics(outcomes, counts, meta, detail)
        Resampler(outcomes.num_rows).intervals(metrics)
        times.append(time.perf_counter() - started)
    return statistics.median(times), len(metrics.named)


def default(repeats: int) -> dict[str, float]:
    outcomes = read_outcomes(ROOT / "data/evaluation/softmax/rows.parquet", "evaluate@softmax")
    meta = read_meta(ROOT / "data/split")
    detail = json.loads((ROOT / "metrics/detail/softmax.json").read_text())
    stage = json.loads((ROOT / "metrics/timings/evaluate/softmax.json").read_text())["seconds"]
    took, named = seconds(outcomes, np.asarray(meta["train_counts"]), meta, detail, repeats)
    return {"rows": outcomes.num_rows, "metrics": named, "seconds": took, "stage": stage}


def million(repeats: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    labels, rows = 1_000_000, 71_507
    weights = 1.0 / np.arange(1, labels + 1)
    counts = np.maximum(1, np.round(2.4e6 * weights / weights.sum())).astype(np.int64)
    truth = rng.choice(labels, size=rows, p=weights / weights.sum())
    right = rng.random(rows) < 0.5
    top = np.where(right, truth, rng.integers(0, labels, rows))
    ranked = np.stack([top, *(rng.integers(0, labels, rows) for _ in range(4))], axis=1)
    probabilities = np.sort(rng.dirichlet(np.ones(6), rows)[:, :5], axis=1)[:, ::-1]
    outcomes = Outcomes(
        "million",
        "k",
        np.arange(rows),
        (np.arange(rows + 1), truth),
        True,
        ranked,
        np.log(rng.random(rows)),
        np.ascontiguousarray(probabilities),
    )
    meta = {"train_rows": int(counts.sum())}
    detail = {"f1_thresholds": {"threshold": 0.5, "micro_tuned": 0.3, "macro_tuned": 0.2}}
    took, named = seconds(outcomes, counts, meta, detail, repeats)
    return {"rows": rows, "labels": labels, "metrics": named, "seconds": took}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    found = {"default": default(args.repeats), "million": million(args.repeats)}
    d, m = found["default"], found["million"]
    print(
        f"default: {d['metrics']} metrics on {d['rows']:,} rows: {d['seconds']:.2f} s, "
        f"{100 * d['seconds'] / d['stage']:.1f} % of the evaluate stage's {d['stage']:.1f} s "
        "(target ≤ 5 %)"
    )
    print(
        f"10^6 labels: {m['metrics']} metrics on {m['rows']:,} rows: {m['seconds']:.2f} s "
        "(target ≤ 10 s)"
    )
    if args.json:
        args.json.write_text(json.dumps(found, indent=2) + "\n")


if __name__ == "__main__":
    main()
