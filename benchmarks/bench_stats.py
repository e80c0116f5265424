"""Are tailkit's intervals and tests calibrated? Measured on a generator whose truth is known.

    python benchmarks/bench_stats.py [--replicates 200] [--rows 50000] [--plant-bin 256]
        [--sections coverage,aa,power] [--json out.json]

A synthetic "true model" over 1,000 labels with a Zipf long tail of training counts (20,000
down to 5): label c is drawn for a test row with probability p_c and the model ranks it first
with probability r_c (0.45 + 0.05 log2 of its training count, ± 0.03: about 0.95 for the head,
0.5 in the tail), so accuracy (Σ p_c r_c), balanced accuracy
(the mean of r_c) and the few group (the mean of r_c over labels with < 20 training rows) are
known exactly. Each replicate draws an independent test set of ``--rows`` rows and scores it.

- **Coverage** of the 95 % intervals evaluate writes (tailkit/evaluation/intervals.py): the
  share of replicates whose interval holds the true value, for accuracy, balanced accuracy
  and the few group (goal: 93–97 %).
- **Coverage in the tail**: the same with ``--tail-labels`` labels (100,000: the training
  counts reach 1 by rank 4,000, so most labels hold zero, one or two test rows, as at 10^6
  labels), where the means over labels rest on one-row labels.
- **False discoveries on A/A pairs**: two runs of the same model whose errors agree on most
  rows (each row's outcome shared with probability 0.9, as two training seeds agree), compared
  by ``tailkit compare``'s tests (tailkit/reporting/compare_tests.py) at q = 0.05. No change is
  real, so any discovery is false: the share of replicates with one among the bins and groups,
  and among the labels (goal ≤ 5 %), and the summary table's paired test of accuracy
  (tailkit/reporting/paired.py) at α = 0.05.
- **Power**: B gains +5 points of recall on 10 % of the labels of one frequency bin (the
  octave from ``--plant-bin`` training rows), every other rate unchanged: the share of planted
  labels compare lists as significant gains at q < 0.05, the share of replicates in which it
  finds at least one (goal ≥ 80 %), and the false discoveries among the other labels. Power is
  a matter of the planted labels' test rows: the header says how many they have.

Prints one table; ``--json`` writes the same numbers. Seeded: the same arguments print the
same numbers on any machine.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import polars as pl

from tailkit.evaluation.intervals import Resampler, metric_set
from tailkit.evaluation.metrics import inverse_propensity
from tailkit.evaluation.outcomes import Outcomes
from tailkit.evaluation.per_class import per_class_frame, per_label_results
from tailkit.groups import DEFAULT_GROUPS
from tailkit.reporting.compare import Side, Source, compare
from tailkit.reporting.paired import adjusted_p_values

LABELS = 1000
AGREEMENT = 0.9
PLANT_SHARE = 0.1
PLANT_GAIN = 0.05


class Truth:
    """The synthetic model: label frequencies, training counts and per-label recall."""

    def __init__(self, plant_bin: int, seed: int = 0, labels: int = LABELS) -> None:
        rng = np.random.default_rng(seed)
        rank = np.arange(1, labels + 1)
        self.counts = np.maximum(1, np.round(20000 / rank**1.2)).astype(np.int64)
        test_weight = self.counts + 4.0  # the test split a little flatter than training
        self.p = test_weight / test_weight.sum()
        recall = 0.45 + 0.05 * np.log2(self.counts) + rng.normal(0, 0.03, labels)
        self.recall = np.clip(recall, 0.05, 0.95)
        few = self.counts < DEFAULT_GROUPS.few_below
        self.true = {
            "accuracy": float((self.p * self.recall).sum()),
            "balanced_accuracy": float(self.recall.mean()),
            "few": float(self.recall[few].mean()),
        }
        self.plant_bin = (plant_bin, 2 * plant_bin)
        in_bin = np.flatnonzero((self.counts >= plant_bin) & (self.counts < 2 * plant_bin))
        chosen = max(1, round(PLANT_SHARE * in_bin.size))
        self.planted = rng.choice(in_bin, size=chosen, replace=False)


def _ranked(
    truth_labels: np.ndarray, right: np.ndarray, rng: np.random.Generator, labels: int = LABELS
) -> np.ndarray:
    wrong = (truth_labels + 1 + rng.integers(0, labels - 1, truth_labels.shape[0])) % labels
    top = np.where(right, truth_labels, wrong)
    return np.stack([(top + j) % labels for j in range(5)], axis=1)


def _outcomes(name: str, labels: np.ndarray, ranked: np.ndarray) -> Outcomes:
    n = labels.shape[0]
    return Outcomes(name, "k", np.arange(n), (np.arange(n + 1), labels), True, ranked, None, None)


def _side(name: str, truth: Truth, labels: np.ndarray, ranked: np.ndarray) -> Side:
    table = pl.DataFrame(
        {
            "label": np.arange(LABELS, dtype=np.int64),
            "name": [f"l{c}" for c in range(LABELS)],
            "train_count": truth.counts,
            "val_count": truth.counts // 8,
            "test_count": np.bincount(labels, minlength=LABELS),
        }
    )
    results = per_label_results(ranked, (np.arange(labels.shape[0] + 1), labels), LABELS)
    meta = {"tailkit.data_key": "k", "tailkit.k": "5", "tailkit.multilabel": "false"}
    return Side(Source(name, name, None), per_class_frame(table, results, 5), meta)


def coverage(truth: Truth, replicates: int, rows: int, seed: int) -> dict[str, float]:
    """The share of replicates whose intervals hold the true values; for the means over
    labels the truth is over the labels the replicate's test rows hold (what the interval,
    given the test rows' labels, claims), the same as over all labels when every label has
    a row."""
    rng = np.random.default_rng(seed)
    held = {name: 0 for name in truth.true}
    q = inverse_propensity(truth.counts, int(truth.counts.sum()))
    few = truth.counts < DEFAULT_GROUPS.few_below
    for _ in range(replicates):
        labels = rng.choice(truth.counts.shape[0], size=rows, p=truth.p)
        right = rng.random(rows) < truth.recall[labels]
        ranked = _ranked(labels, right, rng, truth.counts.shape[0])
        metrics = metric_set(
            ranked, None, None, (np.arange(rows + 1), labels), True, truth.counts, q,
            DEFAULT_GROUPS, None,
        )  # fmt: skip
        metrics.named = {k: v for k, v in metrics.named.items() if k in truth.true}
        found = Resampler(rows).intervals(metrics)
        present = np.bincount(labels, minlength=truth.counts.shape[0]) > 0
        values = {
            "accuracy": truth.true["accuracy"],
            "balanced_accuracy": float(truth.recall[present].mean()),
            "few": float(truth.recall[present & few].mean()),
        }
        for name, value in values.items():
            interval = found[name]
            held[name] += interval is not None and interval[0] <= value <= interval[1]
    return {name: count / replicates for name, count in held.items()}


def _pair(truth: Truth, rows: int, rng: np.random.Generator, plant: bool):
    """Two runs of the model, outcomes shared on a row with probability AGREEMENT; with
    ``plant`` B's recall on the planted labels is PLANT_GAIN higher."""
    labels = rng.choice(LABELS, size=rows, p=truth.p)
    recall = truth.recall[labels]
    shared = rng.random(rows)
    own_a, own_b = rng.random(rows), rng.random(rows)
    mix = rng.random(rows) < AGREEMENT
    right_a = np.where(mix, shared, own_a) < recall
    u_b = np.where(mix, shared, own_b)
    right_b = u_b < recall
    if plant:  # the same draw against a higher rate: B gains exactly on the planted labels
        gain = np.isin(labels, truth.planted)
        right_b |= gain & (u_b < recall + PLANT_GAIN)
    return labels, _ranked(labels, right_a, rng), _ranked(labels, right_b, rng)


