"""``tailkit repro --jobs N``: ``dvc repro`` with independent stages run side by side.

``dvc repro`` runs one stage at a time. On the default pipeline that leaves a core idle for
much of the run: napkinXC trains on one thread (several would make it irreproducible), and
each stage spends seconds in work that does not spread over cores (Python and torch imports,
reading and writing Parquet and safetensors, DVC hashing the outputs). But DVC lets several
``dvc repro`` processes work in one project: it releases its repository lock while a stage's
command runs, and its per-output read/write locks keep two processes off the same files. So
this module reads the stage graph (``dvc dag --dot``), groups each run of stages that follow
one another with nothing branching in or out (``train@x`` then ``evaluate@x``) into one job,
and runs up to N jobs at once, each as one ``dvc repro --single-item`` process over its
stages in order; a job starts when every job it depends on has finished. The result is the
same ``dvc.lock`` and the same outputs as one ``dvc repro``: each stage still runs through
DVC, which still skips what is up to date. Once the head of the graph has run (the code
fingerprint, which always runs, is there), one ``dvc status`` says which stages can still
change; the jobs without one of them are not started at all, so a run with nothing to do
costs one DVC process for the head and one for the status, not one per job. After a whole
pipeline's run, ``dvc.lock`` loses the entries of stages that are gone from it (:func:`prune_lock`).

Threads: a job gets ``cores // min(N, jobs that could run now)`` threads (OpenMP, MKL, BLAS
and numba are told through their environment variables), so the chain at the head of the
graph runs on every core and the experiments share them. tailkit's outputs do not depend on
the thread count (its compiled kernels split work by rows, not by thread, and torch's CPU
kernels give the same bytes on one or two threads: tests/pipeline/test_parallel_repro.py checks a
model), so the bytes are those of a plain ``dvc repro`` on this machine.

Which ready job goes first: the one with the longest chain of expected work below it, the
expected seconds of a training stage being the last recorded ones
(``metrics/timings/train/<experiment>.json``) so that the slowest experiment (napkinXC on the
default) starts early instead of finishing alone at the end.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tailkit.errors import TailkitError

#: Seconds assumed for a stage with no recorded time: most non-training stages take a few.
DEFAULT_SECONDS = 8.0
#: What a training stage costs beyond its loop (imports, reading features, saving the model)
#: and the evaluate stage after it.
STAGE_OVERHEAD = 16.0
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMBA_NUM_THREADS",
)

_NODE = re.compile(r'^\s*"([^"]+)";\s*$')
_EDGE = re.compile(r'^\s*"([^"]+)"\s*->\s*"([^"]+)";\s*$')


class ReproError(TailkitError):
    """A stage failed, or DVC could not describe the pipeline."""


@dataclass
class Job:
    """Stages run in order by one ``dvc repro --single-item`` process."""

    stages: list[str]
    needs: set[int] = field(default_factory=set)  # indices of the jobs that must finish first
    seconds: float = DEFAULT_SECONDS  # expected, for the order only

    @property
    def name(self) -> str:
        return " → ".join(self.stages)


def parse_dot(text: str) -> tuple[list[str], dict[str, set[str]]]:
    """Stages (in DVC's order) and each stage's upstream stages, from ``dvc dag --dot``."""
    stages: list[str] = []
    upstream: dict[str, set[str]] = {}
    for line in text.splitlines():
        if match := _EDGE.match(line):
            source, target = match.groups()
            upstream.setdefault(target, set()).add(source)
        elif match := _NODE.match(line):
            stages.append(match.group(1))
    for stage in stages:
        upstream.setdefault(stage, set())
    unknown = {s for ups in upstream.values() for s in ups} | set(upstream)
    if missing := unknown - set(stages):
        raise ReproError(f"dvc dag: edges name stages it did not list: {sorted(missing)}")
    return stages, upstream


def topological(stages: list[str], upstream: Mapping[str, set[str]]) -> list[str]:
    """``stages`` reordered so every stage follows its upstream ones (ties keep DVC's order)."""
    done: set[str] = set()
    order: list[str] = []
    pending = list(stages)
    while pending:
        ready = [s for s in pending if upstream[s] <= done]
        if not ready:
            raise ReproError(f"dvc dag: a cycle among {sorted(pending)}")
        for stage in ready:
            order.append(stage)
            done.add(stage)
        pending = [s for s in pending if s not in done]
    return order


def group_jobs(
    stages: list[str], upstream: Mapping[str, set[str]], seconds: Callable[[str], float]
) -> list[Job]:
    """One job per chain: a stage follows stage u in u's job when u ends that job, every other
    upstream stage of it is upstream of u too (so it is done when u's job starts), and no other
    downstream stage of u could follow u that way (``train@x`` is followed by ``evaluate@x``;
    the experiments after ``fit-sampler`` stay apart, to run side by side)."""
    order = topological(stages, upstream)
    ancestors: dict[str, set[str]] = {}
    downstream: dict[str, set[str]] = {s: set() for s in order}
    for stage in order:
        ancestors[stage] = set().union(*(ancestors[u] | {u} for u in upstream[stage]))
        for up in upstream[stage]:
            downstream[up].add(stage)

    def can_follow(stage: str, up: str) -> bool:
        return all(v == up or v in ancestors[up] for v in upstream[stage])

    job_of: dict[str, int] = {}
    jobs: list[Job] = []
    for stage in order:
        index = len(jobs)
        for up in upstream[stage]:
            followers = [c for c in downstream[up] if can_follow(c, up)]
            if followers == [stage] and jobs[job_of[up]].stages[-1] == up:
                index = job_of[up]
                break
        if index == len(jobs):
            jobs.append(Job([]))
        jobs[index].stages.append(stage)
        job_of[stage] = index
    for index, job in enumerate(jobs):
        job.seconds = sum(seconds(s) for s in job.stages)
        job.needs = {job_of[up] for s in job.stages for up in upstream[s]} - {index}
    return jobs


def critical_seconds(jobs: list[Job]) -> list[float]:
    """For each job, its expected seconds plus the longest chain of jobs that wait on it."""
    below: list[list[int]] = [[] for _ in jobs]
    for index, job in enumerate(jobs):
        for need in job.needs:
            below[need].append(index)
    memo: dict[int, float] = {}

    def longest(index: int) -> float:
        if index not in memo:
            memo[index] = jobs[index].seconds + max((longest(i) for i in below[index]), default=0)
        return memo[index]

    return [longest(i) for i in range(len(jobs))]


def recorded_seconds(root: Path) -> Callable[[str], float]:
    """Expected seconds of a stage: a training stage's last recorded loop plus its overhead, a
    sampler's last recorded fit plus a stage's usual few seconds."""

    def recorded(path: Path, key: str) -> float | None:
        try:
            return float(json.loads(path.read_text())[key])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def seconds(stage: str) -> float:
        kind, _, item = stage.partition("@")
        timings = root / "metrics" / "timings"
        if kind == "train" and item:
            loop = recorded(timings / "train" / f"{item}.json", "seconds")
            return (loop if loop is not None else DEFAULT_SECONDS) + STAGE_OVERHEAD
        if kind == "fit-sampler" and item:
            fit = recorded(timings / "fit-sampler" / f"{item}.json", "fit_seconds")
            return (fit or 0.0) + DEFAULT_SECONDS
        return DEFAULT_SECONDS

    return seconds


def usable_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


@dataclass
class Finished:
    job: Job
    returncode: int
    output: str
    seconds: float
    threads: int


#: Starts a job: (its stages, its environment) -> a running process writing to ``log``.
Launcher = Callable[[list[str], dict[str, str], Path], subprocess.Popen]


def dvc_launcher(root: Path, force: bool) -> Launcher:
    def launch(stages: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
        command = [sys.executable, "-m", "dvc", "repro", "--single-item"]
        if force:
            command.append("--force")
        with log.open("wb") as out:
            return subprocess.Popen(
                [*command, *stages], cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT
            )

    return launch


#: DVC's advice after each run (git add, autostage, push): once would do, a dozen times is noise.
_HINTS = re.compile(r"^\s*(To track the changes with git|git add |To enable auto staging|"
                    r"dvc config core\.autostage|Use `dvc push`)")  # fmt: skip


def _without_hints(output: str) -> str:
    lines = [line for line in output.splitlines() if line.strip() and not _HINTS.match(line)]
    return "\n".join(lines)


def run_jobs(
    jobs: list[Job],
    workers: int,
    launch: Launcher,
    cores: int,
    report: Callable[[str], None] = print,
    poll_seconds: float = 0.05,
    up_to_date: Callable[[set[int]], set[int]] | None = None,
) -> list[Finished]:
    """Run ``jobs`` on up to ``workers`` processes; after a failure no new job starts, the
    running ones finish, and :class:`ReproError` names the failed stages with their output.

    ``up_to_date``, called once when the jobs that need nothing (the head of the graph) have
    finished, with their indices, returns the jobs that need not run at all; those are
    skipped (and count as done for the jobs after them)."""
    priority = critical_seconds(jobs)
    waiting = set(range(len(jobs)))
    done: set[int] = set()
    roots = {i for i, job in enumerate(jobs) if not job.needs}
    running: dict[int, tuple[subprocess.Popen, Path, float, int]] = {}
    finished: list[Finished] = []
    failed: list[Finished] = []
    with tempfile.TemporaryDirectory(prefix="tailkit-repro-") as logs:
        while waiting or running:
            if up_to_date is not None and roots <= done:
                skipped = up_to_date(set(roots)) & waiting
                up_to_date = None
                if skipped:
                    report(f"repro: {len(skipped)} of {len(jobs)} jobs up to date")
                waiting -= skipped
                done |= skipped
            ready = sorted(
                (i for i in waiting if jobs[i].needs <= done), key=lambda i: (-priority[i], i)
            )
            while ready and len(running) < workers and not failed:
                index = ready.pop(0)
                waiting.discard(index)
                sharing = min(workers, len(running) + 1 + len(ready))
                threads = max(1, cores // sharing)
                env = os.environ | {name: str(threads) for name in THREAD_VARIABLES}
                log = Path(logs) / f"{index}.log"
                report(f"repro: start {jobs[index].name} ({threads} thread{'s' * (threads > 1)})")
                running[index] = (
                    launch(jobs[index].stages, env, log),
                    log,
                    time.monotonic(),
                    threads,
                )
            if failed and not running:
                break
            if not running and waiting:
                raise ReproError(f"repro: jobs wait on jobs that cannot run: {sorted(waiting)}")
            time.sleep(poll_seconds)
            for index, (process, log, start, threads) in list(running.items()):
                if process.poll() is None:
                    continue
                del running[index]
                result = Finished(
                    jobs[index],
                    process.returncode,
                    log.read_text(errors="replace"),
                    time.monotonic() - start,
                    threads,
                )
                if text := _without_hints(result.output):
                    report(text)
                report(f"repro: {'done' if result.returncode == 0 else 'FAILED'} "
                       f"{result.job.name} in {result.seconds:.1f} s")  # fmt: skip
                if result.returncode == 0:
                    done.add(index)
                    finished.append(result)
                else:
                    failed.append(result)
    if failed:
        names = ", ".join(f.job.name for f in failed)
        not_run = len(jobs) - len(finished) - len(failed)
        raise ReproError(f"repro: {names} failed (exit {failed[0].returncode}); "
                         f"{not_run} job(s) not run")  # fmt: skip
    return finished


def _dvc_output(root: Path, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "dvc", *args],
        cwd=root,
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        # DVC's whole message: its cause is often on a line before the last (a params file
        # it cannot parse names the file first, the YAML rule it broke last)
        said = " ".join(line.strip() for line in result.stderr.strip().splitlines())
        raise ReproError(f"dvc {args[0]} failed: {said or 'no output'}")
    return result.stdout


def unchanged_jobs(
    jobs: list[Job], upstream: Mapping[str, set[str]], status: Mapping[str, object], ran: set[int]
) -> set[int]:
    """Jobs none of whose stages can change: not in ``dvc status`` (the stages of jobs in
    ``ran`` have run, so their "always changed" no longer counts) and not downstream of a stage
    that is. A status entry that names no stage of the graph (a ``.dvc`` file of another
    pipeline, a name DVC spells otherwise) makes every job count as changed."""
    stage_job = {stage: i for i, job in enumerate(jobs) for stage in job.stages}
    if any(name not in stage_job for name in status):
        return set()
    changed = {name for name in status if stage_job[name] not in ran}
    for stage in topological(list(stage_job), upstream):
        if upstream[stage] & changed:
            changed.add(stage)
    return {i for i in range(len(jobs)) if i not in ran and not set(jobs[i].stages) & changed}


def stage_graph(root: Path, targets: Iterable[str] = ()) -> tuple[list[str], dict[str, set[str]]]:
    """The pipeline's stages and their upstream stages, as DVC sees them."""
    return parse_dot(_dvc_output(root, "dag", "--dot", *targets))


def reproduce(
    root: Path,
    workers: int,
    targets: Iterable[str] = (),
    force: bool = False,
    report: Callable[[str], None] = print,
) -> list[Finished]:
    """``dvc repro [targets]`` with up to ``workers`` jobs at once (module docstring)."""
    targets = list(targets)
    stages, upstream = stage_graph(root, targets)
    jobs = group_jobs(stages, upstream, recorded_seconds(root))

    def up_to_date(ran: set[int]) -> set[int]:
        # once the head (with the always-changed code fingerprint) has run, one `dvc status`
        # says what else can change: a run with nothing to do then costs no DVC process a job
        with_deps = ["--with-deps", *targets] if targets else []
        status = json.loads(_dvc_output(root, "status", "--json", *with_deps) or "{}")
        return unchanged_jobs(jobs, upstream, status, ran)

    finished = run_jobs(
        jobs,
        workers,
        dvc_launcher(root, force),
        usable_cores(),
        report,
        up_to_date=None if force else up_to_date,
    )
    if not targets:
        gone = prune_lock(root, stages)
        if gone:
            report(f"repro: dropped from dvc.lock, no longer in the pipeline: {', '.join(gone)}")
        swept, freed = sweep_checkpoints(root)
        if swept:
            report(
                f"repro: removed the checkpoints of {len(swept)} run(s) no longer in params.yaml "
                f"({', '.join(swept)}), freeing {freed / 1e6:,.1f} MB"
            )
    return finished


def sweep_checkpoints(root: Path) -> tuple[list[str], int]:
    """Remove ``data/checkpoints/<run>`` for runs params.yaml no longer has (a deleted
    experiment, seed or decoupled run): nothing would ever resume from them, and each holds
    a layer and its optimiser state (~0.85 GB at GeoNames' size). A run still in params keeps
    its checkpoint, to resume from after a failure. Returns the runs removed and the bytes
    freed."""
    import shutil

    from tailkit.params import SEED_RUN, load_params
    from tailkit.paths import Layout

    folder = Layout(root).checkpoints
    if not folder.is_dir():
        return [], 0
    params = load_params(root / "params.yaml")
    runs = set(params.experiments)
    runs |= {
        f"{name}{SEED_RUN}{seed}" for name in params.experiments for seed in params.base.extra_seeds
    }
    swept, freed = [], 0
    for entry in sorted(folder.iterdir()):
        if entry.name in runs or entry.name.startswith("."):
            continue
        freed += sum(f.stat().st_size for f in entry.rglob("*") if f.is_file())
        shutil.rmtree(entry, ignore_errors=True)
        swept.append(entry.name)
    return swept, freed


def prune_lock(root: Path, stages: Iterable[str]) -> list[str]:
    """Drop the ``dvc.lock`` entries of stages the pipeline no longer has; their names.

    ``dvc repro`` rewrites the entries of the stages it runs and never removes one: a stage
    that left ``dvc.yaml`` (an experiment or sampler deleted from ``params.yaml``, whose
    ``foreach`` then generates no stage for it) keeps a lock entry naming outputs nobody
    produces any more, and ``dvc remove`` cannot reach a generated stage. The file is
    rewritten with DVC's own round-trip YAML, so what remains keeps DVC's formatting.
    """
    import yaml
    from dvc.utils.serialize import modify_yaml

    lock = root / "dvc.lock"
    if not lock.exists():
        return []
    current = set(stages)
    entries = (yaml.safe_load(lock.read_text()) or {}).get("stages") or {}
    gone = sorted(name for name in entries if name not in current)
    if gone:  # otherwise the file is left as DVC wrote it, not even rewritten
        with modify_yaml(lock) as data:
            for name in gone:
                del data["stages"][name]
    return gone
