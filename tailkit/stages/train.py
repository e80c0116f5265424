"""Stage ``train@<experiment>``: train one experiment and save its model and learning curve.

Writes ``data/models/<experiment>/`` (weights, the resolved experiment settings and the
``tailkit plugins`` report, so a result records the code that made it) and
``plots/train/<experiment>.tsv``. An interrupted run resumes from
``data/checkpoints/<experiment>/`` when its settings and inputs are unchanged.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tailkit.atomic import atomic_dir, atomic_path, write_json
from tailkit.cache import read_features
from tailkit.checksum import params_hash
from tailkit.errors import InvalidParameterError
from tailkit.params import NO_SAMPLER, Params
from tailkit.paths import Layout
from tailkit.registry import Registry
from tailkit.runtime import resolve_device
from tailkit.stages.fit_sampler import load_sampler
from tailkit.stages.subsample import read_meta
from tailkit.training.checkpoint import Checkpointer
from tailkit.training.loop import LoopConfig, curve_to_tsv, train
from tailkit.training.optim import OPTIMIZERS
from tailkit.training.output_layer import OutputLayer
from tailkit.validation import validate_options


def build_optimizer(spec: dict[str, Any], key: str):
    name = spec.get("name")
    if name not in OPTIMIZERS:
        raise InvalidParameterError(
            f"{key}.name: unknown optimizer {name!r}; available: {', '.join(OPTIMIZERS)}"
        )
    factory = OPTIMIZERS[name]
    return factory(**validate_options(key, factory, {k: v for k, v in spec.items() if k != "name"}))


def build_objective(params: Params, experiment: str, registry: Registry):
    """Loss and optimiser of an experiment, checked against its sampler before any data is read."""
    exp = params.experiment(experiment)
    key = f"experiments.{experiment}"
    loss = registry.build("losses", exp.loss, f"{key}.loss")
    optimizer = build_optimizer(exp.optimizer, f"{key}.optimizer")
    if loss.mode == "sampled" and exp.sampler == NO_SAMPLER:
        raise InvalidParameterError(
            f"{key}.sampler: loss {exp.loss['name']!r} needs negatives; name one of the "
            "samplers (and set negatives)"
        )
    if exp.sampler != NO_SAMPLER and exp.negatives < 1:
        factory = registry.get("samplers", params.samplers[exp.sampler]["name"], "").factory
        if getattr(factory, "uses_negatives", True):
            raise InvalidParameterError(
                f"{key}.negatives: got {exp.negatives}; sampler {exp.sampler!r} draws "
                "`negatives` per step, so it must be >= 1"
            )
    if loss.mode == "full" and exp.sampler != NO_SAMPLER:
        raise InvalidParameterError(
            f"{key}.sampler: got {exp.sampler!r}, but loss {exp.loss['name']!r} scores all "
            "labels; set sampler: none"
        )
    return loss, optimizer


def check_labels(loss, params: Params, experiment: str, meta: dict, registry: Registry) -> None:
    """A one-line error when a full-mode loss that takes one label per row meets multi-label
    data, naming the losses that take it (sampled losses all do, as (row, positive) pairs)."""
    if not meta.get("multilabel") or loss.mode == "sampled" or loss.multilabel:
        return
    fits = [
        c.name
        for c in registry.components("losses")
        if getattr(c.factory, "multilabel", False) or getattr(c.factory, "mode", "") == "sampled"
    ]
    name = params.experiment(experiment).loss["name"]
    raise InvalidParameterError(
        f"experiments.{experiment}.loss: loss {name!r} takes one label per row, but dataset "
        f"{params.dataset['name']!r} is multi-label; losses for multi-label rows: "
        f"{', '.join(fits) or '(none installed)'}"
    )


def build_model(params: Params, experiment: str, registry: Registry, in_dim: int):
    exp = params.experiment(experiment)
    return registry.build("models", exp.model, f"experiments.{experiment}.model", in_dim)


def provenance(params: Params, registry: Registry, settings: dict[str, Any]) -> dict[str, str]:
    """Which plugin distribution and version supplied each component of an experiment, so a
    metrics file (and ``dvc metrics diff``) records the code behind every number."""
    out = {
        "dataset": registry.provenance("datasets", params.dataset),
        "featurizer": registry.provenance("featurizers", params.featurize),
        "model": registry.provenance("models", settings["model"]),
        "loss": registry.provenance("losses", settings["loss"]),
    }
    if settings["sampler"] != NO_SAMPLER:
        out["sampler"] = registry.provenance("samplers", params.samplers[settings["sampler"]])
    return out


def run(
    params: Params,
    layout: Layout,
    registry: Registry,
    experiment: str,
    progress: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    settings = params.resolved(experiment)
    device = resolve_device(params.base.device)
    seed = params.base.seed
    torch.manual_seed(seed)  # before building: encoders and losses may draw their init
    loss, optimizer = build_objective(params, experiment, registry)
    meta = read_meta(layout.features)
    check_labels(loss, params, experiment, meta, registry)
    encoder = build_model(params, experiment, registry, meta["dim"])
    train_set = read_features(layout.features / "train.parquet")
    val_set = read_features(layout.features / "val.parquet")
    sampler = load_sampler(registry, params, settings["sampler"], layout, device)

    encoder, loss = encoder.to(device), loss.to(device)
    layer = OutputLayer.for_loss(
        loss,
        meta["num_classes"],
        encoder.out_dim,
        device=device,
        generator=torch.Generator().manual_seed(seed),
    )
    val_pick = torch.randperm(val_set.x.shape[0], generator=torch.Generator().manual_seed(seed))
    val_pick = val_pick[: params.train.val_rows]
    cfg = LoopConfig(
        experiment=experiment,
        epochs=settings["epochs"],
        batch_size=settings["batch_size"],
        negatives=settings["negatives"],
        max_steps=settings["max_steps"],
        eval_every=params.train.eval_every,
        checkpoint_every=params.train.checkpoint_every,
        seed=seed,
    )
    fingerprint = params_hash(
        {
            "settings": settings,
            "train": params.train.__dict__,
            "seed": seed,
            "data": meta.get("params_hash"),
            "sampler": params.samplers.get(settings["sampler"]),
        }
    )
    checkpoint = Checkpointer(layout.checkpoint(experiment), fingerprint)
    result = train(
        cfg=cfg,
        encoder=encoder,
        layer=layer,
        loss=loss,
        sampler=sampler,
        optimizer=optimizer,
        x_train=train_set.x,
        y_train=train_set.labels,
        x_val=val_set.x[val_pick],
        y_val=val_set.labels[val_pick],
        class_counts=torch.as_tensor(meta["train_counts"], dtype=torch.float64),
        checkpoint=checkpoint,
        progress=progress,
    )
    summary = {
        "experiment": experiment,
        "steps": result.steps,
        "seconds": round(result.seconds, 3),
        "examples_per_second": round(result.steps * cfg.batch_size / max(result.seconds, 1e-9)),
        "device": str(device),
        "plugins": provenance(params, registry, settings),
    }
    plugins = registry.report()
    with atomic_dir(layout.model(experiment)) as tmp:
        torch.save(
            {
                "layer": {k: v.cpu() for k, v in layer.state_dict().items()},
                "encoder": encoder.state_dict(),
                "loss": loss.state_dict(),
                "settings": settings,
                "num_classes": meta["num_classes"],
                "in_dim": meta["dim"],
                "plugins": plugins,
            },
            tmp / "model.pt",
        )
        write_json(tmp / "train.json", summary)
        write_json(tmp / "plugins.json", plugins)
    with atomic_path(layout.curve(experiment)) as tmp:
        tmp.write_text(curve_to_tsv(result.curve))
    checkpoint.clear()
    return summary
