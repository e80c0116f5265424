"""Stage ``evaluate@<experiment>``: score the test split and write ``metrics/<experiment>.json``.

Scores are computed in label chunks with the loss's prediction-time adjustment applied (see
:mod:`tailkit.evaluation.predict`); when the loss has one, the unadjusted metrics are reported
as well, under ``uncorrected``, as the Bamler–Mandt reference logs both.

Beyond accuracy, what the long-tail papers analyse: the calibration error (ECE) of the loss's
own calibrated-probability map (``Loss.confidence``: softmax, σ(s), σ(2s)); the logit margins
γ(x, y) = f_y(x) − max_{y'≠y} f_{y'}(x) per many/medium/few group, with their empirical CDFs in
``plots/eval/<experiment>/margins-<group>.tsv``; and the maximum intra-class distance of the
embeddings Φ(x) per class, normalised by the largest embedding norm (ELM figure 4), summarised
per group over at most ``evaluate.diameter_rows`` test rows of each class; the test accuracy of
every class against its training count in ``plots/classes/<experiment>.tsv``. Under ``ranking``,
the Extreme Classification Repository's metrics of the top-5 ranking (P@k, nDCG@k, PSP@k,
PSnDCG@k, R@k, coverage@k for k = 1, 3, 5; for single-label rows P@1 = R@1 = accuracy).

Multi-label test rows (the XC datasets) have no single true label, so there is no accuracy,
log-likelihood, margin or class diameter; ``test`` holds instead P@k and PSP@k (k = 1, 3, 5),
the macro-averaged per-label recall of the top-k ranking (k = ``evaluate.top_k``; the
multi-label counterpart of balanced accuracy: with one label per row, recall@1 of a class is
its accuracy) over all labels and per many/medium/few group (groups by the rows carrying the
label in training), and the ECE of the top-1 prediction being one of the row's labels. The
per-class file's ``accuracy`` column is then that label's recall@k. Propensities use the number
of training rows as N.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tailkit.artifacts import load_model, load_sampler
from tailkit.atomic import atomic_dir, atomic_path, write_json
from tailkit.cache import read_features
from tailkit.components import Loss, PredictionContext
from tailkit.evaluation.embeddings import class_diameters, diameter_summary, embed, pick_rows
from tailkit.evaluation.metrics import (
    CDF_POINTS,
    classification_metrics,
    expected_calibration_error,
    inverse_propensity,
    label_recall,
    margin_summary,
    per_class_recall,
    propensity_constants,
    ranking_metrics,
    shot_groups,
)
from tailkit.evaluation.predict import Predictions, predict
from tailkit.experiment import build_model, build_objective
from tailkit.labels import LabelSets
from tailkit.params import Params
from tailkit.paths import Layout
from tailkit.registry import Registry
from tailkit.runtime import resolve_device
from tailkit.splits import read_meta
from tailkit.training.loop import log_prior_from_counts
from tailkit.training.output_layer import OutputLayer


def _metrics(
    preds: Predictions, labels: np.ndarray, counts: np.ndarray, loss: Loss
) -> dict[str, Any]:
    out = classification_metrics(
        labels, preds.topk.cpu().numpy(), preds.log_likelihood.cpu().numpy(), counts
    )
    confidence = loss.confidence(preds.top_scores[:, 0], preds.log_partition)
    correct = preds.topk[:, 0].cpu().numpy() == labels
    out["ece"] = (
        None
        if confidence is None
        else expected_calibration_error(confidence.double().cpu().numpy(), correct)
    )
    return out


def _ranking(
    preds: Predictions, labels: np.ndarray | LabelSets, counts: np.ndarray, meta: dict[str, Any]
):
    """The XC repository's P@k, nDCG@k, PSP@k, PSnDCG@k, R@k, coverage@k (k = 1, 3, 5) of the
    top-5 ranking; propensities from the training counts with the dataset's (A, B)."""
    a, b = propensity_constants(meta["dataset"]["name"])
    if isinstance(labels, LabelSets):
        csr, num_train = labels.csr_pair(), int(meta["train_rows"])
    else:
        csr, num_train = (np.arange(labels.shape[0] + 1), labels), int(counts.sum())
    q = inverse_propensity(counts, num_train, a, b)
    ranked = preds.topk.cpu().numpy()
    ks = tuple(k for k in (1, 3, 5) if k <= ranked.shape[1])  # fewer than 5 classes: fewer k
    return ranking_metrics(ranked, csr, len(counts), ks, q)


