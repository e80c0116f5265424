"""The three second stages of a decoupled run (:mod:`tailkit.training.decoupled`), each from
the frozen first stage's embeddings to the layer, loss and learning curve that
``train-decoupled@<run>`` saves: τ-norm (no training; τ given or searched on validation), LWS
(per-class scales learned on the embeddings) and cRT (a new layer trained by the loop, with
checkpoints that resume only the same run on the same first stage).
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from tailkit.components import Loss
from tailkit.evaluation.correction import PredictionContext
from tailkit.output.output_layer import OutputLayer
from tailkit.params import Params, ResolvedExperiment
from tailkit.paths import Layout
from tailkit.pipeline.artifacts import MODEL_WEIGHTS
from tailkit.pipeline.codehash import experiment_code, module_fingerprint
from tailkit.pipeline.run_plan import loop_config, validation_plan
from tailkit.pipeline.trained import Trained
from tailkit.registry import Registry
from tailkit.storage.checksum import params_hash
from tailkit.training.checkpoint import Checkpointer
from tailkit.training.decoupled import (
    Embedded,
    ScaleTraining,
    choose_tau,
    learn_scales,
    scores_of,
    tau_normalised,
)
from tailkit.training.loop import log_prior_from_counts, train
from tailkit.training.row_sampling import RowSampler


@dataclass
class Outcome:
    """What a classifier's second stage leaves: the layer and loss to save, the learning curve,
    steps and seconds, the validation plan and checkpoint interval (cRT's) and its info."""

    layer: OutputLayer
    loss: Loss
    curve: list[dict[str, Any]]
    steps: int = 0
    seconds: float = 0.0
    validation: dict[str, Any] | None = None
    checkpoint_every: int = 0
    info: dict[str, Any] = field(default_factory=dict)
    examples: int = 0  # rows the steps saw


@dataclass
class Inputs:
    """The frozen first stage and the data of its second: embeddings of the training and
    validation rows, their labels, the training counts."""

    start: Trained
    z_train: torch.Tensor
    y_train: Any
    z_val: torch.Tensor
    y_val: Any
    counts: torch.Tensor


def tau_norm(params: Params, settings: ResolvedExperiment, data: Inputs) -> Outcome:
    """τ-norm: the first stage's layer and loss, rows divided by ‖w_j‖^τ (τ given or searched
    on the validation split)."""
    start, info = data.start, {}
    assert settings.decoupled is not None  # train_decoupled refuses a one-stage experiment
    if settings.decoupled["tau"] == "auto":
        search = choose_tau(
            start.layer, start.loss, start.ctx, data.z_val, data.y_val, params.evaluate.batch_size
        )
        tau = search.tau
        info["tau_search"] = search.tried
    else:
        tau = float(settings.decoupled["tau"])
    layer = tau_normalised(start.layer, tau)
    acc, bal = scores_of(
        layer, start.loss, start.ctx, data.z_val, data.y_val, params.evaluate.batch_size
    )
    return Outcome(
        layer, start.loss, [_point(0, 0.0, math.nan, acc, bal)], info={"tau": tau, **info}
    )


def learned_scales(
    params: Params,
    experiment: str,
    settings: ResolvedExperiment,
    loss: Loss,
    optimizer: Any,
    data: Inputs,
) -> Outcome:
    """LWS: per-class scales of the first stage's layer, learned on the frozen embeddings."""
    start = data.start
    device = start.layer.weight.device
    shape = {"num_classes": start.layer.num_classes, "dim": start.layer.dim}
    cfg = loop_config(params, experiment, settings, **shape, negatives=0, sampled_labels=None)
    rows = data.z_train.shape[0]
    loss = loss.to(device)
    loss.setup(data.counts.to(device))
    clock = time.perf_counter()
    layer, losses = learn_scales(
        start.layer,
        loss,
        optimizer,
        data.z_train,
        data.y_train,
        log_prior_from_counts(data.counts).to(device),
        ScaleTraining(
            experiment,
            cfg.batch_size,
            cfg.total_steps(rows),
            math.ceil(rows / cfg.batch_size),
            RowSampler(cfg.row_sampling, data.y_train, start.layer.num_classes, cfg.epochs),
            cfg.seed,
        ),
    )
    seconds = time.perf_counter() - clock
    steps = cfg.total_steps(rows)
    ctx = PredictionContext(log_prior=log_prior_from_counts(data.counts).to(device))
    acc, bal = scores_of(layer, loss, ctx, data.z_val, data.y_val, params.evaluate.batch_size)
    last = losses[-1] if losses else math.nan
    # each epoch visits the rows once in batches of batch_size, the last one short
    full, part = divmod(steps, math.ceil(rows / cfg.batch_size))
    examples = full * rows + min(part * cfg.batch_size, rows)
    return Outcome(
        layer, loss, [_point(steps, seconds, last, acc, bal)], steps, seconds, examples=examples
    )


def _point(step: int, seconds: float, loss: float, acc: float, bal: float) -> dict[str, Any]:
    return {
        "step": step,
        "seconds": round(seconds, 4),
        "loss": loss,
        "val_accuracy": acc,
        "val_balanced_accuracy": bal,
    }


def _first_stage_hash(layout: Layout, first: str) -> str:
    """The first stage's weights, for the checkpoint's fingerprint: another first stage is
    another run."""
    return hashlib.sha256((layout.model(first) / MODEL_WEIGHTS).read_bytes()).hexdigest()


def retrain(
    params: Params,
    layout: Layout,
    registry: Registry,
    experiment: str,
    loss: Loss,
    optimizer: Any,
    data: Inputs,
    progress: Callable[[int, int, dict[str, float]], None] | None,
) -> Outcome:
    """cRT: a freshly initialised output layer trained by the loop on the frozen embeddings."""
    start, z_train, z_val = data.start, data.z_train, data.z_val
    device = z_train.device
    num_classes, dim = start.layer.num_classes, z_train.shape[1]
    settings = params.resolved(experiment)
    shape = {"num_classes": num_classes, "dim": dim}
    cfg = loop_config(params, experiment, settings, **shape, negatives=0, sampled_labels=None)
    loss = loss.to(device)
    layer = OutputLayer.for_loss(
        loss,
        num_classes,
        dim,
        device=device,
        generator=torch.Generator().manual_seed(cfg.seed),
    )
    schedule, pick = validation_plan(
        params,
        cfg,
        train_rows=z_train.shape[0],
        val_rows=z_val.shape[0],
        **shape,
        sampled_labels=None,
    )
    fingerprint = params_hash(
        {
            "settings": settings.as_dict(),
            "train": params.train.__dict__,
            "seed": cfg.seed,
            "first_stage": _first_stage_hash(layout, start.info["experiment"]),
            "code": [
                experiment_code(params, registry, experiment)["sha256"],
                module_fingerprint("tailkit.stages.train_decoupled")["sha256"],
            ],
        }
    )
    checkpoint = Checkpointer(
        layout.checkpoint(experiment), fingerprint, f"train-decoupled@{experiment}"
    )
    result = train(
        cfg=cfg,
        encoder=Embedded(dim),
        layer=layer,
        loss=loss,
        sampler=None,
        optimizer=optimizer,
        x_train=z_train,
        y_train=data.y_train,
        x_val=z_val[pick.to(device)],
        y_val=data.y_val[pick],
        class_counts=data.counts,
        checkpoint=checkpoint,
        progress=progress,
    )
    checkpoint.clear()
    return Outcome(
        layer,
        loss,
        result.curve,
        result.steps,
        result.seconds,
        schedule.as_dict(),
        result.checkpoint_every,
        examples=result.examples,
    )
