"""What portable arithmetic costs: each workload run under the pinned kernels
(tailkit/native/arithmetic.py) and under ``TAILKIT_ISA=native``, alternating, in fresh
processes (the libraries read the mode once, at load), with the median ratio pinned/native.

Workloads: every stage of the golden pipeline (tailkit/testing/golden.py: TF-IDF and its SVD,
the tree's fit, a dense MLP and a sparse model with the tree's draws and correction, both
evaluations) and bench_step.py's training steps. On a CPU without AVX-512 the two modes run
the same kernels and the ratios are noise around 1; the cost is on the wider machines.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEP = re.compile(r"^\s+(sampled|full)\s+C=\s*(\d+):\s+([\d.]+) ms", re.MULTILINE)


def environment(mode: str) -> dict[str, str]:
    from tailkit.native.arithmetic import OPT_OUT, pins

    env = {k: v for k, v in os.environ.items() if k not in pins()}
    env[OPT_OUT] = mode
    return env


def golden_seconds(mode: str) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-m", "tailkit.testing.golden", "--seconds"],
        env=environment(mode),
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return json.loads(done.stdout)


def step_milliseconds(mode: str) -> dict[str, float]:
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_step.py"),
            "--repeats",
            "3",
            "--steps",
            "10",
        ],
        env=environment(mode),
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    )
    return {f"step {kind} C={c}": float(ms) / 1000 for kind, c, ms in STEP.findall(done.stdout)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3, help="alternating pairs per workload")
    args = parser.parse_args()
    from tailkit.native.arithmetic import cpu_flags, cpu_model

    wide = "avx512f" in cpu_flags()
    print(f"CPU: {cpu_model()} ({'AVX-512' if wide else 'no AVX-512'})")
    for name, workload in (("golden pipeline", golden_seconds), ("bench_step", step_milliseconds)):
        workload("portable"), workload("native")  # compile both modes' kernels first
        times: dict[str, dict[str, list[float]]] = {}
        for _ in range(args.rounds):
            for mode in ("portable", "native"):
                for key, value in workload(mode).items():
                    times.setdefault(key, {}).setdefault(mode, []).append(value)
        print(f"\n{name}: median seconds over {args.rounds} rounds, ratio portable/native")
        for key, by_mode in times.items():
            p, n = (statistics.median(by_mode[m]) for m in ("portable", "native"))
            print(f"  {key:<28} portable {p:8.3f}  native {n:8.3f}  ratio {p / n:5.2f}")


if __name__ == "__main__":
    main()
