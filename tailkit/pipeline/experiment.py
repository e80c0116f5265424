"""How an experiment of ``params.experiments`` becomes objects: its loss, optimiser, encoder and
the provenance of each component, shared by the train and evaluate stages (neither stage
imports the other).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import torch

from tailkit.components import Loss, Sampler
from tailkit.errors import InvalidParameterError
from tailkit.native.arithmetic import provenance_record
from tailkit.native.device import resolve_device
from tailkit.output.optim import OPTIMIZERS
from tailkit.params import NO_SAMPLER, Params, ResolvedExperiment
from tailkit.paths import Layout
from tailkit.pipeline.codehash import tool_versions
from tailkit.registry import Registry
from tailkit.validation import validate_options


def build_optimizer(spec: dict[str, Any], key: str):
    name = spec.get("name")
    if name not in OPTIMIZERS:
        raise InvalidParameterError(
            f"{key}.name: unknown optimizer {name!r}; available: {', '.join(OPTIMIZERS)}"
        )
    factory = OPTIMIZERS[name]
    return factory(**validate_options(key, factory, {k: v for k, v in spec.items() if k != "name"}))


def trains_itself(params: Params, experiment: str, registry: Registry) -> bool:
    """Whether the experiment's model is a :class:`~tailkit.components.Learner` (a wrapped tool
    with its own objective and solver) rather than an encoder trained by tailkit's loop."""
    name = params.experiment(experiment).model["name"]
    model = registry.get("models", name, f"experiments.{experiment}.model.name")
    return bool(model.traits["learner"])


def check_components(params: Params, experiment: str, registry: Registry) -> None:
    """A one-line error when an experiment's components do not fit its kind of model: a model
    that trains itself takes no loss, optimizer, sampler or negatives; any other needs a loss
    and an optimizer."""
    exp = params.experiment(experiment)
    key = f"experiments.{experiment}"
    model = exp.model["name"]
    if trains_itself(params, experiment, registry):
        given = [
            name
            for name, value in (
                ("loss", exp.loss),
                ("optimizer", exp.optimizer),
                ("sampler", None if exp.sampler == NO_SAMPLER else exp.sampler),
                ("negatives", exp.negatives or None),
            )
            if value is not None
        ]
        if given:
            raise InvalidParameterError(
                f"{key}.{given[0]}: model {model!r} trains itself with its own objective; "
                f"remove {', '.join(given)} (and set sampler: {NO_SAMPLER})"
            )
        rows, shown = _row_sampling(params, experiment)
        if rows != "instance":  # the tool reads the training rows as they are
            raise InvalidParameterError(
                f"{key}.row_sampling: got {shown}, but model {model!r} trains itself "
                "on every training row as it is; set row_sampling: instance"
            )
        return
    for name in ("loss", "optimizer"):
        if getattr(exp, name) is None:
            raise InvalidParameterError(
                f"{key}.{name}: missing; model {model!r} is trained by tailkit's loop, which "
                "needs a loss and an optimizer (only a model that trains itself, such as "
                "napkinxc-plt or omikuji, takes neither)"
            )


def batch_mode(params: Params, experiment: str) -> str:
    """The batch mode an experiment trains in: ``"sampled"`` when it names a sampler, else
    ``"full"`` (its loss must take that mode's batch type)."""
    return "full" if params.experiment(experiment).sampler == NO_SAMPLER else "sampled"


def build_objective(params: Params, experiment: str, registry: Registry):
    """Loss and optimiser of an experiment, checked against its sampler before any data is read."""
    check_components(params, experiment, registry)
    exp = params.experiment(experiment)
    key = f"experiments.{experiment}"
    # check_components raised unless the model is trained by the loop, which has both.
    loss_spec = cast(dict[str, Any], exp.loss)
    optimizer_spec = cast(dict[str, Any], exp.optimizer)
    info = registry.get("losses", loss_spec["name"], f"{key}.loss.name")
    mode = batch_mode(params, experiment)
    if mode not in info.modes:
        if mode == "full":
            raise InvalidParameterError(
                f"{key}.sampler: loss {loss_spec['name']!r} takes only sampled batches "
                "(SampledBatch); name one of the samplers (and set negatives)"
            )
        raise InvalidParameterError(
            f"{key}.sampler: got {exp.sampler!r}, but loss {loss_spec['name']!r} takes only "
            "full batches (FullBatch: the logits of all labels); set sampler: none"
        )
    if exp.sampler != NO_SAMPLER and exp.negatives < 1:
        sampler = registry.get("samplers", params.samplers[exp.sampler]["name"], "")
        if sampler.traits["uses_negatives"]:
            raise InvalidParameterError(
                f"{key}.negatives: got {exp.negatives}; sampler {exp.sampler!r} draws "
                "`negatives` per step, so it must be >= 1"
            )
    loss = registry.build("losses", loss_spec, f"{key}.loss")
    optimizer = build_optimizer(optimizer_spec, f"{key}.optimizer")
    return loss, optimizer


