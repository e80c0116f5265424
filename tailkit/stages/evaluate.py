"""Stage ``evaluate@<experiment>``: score the test split; every metric goes to
``metrics/detail/<experiment>.json`` and the headline ones (:data:`tailkit.metrics_file.HEADLINE`)
to ``metrics/<experiment>.json``, the file DVC compares.

Scores are computed in label chunks with the loss's prediction-time adjustment applied (see
:mod:`tailkit.evaluation.predict`); when the loss has one, the unadjusted metrics are reported
as well, under ``uncorrected``, as the Bamler–Mandt reference logs both.

Beyond accuracy, what the long-tail papers analyse: the calibration error (ECE) of the loss's
own calibrated-probability map (``Loss.confidence``: softmax, σ(s), σ(2s)); the logit margins
γ(x, y) = f_y(x) − max_{y'≠y} f_{y'}(x) per many/medium/few group, with their empirical CDFs in
``plots/eval/<experiment>/margins-<group>.tsv``; and the maximum intra-class distance of the
embeddings Φ(x) per class, normalised by the largest embedding norm (ELM figure 4), summarised
per group over at most ``evaluate.diameter_rows`` test rows of each class; the test accuracy of
every label in ``data/evaluation/<experiment>/per_class.parquet``
(:mod:`tailkit.evaluation.per_class`; aggregated per frequency bin for ``dvc plots`` in
``plots/classes/<experiment>.tsv``). Under ``ranking``,
the Extreme Classification Repository's metrics of the top-5 ranking (P@k, nDCG@k, PSP@k,
PSnDCG@k, R@k, coverage@k for k = 1, 3, 5; for single-label rows P@1 = R@1 = accuracy).

Multi-label test rows (the XC datasets) have no single true label, so there is no accuracy,
log-likelihood, margin or class diameter; ``test`` holds instead P@k and PSP@k (k = 1, 3, 5),
the macro-averaged per-label recall of the top-k ranking (k = ``evaluate.top_k``; the
multi-label counterpart of balanced accuracy: with one label per row, recall@1 of a class is
its accuracy) over all labels and per many/medium/few group (groups by the rows carrying the
label in training), and the ECE of the top-1 prediction being one of the row's labels. The
per-class plot's ``accuracy`` column is then the labels' recall@k. Propensities use the number
of training rows as N.

A model that trains itself (napkinXC, omikuji) scores only its top k labels: its metrics are
computed from that ranking alone, ECE from its top probability, and the log-likelihood,
margins and class diameters are None.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tailkit.artifacts import load_learner, load_model, load_sampler
from tailkit.atomic import atomic_dir, write_json
from tailkit.cache import FeatureTable, read_features
from tailkit.components import DEFAULT_PROPENSITY, Loss, PredictionContext
from tailkit.evaluation.embeddings import class_diameters, diameter_summary, embed, pick_rows
from tailkit.evaluation.metrics import (
    CDF_POINTS,
    classification_metrics,
    expected_calibration_error,
    inverse_propensity,
    label_recall,
    margin_summary,
    ranking_metrics,
    shot_groups,
)
from tailkit.evaluation.per_class import (
    data_key,
    per_class_frame,
    per_label_results,
    write_class_plot,
    write_per_class,
)
from tailkit.evaluation.predict import Predictions, predict
from tailkit.experiment import build_model, build_objective, feature_dir, trains_itself
from tailkit.labels import LabelSets
from tailkit.metrics_file import headline, null_non_finite, write_metrics
from tailkit.params import Params
from tailkit.paths import Layout
from tailkit.progress import notice
from tailkit.registry import Registry
from tailkit.runtime import resolve_device
from tailkit.splits import read_labels, read_meta
from tailkit.training.loop import log_prior_from_counts
from tailkit.training.output_layer import OutputLayer


def _metrics(
    topk: np.ndarray,
    labels: np.ndarray,
    counts: np.ndarray,
    log_likelihood: np.ndarray | None,
    confidence: np.ndarray | None,
) -> dict[str, Any]:
    out = classification_metrics(labels, topk, log_likelihood, counts)
    out["ece"] = (
        None if confidence is None else expected_calibration_error(confidence, topk[:, 0] == labels)
    )
    return out


def _confidence(preds: Predictions, loss: Loss) -> np.ndarray | None:
    """The loss's calibrated probability of each row's top label (None: it has none)."""
    confidence = loss.confidence(preds.top_scores[:, 0], preds.log_partition)
    return None if confidence is None else confidence.double().cpu().numpy()


def _truth(labels: np.ndarray | LabelSets) -> tuple[np.ndarray, np.ndarray]:
    """Each test row's true labels as a CSR pair (indptr, indices)."""
    if isinstance(labels, LabelSets):
        return labels.csr_pair()
    return np.arange(labels.shape[0] + 1), labels


