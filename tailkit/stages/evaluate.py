"""Stage ``evaluate@<experiment>``: restore the trained experiment, score its test split and
write what :mod:`tailkit.evaluation.results` computes from the scores: every metric to
``metrics/detail/<experiment>.json``, the headline (:data:`tailkit.storage.metrics_file.HEADLINE`) to
``metrics/<experiment>.json``, the per-class table and the margin CDFs.

Scores are computed in label chunks with the loss's prediction-time adjustment applied (see
:mod:`tailkit.evaluation.predict`); when the loss has one, the unadjusted metrics are reported
as well, under ``uncorrected``, as the Bamler–Mandt reference logs both. A model that trains
itself (napkinXC, omikuji) scores only its top k labels: its metrics are computed from that
ranking alone, ECE from its top probability, and the log-likelihood, margins and class
diameters are None.
"""

from __future__ import annotations

import time
from typing import Any

from tailkit.distributed.launch import joined_world
from tailkit.native.device import resolve_device
from tailkit.params import Params
from tailkit.paths import Layout
from tailkit.pipeline.evaluate_run import evaluate_experiment
from tailkit.registry import Registry
from tailkit.storage.atomic import write_json


def run(params: Params, layout: Layout, registry: Registry, experiment: str) -> dict[str, Any]:
    start = time.perf_counter()
    device = resolve_device(params.base.device)
    # under torchrun (train.distributed) each process scores its own labels; rank 0 writes
    with joined_world(params.train.distributed_settings, device) as world:
        metrics = evaluate_experiment(params, layout, registry, experiment, world)
        if world.rank == 0:
            seconds = round(time.perf_counter() - start, 3)
            write_json(
                layout.timing(f"evaluate/{experiment}"),
                {"seconds": seconds, "world_size": world.size},
            )
        return metrics
