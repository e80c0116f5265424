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

from collections.abc import Callable
from typing import Any

import torch

from tailkit.errors import InvalidParameterError
from tailkit.evaluation.embeddings import embed
from tailkit.native.device import resolve_device
from tailkit.params import NO_SAMPLER, Params
from tailkit.paths import Layout
from tailkit.pipeline.codehash import experiment_code
from tailkit.pipeline.experiment import (
    build_objective,
    check_labels,
    check_row_sampling,
    feature_dir,
    trains_itself,
)
from tailkit.pipeline.saved_run import run_info, run_timing, save_run
from tailkit.pipeline.second_stage import Inputs, learned_scales, retrain, tau_norm
from tailkit.pipeline.trained import restore
from tailkit.registry import Registry
from tailkit.storage.feature_cache import read_features


def _refuse(message: str, run: str, key: str = "init_from") -> InvalidParameterError:
    return InvalidParameterError(f"decoupled.{run}.{key}: {message}")


def run(
    params: Params,
    layout: Layout,
    registry: Registry,
    experiment: str,
    progress: Callable[[int, int, dict[str, float]], None] | None = None,
) -> dict[str, Any]:
    settings = params.resolved(experiment)
    if settings.decoupled is None:
        raise InvalidParameterError(
            f"{params.source}: {experiment!r} is an experiment, not a run of decoupled; "
            f"train it with `tailkit train --experiment {experiment}`"
        )
    first, classifier = settings.decoupled["init_from"], settings.decoupled["classifier"]
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
    data = Inputs(
        start,
        # Φ(x) once, in evaluation mode (no dropout, no augmentation): the encoder is frozen
        embed(start.encoder, train_set.x, device).to(device),
        train_set.labels,
        embed(start.encoder, val_set.x, device).to(device),
        val_set.labels,
        torch.as_tensor(start.meta["train_counts"], dtype=torch.float64),
    )
    if classifier == "tau-norm":
        outcome = tau_norm(params, settings, data)
    elif classifier == "crt":
        outcome = retrain(params, layout, registry, experiment, loss, optimizer, data, progress)
    else:
        outcome = learned_scales(params, experiment, settings, loss, optimizer, data)

    timing = run_timing(outcome.seconds, outcome.steps, outcome.examples, str(device))
    info = run_info(
        params,
        registry,
        experiment,
        code=experiment_code(params, registry, experiment)["sha256"],
        num_classes=start.info["num_classes"],
        in_dim=start.info["in_dim"],
        steps=outcome.steps,
        validation=outcome.validation,
        checkpoint_every=outcome.checkpoint_every,
        decoupled={"init_from": first, "classifier": classifier, **outcome.info},
    )
    weights = {
        "layer": outcome.layer.state_dict(),
        "encoder": start.encoder.state_dict(),  # the first stage's, as it was
        "loss": outcome.loss.state_dict(),
    }
    model_dir = params.model_dir(layout, experiment)  # its seed runs live apart
    save_run(
        layout,
        experiment,
        curve=outcome.curve,
        timing=timing,
        weights=weights,
        info=info,
        model_dir=model_dir,
    )
    return timing