def _inverse_propensity(
    labels: np.ndarray | LabelSets, counts: np.ndarray, meta: dict[str, Any]
) -> np.ndarray:
    """q_l of the XC repository's propensity model, from the training counts with the
    dataset's (A, B); N is the training rows (their label count for one label per row)."""
    a, b = meta.get("propensity", DEFAULT_PROPENSITY)  # the dataset's, recorded by subsample
    multi = isinstance(labels, LabelSets)
    num_train = int(meta["train_rows"]) if multi else int(counts.sum())
    return inverse_propensity(counts, num_train, a, b)


def _ranking(
    ranked: np.ndarray, labels: np.ndarray | LabelSets, counts: np.ndarray, meta: dict[str, Any]
):
    """The XC repository's P@k, nDCG@k, PSP@k, PSnDCG@k, R@k, coverage@k (k = 1, 3, 5) of the
    top-5 ranking."""
    q = _inverse_propensity(labels, counts, meta)
    ks = tuple(k for k in (1, 3, 5) if k <= ranked.shape[1])  # fewer than 5 classes: fewer k
    return ranking_metrics(ranked, _truth(labels), len(counts), ks, q)


def _multilabel_metrics(
    ranked: np.ndarray,
    labels: LabelSets,
    counts: np.ndarray,
    ranking: dict[str, float],
    confidence: np.ndarray | None,
) -> dict[str, Any]:
    """The ``test`` block of multi-label rows (module docstring)."""
    recall, support = label_recall(ranked, labels.csr_pair(), labels.num_classes)
    present = support > 0
    k = ranked.shape[1]
    out: dict[str, Any] = {"rows": len(labels)}
    out.update((key, ranking[key]) for key in ranking if key.split("@")[0] in ("P", "PSP"))
    out[f"macro_recall@{k}"] = float(recall[present].mean()) if present.any() else None
    for group, mask in shot_groups(counts).items():
        chosen = recall[mask & present]
        out[group] = float(chosen.mean()) if chosen.size else None
        out[f"{group}_classes"] = int((mask & present).sum())
    top1 = torch.from_numpy(ranked[:, :1])
    correct = labels.contains(torch.arange(len(labels)), top1).squeeze(1).numpy()
    correct &= ranked[:, 0] >= 0
    out["ece"] = None if confidence is None else expected_calibration_error(confidence, correct)
    return out


def _write_margin_cdfs(directory: Path, cdfs: dict[str, np.ndarray]) -> None:
    with atomic_dir(directory) as tmp:
        for group, values in cdfs.items():
            rows = "".join(f"{v:.6g}\t{q:.2f}\n" for v, q in zip(values, CDF_POINTS, strict=True))
            (tmp / f"margins-{group}.tsv").write_text("margin\tcdf\n" + rows)


def run(params: Params, layout: Layout, registry: Registry, experiment: str) -> dict[str, Any]:
    start = time.perf_counter()
    metrics = _evaluate(params, layout, registry, experiment)
    seconds = round(time.perf_counter() - start, 3)
    write_json(layout.timing(f"evaluate/{experiment}"), {"seconds": seconds})
    return metrics


