"""One experiment scored, from its trained run to the files ``evaluate@<experiment>`` writes
(:mod:`tailkit.evaluation.results`): the test split's top k with the loss's prediction-time
adjustment (and without it, when the loss has one), the F1 threshold tuned on validation, the
margins and class diameters of single-label rows; a model that trains itself from its own
top k alone.
"""

from __future__ import annotations

import numpy as np
import torch

from tailkit.distributed.world import World
from tailkit.errors import InvalidParameterError
from tailkit.evaluation.embeddings import class_diameters, diameter_summary, embed, pick_rows
from tailkit.evaluation.metrics import margin_summary
from tailkit.evaluation.predict import Predictions
from tailkit.evaluation.predict_sharded import predict_sharded
from tailkit.evaluation.results import (
    Scored,
    f1_of,
    probabilities_of,
    write_margin_cdfs,
    write_results,
)
from tailkit.labels import LabelSets
from tailkit.native.device import resolve_device
from tailkit.output.shards import shard_layer
from tailkit.params import Params
from tailkit.paths import Layout
from tailkit.pipeline.experiment import feature_dir, trains_itself
from tailkit.pipeline.trained import restore, restore_learner
from tailkit.progress import notice
from tailkit.registry import Registry
from tailkit.storage.feature_cache import read_features


def _seeds(params: Params) -> dict[str, int]:
    """The training seed and, apart from it, the seed of the subsample and split the model was
    trained and tested on (recorded in the train block of the metrics)."""
    return {"seed": params.base.seed, "split_seed": params.subsample.seed}


def _top_k(params: Params, num_classes: int) -> int:
    """``evaluate.top_k``, capped at the number of labels, with a notice when it is."""
    k = params.evaluate.top_k
    if k > num_classes:
        notice(f"evaluate.top_k={k} is more than the {num_classes} labels; ranking all of them")
    return min(k, num_classes)


def evaluate_experiment(
    params: Params, layout: Layout, registry: Registry, experiment: str, world: World
) -> dict:
    """Score one experiment's test split (this process's labels when they are sharded) and,
    on rank 0, write its results; returns the headline metrics ({} on the other ranks)."""
    if trains_itself(params, experiment, registry):
        if world.sharded:
            raise InvalidParameterError(
                f"experiments.{experiment}: a model that trains itself runs in one process "
                "(train.distributed.nproc_per_node: 1)"
            )
        return _evaluate_learner(params, layout, registry, experiment)
    device = resolve_device(params.base.device)
    trained = restore(params, layout, registry, experiment, device)
    encoder, loss, ctx = trained.encoder, trained.loss, trained.ctx
    layer = shard_layer(trained.layer, world)  # this process's labels (all, in one process)
    info, meta = trained.info, trained.meta
    counts = np.asarray(meta["train_counts"])
    features = feature_dir(params, layout, experiment)
    test = read_features(features / "test.parquet")
    x_test, y_test = test.x, test.labels
    assert x_test is not None and y_test is not None  # read with every column
    multilabel = isinstance(y_test, LabelSets)
    single = None if isinstance(y_test, LabelSets) else y_test  # (N,) ids; None: multi-label
    adjusted, raw = predict_sharded(
        encoder,
        layer,
        loss,
        ctx,
        x_test,
        single,
        world,
        k=_top_k(params, meta["num_classes"]),
        batch_size=params.evaluate.batch_size,
        label_chunk=params.evaluate.label_chunk,
    )

    def scored(preds: Predictions) -> Scored:
        ll = None if multilabel else preds.log_likelihood.cpu().numpy()
        return Scored(preds.topk.cpu().numpy(), ll, probabilities_of(preds, loss))

    k = _top_k(params, meta["num_classes"])
    tested = scored(adjusted)
    val = read_features(features / "val.parquet")
    assert val.x is not None and val.labels is not None
    val_scored = None
    if tested.probabilities is not None:  # the F1 threshold is tuned on validation
        val_preds, _ = predict_sharded(
            encoder,
            layer,
            loss,
            ctx,
            val.x,
            None,
            world,
            k=k,
            batch_size=params.evaluate.batch_size,
            label_chunk=params.evaluate.label_chunk,
            unadjusted=False,
        )
        val_scored = Scored(val_preds.topk.cpu().numpy(), None, probabilities_of(val_preds, loss))
    f1 = f1_of(
        tested, y_test, val_scored, val.labels, meta["num_classes"], params.evaluate.threshold
    )

    margins, intra = None, None
    groups = params.evaluate.thresholds
    if world.rank != 0:  # one writer: the others have done their part of the scoring
        return {}
    if single is not None:  # not multilabel
        labels = single.numpy()
        margins, cdfs = margin_summary(
            adjusted.margins(single).cpu().numpy(), labels, counts, groups
        )
        picked = pick_rows(labels, params.evaluate.diameter_rows, seed=params.base.seed)
        z = embed(encoder, x_test[torch.from_numpy(picked)], device)
        diameters = class_diameters(z, labels[picked], len(counts))
        intra = diameter_summary(diameters, counts, groups)
    else:  # no margin for a row of several labels: header-only files, as dvc.yaml declares
        cdfs = {}
    write_margin_cdfs(layout.eval_plots(experiment), cdfs)
    return write_results(
        layout,
        experiment,
        features,
        meta,
        test,
        tested,
        None if raw is None else scored(raw),
        {"steps": info["steps"], **_seeds(params)},
        info["plugins"],
        margins,
        intra,
        groups,
        f1,
    )


def _evaluate_learner(params: Params, layout: Layout, registry: Registry, experiment: str):
    """Score a model that trains itself from its top-k alone: it has no score for labels
    outside them, so no log-likelihood, margin or embedding (those entries are None)."""
    features = feature_dir(params, layout, experiment)
    model, info, meta = restore_learner(params, layout, registry, experiment)
    k = _top_k(params, meta["num_classes"])

    def scored(x) -> Scored:
        ranked, scores = model.predict_topk(x, k)
        probabilities = scores.astype(np.float64) if model.scores_are_probabilities else None
        return Scored(ranked, None, probabilities)

    test = read_features(features / "test.parquet")
    tested = scored(test.x)
    assert test.labels is not None
    f1 = None
    if tested.probabilities is not None:  # the F1 threshold is tuned on validation
        val = read_features(features / "val.parquet")
        assert val.labels is not None
        f1 = f1_of(
            tested,
            test.labels,
            scored(val.x),
            val.labels,
            meta["num_classes"],
            params.evaluate.threshold,
        )
    write_margin_cdfs(layout.eval_plots(experiment), {})  # no margins from top-k alone
    return write_results(
        layout,
        experiment,
        features,
        meta,
        test,
        tested,
        None,
        {"steps": None, "deterministic": info["deterministic"], **_seeds(params)},
        info["plugins"],
        None,
        None,
        params.evaluate.thresholds,
        f1,
    )
