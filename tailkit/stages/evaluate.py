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
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tailkit.atomic import atomic_dir, atomic_path, write_json
from tailkit.cache import read_features
from tailkit.components import Loss, PredictionContext
from tailkit.evaluation.embeddings import class_diameters, diameter_summary, embed, pick_rows
from tailkit.evaluation.metrics import (
    CDF_POINTS,
    DEFAULT_PROPENSITY,
    PROPENSITY_CONSTANTS,
    classification_metrics,
    expected_calibration_error,
    inverse_propensity,
    margin_summary,
    per_class_recall,
    ranking_metrics,
)
from tailkit.evaluation.predict import Predictions, predict
from tailkit.params import Params
from tailkit.paths import Layout, require
from tailkit.registry import Registry
from tailkit.runtime import resolve_device
from tailkit.stages.fit_sampler import load_sampler
from tailkit.stages.subsample import read_meta
from tailkit.stages.train import build_model, build_objective
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


def _ranking(preds: Predictions, labels: np.ndarray, counts: np.ndarray, dataset: str):
    """The XC repository's P@k, nDCG@k, PSP@k, PSnDCG@k, R@k, coverage@k (k = 1, 3, 5) of the
    top-5 ranking; propensities from the training counts with the dataset's (A, B)."""
    a, b = PROPENSITY_CONSTANTS.get(dataset, DEFAULT_PROPENSITY)
    q = inverse_propensity(counts, int(counts.sum()), a, b)
    csr = (np.arange(labels.shape[0] + 1), labels)
    ranked = preds.topk.cpu().numpy()
    ks = tuple(k for k in (1, 3, 5) if k <= ranked.shape[1])  # fewer than 5 classes: fewer k
    return ranking_metrics(ranked, csr, len(counts), ks, q)


def _write_margin_cdfs(directory: Path, cdfs: dict[str, np.ndarray]) -> None:
    with atomic_dir(directory) as tmp:
        for group, values in cdfs.items():
            rows = "".join(f"{v:.6g}\t{q:.2f}\n" for v, q in zip(values, CDF_POINTS, strict=True))
            (tmp / f"margins-{group}.tsv").write_text("margin\tcdf\n" + rows)


def _write_class_accuracy(path: Path, labels: np.ndarray, top1: np.ndarray, counts: np.ndarray):
    """Test accuracy of every class that has test rows, beside its training count: the data of
    the accuracy-against-frequency plot, which shows where in the tail a method gains or loses."""
    recall, support = per_class_recall(labels, top1, len(counts))
    present = np.flatnonzero(support > 0)
    rows = "".join(f"{c}\t{counts[c]}\t{support[c]}\t{recall[c]:.4f}\n" for c in present.tolist())
    with atomic_path(path) as tmp:
        tmp.write_text("class\ttrain_count\ttest_count\taccuracy\n" + rows)


def run(params: Params, layout: Layout, registry: Registry, experiment: str) -> dict[str, Any]:
    device = resolve_device(params.base.device)
    loss, _ = build_objective(params, experiment, registry)
    meta = read_meta(layout.features)
    model_dir = layout.model(experiment)
    model_path = require(model_dir / "model.pt", f"train@{experiment}")
    state = torch.load(model_path, map_location=device, weights_only=False)
    encoder = build_model(params, experiment, registry, state["in_dim"])
    encoder.load_state_dict(state["encoder"])
    encoder, loss = encoder.to(device), loss.to(device)
    counts = np.asarray(meta["train_counts"])
    loss.setup(torch.as_tensor(counts, dtype=torch.float64, device=device))
    loss.load_state_dict(state["loss"])
    layer = OutputLayer.for_loss(loss, state["num_classes"], encoder.out_dim, device=device)
    layer.load_state_dict(state["layer"])
    sampler = load_sampler(registry, params, state["settings"]["sampler"], layout, device)
    ctx = PredictionContext(log_prior=log_prior_from_counts(counts).to(device), sampler=sampler)

    test = read_features(layout.features / "test.parquet")
    adjusted, raw = predict(
        encoder,
        layer,
        loss,
        ctx,
        test.x,
        test.labels,
        k=params.evaluate.top_k,
        batch_size=params.evaluate.batch_size,
        label_chunk=params.evaluate.label_chunk,
    )
    labels = test.labels.numpy()
    train_summary = json.loads((model_dir / "train.json").read_text())
    margins, cdfs = margin_summary(adjusted.margins(test.labels).cpu().numpy(), labels, counts)
    picked = pick_rows(labels, params.evaluate.diameter_rows, seed=params.base.seed)
    z = embed(encoder, test.x[torch.from_numpy(picked)], device)
    diameters = class_diameters(z, labels[picked], len(counts))
    metrics: dict[str, Any] = {
        "test": _metrics(adjusted, labels, counts, loss),
        "ranking": _ranking(adjusted, labels, counts, params.dataset["name"]),
        "train": {k: train_summary[k] for k in ("seconds", "steps", "examples_per_second")},
        "margins": margins,
        "intra_class_distance": diameter_summary(diameters, counts),
        "plugins": train_summary.get("plugins", {}),
    }
    if raw is not None:
        metrics["uncorrected"] = _metrics(raw, labels, counts, loss)
    _write_margin_cdfs(layout.eval_plots(experiment), cdfs)
    _write_class_accuracy(
        layout.class_plot(experiment), labels, adjusted.topk[:, 0].cpu().numpy(), counts
    )
    write_json(layout.metrics(experiment), metrics)
    return metrics
