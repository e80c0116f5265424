"""``tailkit verify [REV]``: after a repro, is each experiment a reproduction of REV's?

Per experiment, one verdict, from what DVC recorded of both sides (``dvc.lock`` at REV and in
the workspace) and the metrics files:

* **identical**: every non-timing output of its train and evaluate stages has REV's hash;
* **within tolerance**: some bytes differ, but every quality metric is within
  :data:`RELATIVE_TOLERANCE` of REV's value (what a change of CPU kind, library version or
  native arithmetic gives: the last bits move, and every number after them a little);
* **differs**: a quality metric moved beyond it, which is the only verdict that fails (an
  experiment with no metrics on one side is reported as missing).

Each verdict that is not "identical" names the likely cause, read from the provenance the
train stage records (:func:`tailkit.native.arithmetic.provenance_record`) and from the
experiment's code fingerprint and settings: native arithmetic, another architecture, a GPU,
other library versions, or a change to the experiment itself.
"""

from __future__ import annotations

import functools
import json
import math
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tailkit.errors import TailkitError
from tailkit.paths import carries_time
from tailkit.reporting.tables import scalars

#: How far a quality metric may move and still count as a reproduction, relative to REV's
#: value. The last-bit differences of another CPU kind moved the default's metrics by under
#: 10^-4 relative; a change of method moves them by 10^-2 and more.
RELATIVE_TOLERANCE = 0.005
#: The DVC stages that make an experiment's numbers, by the prefix of their name.
STAGE_PREFIXES = ("train@", "train-decoupled@", "evaluate@")


@dataclass(frozen=True)
class Verdict:
    experiment: str
    kind: str  # "identical", "within", "differs", "missing"
    detail: str = ""

    @property
    def fails(self) -> bool:
        return self.kind == "differs"

    def line(self) -> str:
        label = {
            "identical": "identical",
            "within": "within tolerance",
            "differs": "DIFFERS",
            "missing": "MISSING",
        }[self.kind]
        return f"{self.experiment}: {label}" + (f"; {self.detail}" if self.detail else "")


class Side:
    """One side of the comparison: the workspace (``rev`` None) or a git revision."""

    def __init__(self, root: Path, rev: str | None) -> None:
        self.root, self.rev = root, rev
        self._texts: dict[str, str | None] = {}  # every experiment reads dvc.lock and params

    def text(self, path: str) -> str | None:
        if path not in self._texts:
            self._texts[path] = self._read(path)
        return self._texts[path]

    def _read(self, path: str) -> str | None:
        if self.rev is None:
            file = self.root / path
            return file.read_text() if file.is_file() else None
        done = subprocess.run(
            ["git", "show", f"{self.rev}:{path}"],
            cwd=self.root,
            capture_output=True,
            text=True,
            check=False,
        )
        return done.stdout if done.returncode == 0 else None

    def json(self, path: str) -> dict[str, Any] | None:
        text = self.text(path)
        if text is None:
            return None
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            return None
        return value if isinstance(value, dict) else None

    @functools.cached_property
    def stages(self) -> dict[str, Any]:
        text = self.text("dvc.lock")
        if text is None:
            return {}
        return (yaml.safe_load(text) or {}).get("stages") or {}

    @functools.cached_property
    def params(self) -> dict[str, Any]:
        return yaml.safe_load(self.text("params.yaml") or "") or {}


def check_revision(root: Path, rev: str) -> None:
    done = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        cwd=root,
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        raise TailkitError(f"verify: {rev!r} is not a git revision of {root.resolve()}")


def output_hashes(stages: dict[str, Any], experiment: str) -> dict[str, str]:
    """``{path: md5}`` of the non-timing outputs of the stages that make ``experiment``."""
    out = {}
    for name, stage in stages.items():
        if not name.startswith(STAGE_PREFIXES) or name.split("@", 1)[1] != experiment:
            continue
        for entry in stage.get("outs") or []:
            if not carries_time(entry["path"]):
                out[entry["path"]] = str(entry.get("md5"))
    return out


def largest_change(old: dict[str, Any], new: dict[str, Any]) -> tuple[str, float, float, float]:
    """The metric that moved most relative to its old value: (key, old, new, relative change);
    a metric on one side only counts as an infinite change."""
    before, after = (
        {k: v for k, v in scalars(side).items() if v is not None} for side in (old, new)
    )
    worst = ("", math.nan, math.nan, 0.0)
    for key in sorted(before.keys() | after.keys()):
        a, b = before.get(key, math.nan), after.get(key, math.nan)
        if math.isnan(a) and math.isnan(b) and key in before and key in after:
            continue
        if math.isnan(a) or math.isnan(b):
            change = math.inf
        else:
            change = abs(b - a) / max(abs(a), abs(b), 1e-12) if a != b else 0.0
        if change > worst[3]:
            worst = (key, a, b, change)
    return worst


