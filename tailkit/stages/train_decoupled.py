"""Stage ``train-decoupled@<run>``: the second stage of a decoupled run of ``params.decoupled``
(:mod:`tailkit.training.decoupled`: cRT, τ-norm, LWS) on the frozen encoder of the experiment
it starts from.

Writes what ``train@<experiment>`` writes, so ``evaluate-decoupled@<run>``, the report and
``tailkit predict`` treat the run as one more experiment: ``data/models/<run>/`` holds the first
stage's encoder tensors as they were (bit for bit) with the new output layer and loss state,
``model.json`` adds a ``decoupled`` block (the first stage, the classifier, the τ kept and the
validation scores of every τ tried); ``plots/train/<run>.tsv`` the learning curve (cRT: the
loop's; LWS: one point per epoch; τ-norm: the chosen τ's validation scores) and
``metrics/timings/train/<run>.json`` the time.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from tailkit.components import Loss, PredictionContext
from tailkit.errors import InvalidParameterError
from tailkit.evaluation.embeddings import embed
from tailkit.native.device import resolve_device
from tailkit.params import NO_SAMPLER, Params
from tailkit.paths import Layout
from tailkit.pipeline.artifacts import MODEL_WEIGHTS, save_model
from tailkit.pipeline.codehash import experiment_code, module_fingerprint
from tailkit.pipeline.experiment import (
    build_objective,
    check_labels,
    check_row_sampling,
    feature_dir,
    provenance,
    trains_itself,
)
from tailkit.pipeline.trained import Trained, restore
from tailkit.registry import Registry
from tailkit.storage.atomic import atomic_dir, atomic_path, write_json
from tailkit.storage.checksum import params_hash
from tailkit.storage.feature_cache import read_features
from tailkit.training.cadence import plan_validation, step_work
from tailkit.training.checkpoint import Checkpointer
from tailkit.training.decoupled import (
    Embedded,
    ScaleTraining,
    choose_tau,
    learn_scales,
    scores_of,
    tau_normalised,
)
from tailkit.training.loop import (
    LoopConfig,
    curve_to_tsv,
    log_prior_from_counts,
    train,
    validation_rows,
)
from tailkit.training.output_layer import OutputLayer
from tailkit.training.row_sampling import RowSampler


def _refuse(message: str, run: str, key: str = "init_from") -> InvalidParameterError:
    return InvalidParameterError(f"decoupled.{run}.{key}: {message}")


@dataclass
class _Outcome:
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
class _Inputs:
    """The frozen first stage and the data of its second: embeddings of the training and
    validation rows, their labels, the training counts."""

    start: Trained
    z_train: torch.Tensor
    y_train: Any
    z_val: torch.Tensor
    y_val: Any
    counts: torch.Tensor


def run(
    params: Params,
    layout: Layout,
    registry: Registry,
    experiment: str,
    progress: Callable[[int, int, dict[str, float]], None] | None = None,
) -> dict[str, Any]:
    settings = params.resolved(experiment)
    if "decoupled" not in settings:
        raise InvalidParameterError(
            f"{params.source}: {experiment!r} is an experiment, not a run of decoupled; "
            f"train it with `tailkit train --experiment {experiment}`"
        )
    first, classifier = settings["decoupled"]["init_from"], settings["decoupled"]["classifier"]
    if trains_itself(params, first, registry):
        raise _refuse(f"{first!r} is trained by its own tool: no encoder to freeze", experiment)
    if classifier == "tau-norm" and params.experiment(first).sampler != NO_SAMPLER:
        raise _refuse(
            f"tau-norm rescales a full-softmax classifier; {first!r} trains with sampler "
            f"{params.experiment(first).sampler!r} (use classifier: crt)",
            experiment,
        )
    device = resolve_device(params.base.device)
    torch.manual_seed(params.base.seed)
    start = restore(params, layout, registry, first, device)
    if classifier != "crt" and start.layer.cosine_scale is not None:
        raise _refuse(
            f"{classifier} rescales the rows of a dot-product output layer; {first!r}'s loss "
            "scores by cosine (its rows are normalised already): use classifier: crt",
            experiment,
            "classifier",
        )
    loss, optimizer = build_objective(params, experiment, registry)
    check_labels(loss, params, experiment, start.meta, registry)
    check_row_sampling(params, experiment, start.meta)
    features = feature_dir(params, layout, experiment)
    train_set = read_features(features / "train.parquet")
    val_set = read_features(features / "val.parquet")
    assert train_set.x is not None and train_set.labels is not None
    assert val_set.x is not None and val_set.labels is not None
    data = _Inputs(
        start,
        # Φ(x) once, in evaluation mode (no dropout, no augmentation): the encoder is frozen
        embed(start.encoder, train_set.x, device).to(device),
        train_set.labels,
        embed(start.encoder, val_set.x, device).to(device),
        val_set.labels,
        torch.as_tensor(start.meta["train_counts"], dtype=torch.float64),
    )
    if classifier == "tau-norm":
        outcome = _tau_norm(params, settings, data)
    elif classifier == "crt":
        outcome = _retrain(params, layout, registry, experiment, loss, optimizer, data, progress)
    else:
        outcome = _scales(params, experiment, settings, loss, optimizer, data)

    with atomic_dir(params.model_dir(layout, experiment)) as tmp:
        save_model(
            tmp,
            {
                "layer": outcome.layer.state_dict(),
                "encoder": start.encoder.state_dict(),  # the first stage's, as it was
                "loss": outcome.loss.state_dict(),
            },
            {
                "experiment": experiment,
                "settings": settings,
                "code": experiment_code(params, registry, experiment)["sha256"],
                "num_classes": start.info["num_classes"],
                "in_dim": start.info["in_dim"],
                "steps": outcome.steps,
                "validation": outcome.validation,
                "checkpoint_every": outcome.checkpoint_every,
                "plugins": provenance(params, registry, settings),
                "decoupled": {"init_from": first, "classifier": classifier, **outcome.info},
            },
        )
    with atomic_path(layout.curve(experiment)) as tmp:
        tmp.write_text(curve_to_tsv(outcome.curve))
    timing = {
        "seconds": round(outcome.seconds, 3),
        "steps": outcome.steps,
        "examples_per_second": round(outcome.examples / max(outcome.seconds, 1e-9)),
        "device": str(device),
    }
    write_json(layout.timing(f"train/{experiment}"), timing)
    return timing


def _tau_norm(params: Params, settings: dict[str, Any], data: _Inputs) -> _Outcome:
    """τ-norm: the first stage's layer and loss, rows divided by ‖w_j‖^τ (τ given or searched
    on the validation split)."""
    start, info = data.start, {}
    if settings["decoupled"]["tau"] == "auto":
        search = choose_tau(
            start.layer, start.loss, start.ctx, data.z_val, data.y_val, params.evaluate.batch_size
        )
        tau = search.tau
        info["tau_search"] = search.tried
    else:
        tau = float(settings["decoupled"]["tau"])
    layer = tau_normalised(start.layer, tau)
    acc, bal = scores_of(
        layer, start.loss, start.ctx, data.z_val, data.y_val, params.evaluate.batch_size
    )
    return _Outcome(
        layer, start.loss, [_point(0, 0.0, math.nan, acc, bal)], info={"tau": tau, **info}
    )


def _scales(
    params: Params,
    experiment: str,
    settings: dict[str, Any],
    loss: Loss,
    optimizer: Any,
    data: _Inputs,
) -> _Outcome:
    """LWS: per-class scales of the first stage's layer, learned on the frozen embeddings."""
    start = data.start
    device = start.layer.weight.device
    cfg = _loop_config(params, experiment, settings, start.layer.num_classes, start.layer.dim)
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
    return _Outcome(
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


def _loop_config(
    params: Params, experiment: str, settings: dict[str, Any], num_classes: int, dim: int
) -> LoopConfig:
    return LoopConfig(
        experiment=experiment,
        epochs=settings["epochs"],
        batch_size=settings["batch_size"],
        negatives=0,
        max_steps=settings["max_steps"],
        checkpoint_every=params.train.checkpoint_every,
        checkpoint_budget=params.train.checkpoint_budget,
        step_work=step_work(settings["batch_size"], num_classes, dim, None),
        seed=params.base.seed,
        row_sampling=settings["row_sampling"],
        label_chunk=params.train.label_chunk,
        matmul=params.train.matmul,
    )


def _first_stage_hash(layout: Layout, first: str) -> str:
    """The first stage's weights, for the checkpoint's fingerprint: another first stage is
    another run."""
    return hashlib.sha256((layout.model(first) / MODEL_WEIGHTS).read_bytes()).hexdigest()


def _retrain(
    params: Params,
    layout: Layout,
    registry: Registry,
    experiment: str,
    loss: Loss,
    optimizer: Any,
    data: _Inputs,
    progress: Callable[[int, int, dict[str, float]], None] | None,
) -> _Outcome:
    """cRT: a freshly initialised output layer trained by the loop on the frozen embeddings."""
    start, z_train, z_val = data.start, data.z_train, data.z_val
    device = z_train.device
    num_classes, dim = start.layer.num_classes, z_train.shape[1]
    cfg = _loop_config(params, experiment, params.resolved(experiment), num_classes, dim)
    loss = loss.to(device)
    layer = OutputLayer.for_loss(
        loss,
        num_classes,
        dim,
        device=device,
        generator=torch.Generator().manual_seed(cfg.seed),
    )
    schedule = plan_validation(
        eval_every=params.train.eval_every,
        val_rows=params.train.val_rows,
        val_budget=params.train.val_budget,
        available_rows=z_val.shape[0],
        total_steps=cfg.total_steps(z_train.shape[0]),
        batch_size=cfg.batch_size,
        num_classes=num_classes,
        dim=dim,
        sampled_labels=None,
        correction_per_label=0.0,
    )
    cfg.eval_every = schedule.every
    pick = validation_rows(z_val.shape[0], params.base.seed, params.train.val_rows)
    pick = pick[: schedule.rows]
    fingerprint = params_hash(
        {
            "settings": params.resolved(experiment),
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
    return _Outcome(
        layer,
        loss,
        result.curve,
        result.steps,
        result.seconds,
        schedule.as_dict(),
        result.checkpoint_every,
        examples=result.examples,
    )
