"""Start-up time of the `tailkit` commands a newcomer types first (issue 15, item 6).

    python benchmarks/bench_cli.py [--repeats 5] [--json out.json]

Each command runs as a fresh process (the way a shell runs it) in an empty folder; the median
wall time over ``--repeats`` is reported beside the target (≤ 1 s). Then ``python -X importtime``
of each gives the modules that cost the most (cumulative microseconds, top 5), which is where a
slow command spends its start-up. One machine, one run: timings on shared machines move ±40 %.

``list``, ``plugins`` and ``options`` read the component catalog (:mod:`tailkit.catalog`),
which the first call after an install or a code edit builds by importing every component; the
``cold`` column is that first call, with an empty cache folder, once.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = [
    ["--version"],
    ["--help"],
    ["list", "losses"],
    ["plugins"],
    ["options", "samplers", "tree"],
]
TARGET_SECONDS = 1.0


def wall(args: list[str], cwd: Path, env: dict[str, str] | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "tailkit", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        env=env,
    )
    return time.perf_counter() - start


def heaviest_imports(args: list[str], cwd: Path, top: int = 5) -> list[tuple[str, float]]:
    """The ``top`` top-level imports by cumulative time (seconds), from ``-X importtime``."""
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "tailkit", *args],
        cwd=cwd,
        check=True,
        capture_output=True,
        text=True,
    ).stderr
    rows = []
    for line in out.splitlines():
        if not line.startswith("import time:") or "|" not in line:
            continue
        _, cumulative, name = line.split(":", 1)[1].split("|")
        # a module imported by another is indented below it: keep the outermost ones only
        if cumulative.strip().isdigit() and not name.startswith("  "):
            rows.append((name.strip(), int(cumulative) / 1e6))
    return sorted(rows, key=lambda r: -r[1])[:top]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        cwd = Path(tmp)
        for command in COMMANDS:
            with tempfile.TemporaryDirectory() as empty:
                cold = wall(command, cwd, {**os.environ, "XDG_CACHE_HOME": empty})
            wall(command, cwd)  # warm the file cache and numba's, as a second call would be
            times = [wall(command, cwd) for _ in range(args.repeats)]
            median = statistics.median(times)
            name = "tailkit " + " ".join(command)
            results[name] = {
                "median_seconds": round(median, 3),
                "cold_seconds": round(cold, 3),
                "target_seconds": TARGET_SECONDS,
                "meets_target": median <= TARGET_SECONDS,
                "heaviest_imports": heaviest_imports(command, cwd),
            }
    width = max(len(n) for n in results)
    for name, r in results.items():
        mark = "ok " if r["meets_target"] else "SLOW"
        imports = ", ".join(f"{m} {s:.2f}s" for m, s in r["heaviest_imports"][:3])
        print(
            f"{mark} {name:<{width}}  {r['median_seconds']:6.3f} s  "
            f"(cold {r['cold_seconds']:5.2f} s)   {imports}"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
