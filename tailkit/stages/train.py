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

from tailkit.distributed.launch import joined_world
from tailkit.native.device import resolve_device
from tailkit.params import Params
from tailkit.paths import Layout
from tailkit.pipeline.experiment import trains_itself
from tailkit.pipeline.learner_run import fit_learner
from tailkit.pipeline.train_run import train_experiment
from tailkit.registry import Registry


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
        return train_experiment(
            params, layout, registry, experiment, settings, device, world, progress
        )