def _multilabel_metrics(
    preds: Predictions, labels: LabelSets, counts: np.ndarray, ranking: dict[str, float], loss
) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """The ``test`` block of multi-label rows (module docstring), and the per-label recall@k
    and test rows it was built from."""
    ranked = preds.topk.cpu().numpy()
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
    confidence = loss.confidence(preds.top_scores[:, 0], preds.log_partition)
    top1 = torch.from_numpy(ranked[:, :1])
    correct = labels.contains(torch.arange(len(labels)), top1).squeeze(1).numpy()
    out["ece"] = (
        None
        if confidence is None
        else expected_calibration_error(confidence.double().cpu().numpy(), correct)
    )
    return out, recall, support


def _write_margin_cdfs(directory: Path, cdfs: dict[str, np.ndarray]) -> None:
    with atomic_dir(directory) as tmp:
        for group, values in cdfs.items():
            rows = "".join(f"{v:.6g}\t{q:.2f}\n" for v, q in zip(values, CDF_POINTS, strict=True))
            (tmp / f"margins-{group}.tsv").write_text("margin\tcdf\n" + rows)


def _write_class_accuracy(path: Path, recall: np.ndarray, support: np.ndarray, counts: np.ndarray):
    """Test accuracy of every class that has test rows, beside its training count: the data of
    the accuracy-against-frequency plot, which shows where in the tail a method gains or loses."""
    present = np.flatnonzero(support > 0)
    rows = "".join(f"{c}\t{counts[c]}\t{support[c]}\t{recall[c]:.4f}\n" for c in present.tolist())
    with atomic_path(path) as tmp:
        tmp.write_text("class\ttrain_count\ttest_count\taccuracy\n" + rows)


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
    meta = read_meta(layout.features)
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


def _evaluate(params: Params, layout: Layout, registry: Registry, experiment: str) -> dict:
    device = resolve_device(params.base.device)
    encoder, layer, loss, ctx, info, meta = restore(params, layout, registry, experiment, device)
    counts = np.asarray(meta["train_counts"])
    test = read_features(layout.features / "test.parquet")
    multilabel = isinstance(test.labels, LabelSets)
    adjusted, raw = predict(
        encoder,
        layer,
        loss,
        ctx,
        test.x,
        None if multilabel else test.labels,
        k=params.evaluate.top_k,
        batch_size=params.evaluate.batch_size,
        label_chunk=params.evaluate.label_chunk,
    )
    if multilabel:
        ranking = _ranking(adjusted, test.labels, counts, meta)
        test_metrics, recall, support = _multilabel_metrics(
            adjusted, test.labels, counts, ranking, loss
        )
        metrics = {
            "test": test_metrics,
            "ranking": ranking,
            "train": {"steps": info["steps"]},
            "plugins": info["plugins"],
        }
        if raw is not None:
            metrics["uncorrected"] = _multilabel_metrics(
                raw, test.labels, counts, _ranking(raw, test.labels, counts, meta), loss
            )[0]
        _write_class_accuracy(layout.class_plot(experiment), recall, support, counts)
        write_json(layout.metrics(experiment), metrics)
        return metrics
    labels = test.labels.numpy()
    margins, cdfs = margin_summary(adjusted.margins(test.labels).cpu().numpy(), labels, counts)
    picked = pick_rows(labels, params.evaluate.diameter_rows, seed=params.base.seed)
    z = embed(encoder, test.x[torch.from_numpy(picked)], device)
    diameters = class_diameters(z, labels[picked], len(counts))
    metrics: dict[str, Any] = {
        "test": _metrics(adjusted, labels, counts, loss),
        "ranking": _ranking(adjusted, labels, counts, meta),
        "train": {"steps": info["steps"]},
        "margins": margins,
        "intra_class_distance": diameter_summary(diameters, counts),
        "plugins": info["plugins"],
    }
    if raw is not None:
        metrics["uncorrected"] = _metrics(raw, labels, counts, loss)
    _write_margin_cdfs(layout.eval_plots(experiment), cdfs)
    recall, support = per_class_recall(labels, adjusted.topk[:, 0].cpu().numpy(), len(counts))
    _write_class_accuracy(layout.class_plot(experiment), recall, support, counts)
    write_json(layout.metrics(experiment), metrics)
    return metrics
