"""Training a model that trains itself (:class:`~tailkit.components.Learner`: napkinXC,
omikuji): one ``fit`` by its tool on the training split, in place of tailkit's loop, with the
same outputs as a trained experiment (``model.json`` beside the tool's files in ``learner/``,
a learning curve of one point, the timing file).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from tailkit.params import Params
from tailkit.paths import Layout
from tailkit.pipeline.artifacts import LEARNER_FILES, MODEL_INFO
from tailkit.pipeline.codehash import experiment_code
from tailkit.pipeline.experiment import build_model, check_components, feature_dir
from tailkit.pipeline.saved_run import run_info, run_timing, save_run
from tailkit.registry import Registry
from tailkit.storage.atomic import atomic_dir, write_json
from tailkit.storage.feature_cache import read_features
from tailkit.storage.splits import read_meta
from tailkit.training.loop import validation_rows, validation_scores


def fit_learner(
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
    features = feature_dir(params, layout, experiment)
    meta = read_meta(features)
    model = build_model(params, experiment, registry, meta["dim"], meta.get("kind", "dense"))
    train_set = read_features(features / "train.parquet")
    val_set = read_features(features / "val.parquet")
    x_train, y_train, x_val, y_val = train_set.x, train_set.labels, val_set.x, val_set.labels
    # read with every column, so none is None
    assert x_train is not None and y_train is not None and x_val is not None and y_val is not None
    val_pick = validation_rows(x_val.shape[0], params.base.seed, params.train.val_rows)
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
        info = run_info(
            params,
            registry,
            experiment,
            code=experiment_code(params, registry, experiment)["sha256"],
            num_classes=meta["num_classes"],
            in_dim=meta["dim"],
            steps=None,
            # False: the tool draws randomness no caller can seed; a rerun differs
            deterministic=model.deterministic,
        )
        write_json(tmp / MODEL_INFO, info)
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
    timing = run_timing(seconds, None, int(x_train.shape[0]), "cpu")
    save_run(layout, experiment, curve=curve, timing=timing)  # the tool wrote its own model
    return timing
