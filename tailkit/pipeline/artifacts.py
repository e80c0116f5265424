"""The fitted sampler and trained model files that later stages read, and nothing else.

Tensors go to safetensors (:mod:`tailkit.storage.tensorfile`), metadata to JSON: a model or sampler
state from a shared DVC remote cannot run code when it is loaded. A model that trains itself
(napkinXC, omikuji) leaves its tool's own binary files, which that tool parses as data. No file
holds a clock reading, so re-running a stage on the same inputs writes the same bytes and DVC
re-runs nothing downstream (except after a tool that cannot be seeded: ``Learner.deterministic``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from tailkit.components import Learner, Sampler
from tailkit.errors import MismatchedArtifactError, TrainingDivergedError
from tailkit.params import NO_SAMPLER, Params
from tailkit.paths import Layout, require
from tailkit.registry import Registry
from tailkit.storage import tensorfile
from tailkit.storage.atomic import write_json
from tailkit.training.finite import first_non_finite

SAMPLER_STATE = "state.safetensors"
MODEL_WEIGHTS = "model.safetensors"
MODEL_INFO = "model.json"
#: A model that trains itself keeps its files here, in its tool's own format, beside MODEL_INFO.
LEARNER_FILES = "learner"


def save_sampler(directory: Path, sampler: Sampler) -> None:
    tensorfile.save(directory / SAMPLER_STATE, sampler.state_dict())


def load_sampler(
    registry: Registry, params: Params, key: str, layout: Layout, device: torch.device
) -> Sampler | None:
    """The fitted sampler ``key`` (None for ``none``), on ``device``."""
    if key == NO_SAMPLER:
        return None
    sampler = registry.build("samplers", params.samplers[key], f"samplers.{key}")
    sampler.load_state_dict(
        tensorfile.load(require(layout.sampler(key) / SAMPLER_STATE, "fit-sampler"))
    )
    return sampler.to(device)


def save_model(directory: Path, weights: dict[str, Any], info: dict[str, Any]) -> None:
    """``weights``: the state dicts (layer, encoder, loss); ``info``: JSON-able metadata.
    A model holding a NaN or an infinity is refused, naming the tensor: nothing is written."""
    bad = first_non_finite(weights)
    if bad is not None:
        raise TrainingDivergedError(
            f"experiments.{info.get('experiment')}: the trained model's {bad} is not finite "
            f"(after {info.get('steps')} steps); no model was saved"
        )
    tensorfile.save(directory / MODEL_WEIGHTS, weights)
    write_json(directory / MODEL_INFO, info)


def read_model_info(directory: Path, producer: str) -> dict:
    """The metadata :func:`save_model` (or a learner's fit) wrote beside a model."""
    return json.loads(require(directory / MODEL_INFO, producer).read_text())


def load_learner(directory: Path, producer: str, learner: Learner) -> None:
    """Read a trained :class:`~tailkit.components.Learner`'s files back into ``learner`` (the
    tool itself parses them)."""
    learner.load(require(directory / LEARNER_FILES, producer))


def check_made_for(directory: Path, info: dict, params: Params, run: str, code: str) -> None:
    """Refuse a model that ``train@<run>`` did not make with today's settings and code: one
    swapped in from another experiment's folder, trained before params.yaml changed what
    ``run`` is (its loss, model, features, optimiser …), or trained by other code of its loss,
    model or sampler (``code``, :func:`tailkit.pipeline.codehash.experiment_code`'s hash), in
    one line with the command that fixes it. Evaluation would otherwise score the old model
    under the new name, settings or code."""
    fix = f"run `dvc repro {params.train_stage(run)}`"
    if info.get("experiment") != run:
        raise MismatchedArtifactError(
            f"{directory}: this model was trained for {info.get('experiment')!r}, not "
            f"{run!r}; {fix}"
        )
    now = json.loads(json.dumps(params.resolved(run).as_dict()))  # as the model's JSON holds them
    then = info.get("settings") or {}
    changed = sorted(k for k in now.keys() | then.keys() if now.get(k) != then.get(k))
    if changed:
        key = changed[0]
        raise MismatchedArtifactError(
            f"{directory}: trained with {key} = {_short(then.get(key))}, params.yaml now has "
            f"{_short(now.get(key))}" + (f" (and {len(changed) - 1} more)" if changed[1:] else "")
            + f"; {fix}"
        )  # fmt: skip
    if info.get("code") != code:
        made = "before tailkit recorded it" if info.get("code") is None else "since"
        raise MismatchedArtifactError(
            f"{directory}: the code of the loss, model or sampler of {run!r} changed {made} "
            f"this model was trained; {fix}"
        )


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 100 else text[:100] + "…"


def load_model(directory: Path, producer: str, device: torch.device) -> dict:
    """The state dicts :func:`save_model` wrote."""
    return tensorfile.load(require(directory / MODEL_WEIGHTS, producer), device)
