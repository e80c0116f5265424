"""Stage ``train@<experiment>``: train one experiment and save its model and learning curve.

Writes ``data/models/<experiment>/`` (``model.safetensors``: the output layer's, encoder's and
loss's tensors; ``model.json``: the resolved settings, the step count and which plugin
distribution and version supplied each component), ``plots/train/<experiment>.tsv`` (the
learning curve) and ``metrics/timings/train/<experiment>.json`` (seconds, examples/s, device;
the only file here that differs between two runs). An interrupted run resumes from
``data/checkpoints/<experiment>/`` when its settings, inputs and code are unchanged: the
checkpoint's fingerprint holds the hash of the experiment's component sources and of this
stage's own code (:mod:`tailkit.codehash`), so after a code change it starts afresh.

A model that trains itself (:class:`~tailkit.components.Learner`: napkinXC, omikuji) is fitted
once by its tool instead; ``model.json`` sits beside the tool's own files in ``learner/``, and
the learning curve is one point (the fit's seconds, the validation scores).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from tailkit.artifacts import LEARNER_FILES, MODEL_INFO, load_sampler, save_model
from tailkit.atomic import atomic_dir, atomic_path, write_json
from tailkit.cache import read_features
from tailkit.checksum import params_hash
from tailkit.codehash import experiment_code, module_fingerprint
from tailkit.components import Loss, Sampler
from tailkit.errors import InvalidParameterError
from tailkit.experiment import (
    build_model,
    build_objective,
    check_components,
    check_labels,
    feature_dir,
    provenance,
    trains_itself,
)
from tailkit.params import Params
from tailkit.paths import Layout
from tailkit.registry import Registry
from tailkit.runtime import resolve_device
from tailkit.splits import read_meta
from tailkit.training.cadence import plan_validation, step_work
from tailkit.training.checkpoint import Checkpointer
from tailkit.training.loop import LoopConfig, curve_to_tsv, train, validation_scores
from tailkit.training.output_layer import OutputLayer


def run(
    params: Params,
    layout: Layout,
    registry: Registry,
    experiment: str,
    progress: Callable[[int, int, dict[str, float]], None] | None = None,
) -> dict[str, Any]:
    if trains_itself(params, experiment, registry):
        return _fit_learner(params, layout, registry, experiment, progress)
    settings = params.resolved(experiment)
    device = resolve_device(params.base.device)
    seed = params.base.seed
    torch.manual_seed(seed)  # before building: encoders and losses may draw their init
    loss, optimizer = build_objective(params, experiment, registry)
    features = feature_dir(params, layout, experiment)
    meta = read_meta(features)
    check_labels(loss, params, experiment, meta, registry)
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

    encoder, loss = encoder.to(device), loss.to(device)
    layer = OutputLayer.for_loss(
        loss,
        meta["num_classes"],
        encoder.out_dim,
        device=device,
        generator=torch.Generator().manual_seed(seed),
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
    val_pick = _validation_rows(x_val.shape[0], params)[: schedule.rows]
    fingerprint = params_hash(
        {
            "settings": settings,
            "train": params.train.__dict__,
            "seed": seed,
            "data": meta.get("params_hash"),
            "sampler": params.samplers.get(settings["sampler"]),
            # a checkpoint written by other code is not this run's past (module docstring)
            "code": [
                experiment_code(params, registry, experiment)["sha256"],
                module_fingerprint("tailkit.stages.train")["sha256"],
            ],
        }
    )
    checkpoint = Checkpointer(layout.checkpoint(experiment), fingerprint, f"train@{experiment}")
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
        checkpoint=checkpoint,
        progress=progress,
    )
    timing = {
        "seconds": round(result.seconds, 3),
        "steps": result.steps,
        "examples_per_second": round(result.steps * cfg.batch_size / max(result.seconds, 1e-9)),
        "device": str(device),
    }
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


def check_support(
    loss: Loss,
    sampler: Sampler | None,
    params: Params,
    key: str,
    experiment: str,
    num_classes: int,
    device: torch.device,
) -> None:
    """Refuse an unconditional proposal that gives some label q = 0 to a loss that divides by
    q (:attr:`Loss.uses_log_q`): importance weights would be unbiased for a different loss,
    and the label's corrected score would be −∞ (it could never be predicted). It happens to
    a unigram proposal with offset 0 when a label has no training row (multi-label data with a
    random validation split, a profile that empties a class)."""
    if sampler is None or sampler.conditional or not loss.uses_log_q:
        return
    labels = torch.arange(num_classes, device=device)
    try:
        log_q = sampler.log_prob(None, labels).cpu()
    except NotImplementedError:
        return
    zero = torch.isneginf(log_q).nonzero().flatten()
    if zero.numel():
        fix = (
            f"set samplers.{key}.offset above 0 (1 is Bamler–Mandt's frequency baseline)"
            if params.samplers.get(key, {}).get("name") == "unigram"
            else f"make samplers.{key} give every label some probability"
        )
        raise InvalidParameterError(
            f"experiments.{experiment}: sampler {key!r} gives {zero.numel()} of {num_classes} "
            f"labels probability 0 (e.g. label {int(zero[0])}), but loss "
            f"{type(loss).__name__} divides by q; {fix}, or use a loss that needs no q "
            "(weighting: constant)"
        )


def _validation_rows(rows: int, params: Params) -> torch.Tensor:
    """The validation rows of the learning curve: a seeded pick of ``train.val_rows``, the same
    for every experiment, whichever way it trains."""
    pick = torch.randperm(rows, generator=torch.Generator().manual_seed(params.base.seed))
    return pick[: params.train.val_rows]


def _fit_learner(
    params: Params,
    layout: Layout,
    registry: Registry,
    experiment: str,
    progress: Callable[[int, int, dict[str, float]], None] | None,
) -> dict[str, Any]:
    """Train a model that trains itself (a wrapped tool): one ``fit`` on the training split,
    its files in the tool's format under ``learner/``, and a one-point learning curve (the fit's
    seconds and the validation scores of the same validation rows as the loop's)."""
    check_components(params, experiment, registry)  # the loop's path checks in build_objective
    settings = params.resolved(experiment)
    features = feature_dir(params, layout, experiment)
    meta = read_meta(features)
    model = build_model(params, experiment, registry, meta["dim"], meta.get("kind", "dense"))
    train_set = read_features(features / "train.parquet")
    val_set = read_features(features / "val.parquet")
    x_train, y_train, x_val, y_val = train_set.x, train_set.labels, val_set.x, val_set.labels
    # read with every column, so none is None
    assert x_train is not None and y_train is not None and x_val is not None and y_val is not None
    val_pick = _validation_rows(x_val.shape[0], params)
    if progress is not None:
        progress(0, 1, {})
    with atomic_dir(layout.model(experiment)) as tmp:
        start = time.perf_counter()
        model.fit(
            x_train,
            y_train,
            meta["num_classes"],
            tmp / LEARNER_FILES,
            params.base.seed,
        )
        seconds = time.perf_counter() - start
        top1, _ = model.predict_topk(x_val[val_pick], 1)
        write_json(
            tmp / MODEL_INFO,
            {
                "experiment": experiment,
                "settings": settings,
                "num_classes": meta["num_classes"],
                "in_dim": meta["dim"],
                "steps": None,  # one fit by the tool, not steps of tailkit's loop
                # False: the tool draws randomness no caller can seed; a rerun differs
                "deterministic": model.deterministic,
                "plugins": provenance(params, registry, settings),
            },
        )
    if progress is not None:
        progress(1, 1, {})
    accuracy, balanced = validation_scores(
        torch.from_numpy(top1[:, 0]), y_val[val_pick], meta["num_classes"]
    )
    curve = [
        {
            "step": 1,
            "seconds": seconds,
            "loss": float("nan"),  # the tool reports no training loss
            "val_accuracy": accuracy,
            "val_balanced_accuracy": balanced,
        }
    ]
    with atomic_path(layout.curve(experiment)) as tmp:
        tmp.write_text(curve_to_tsv(curve))
    rows = int(x_train.shape[0])
    timing = {
        "seconds": round(seconds, 3),
        "steps": None,
        "examples_per_second": round(rows / max(seconds, 1e-9)),
        "device": "cpu",
    }
    write_json(layout.timing(f"train/{experiment}"), timing)
    return timing
