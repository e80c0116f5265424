"""A trained experiment restored from its model directory, ready to score rows: what the
evaluate stage, ``tailkit predict`` and the benchmarks share."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.overrides import TorchFunctionMode

from tailkit.components import Encoder, Learner, Loss
from tailkit.evaluation.correction import PredictionContext
from tailkit.output.output_layer import OutputLayer
from tailkit.params import Params
from tailkit.paths import Layout
from tailkit.pipeline.artifacts import (
    check_made_for,
    load_learner,
    load_model,
    load_sampler,
    read_model_info,
)
from tailkit.pipeline.codehash import experiment_code
from tailkit.pipeline.experiment import build_model, build_objective, feature_dir
from tailkit.registry import Registry
from tailkit.storage.splits import read_meta
from tailkit.training.loop import log_prior_from_counts


@dataclass
class Trained:
    """An encoder, its output layer and loss (whose prediction-time adjustment and probability
    map scoring applies), the prediction context, the model's saved info and the feature set's
    meta, each on the device it was restored to."""

    encoder: Encoder
    layer: OutputLayer
    loss: Loss
    ctx: PredictionContext
    info: dict[str, Any]
    meta: dict[str, Any]


def _made_for(
    params: Params, layout: Layout, registry: Registry, experiment: str
) -> tuple[dict[str, Any], Path, str, dict[str, Any]]:
    """The feature meta, the model's folder, the stage that makes it and its saved info, once
    the model is known to be this experiment's, with these settings and this code."""
    meta = read_meta(feature_dir(params, layout, experiment))  # the earliest input first
    directory, producer = params.model_dir(layout, experiment), params.train_stage(experiment)
    info = read_model_info(directory, producer)
    code = experiment_code(params, registry, experiment)["sha256"]
    check_made_for(directory, info, params, experiment, code)
    return meta, directory, producer, info


def restore(
    params: Params, layout: Layout, registry: Registry, experiment: str, device: torch.device
) -> Trained:
    """The experiment trained by ``train@<experiment>``, on ``device``."""
    meta, directory, producer, info = _made_for(params, layout, registry, experiment)
    loss, _ = build_objective(params, experiment, registry)
    state = load_model(directory, producer, device)
    encoder = _restored_encoder(params, registry, experiment, info["in_dim"], state["encoder"])
    encoder, loss = encoder.to(device), loss.to(device)
    counts = np.asarray(meta["train_counts"])
    loss.setup(torch.as_tensor(counts, dtype=torch.float64, device=device))
    loss.load_state_dict(state["loss"])
    layer = OutputLayer.for_loss(loss, info["num_classes"], encoder.out_dim, device=device)
    layer.load_state_dict(state["layer"])
    sampler = load_sampler(registry, params, info["settings"]["sampler"], layout, device)
    ctx = PredictionContext(log_prior=log_prior_from_counts(counts).to(device), sampler=sampler)
    return Trained(encoder, layer, loss, ctx, info, meta)


class _MetaFills(TorchFunctionMode):
    """In-place random fills of a meta tensor as the no-ops they are (it has no values):
    the tensor methods and the ``torch.nn.init`` functions, which dispatch as themselves
    first (the mode is off while it handles a call, so their inner ``normal_`` is not seen).

    torch has no meta kernel for ``normal_``: it falls back to a Python decomposition whose
    first call imports torch._dynamo, 2.3 s, more than the draws it spares.
    """

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _FILLS or getattr(func, "__module__", None) == "torch.nn.init":
            # the init functions dispatch with their tensor as a keyword
            target = args[0] if args else kwargs.get("tensor")
            if isinstance(target, torch.Tensor) and target.is_meta:
                return target
        return func(*args, **kwargs)


_FILLS = frozenset(
    getattr(torch.Tensor, name)
    for name in (
        "normal_",
        "uniform_",
        "bernoulli_",
        "exponential_",
        "log_normal_",
        "cauchy_",
        "geometric_",
        "random_",
    )
)


def _restored_encoder(
    params: Params, registry: Registry, experiment: str, in_dim: int, state: dict[str, Any]
) -> Encoder:
    """The experiment's encoder holding the saved ``state``, built without initialising it.

    Drawing the initial weights only to overwrite them is most of a restore for a large
    model: GeoNames' 830,909 × 128 input table took 1.4 s of normal draws against a 5 s
    evaluate. So the encoder is built on the meta device (no storage, no draws; random fills
    are no-ops, :class:`_MetaFills`) and takes the saved tensors as its own. An encoder that
    computes a tensor at construction which its state dict does not hold (a non-persistent
    buffer) would be left without it, and one whose construction needs real values
    (``.item()``, an op without a meta kernel) cannot be built there: those are built and
    initialised as usual, then loaded.
    """
    try:
        with torch.device("meta"), _MetaFills():
            encoder = build_model(params, experiment, registry, in_dim)
        encoder.load_state_dict(state, assign=True)
    except (NotImplementedError, RuntimeError):
        pass
    else:
        if not any(t.is_meta for t in (*encoder.parameters(), *encoder.buffers())):
            return encoder
    encoder = build_model(params, experiment, registry, in_dim)
    encoder.load_state_dict(state)
    return encoder


def restore_learner(
    params: Params, layout: Layout, registry: Registry, experiment: str
) -> tuple[Learner, dict[str, Any], dict[str, Any]]:
    """A model that trains itself (napkinXC, omikuji), its saved info and the feature meta."""
    meta, directory, producer, info = _made_for(params, layout, registry, experiment)
    model = build_model(params, experiment, registry, meta["dim"], meta.get("kind", "dense"))
    load_learner(directory, producer, model)
    return model, info, meta