def _group_of(truth: Truth) -> str:
    """The many/medium/few group of the planted bin."""
    count = int(truth.counts[truth.planted[0]])
    if count > DEFAULT_GROUPS.many_above:
        return "many"
    return "few" if count < DEFAULT_GROUPS.few_below else "medium"


def tests(truth: Truth, replicates: int, rows: int, seed: int, plant: bool) -> dict[str, float]:
    rng = np.random.default_rng(seed)
    any_key = any_label = table = bin_found = 0
    found_planted = replicates_with_found = false_labels = 0
    for _ in range(replicates):
        labels, ranked_a, ranked_b = _pair(truth, rows, rng, plant)
        sides = [_side(n, truth, labels, r) for n, r in (("a", ranked_a), ("b", ranked_b))]
        outcomes = (_outcomes("a", labels, ranked_a), _outcomes("b", labels, ranked_b))
        result = compare(*sides, outcomes=outcomes, top=LABELS)
        assert result.significant_gains is not None and result.significant_losses is not None
        # a bin or group holding a planted label has a real change: only the others can
        # discover falsely
        planted_counts = truth.counts[truth.planted] if plant else np.array([], dtype=np.int64)
        real = [
            bool(((planted_counts >= low) & (planted_counts < high)).any())
            for low, high in result.bins.select("count_low", "count_high").iter_rows()
        ]
        groups = result.groups["group"].to_list()
        real_groups = [plant and g in ("all", _group_of(truth)) for g in groups]
        q = np.r_[result.bins["q"].to_numpy(), result.groups["q"].to_numpy()]
        is_real = np.r_[real, real_groups].astype(bool)
        any_key += bool((q[~is_real] < 0.05).any())
        bin_found += bool(plant and (q[: len(real)][np.asarray(real, dtype=bool)] < 0.05).any())
        listed = set(result.significant_gains["label"].to_list())
        listed |= set(result.significant_losses["label"].to_list())
        planted = set(truth.planted.tolist()) if plant else set()
        false_labels += len(listed - planted)
        any_label += bool(listed - planted)
        hits = len(listed & planted)
        found_planted += hits
        replicates_with_found += hits > 0
        if not plant:
            values = {}
            for name, o in zip(("a", "b"), outcomes, strict=True):
                metrics = metric_set(
                    o.ranked, None, None, o.truth, True, truth.counts,
                    np.ones(LABELS), DEFAULT_GROUPS, None,
                )  # fmt: skip
                metrics.named = {"accuracy": metrics.named["accuracy"]}
                values[name] = Resampler(rows).values(metrics)
            table += adjusted_p_values(values, "accuracy", "a", ["b"])["b"] < 0.05
    out = {
        "replicates with a false bin/group discovery": any_key / replicates,
        "replicates with a false label discovery": any_label / replicates,
        "false label discoveries per replicate": false_labels / replicates,
    }
    if plant:
        out["replicates finding the planted bin's change"] = bin_found / replicates
        out["planted labels found"] = found_planted / (replicates * len(truth.planted))
        out["replicates finding a planted label"] = replicates_with_found / replicates
    else:
        out["table: accuracy told apart (α = 0.05)"] = table / replicates
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--replicates", type=int, default=200)
    parser.add_argument("--rows", type=int, default=50000)
    parser.add_argument("--plant-bin", type=int, default=256, help="lower end of the octave")
    parser.add_argument(
        "--sections", default="coverage,tail,aa,power", help="of coverage,tail,aa,power"
    )
    parser.add_argument("--tail-labels", type=int, default=100_000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    truth = Truth(args.plant_bin)
    started = time.perf_counter()
    rows_in_bin = truth.p[truth.planted].mean() * args.rows
    print(
        f"# bench_stats: {LABELS} labels, {args.rows:,} test rows a replicate, "
        f"{args.replicates} replicates; {len(truth.planted)} planted labels of "
        f"{truth.plant_bin[0]}–{truth.plant_bin[1] - 1} training rows, ~{rows_in_bin:.0f} test rows each"
    )
    sections = {
        "coverage": ("coverage of 95 % intervals", lambda: coverage(truth, n, rows, 1)),
        "tail": (
            f"coverage of 95 % intervals, {args.tail_labels:,} labels (most with 0–2 test rows)",
            lambda: coverage(Truth(args.plant_bin, labels=args.tail_labels), n, rows, 4),
        ),
        "aa": ("A/A pairs", lambda: tests(truth, n, rows, 2, plant=False)),
        "power": ("planted +5 points", lambda: tests(truth, n, rows, 3, plant=True)),
    }
    n, rows = args.replicates, args.rows
    results = {}
    for key in args.sections.split(","):
        title, run = sections[key]
        results[title] = run()
    for title, numbers in results.items():
        print(f"\n## {title}\n")
        for name, value in numbers.items():
            print(f"- {name}: {100 * value:.1f} %" if value <= 1 else f"- {name}: {value:.2f}")
    print(f"\n({time.perf_counter() - started:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
