"""Stage ``fit-sampler``: fit every named sampler of ``params.samplers`` on the training split.

Each lands in ``data/sampler/<key>/`` (its config and fitted state); ``data/sampler/none/``
stands for experiments without negatives, so every ``train@<experiment>`` can depend on exactly
its own sampler directory. ``metrics/sampler.json`` records, per sampler, the fit time and the
mean log q(y|x) of the true labels on the training and validation splits (log-likelihood per
example), plus whatever the sampler's ``fit_report()`` adds (the tree: depth, k, split rule,
PCA and tree-fit seconds, discrete rounds and Newton steps).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from tailkit.atomic import atomic_dir, write_json
from tailkit.cache import read_features
from tailkit.components import Sampler
from tailkit.errors import DataValidationError
from tailkit.params import NO_SAMPLER, Params
from tailkit.paths import Layout, require
from tailkit.progress import each
from tailkit.registry import Registry
from tailkit.stages.subsample import read_meta


def mean_log_prob(sampler: Sampler, x: torch.Tensor, y: torch.Tensor, chunk: int = 65536) -> float:
    total = 0.0
    for lo in range(0, y.shape[0], chunk):
        lp = sampler.log_prob(x[lo : lo + chunk], y[lo : lo + chunk].unsqueeze(1))
        total += float(lp.double().sum())
    return total / max(y.shape[0], 1)


def load_sampler(
    registry: Registry, params: Params, key: str, layout: Layout, device: torch.device
) -> Sampler | None:
    """The fitted sampler ``key`` (None for ``none``), on ``device``."""
    if key == NO_SAMPLER:
        return None
    sampler = registry.build("samplers", params.samplers[key], f"samplers.{key}")
    path = require(layout.sampler(key) / "state.pt", "fit-sampler")
    state = torch.load(path, map_location="cpu", weights_only=False)
    sampler.load_state_dict(state)
    return sampler.to(device)


def run(params: Params, layout: Layout, registry: Registry) -> dict[str, Any]:
    meta = read_meta(layout.features)
    train = read_features(layout.features / "train.parquet")
    val = read_features(layout.features / "val.parquet")
    samplers = {
        key: registry.build("samplers", spec, f"samplers.{key}")
        for key, spec in params.samplers.items()
    }
    report: dict[str, Any] = {}
    with atomic_dir(layout.samplers) as tmp:
        _write_config(tmp / NO_SAMPLER, {"name": NO_SAMPLER})
        for key, sampler in each(samplers.items(), "fit-sampler", unit="sampler"):
            start = time.perf_counter()
            try:
                sampler.fit(train.x, train.labels, meta["num_classes"])
            except (ValueError, TypeError) as exc:
                raise DataValidationError(f"samplers.{key}: fit failed: {exc}") from exc
            fit_seconds = time.perf_counter() - start
            _write_config(tmp / key, params.samplers[key])
            torch.save(sampler.state_dict(), tmp / key / "state.pt")
            # A model-based proposal is the model itself: there is nothing to score before training.
            scored = sampler.conditions_on == "input"
            report[key] = {
                "fit_seconds": round(fit_seconds, 4),
                "train_log_likelihood": mean_log_prob(sampler, train.x, train.labels)
                if scored
                else None,
                "val_log_likelihood": mean_log_prob(sampler, val.x, val.labels) if scored else None,
                **sampler.fit_report(),
            }
    write_json(layout.sampler_metrics, report)
    return report


def _write_config(directory: Path, spec: dict[str, Any]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    write_json(directory / "config.json", spec)
