"""What every trained run leaves, assembled in one place: ``data/models/<run>/`` (the weights
and ``model.json``, or a wrapped tool's own files beside ``model.json``), the learning curve
``plots/train/<run>.tsv`` and the timing file ``metrics/timings/train/<run>.json``.

``train@``, ``train-decoupled@`` and a model that trains itself all write these three, so
evaluate, the report and ``tailkit predict`` read one kind of run whatever made it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tailkit.params import Params
from tailkit.paths import Layout
from tailkit.pipeline.artifacts import save_model
from tailkit.pipeline.experiment import provenance
from tailkit.registry import Registry
from tailkit.storage.atomic import atomic_dir, atomic_path, write_json
from tailkit.training.loop import curve_to_tsv


def run_info(
    params: Params,
    registry: Registry,
    experiment: str,
    *,
    code: str,
    num_classes: int,
    in_dim: int,
    steps: int | None,
    **extra: Any,
) -> dict[str, Any]:
    """``model.json``: the run's name, settings, code (the hash of its loss, model and sampler:
    :func:`~tailkit.pipeline.codehash.experiment_code`, which the trainer has already computed
    for its checkpoint) and components, and ``extra`` (how its validation ran, a decoupled run's
    first stage, a tool's determinism)."""
    settings = params.resolved(experiment)
    return {
        "experiment": experiment,
        "settings": settings.as_dict(),
        # the code of its loss, model and sampler: evaluate refuses a model whose code has
        # moved on (pipeline/artifacts.py check_made_for)
        "code": code,
        "num_classes": num_classes,
        "in_dim": in_dim,
        "steps": steps,  # None: one fit by a tool, not steps of tailkit's loop
        "plugins": provenance(params, registry, settings),
        **extra,
    }


def run_timing(
    seconds: float, steps: int | None, examples: int, device: str, **extra: Any
) -> dict[str, Any]:
    """The timing file: seconds, steps, and rows seen per second (not steps × batch)."""
    return {
        "seconds": round(seconds, 3),
        "steps": steps,
        "examples_per_second": round(examples / max(seconds, 1e-9)),
        "device": device,
        **extra,
    }


def save_run(
    layout: Layout,
    experiment: str,
    *,
    curve: list[dict[str, Any]],
    timing: dict[str, Any],
    weights: dict[str, Any] | None = None,
    info: dict[str, Any] | None = None,
    model_dir: Path | None = None,
) -> None:
    """Write the run's model (``weights`` and ``info``; a tool that wrote its own folder passes
    neither) to ``model_dir`` (``data/models/<run>`` unless given: a decoupled run's seed runs
    live apart, :meth:`tailkit.params.Params.model_dir`), then its learning curve and its
    timing, each file whole or not at all."""
    if weights is not None:
        assert info is not None, "a model's weights go with its model.json"
        with atomic_dir(model_dir or layout.model(experiment)) as tmp:
            save_model(tmp, weights, info)
    with atomic_path(layout.curve(experiment)) as tmp:
        tmp.write_text(curve_to_tsv(curve))
    write_json(layout.timing(f"train/{experiment}"), timing)
