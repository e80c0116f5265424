"""One experiment trained by tailkit's loop, from its resolved settings to its saved run:
the components built and checked against the data, the output layer (this process's labels
when they are sharded), the loop's configuration and validation plan, a checkpoint that
resumes only the same run (settings, inputs and code: its fingerprint holds the experiment's
component sources and the train stage's closure), and the model, curve and timing on rank 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tailkit.distributed.world import World
from tailkit.errors import ComponentFault
from tailkit.evaluation.correction import correction_work_per_label
from tailkit.output.output_layer import OutputLayer
from tailkit.output.shards import whole_layer
from tailkit.params import Params, ResolvedExperiment
from tailkit.paths import Layout
from tailkit.pipeline.artifacts import load_sampler
from tailkit.pipeline.codehash import experiment_code, module_fingerprint
from tailkit.pipeline.experiment import (
    build_model,
    build_objective,
    check_labels,
    check_row_sampling,
    check_support,
    feature_dir,
)
from tailkit.pipeline.run_plan import loop_config, validation_plan
from tailkit.pipeline.saved_run import run_info, run_timing, save_run
from tailkit.registry import Registry
from tailkit.storage.checksum import params_hash
from tailkit.storage.feature_cache import read_features
from tailkit.storage.splits import read_meta
from tailkit.training.checkpoint import Checkpointer
from tailkit.training.loop import train
from tailkit.training.plan import check_step_fits


def train_experiment(
    params: Params,
    layout: Layout,
    registry: Registry,
    experiment: str,
    settings: ResolvedExperiment,
    device: torch.device,
    world: World,
    progress: Callable[[int, int, dict[str, float]], None] | None,
) -> dict[str, Any]:
    """Train one experiment of tailkit's loop on this process's share of the labels and, on
    rank 0, save the run (:mod:`tailkit.pipeline.saved_run`); returns its timing."""
    seed = params.base.seed
    torch.manual_seed(seed)  # before building: encoders and losses may draw their init
    loss, optimizer = build_objective(params, experiment, registry)
    features = feature_dir(params, layout, experiment)
    meta = read_meta(features)
    check_labels(loss, params, experiment, meta, registry)
    check_row_sampling(params, experiment, meta)
    encoder = build_model(params, experiment, registry, meta["dim"], meta.get("kind", "dense"))
    train_set = read_features(features / "train.parquet")
    val_set = read_features(features / "val.parquet")
    x_train, y_train, x_val, y_val = train_set.x, train_set.labels, val_set.x, val_set.labels
    # read with every column, so none is None
    assert x_train is not None and y_train is not None and x_val is not None and y_val is not None
    sampler = load_sampler(registry, params, settings.sampler, layout, device)
    check_support(loss, sampler, params, settings.sampler, experiment, meta["num_classes"], device)

    check_step_fits(
        f"experiments.{experiment}",
        num_classes=meta["num_classes"],
        dim=encoder.out_dim,
        batch_size=settings.batch_size,
        negatives=None if sampler is None else settings.negatives,
        label_chunk=params.train.label_chunk,
        nproc=world.size,
        device=torch.device(device),
    )
    encoder, loss = encoder.to(device), loss.to(device)
    layer = OutputLayer.for_loss(
        loss,
        meta["num_classes"],
        encoder.out_dim,
        device=device,
        generator=torch.Generator().manual_seed(seed),
        # this process's labels (all of them in one process), drawn without the others' rows
        rows=world.label_range(meta["num_classes"]) if world.sharded else None,
    )
    sampled_labels = None if sampler is None else 1 + settings.negatives
    shape = {"num_classes": meta["num_classes"], "dim": encoder.out_dim}
    cfg = loop_config(
        params,
        experiment,
        settings,
        **shape,
        negatives=settings.negatives,
        sampled_labels=sampled_labels,
    )
    schedule, val_pick = validation_plan(
        params,
        cfg,
        train_rows=x_train.shape[0],
        val_rows=x_val.shape[0],
        **shape,
        sampled_labels=sampled_labels,
        correction_per_label=correction_work_per_label(sampler) if loss.adjusts_scores else 0.0,
    )
    code = experiment_code(params, registry, experiment)["sha256"]
    fingerprint = params_hash(
        {
            "settings": settings.as_dict(),
            # the processes are not part of a run's identity (its results do not depend on
            # them beyond float rounding)
            "train": {k: v for k, v in params.train.__dict__.items() if k != "distributed"},
            "seed": seed,
            "data": meta.get("params_hash"),
            "sampler": params.samplers.get(settings.sampler),
            # a checkpoint written by other code is not this run's past (module docstring)
            "code": [code, module_fingerprint("tailkit.stages.train")["sha256"]],
        }
    )
    checkpoint = Checkpointer(layout.checkpoint(experiment), fingerprint, f"train@{experiment}")
    try:
        result = train(
            cfg=cfg,
            encoder=encoder,
            layer=layer,
            loss=loss,
            sampler=sampler,
            optimizer=optimizer,
            x_train=x_train,
            y_train=y_train,
            x_val=x_val[val_pick],
            y_val=y_val[val_pick],
            class_counts=torch.as_tensor(meta["train_counts"], dtype=torch.float64),
            checkpoint=checkpoint,  # every process writes the rows of its own labels
            progress=progress if world.rank == 0 else None,
            world=world,
        )
    except ComponentFault as fault:  # the loop saw it; here the plugin has a name
        spec = settings.model if fault.kind == "model" else params.samplers[settings.sampler]
        kinds = "models" if fault.kind == "model" else "samplers"
        raise fault.named(registry.provenance(kinds, spec), experiment) from fault
    layer = whole_layer(layer, world)  # every rank's rows, in label order
    timing = run_timing(
        result.seconds, result.steps, result.examples, str(device), world_size=world.size
    )
    if world.rank != 0:  # one writer: rank 0 writes what one process writes
        return timing
    info = run_info(
        params,
        registry,
        experiment,
        code=code,
        num_classes=meta["num_classes"],
        in_dim=meta["dim"],
        steps=result.steps,
        validation=schedule.as_dict(),  # which validation rows and steps the curve used
        checkpoint_every=result.checkpoint_every,
    )
    weights = {
        "layer": layer.state_dict(),
        "encoder": encoder.state_dict(),
        "loss": loss.state_dict(),
    }
    save_run(layout, experiment, curve=result.curve, timing=timing, weights=weights, info=info)
    checkpoint.clear()
    return timing
