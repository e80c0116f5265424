"""The rows a report compares: one trained-and-evaluated experiment each, from the workspace
or from a DVC experiment (``dvc exp show --json``), with the settings that produced it.

A *study* is a set of runs trained on the same data (same dataset, subsample and featurize
params): only such runs are comparable in one table. A DVC experiment that changes one
experiment's params joins the workspace's study with that row; one that changes the data
forms a study of its own.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tailkit.errors import DataValidationError, InvalidParameterError, TailkitError
from tailkit.params import NO_SAMPLER, Params, parse_params
from tailkit.paths import Layout, require
from tailkit.storage.checksum import params_hash

WORKSPACE = "workspace"


@dataclass
class Run:
    """One experiment's metrics and settings, and where they came from."""

    experiment: str  # the key in params.experiments
    source: str  # "": the summary's or a baseline commit's rows; else an exp's name or "workspace"
    params: Params
    metrics: dict[str, Any]

    @property
    def name(self) -> str:
        return f"{self.source}:{self.experiment}" if self.source else self.experiment

    @property
    def settings(self) -> dict[str, Any]:
        """The experiment's resolved settings, flattened to dotted keys, with its sampler's
        fitted configuration spelled out (two keys naming the same sampler config are equal)."""
        resolved = self.params.resolved(self.experiment).as_dict()
        sampler = resolved.pop("sampler")
        flat = _flatten(resolved)
        flat["sampler"] = sampler
        if sampler != NO_SAMPLER:
            flat.update(_flatten(self.params.samplers[sampler], "sampler."))
        return flat

    @property
    def study(self) -> str:
        """Key of the data this run was trained on."""
        return data_key(self.params)


def data_key(params: Params) -> str:
    return params_hash(
        {
            "dataset": params.dataset,
            "subsample": params.subsample.__dict__,
            "featurize": params.featurize,
        }
    )


def describe_data(params: Params) -> str:
    """``geonames · natural profile · rff: rff (dim=512, bandwidth=0.02)``, one entry per
    feature set."""
    sub = params.subsample
    profile = f"{sub.profile} profile"
    if sub.profile != "natural":
        profile += f" (ratio {sub.imbalance_ratio:g})"
    sets = [f"{key}: {_component(spec)}" for key, spec in params.featurize.items()]
    return " · ".join([_component(params.dataset), profile, *sets])


def _component(spec: dict[str, Any]) -> str:
    options = ", ".join(f"{k}={v}" for k, v in spec.items() if k != "name")
    return f"{spec['name']} ({options})" if options else spec["name"]