def likely_cause(old: Side, new: Side, experiment: str) -> str:
    """What differs between the sides that could move the experiment's numbers."""
    causes = []
    before = _arithmetic(old, experiment)
    after = _arithmetic(new, experiment)
    if before is None or after is None:
        causes.append("no arithmetic recorded on one side (made before tailkit recorded it)")
    else:
        if before.get("machine") != after.get("machine"):
            causes.append(
                f"another architecture ({before.get('machine')} → {after.get('machine')})"
            )
        if before.get("device") != after.get("device"):
            causes.append(f"another device ({before.get('device')} → {after.get('device')})")
        if before.get("mode") != after.get("mode"):
            causes.append(f"{before.get('mode')} → {after.get('mode')} arithmetic")
        elif after.get("mode") == "native" and before.get("cpu") != after.get("cpu"):
            causes.append(f"native arithmetic on another CPU ({after.get('cpu')})")
        libraries = [
            f"{name} {before.get('libraries', {}).get(name)} → {version}"
            for name, version in sorted((after.get("libraries") or {}).items())
            if (before.get("libraries") or {}).get(name) != version
        ]
        if libraries:
            causes.append("other library versions (" + ", ".join(libraries) + ")")
    code = f"fingerprints/experiments/{experiment}.json"
    if old.text(code) != new.text(code):
        causes.append(f"its code changed ({code})")
    for stage in ("train", "evaluate"):
        path = f"fingerprints/stages/{stage}.json"
        if _stage_code(old, path) != _stage_code(new, path):
            causes.append(f"the {stage} stage's code changed ({path})")
    if _settings(old, experiment) != _settings(new, experiment):
        causes.append("its settings in params.yaml changed")
    if not causes:
        return "no recorded cause: same code, settings, libraries and arithmetic"
    return "likely cause: " + "; ".join(causes)


def _stage_code(side: Side, path: str) -> Any:
    """A stage fingerprint's code part (its arithmetic record is compared on its own)."""
    record = side.json(path) or {}
    return {k: v for k, v in record.items() if k != "arithmetic"}


def _arithmetic(side: Side, experiment: str) -> dict[str, Any] | None:
    detail = side.json(f"metrics/detail/{experiment}.json") or {}
    record = (detail.get("plugins") or {}).get("arithmetic")
    return record if isinstance(record, dict) else None


def _settings(side: Side, experiment: str) -> Any:
    params = side.params
    return (params.get("experiments") or {}).get(experiment), params.get("base")


def verdict(old: Side, new: Side, experiment: str) -> Verdict:
    path = f"metrics/{experiment}.json"
    before, after = old.json(path), new.json(path)
    if before is None or after is None:
        where = "the workspace" if after is None else old.rev
        return Verdict(experiment, "missing", f"no {path} in {where}")
    hashes_old = output_hashes(old.stages, experiment)
    hashes_new = output_hashes(new.stages, experiment)
    changed = sorted(
        p for p in hashes_old.keys() | hashes_new.keys() if hashes_old.get(p) != hashes_new.get(p)
    )
    detail = f"metrics/detail/{experiment}.json"
    if old.text(detail) != new.text(detail) and detail not in changed:
        changed.append(detail)
    if before == after and hashes_old and not changed:
        return Verdict(experiment, "identical")
    key, a, b, change = largest_change(before, after)
    cause = likely_cause(old, new, experiment)
    if change <= RELATIVE_TOLERANCE:
        moved = (
            f"largest change {key} {a:.6g} → {b:.6g} ({change:.1e} relative)"
            if change > 0
            else f"same metrics, {len(changed)} output(s) differ ({', '.join(changed[:3])})"
        )
        return Verdict(experiment, "within", f"{moved}; {cause}")
    shown = f"{key} {a:.6g} → {b:.6g}" if math.isfinite(change) else f"{key} on one side only"
    return Verdict(
        experiment,
        "differs",
        f"{shown} (beyond {RELATIVE_TOLERANCE:.1%} of {old.rev}'s value); {cause}",
    )


def experiments(old: Side, new: Side) -> list[str]:
    """The experiments of either side's params.yaml."""
    names: list[str] = []
    for side in (new, old):
        for name in side.params.get("experiments") or {}:
            if name not in names:
                names.append(name)
    return names


def verify(root: Path, rev: str = "HEAD") -> list[Verdict]:
    check_revision(root, rev)
    old, new = Side(root, rev), Side(root, None)
    names = experiments(old, new)
    if not names:
        raise TailkitError(f"verify: no experiments in params.yaml of {rev} or the workspace")
    return [verdict(old, new, name) for name in names]
