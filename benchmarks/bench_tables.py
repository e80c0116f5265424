"""Speed and memory of the per-label tables and the reports built on them.

    python benchmarks/bench_tables.py [--labels 1000000] [--repeats 5] [--json out.json]

At C labels (default 10^6, a Zipf long tail of training counts):

- writing one ``per_class.parquet`` from the evaluation's arrays (the polars frame and its
  zstd file; target ≤ 1 s), beside the per-label text file an earlier tailkit wrote with a
  Python loop over labels, and the binned plot file that replaced it;
- ``tailkit compare A B`` of two such tables as a process, start-up, figure and all (target
  ≤ 3 s and ≤ 1 GB peak resident memory);
- ``tailkit report --no-figures`` over 20 experiments × 3 seeds (target ≤ 2 s): as a process
  over a workspace of 60 experiments, and in-process the seed summary (mean ± std of 20
  experiments over 3 seeds) the table is rendered from.

Medians over ``--repeats``; one machine, one run (±40 % on shared machines).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import yaml

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from conftest import TINY_PARAMS

from tailkit.evaluation.per_class import (
    per_class_frame,
    write_class_plot,
    write_per_class,
)
from tailkit.params import parse_params
from tailkit.paths import Layout
from tailkit.reporting.runs import Run
from tailkit.reporting.tables import comparison_table
from tailkit.storage.splits import write_labels


def _median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


#: Runs argv[1:] and prints its peak RSS in kB. A small process forks the measured one: Linux
#: carries the forking process's high-water RSS through exec, so forking from this benchmark,
#: with its 10^6-label frames in memory, would report those instead.
LAUNCHER = (
    "import os, sys; pid = os.fork()\n"
    "if pid == 0: os.execv(sys.argv[1], sys.argv[1:])\n"
    "_, status, usage = os.wait4(pid, 0)\n"
    "print(usage.ru_maxrss, os.waitstatus_to_exitcode(status))"
)


def _process(args: list[str], cwd: Path) -> tuple[float, float]:
    """Seconds and peak RSS (MB) of ``python -m tailkit <args>`` in ``cwd``."""
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    command = [sys.executable, "-m", "tailkit", *args]
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-c", LAUNCHER, *command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    seconds = time.perf_counter() - start
    peak_kb, code = done.stdout.split()[-2:]
    if done.returncode != 0 or code != "0":
        raise SystemExit(f"tailkit {' '.join(args)} failed in {cwd}: {done.stderr[-500:]}")
    return seconds, int(peak_kb) / 1024


def _median_process(args: list[str], cwd: Path, repeats: int) -> tuple[float, float]:
    runs = [_process(args, cwd) for _ in range(repeats)]
    return statistics.median(s for s, _ in runs), max(m for _, m in runs)


def _label_table(labels: int, rng) -> pl.DataFrame:
    train = np.minimum(rng.zipf(1.5, labels) - 1, 200_000)
    return pl.DataFrame(
        {
            "label": np.arange(labels, dtype=np.int64),
            "name": [f"label-{j}" for j in range(labels)],
            "train_count": train,
            "val_count": train // 10,
            "test_count": train // 5,
        }
    )


def _results(table: pl.DataFrame, rng) -> dict[str, np.ndarray]:
    support = table["test_count"].to_numpy()
    recall = np.where(support > 0, rng.random(len(support)), np.nan)
    return {
        "support": support,
        "recall@1": recall,
        "recall@k": np.where(support > 0, np.maximum(recall, rng.random(len(support))), np.nan),
        "precision@1": np.where(rng.random(len(support)) < 0.3, rng.random(len(support)), np.nan),
    }


def _old_text_writer(path: Path, recall, support, counts) -> None:
    """The per-class text file earlier tailkit versions wrote (one line per label)."""
    present = np.flatnonzero(support > 0)
    rows = "".join(f"{c}\t{counts[c]}\t{support[c]}\t{recall[c]:.4f}\n" for c in present.tolist())
    path.write_text("class\ttrain_count\ttest_count\taccuracy\n" + rows)


def bench_write(root: Path, labels: int, repeats: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    table = _label_table(labels, rng)
    results = _results(table, rng)
    layout = Layout(root)

    def write() -> None:
        frame = per_class_frame(table, results, 5)
        write_per_class(layout.per_class("a"), frame, "a", 5, "k", multilabel=False)

    frame = per_class_frame(table, results, 5)
    counts = table["train_count"].to_numpy()
    return {
        "per_class_parquet_s": _median_seconds(write, repeats),
        "parquet_mb": layout.per_class("a").stat().st_size / 2**20,
        "binned_plot_s": _median_seconds(
            lambda: write_class_plot(layout.class_plot("a"), frame, "recall@1"), repeats
        ),
        "plot_rows": len(layout.class_plot("a").read_text().splitlines()) - 1,
        "old_text_file_s": _median_seconds(
            lambda: _old_text_writer(
                root / "old.tsv", results["recall@1"], results["support"], counts
            ),
            repeats,
        ),
        "old_text_mb": (root / "old.tsv").stat().st_size / 2**20,
    }


def bench_compare(root: Path, labels: int, repeats: int) -> dict[str, float]:
    rng = np.random.default_rng(1)
    table = _label_table(labels, rng)
    layout = Layout(root)
    for name in ("a", "b"):
        frame = per_class_frame(table, _results(table, rng), 5)
        write_per_class(layout.per_class(name), frame, name, 5, "k", multilabel=False)
    seconds, peak = _median_process(["compare", "a", "b"], root, repeats)
    return {"compare_s": seconds, "compare_peak_mb": peak}


EXPERIMENTS, SEEDS = 20, 3


def _metrics(rng) -> dict:
    test = {k: float(rng.random()) for k in ("accuracy", "balanced_accuracy", "many", "medium")}
    test.update(few=float(rng.random()), top5_accuracy=float(rng.random()), ece=0.05)
    ranking = {f"{m}@{k}": float(rng.random()) for m in ("P", "PSP", "nDCG") for k in (1, 3, 5)}
    return {"test": test, "ranking": ranking, "train": {"steps": 100}, "plugins": {}}


def _report_workspace(root: Path) -> None:
    """A workspace of 20 × 3 experiments with every file `tailkit report` reads."""
    rng = np.random.default_rng(2)
    root.mkdir(parents=True)
    raw = copy.deepcopy(TINY_PARAMS)
    base = raw["experiments"]["softmax"]
    raw["experiments"] = {
        f"e{i}-s{s}": dict(base) for i in range(EXPERIMENTS) for s in range(SEEDS)
    }
    (root / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    layout = Layout(root)
    layout.split.mkdir(parents=True)
    counts = {s: rng.integers(0, 50, 30) for s in ("train", "val", "test")}
    write_labels(layout.split, [f"c{j}" for j in range(30)], counts)
    meta = {"dataset": raw["dataset"], "num_classes": 30}
    (layout.split / "meta.json").write_text(json.dumps(meta))
    table = _label_table(30, rng)
    for name in raw["experiments"]:
        layout.metrics(name).parent.mkdir(parents=True, exist_ok=True)
        layout.metrics(name).write_text(json.dumps(_metrics(rng)))
        layout.curve(name).parent.mkdir(parents=True, exist_ok=True)
        curve = "step\tseconds\tloss\tval_accuracy\tval_balanced_accuracy\n"
        layout.curve(name).write_text(
            curve + "".join(f"{i}\t{i}\t1\t0.5\t0.4\n" for i in range(20))
        )
        write_class_plot(
            layout.class_plot(name), per_class_frame(table, _results(table, rng), 5), "recall@1"
        )


def bench_report(root: Path, repeats: int) -> dict[str, float]:
    _report_workspace(root)
    seconds, peak = _median_process(["report", "--no-figures"], root, repeats)
    rng = np.random.default_rng(3)
    runs = []
    for seed in range(SEEDS):
        raw = copy.deepcopy(TINY_PARAMS)
        raw["base"]["seed"] = seed
        raw["experiments"] = {
            f"e{i}": dict(TINY_PARAMS["experiments"]["softmax"]) for i in range(EXPERIMENTS)
        }
        params = parse_params(raw)
        runs += [Run(name, "", params, _metrics(rng)) for name in raw["experiments"]]
    table = comparison_table(runs)
    assert " ± " in table and len(table.splitlines()) == 2 + EXPERIMENTS
    return {
        "report_s": seconds,
        "report_peak_mb": peak,
        "seed_table_s": _median_seconds(lambda: comparison_table(runs), repeats),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--labels", type=int, default=1_000_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    out: dict[str, float] = {"labels": args.labels}
    with tempfile.TemporaryDirectory() as scratch:
        root = Path(scratch)
        out.update(bench_write(root / "write", args.labels, args.repeats))
        out.update(bench_compare(root / "compare", args.labels, args.repeats))
        out.update(bench_report(root / "report", args.repeats))
    width = max(len(k) for k in out)
    for key, value in out.items():
        print(
            f"{key:<{width}}  {value:.3f}"
            if isinstance(value, float)
            else f"{key:<{width}}  {value}"
        )
    if args.json:
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