def _flatten(value: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(item, dict):
            out.update(_flatten(item, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = item
    return out


def _with_time(metrics: dict[str, Any], timing: dict[str, Any] | None) -> dict[str, Any]:
    """The quality metrics with the training seconds of ``metrics/timings/train/<exp>.json``
    under ``train.seconds``, where the report's tables look for them (the files stay apart so
    that the metrics do not change when only the clock does)."""
    if not timing or "seconds" not in timing:
        return metrics
    return {**metrics, "train": {**metrics.get("train", {}), "seconds": timing["seconds"]}}


def read_json(path: Path, producer: str) -> dict[str, Any]:
    """A metrics file as a dict; missing, unreadable or not an object: one line naming it and
    the ``dvc repro`` target that rebuilds it."""
    try:
        value = json.loads(require(path, producer).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        reason = getattr(exc, "msg", None) or type(exc).__name__
        raise DataValidationError(
            f"{path}: unreadable ({reason}); rebuild it with `dvc repro {producer}`"
        ) from exc
    if not isinstance(value, dict):
        raise DataValidationError(
            f"{path}: not a JSON object; rebuild it with `dvc repro {producer}`"
        )
    return value


def workspace_runs(params: Params, layout: Layout, with_time: bool = True) -> list[Run]:
    """Every experiment of ``params`` with all its metrics (``metrics/detail/``) and, with
    ``with_time``, its time; then its runs with each of ``base.extra_seeds``
    (``<experiment>+seed<s>``), the repeats the tables average."""

    def run(params: Params, name: str, output: str, stage: str) -> Run:
        metrics = read_json(layout.metrics_detail(output), f"evaluate{stage}")
        timing_path = layout.timing(f"train/{output}")
        timing = None
        if with_time and timing_path.exists():
            timing = read_json(timing_path, f"train{stage}")
        return Run(name, "", params, _with_time(metrics, timing))

    runs = []
    for name in params.experiments:
        prefix = "-decoupled" if params.experiment(name).decoupled else ""
        runs.append(run(params, name, name, f"{prefix}@{name}"))
        for seed in params.base.extra_seeds:
            seeded, output = params.seed_run(name, seed)
            runs.append(run(seeded, name, output, f"{prefix}-seed@{name}-{seed}"))
    return runs


def dvc_exp_show(root: Path) -> list[dict[str, Any]]:
    """The parsed output of ``dvc exp show --json`` in ``root``."""
    try:
        done = subprocess.run(
            ["dvc", "exp", "show", "--json"], check=False, cwd=root, capture_output=True, text=True
        )
    except FileNotFoundError as exc:
        raise TailkitError("report: `dvc` is not on PATH; activate the project's venv") from exc
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise TailkitError(f"report: `dvc exp show --json` failed: {last}")
    return json.loads(done.stdout)


def _metrics_of(metrics: dict[str, Any] | None, experiment: str) -> dict[str, Any] | None:
    """An experiment's headline metrics (what DVC records of a run) and time from exp show's
    ``{path: {"data": ...}}`` entries."""

    def data(path: Path) -> dict[str, Any] | None:
        return ((metrics or {}).get(path.as_posix()) or {}).get("data") or None

    quality = data(Layout().metrics(experiment))
    return quality and _with_time(quality, data(Layout().timing(f"train/{experiment}")))


def _detail_at(root: Path | None, rev: str, experiment: str) -> dict[str, Any] | None:
    """The experiment's detail metrics as commit ``rev`` (or the workspace) holds them — a
    git-tracked file with what the headline leaves out: the intervals, the plugins behind the
    numbers, the group and F1 thresholds; None without ``root``, where the commit lacks the
    file, or where it is not a JSON object."""
    if root is None:
        return None
    relative = Layout().metrics_detail(experiment).as_posix()
    if rev == WORKSPACE:
        path = root / relative
        text = path.read_text() if path.is_file() else None
    else:
        done = subprocess.run(
            ["git", "show", f"{rev}:{relative}"],
            cwd=root,
            capture_output=True,
            text=True,
            check=False,
        )
        text = done.stdout if done.returncode == 0 else None
    try:
        value = json.loads(text) if text else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _runs_of(
    entry: dict[str, Any], source: str, params_file: str, root: Path | None = None
) -> list[Run]:
    """The runs recorded in one ``exp show`` entry (a commit, an experiment or the workspace);
    with ``root``, each with the detail metrics its commit holds (:func:`_detail_at`)."""
    data = entry.get("data") or {}
    raw = ((data.get("params") or {}).get(params_file) or {}).get("data")
    if entry.get("error") or not raw:
        return []  # queued, running or failed: nothing to report yet
    try:
        params = parse_params(raw, f"{params_file}@{source or entry.get('rev')}")
    except InvalidParameterError:
        return []  # made with an older params schema
    rev = str(entry.get("rev", ""))
    runs = []
    for key in params.experiments:
        # the experiment's run, then one per extra seed (<experiment>+seed<s>), the repeats
        # the tables show as mean ± std
        seeded = [(params, key), *(params.seed_run(key, s) for s in params.base.extra_seeds)]
        for run_params, output in seeded:
            metrics = _metrics_of(data.get("metrics"), output)
            if metrics is None:
                continue
            detail = _detail_at(root, rev, output)
            if detail is not None:  # the same run's every metric; the time stays the headline's
                train = {**(detail.get("train") or {}), **(metrics.get("train") or {})}
                metrics = {**detail, "test": {**detail.get("test", {}), **metrics["test"]}}
                metrics["train"] = train
            runs.append(Run(key, source, run_params, metrics))
    return runs


def exp_runs(
    show: list[dict[str, Any]], params_file: str = "params.yaml", root: Path | None = None
) -> list[Run]:
    """Every run in ``dvc exp show --json`` output: each baseline commit's (plain names), then
    its experiments' (``<exp>:<experiment>``), then the workspace's (``workspace:<...>``), with
    the rows that repeat an earlier one's data and settings dropped — a DVC experiment repeats
    every experiment it did not change, and ``dvc exp run`` leaves its results in the
    workspace. With the project's ``root``, each run carries the detail metrics of its commit
    (intervals, plugins, thresholds) beside the headline DVC recorded."""
    baselines, workspace = [], []
    for entry in show:
        if entry.get("rev") == WORKSPACE:
            workspace += _runs_of(entry, WORKSPACE, params_file, root)
            continue
        baselines += _runs_of(entry, "", params_file, root)
        for group in entry.get("experiments") or []:
            for rev in group.get("revs") or []:
                name = rev.get("name") or group.get("name") or str(rev.get("rev", ""))[:7]
                baselines += _runs_of(rev, name, params_file, root)
    return distinct(baselines + workspace)


def distinct(runs: list[Run]) -> list[Run]:
    """``runs`` without those whose data, seed and settings equal an earlier run's."""
    seen, out = set(), []
    for run in runs:
        # the seed too: runs differing only in it are the repeats a mean ± std is made of
        settings = json.dumps(run.settings, sort_keys=True, default=str)
        key = (run.study, run.experiment, run.params.base.seed, settings)
        if key not in seen:
            seen.add(key)
            out.append(run)
    return out
