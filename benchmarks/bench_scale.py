"""Growth of every stage with the label count, measured: wall time and peak memory per stage.

    python benchmarks/bench_scale.py [--labels 10000 100000 1000000] [--json out.json]
        [--study million-labels | amazon-670k-shaped]

Runs the stages of ``examples/studies/million-labels.yaml`` (synthetic hierarchy, d = 32,
~2.5 rows per label; sampled softmax over uniform and in-batch negatives, negative sampling
with the adversarial tree and its correction), or of ``amazon-670k-shaped.yaml`` (the same
experiments on sparse TF-IDF rows of the ``synthetic-xc`` set, features and rows scaled with C
in Amazon-670K's proportions), at each C, rows in proportion, each stage the
command ``dvc repro`` runs (``python -m tailkit <stage>``) as its own process in a scratch
project. For each stage it prints the seconds and the peak resident memory (the process's
``ru_maxrss``) at every C, and the growth exponent α of time ∝ C^α fitted by least squares on
log–log axes. Exact evaluation scores every label of every test row, so its O(N·C) = O(C²)
here is inherent; so is a full softmax's, which the study leaves out.

Times are from one run on whatever machine runs it (±40 % on shared ones); the exponents, from
one machine and run, are what to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).parents[1]
STUDIES = ROOT / "examples" / "studies"
ROWS_PER_LABEL = 2.5


def scaled(params: dict, num_classes: int) -> dict:
    """The study's params at ``num_classes`` labels, the other sizes in proportion."""
    dataset = params["dataset"]
    if dataset["name"] == "synthetic":
        dataset["num_classes"] = num_classes
        dataset["num_examples"] = int(ROWS_PER_LABEL * num_classes)
    elif dataset["name"] == "synthetic-xc":
        ratio = num_classes / dataset["num_labels"]
        for key in ("num_features", "num_train", "num_test"):
            dataset[key] = max(1, round(dataset[key] * ratio))
        dataset["num_labels"] = num_classes
    else:
        raise SystemExit(f"no rule to scale dataset {dataset['name']!r}")
    return params


def _stages(params: dict) -> list[tuple[str, list[str]]]:
    stages = [
        ("download", ["download"]),
        ("subsample", ["subsample"]),
        *((f"featurize@{key}", ["featurize", "--features", key]) for key in params["featurize"]),
        ("fit-sampler", ["fit-sampler"]),
    ]
    for name in params["experiments"]:
        stages.append((f"train@{name}", ["train", "--experiment", name]))
    for name in params["experiments"]:
        stages.append((f"evaluate@{name}", ["evaluate", "--experiment", name]))
    return stages


def _run(args: list[str], cwd: Path) -> tuple[float, float]:
    """Seconds and peak RSS (MB) of one stage process."""
    env = {**os.environ, "DVC_NO_ANALYTICS": "1"}
    cmd = [sys.executable, "-m", "tailkit", *args, "--params", "params.yaml"]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(args)} failed at {cwd}")
    return seconds, usage.ru_maxrss / 1024


def measure(
    num_classes: int, workdir: Path, study: str, only: list[str] | None = None
) -> dict[str, dict[str, float]]:
    params = scaled(yaml.safe_load((STUDIES / f"{study}.yaml").read_text()), num_classes)
    if only:
        params["experiments"] = {k: v for k, v in params["experiments"].items() if k in only}
    project = workdir / f"C{num_classes}"
    project.mkdir(parents=True)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    out = {}
    for stage, args in _stages(params):
        seconds, rss = _run(args, project)
        out[stage] = {"seconds": round(seconds, 2), "peak_mb": round(rss)}
        print(f"C={num_classes:,} {stage}: {seconds:.1f} s, {rss:,.0f} MB", flush=True)
    return out


def exponent(labels: list[int], seconds: list[float]) -> float:
    """α of time ∝ C^α, least squares on log–log axes."""
    return float(np.polyfit(np.log(labels), np.log(seconds), 1)[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--labels", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--json", type=Path, help="also write the measurements here")
    parser.add_argument("--keep", type=Path, help="run in this folder and keep it")
    parser.add_argument("--study", default="million-labels")
    parser.add_argument("--only", nargs="*", help="run only these experiments")
    args = parser.parse_args()
    labels = sorted(args.labels)
    with tempfile.TemporaryDirectory(prefix="tailkit-scale-") as tmp:
        workdir = args.keep or Path(tmp)
        runs = {c: measure(c, workdir, args.study, args.only) for c in labels}
    stages = list(runs[labels[0]])
    head = " | ".join(f"C = {c:,}: s / MB" for c in labels)
    # a stage's ~3 s of imports dominates the small runs and flattens the fit over all of
    # them; the last decade shows the growth where the work dominates
    print(f"\n| stage | {head} | α (fit) | α (last step) |")
    print("|---|" + "---:|" * (len(labels) + 2))
    table = {}
    for stage in stages:
        seconds = [max(runs[c][stage]["seconds"], 1e-3) for c in labels]
        alpha = exponent(labels, seconds) if len(labels) > 1 else None
        last = exponent(labels[-2:], seconds[-2:]) if len(labels) > 1 else None
        cells = " | ".join(
            f"{runs[c][stage]['seconds']:.1f} / {runs[c][stage]['peak_mb']:,}" for c in labels
        )
        shown = ["–" if a is None else f"{a:.2f}" for a in (alpha, last)]
        print(f"| {stage} | {cells} | {shown[0]} | {shown[1]} |")
        table[stage] = {
            "alpha": alpha,
            "alpha_last": last,
            **{str(c): runs[c][stage] for c in labels},
        }
    if args.json:
        args.json.write_text(json.dumps(table, indent=2) + "\n")


if __name__ == "__main__":
    main()
