"""The fitted sampler and trained model files that later stages read, and nothing else.

Tensors go to safetensors (:mod:`tailkit.tensorfile`), metadata to JSON: a model or sampler
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

from tailkit import tensorfile
from tailkit.atomic import write_json
from tailkit.components import Learner, Sampler
from tailkit.errors import TrainingDivergedError
from tailkit.finite import first_non_finite
from tailkit.params import NO_SAMPLER, Params
from tailkit.paths import Layout, require
from tailkit.registry import Registry

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


def load_learner(directory: Path, producer: str, learner: Learner) -> dict:
    """Read a trained :class:`~tailkit.components.Learner`'s files back into ``learner`` (the
    tool itself parses them); returns the metadata saved beside them."""
    info = json.loads(require(directory / MODEL_INFO, producer).read_text())
    learner.load(require(directory / LEARNER_FILES, producer))
    return info


def load_model(directory: Path, producer: str, device: torch.device) -> tuple[dict, dict]:
    """The state dicts and the metadata :func:`save_model` wrote."""
    weights = tensorfile.load(require(directory / MODEL_WEIGHTS, producer), device)
    info = json.loads(require(directory / MODEL_INFO, producer).read_text())
    return weights, info
