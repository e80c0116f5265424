"""A trained experiment restored from its model directory, ready to score rows: what the
evaluate stage, ``tailkit predict`` and the benchmarks share."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tailkit.artifacts import load_learner, load_model, load_sampler
from tailkit.components import Encoder, Learner, Loss, PredictionContext
from tailkit.experiment import build_model, build_objective, feature_dir
from tailkit.params import Params
from tailkit.paths import Layout
from tailkit.registry import Registry
from tailkit.splits import read_meta
from tailkit.training.loop import log_prior_from_counts
from tailkit.training.output_layer import OutputLayer


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


def restore(
    params: Params, layout: Layout, registry: Registry, experiment: str, device: torch.device
) -> Trained:
    """The experiment trained by ``train@<experiment>``, on ``device``."""
    loss, _ = build_objective(params, experiment, registry)
    meta = read_meta(feature_dir(params, layout, experiment))
    state, info = load_model(
        params.model_dir(layout, experiment), params.train_stage(experiment), device
    )
    encoder = build_model(params, experiment, registry, info["in_dim"])
    encoder.load_state_dict(state["encoder"])
    encoder, loss = encoder.to(device), loss.to(device)
    counts = np.asarray(meta["train_counts"])
    loss.setup(torch.as_tensor(counts, dtype=torch.float64, device=device))
    loss.load_state_dict(state["loss"])
    layer = OutputLayer.for_loss(loss, info["num_classes"], encoder.out_dim, device=device)
    layer.load_state_dict(state["layer"])
    sampler = load_sampler(registry, params, info["settings"]["sampler"], layout, device)
    ctx = PredictionContext(log_prior=log_prior_from_counts(counts).to(device), sampler=sampler)
    return Trained(encoder, layer, loss, ctx, info, meta)


def restore_learner(
    params: Params, layout: Layout, registry: Registry, experiment: str
) -> tuple[Learner, dict[str, Any], dict[str, Any]]:
    """A model that trains itself (napkinXC, omikuji), its saved info and the feature meta."""
    meta = read_meta(feature_dir(params, layout, experiment))
    model = build_model(params, experiment, registry, meta["dim"], meta.get("kind", "dense"))
    info = load_learner(params.model_dir(layout, experiment), params.train_stage(experiment), model)
    return model, info, meta