def restore(params: Params, layout: Layout, registry: Registry, experiment: str, device):
    """The trained experiment ready to predict: (encoder, output layer, loss, prediction
    context, model info, feature meta), each on ``device``; benchmarks reuse it."""
    loss, _ = build_objective(params, experiment, registry)
    features = feature_dir(params, layout, experiment)
    meta = read_meta(features)
    state, info = load_model(layout.model(experiment), f"train@{experiment}", device)
    encoder = build_model(params, experiment, registry, info["in_dim"])
    encoder.load_state_dict(state["encoder"])
    encoder, loss = encoder.to(device), loss.to(device)
    counts = np.asarray(meta["train_counts"])
    loss.setup(torch.as_tensor(counts, dtype=torch.float64, device=device))
    loss.load_state_dict(state["loss"])
    layer = OutputLayer.for_loss(loss, info["num_classes"], encoder.out_dim, device=device)
    layer.load_state_dict(state["layer"])
    sampler = load_sampler(registry, params, info["settings"]["sampler"], layout, device)
    ctx = PredictionContext(log_prior=log_prior_from_counts(counts).to(device), sampler=sampler)
    return encoder, layer, loss, ctx, info, meta


@dataclass
class _Scored:
    """What evaluation computes from, for one set of scores (adjusted or raw): each test row's
    top-k ranking (N, k), the log-likelihood of its true label and the model's probability of
    its top label (None where the model gives none)."""

    ranked: np.ndarray
    log_likelihood: np.ndarray | None
    confidence: np.ndarray | None


def _top_k(params: Params, num_classes: int) -> int:
    """``evaluate.top_k``, capped at the number of labels, with a notice when it is."""
    k = params.evaluate.top_k
    if k > num_classes:
        notice(f"evaluate.top_k={k} is more than the {num_classes} labels; ranking all of them")
    return min(k, num_classes)


def _evaluate(params: Params, layout: Layout, registry: Registry, experiment: str) -> dict:
    if trains_itself(params, experiment, registry):
        return _evaluate_learner(params, layout, registry, experiment)
    device = resolve_device(params.base.device)
    encoder, layer, loss, ctx, info, meta = restore(params, layout, registry, experiment, device)
    counts = np.asarray(meta["train_counts"])
    features = feature_dir(params, layout, experiment)
    test = read_features(features / "test.parquet")
    x_test, y_test = test.x, test.labels
    assert x_test is not None and y_test is not None  # read with every column
    multilabel = isinstance(y_test, LabelSets)
    single = None if isinstance(y_test, LabelSets) else y_test  # (N,) ids; None: multi-label
    adjusted, raw = predict(
        encoder,
        layer,
        loss,
        ctx,
        x_test,
        single,
        k=_top_k(params, meta["num_classes"]),
        batch_size=params.evaluate.batch_size,
        label_chunk=params.evaluate.label_chunk,
    )

    def scored(preds: Predictions) -> _Scored:
        ll = None if multilabel else preds.log_likelihood.cpu().numpy()
        return _Scored(preds.topk.cpu().numpy(), ll, _confidence(preds, loss))

    margins, intra = None, None
    if single is not None:  # not multilabel
        labels = single.numpy()
        margins, cdfs = margin_summary(adjusted.margins(single).cpu().numpy(), labels, counts)
        picked = pick_rows(labels, params.evaluate.diameter_rows, seed=params.base.seed)
        z = embed(encoder, x_test[torch.from_numpy(picked)], device)
        intra = diameter_summary(class_diameters(z, labels[picked], len(counts)), counts)
        _write_margin_cdfs(layout.eval_plots(experiment), cdfs)
    return _write_metrics(
        layout,
        experiment,
        features,
        meta,
        test,
        scored(adjusted),
        None if raw is None else scored(raw),
        {"steps": info["steps"]},
        info["plugins"],
        margins,
        intra,
    )


