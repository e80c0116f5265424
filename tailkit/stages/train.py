"""Stage ``train@<experiment>``: train one experiment and save its model and learning curve.

Writes ``data/models/<experiment>/`` (``model.safetensors``: the output layer's, encoder's and
loss's tensors; ``model.json``: the resolved settings, the step count and which plugin
distribution and version supplied each component), ``plots/train/<experiment>.tsv`` (the
learning curve) and ``metrics/timings/train/<experiment>.json`` (seconds, examples/s, device;
the only file here that differs between two runs). An interrupted run resumes from
``data/checkpoints/<experiment>/`` when its settings, inputs and code are unchanged: the
checkpoint's fingerprint holds the hash of the experiment's component sources and of this
stage's own code (:mod:`tailkit.pipeline.codehash`), so after a code change it starts afresh.

A model that trains itself (:class:`~tailkit.components.Learner`: napkinXC, omikuji) is fitted
once by its tool instead; ``model.json`` sits beside the tool's own files in ``learner/``, and
the learning curve is one point (the fit's seconds, the validation scores).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tailkit.distributed.launch import joined_world
from tailkit.distributed.layer import whole_layer
from tailkit.distributed.plan import check_step_fits
from tailkit.distributed.world import World
from tailkit.errors import ComponentFault
from tailkit.native.device import resolve_device
from tailkit.params import Params
from tailkit.paths import Layout
from tailkit.pipeline.artifacts import load_sampler, save_model
from tailkit.pipeline.codehash import experiment_code, module_fingerprint
from tailkit.pipeline.experiment import (
    build_model,
    build_objective,
    check_labels,
    check_row_sampling,
    check_support,
    feature_dir,
    provenance,
    trains_itself,
)
from tailkit.registry import Registry
from tailkit.storage.atomic import atomic_dir, atomic_path, write_json
from tailkit.storage.checksum import params_hash
from tailkit.storage.feature_cache import read_features
from tailkit.storage.splits import read_meta
from tailkit.training.cadence import plan_validation, step_work
from tailkit.training.checkpoint import Checkpointer
from tailkit.training.learner import fit_learner
from tailkit.training.loop import LoopConfig, curve_to_tsv, train, validation_rows
from tailkit.training.output_layer import OutputLayer


def run(
    params: Params,
    layout: Layout,
    registry: Registry,
    experiment: str,
    progress: Callable[[int, int, dict[str, float]], None] | None = None,
) -> dict[str, Any]:
    if trains_itself(params, experiment, registry):
        return fit_learner(params, layout, registry, experiment, progress)
    settings = params.resolved(experiment)
    device = resolve_device(params.base.device)
    # under torchrun (train.distributed) each process owns a shard of the labels
    with joined_world(params.train.distributed_settings, device) as world:
        return _train(params, layout, registry, experiment, settings, device, world, progress)


def _train(
    params: Params,
    layout: Layout,
    registry: Registry,
    experiment: str,
    settings: dict[str, Any],
    device: torch.device,
    world: World,
    progress: Callable[[int, int, dict[str, float]], None] | None,
) -> dict[str, Any]:
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
    sampler = load_sampler(registry, params, settings["sampler"], layout, device)
    check_support(
        loss, sampler, params, settings["sampler"], experiment, meta["num_classes"], device
    )

    check_step_fits(
        f"experiments.{experiment}",
        num_classes=meta["num_classes"],
        dim=encoder.out_dim,
        batch_size=settings["batch_size"],
        negatives=None if sampler is None else settings["negatives"],
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
    sampled_labels = None if sampler is None else 1 + settings["negatives"]
    cfg = LoopConfig(
        experiment=experiment,
        epochs=settings["epochs"],
        batch_size=settings["batch_size"],
        negatives=settings["negatives"],
        max_steps=settings["max_steps"],
        checkpoint_every=params.train.checkpoint_every,
        checkpoint_budget=params.train.checkpoint_budget,
        step_work=step_work(
            settings["batch_size"], meta["num_classes"], encoder.out_dim, sampled_labels
        ),
        seed=seed,
        row_sampling=settings["row_sampling"],
        label_chunk=params.train.label_chunk,
        matmul=params.train.matmul,
    )
    schedule = plan_validation(
        eval_every=params.train.eval_every,
        val_rows=params.train.val_rows,
        val_budget=params.train.val_budget,
        available_rows=x_val.shape[0],
        total_steps=cfg.total_steps(x_train.shape[0]),
        batch_size=cfg.batch_size,
        num_classes=meta["num_classes"],
        dim=encoder.out_dim,
        sampled_labels=sampled_labels,
        correction_per_label=(
            sampler.correction_work_per_label()
            if sampler is not None and loss.adjusts_scores
            else 0.0
        ),
    )
    cfg.eval_every = schedule.every
    val_pick = validation_rows(x_val.shape[0], params.base.seed, params.train.val_rows)[
        : schedule.rows
    ]
    code = experiment_code(params, registry, experiment)["sha256"]
    fingerprint = params_hash(
        {
            "settings": settings,
            # the processes are not part of a run's identity (its results do not depend on
            # them beyond float rounding)
            "train": {k: v for k, v in params.train.__dict__.items() if k != "distributed"},
            "seed": seed,
            "data": meta.get("params_hash"),
            "sampler": params.samplers.get(settings["sampler"]),
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
        spec = settings["model"] if fault.kind == "model" else params.samplers[settings["sampler"]]
        kinds = "models" if fault.kind == "model" else "samplers"
        raise fault.named(registry.provenance(kinds, spec), experiment) from fault
    layer = whole_layer(layer, world)  # every rank's rows, in label order
    timing = {
        "seconds": round(result.seconds, 3),
        "steps": result.steps,
        "examples_per_second": result.examples_per_second,  # rows seen, not steps × batch
        "device": str(device),
        "world_size": world.size,
    }
    if world.rank != 0:  # one writer: rank 0 writes what one process writes
        return timing
    with atomic_dir(layout.model(experiment)) as tmp:
        save_model(
            tmp,
            {
                "layer": layer.state_dict(),
                "encoder": encoder.state_dict(),
                "loss": loss.state_dict(),
            },
            {
                "experiment": experiment,
                "settings": settings,
                # the code of its loss, model and sampler: evaluate refuses a model whose
                # code has moved on (pipeline/artifacts.py check_made_for)
                "code": code,
                "num_classes": meta["num_classes"],
                "in_dim": meta["dim"],
                "steps": result.steps,
                # which validation rows and steps the learning curve used
                "validation": schedule.as_dict(),
                "checkpoint_every": result.checkpoint_every,
                "plugins": provenance(params, registry, settings),
            },
        )
    with atomic_path(layout.curve(experiment)) as tmp:
        tmp.write_text(curve_to_tsv(result.curve))
    write_json(layout.timing(f"train/{experiment}"), timing)
    checkpoint.clear()
    return timing
