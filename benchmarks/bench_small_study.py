"""Where a small study's time goes: end to end against the work its stages do.

    python benchmarks/bench_small_study.py [--rows 20000] [--labels 500] [--jobs 1]
        [--json out.json]

The study is ``examples/studies/text-table.yaml`` (softmax, logit-adjusted and a sampled loss
on a table of short texts) on a generated table (``tailkit.testing.tables.zipf_text_table``),
in a fresh git + DVC project, run from nothing with ``tailkit repro --jobs N``. Printed: the
end-to-end seconds, each job's seconds as ``tailkit repro`` reports them, the stages' own train
and evaluate seconds (``metrics/timings/``), their ratio (target ≤ 3× at ``--rows 200000``:
with one process per DVC stage, starting a 20,000-row study's 13 processes and 6 jobs costs
more than its training, so 1.5× is out of its reach; docs/notes), and the seconds of a repeat
``tailkit repro`` that has nothing to do and of the fingerprint stage alone (target
≤ 2 s). One machine, one run: timings on shared machines move ±40 %.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from tailkit.testing.tables import zipf_text_table

ROOT = Path(__file__).parents[1]
BIN = Path(sys.executable).parent


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        DVC_NO_ANALYTICS="1",
        DVC_STUDIO_OFFLINE="true",
        GIT_AUTHOR_NAME="bench",
        GIT_AUTHOR_EMAIL="bench@example.invalid",
        GIT_COMMITTER_NAME="bench",
        GIT_COMMITTER_EMAIL="bench@example.invalid",
    )
    return env


def _run(cmd: list[str], cwd: Path, **extra: str) -> tuple[float, str]:
    started = time.perf_counter()
    env = {**_env(), **extra}
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - started
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}\n{done.stdout}{done.stderr}")
    return took, done.stdout + done.stderr


def project(path: Path, rows: int, labels: int) -> None:
    """A git + DVC repo with our dvc.yaml and the study's params on a generated table."""
    shutil.copy(ROOT / "dvc.yaml", path / "dvc.yaml")
    shutil.copy(ROOT / ".dvcignore", path / ".dvcignore")
    shutil.copytree(
        ROOT / "tailkit", path / "tailkit", ignore=shutil.ignore_patterns("__pycache__")
    )
    (path / ".gitignore").write_text("/data/\n__pycache__/\n")
    zipf_text_table(rows, labels).write_parquet(path / "my-table.parquet")
    params = yaml.safe_load((ROOT / "examples/studies/text-table.yaml").read_text())
    (path / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for cmd in (
        ["git", "init", "-q", "-b", "main"],
        ["dvc", "init", "-q"],
        ["dvc", "config", "core.analytics", "false"],
    ):
        _run(cmd, path)
    shutil.copytree(ROOT / ".dvc" / "plots", path / ".dvc" / "plots")
    _run(["git", "add", "-A"], path)
    _run(["git", "commit", "-qm", "init"], path)


def stage_seconds(path: Path, stage: str) -> float:
    return sum(
        json.loads(f.read_text())["seconds"]
        for f in sorted((path / "metrics" / "timings" / stage).glob("*.json"))
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--labels", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="tailkit-small-study-") as folder:
        path = Path(folder)
        project(path, args.rows, args.labels)
        tailkit = [str(BIN / "tailkit")]
        total, log = _run([*tailkit, "repro", "--jobs", str(args.jobs)], path)
        jobs = {
            m.group(1): float(m.group(2))
            for m in re.finditer(r"repro: done (.+?) in ([\d.]+) s", log)
        }
        train, evaluate = stage_seconds(path, "train"), stage_seconds(path, "evaluate")
        idle, _ = _run([*tailkit, "repro", "--jobs", str(args.jobs)], path)
        # each stage's command alone, outside DVC: what its process costs
        lock = yaml.safe_load((path / "dvc.lock").read_text())["stages"]
        commands = {
            name: _run(["bash", "-c", entry["cmd"]], path, DVC_STAGE=name)[0]
            for name, entry in lock.items()
        }
        fingerprint = commands["fingerprint"]
    work = train + evaluate
    found = {
        "end_to_end": total,
        "train": train,
        "evaluate": evaluate,
        "ratio": total / work,
        "nothing_to_do": idle,
        "fingerprint": fingerprint,
        "jobs": jobs,
        "commands": commands,
    }
    print(f"# {args.rows:,} rows, {args.labels} labels, tailkit repro --jobs {args.jobs}\n")
    for name, seconds in jobs.items():
        alone = sum(commands.get(stage, 0.0) for stage in name.split(" → "))
        print(f"- {name}: {seconds:.1f} s (its commands alone {alone:.1f} s)")
    print(
        f"\nend to end {total:.1f} s; the stages' own train {train:.1f} s + evaluate "
        f"{evaluate:.1f} s = {work:.1f} s; ratio {total / work:.1f}× (target ≤ 3× at 200,000 rows)\n"
        f"a repeat with nothing to do {idle:.1f} s; the fingerprint stage {fingerprint:.1f} s "
        "(target ≤ 2 s)"
    )
    if args.json:
        args.json.write_text(json.dumps(found, indent=2) + "\n")


if __name__ == "__main__":
    main()