def _evaluate_learner(params: Params, layout: Layout, registry: Registry, experiment: str):
    """Score a model that trains itself from its top-k alone: it has no score for labels
    outside them, so no log-likelihood, margin or embedding (those entries are None)."""
    features = feature_dir(params, layout, experiment)
    meta = read_meta(features)
    model = build_model(params, experiment, registry, meta["dim"], meta.get("kind", "dense"))
    info = load_learner(layout.model(experiment), f"train@{experiment}", model)
    test = read_features(features / "test.parquet")
    ranked, scores = model.predict_topk(test.x, _top_k(params, meta["num_classes"]))
    confidence = scores[:, 0].astype(np.float64) if model.scores_are_probabilities else None
    if not isinstance(test.labels, LabelSets):
        _write_margin_cdfs(layout.eval_plots(experiment), {})
    return _write_metrics(
        layout,
        experiment,
        features,
        meta,
        test,
        _Scored(ranked, None, confidence),
        None,
        {"steps": None, "deterministic": info["deterministic"]},
        info["plugins"],
        None,
        None,
    )


def _write_metrics(
    layout: Layout,
    experiment: str,
    features: Path,
    meta: dict[str, Any],
    test: FeatureTable,
    adjusted: _Scored,
    raw: _Scored | None,
    train: dict[str, Any],
    plugins: dict[str, str],
    margins: dict[str, Any] | None,
    intra: dict[str, Any] | None,
) -> dict[str, Any]:
    """``metrics/<experiment>.json`` and the per-class table, for either kind of model and
    either kind of label."""
    counts = np.asarray(meta["train_counts"])
    labels = test.labels
    if isinstance(labels, LabelSets):
        ranking = _ranking(adjusted.ranked, labels, counts, meta)
        test_metrics = _multilabel_metrics(
            adjusted.ranked, labels, counts, ranking, adjusted.confidence
        )
        metrics: dict[str, Any] = {
            "test": test_metrics,
            "ranking": ranking,
            "train": train,
            "plugins": plugins,
        }
        if raw is not None:
            raw_ranking = _ranking(raw.ranked, labels, counts, meta)
            metrics["uncorrected"] = _multilabel_metrics(
                raw.ranked, labels, counts, raw_ranking, raw.confidence
            )
    else:
        assert labels is not None  # read with every column
        y = labels.numpy()
        metrics = {
            "test": _metrics(
                adjusted.ranked, y, counts, adjusted.log_likelihood, adjusted.confidence
            ),
            "ranking": _ranking(adjusted.ranked, y, counts, meta),
            "train": train,
            "margins": margins,
            "intra_class_distance": intra,
            "plugins": plugins,
        }
        if raw is not None:
            metrics["uncorrected"] = _metrics(
                raw.ranked, y, counts, raw.log_likelihood, raw.confidence
            )
    _write_per_class(layout, experiment, features, meta, test, adjusted.ranked)
    write_metrics(layout.metrics_detail(experiment), metrics)
    write_metrics(layout.metrics(experiment), headline(null_non_finite(metrics)))
    return metrics


def _write_per_class(
    layout: Layout,
    experiment: str,
    features: Path,
    meta: dict[str, Any],
    test: FeatureTable,
    ranked: np.ndarray,
) -> None:
    """``per_class.parquet`` and its binned plot file (module docstring)."""
    counts = np.asarray(meta["train_counts"])
    y_test, row_ids = test.labels, test.row_ids
    assert y_test is not None and row_ids is not None  # read with every column
    multilabel = isinstance(y_test, LabelSets)
    labels = y_test if isinstance(y_test, LabelSets) else y_test.numpy()
    truth = _truth(labels)
    # p_l = 1/q_l, for multi-label data only (single-label tables have no propensity column)
    propensity = 1.0 / _inverse_propensity(labels, counts, meta) if multilabel else None
    k = ranked.shape[1]
    frame = per_class_frame(
        read_labels(features), per_label_results(ranked, truth, len(counts)), k, propensity
    )
    key = data_key(counts, row_ids.numpy(), truth)
    write_per_class(layout.per_class(experiment), frame, experiment, k, key, multilabel)
    write_class_plot(
        layout.class_plot(experiment), frame, f"recall@{k}" if multilabel else "recall@1"
    )