def check_labels(loss, params: Params, experiment: str, meta: dict, registry: Registry) -> None:
    """A one-line error when a full-mode loss that takes one label per row meets multi-label
    data, naming the losses that take it (sampled losses all do, as (row, positive) pairs)."""
    if not meta.get("multilabel") or batch_mode(params, experiment) == "sampled" or loss.multilabel:
        return
    fits = [
        c.name
        for c in registry.components("losses")
        if c.traits["multilabel"] or "sampled" in c.modes
    ]
    name = cast(dict[str, Any], params.experiment(experiment).loss)["name"]  # as build_objective
    raise InvalidParameterError(
        f"experiments.{experiment}.loss: loss {name!r} takes one label per row, but dataset "
        f"{params.dataset['name']!r} is multi-label; losses for multi-label rows: "
        f"{', '.join(fits) or '(none installed)'}"
    )


def check_row_sampling(params: Params, experiment: str, meta: dict) -> None:
    """A one-line error when multi-label rows meet a row sampling other than ``instance``:
    Kang et al.'s class-aware samplers draw a class, then a row of it, which gives each class
    its intended share only when a row has one label (tailkit/training/row_sampling.py)."""
    rows, shown = _row_sampling(params, experiment)
    if meta.get("multilabel") and rows != "instance":
        raise InvalidParameterError(
            f"experiments.{experiment}.row_sampling: got {shown}, but dataset "
            f"{params.dataset['name']!r} is multi-label and the class-aware samplers need one "
            "label per row; set row_sampling: instance"
        )


def _row_sampling(params: Params, experiment: str) -> tuple[str, str]:
    """The experiment's row sampling, and that value as an error message shows it: quoted, and
    marked when it comes from the ``train:`` default (setting it on the experiment is the fix)."""
    rows = params.resolved(experiment).row_sampling
    shown = repr(rows)
    if params.experiment(experiment).row_sampling is None:
        shown += " (from train.row_sampling)"
    return rows, shown


def build_model(
    params: Params, experiment: str, registry: Registry, in_dim: int, kind: str | None = None
):
    """The experiment's encoder for ``in_dim`` inputs; with ``kind`` (the cached features'
    kind), a model that reads another kind is a one-line error naming the models that fit."""
    exp = params.experiment(experiment)
    key = f"experiments.{experiment}.model"
    if kind is not None:
        reads = registry.get("models", exp.model["name"], f"{key}.name").traits["input_kind"]
        if reads != kind:
            fits = [c.name for c in registry.components("models") if c.traits["input_kind"] == kind]
            raise InvalidParameterError(
                f"{key}: model {exp.model['name']!r} reads {reads} features, but feature set "
                f"{exp.features!r} ({params.featurize[exp.features]['name']}) holds {kind} ones; "
                f"models for {kind} features: "
                f"{', '.join(fits) or '(none installed)'}"
            )
    return registry.build("models", exp.model, key, in_dim)


def feature_dir(params: Params, layout: Layout, experiment: str) -> Path:
    """``data/features/<set>``: the feature set the experiment trains on."""
    return layout.feature_set(params.experiment(experiment).features)


def provenance(params: Params, registry: Registry, settings: ResolvedExperiment) -> dict[str, Any]:
    """Which plugin distribution and version supplied each component of an experiment, so a
    metrics file (and ``dvc metrics diff``) records the code behind every number; and under
    ``arithmetic``, the mode, machine, device and numerical libraries that made its bits
    (:func:`tailkit.native.arithmetic.provenance_record`)."""
    out: dict[str, Any] = {
        "dataset": registry.provenance("datasets", params.dataset),
        "featurizer": registry.provenance("featurizers", params.featurize[settings.features]),
        "model": registry.provenance("models", settings.model),
    }
    if settings.loss is not None:
        out["loss"] = registry.provenance("losses", settings.loss)
    model = registry.get("models", settings.model["name"], "model")
    for distribution, version in tool_versions(model.requires).items():
        out[distribution] = f"{distribution} {version}"
    if settings.sampler != NO_SAMPLER:
        out["sampler"] = registry.provenance("samplers", params.samplers[settings.sampler])
    out["arithmetic"] = provenance_record(resolve_device(params.base.device).type)
    return out


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
