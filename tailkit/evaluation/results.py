"""The numbers of a scored test split, as the evaluate stage writes them.

From each test row's top-k ranking (and, for a model that gives them, the log-likelihood of
the true label and the probability of the top one): the ``test`` block (single-label accuracy,
balanced accuracy, groups, top-5, log-likelihood and ECE; for multi-label rows P@k, PSP@k,
macro recall@k per group and ECE), the XC repository's ranking metrics under Jain et al.'s
propensities, the per-class table with its binned plot file, and the margin CDF files. The
stage module reads the params, predicts, and hands what it scored here.

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
PSnDCG@k, R@k, RP@k, coverage@k for k = 1, 3, 5; for single-label rows P@1 = R@1 =
accuracy). In ``test`` too, for models that give probabilities, Micro- and Macro-F1 of the
predictions whose probability clears ``evaluate.threshold``, and each at the threshold best on
the validation split (``*_f1_tuned``; the thresholds in ``f1_thresholds``,
:mod:`tailkit.evaluation.thresholds`).

Multi-label test rows (the XC datasets) have no single true label, so there is no accuracy,
log-likelihood, margin or class diameter; ``test`` holds instead P@k and PSP@k (k = 1, 3, 5),
the macro-averaged per-label recall of the top-k ranking (k = ``evaluate.top_k``; the
multi-label counterpart of balanced accuracy: with one label per row, recall@1 of a class is
its accuracy) over all labels and per many/medium/few group (groups by the rows carrying the
label in training), and the ECE of the top-1 prediction being one of the row's labels. The
per-class plot's ``accuracy`` column is then the labels' recall@k. Propensities use the number
of training rows as N.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tailkit.components import Loss
from tailkit.evaluation import intervals
from tailkit.evaluation.metrics import (
    CDF_POINTS,
    classification_metrics,
    expected_calibration_error,
    label_recall,
    ranking_metrics,
    shot_groups,
    split_inverse_propensity,
)
from tailkit.evaluation.outcomes import Outcomes, write_outcomes
from tailkit.evaluation.per_class import (
    data_key,
    per_class_frame,
    per_label_results,
    write_class_plot,
    write_per_class,
)
from tailkit.evaluation.predict import Predictions
from tailkit.evaluation.thresholds import Thresholded, f1_block
from tailkit.groups import GROUPS, GroupThresholds
from tailkit.labels import LabelSets
from tailkit.paths import Layout
from tailkit.storage.atomic import atomic_dir, atomic_path
from tailkit.storage.feature_cache import FeatureTable
from tailkit.storage.metrics_file import headline, null_non_finite, write_metrics
from tailkit.storage.splits import read_labels


@dataclass
class Scored:
    """What evaluation computes from, for one set of scores (adjusted or raw): each row's
    top-k ranking (N, k), the log-likelihood of its true label and the model's probability of
    each ranked label (N, k) (None where the model gives none)."""

    ranked: np.ndarray
    log_likelihood: np.ndarray | None
    probabilities: np.ndarray | None

    @property
    def confidence(self) -> np.ndarray | None:
        """The probability of each row's top label, for ECE."""
        return None if self.probabilities is None else self.probabilities[:, 0]


def _metrics(
    topk: np.ndarray,
    labels: np.ndarray,
    counts: np.ndarray,
    log_likelihood: np.ndarray | None,
    confidence: np.ndarray | None,
    groups: GroupThresholds,
) -> dict[str, Any]:
    out = classification_metrics(labels, topk, log_likelihood, counts, groups)
    out["ece"] = (
        None if confidence is None else expected_calibration_error(confidence, topk[:, 0] == labels)
    )
    return out


def probabilities_of(preds: Predictions, loss: Loss) -> np.ndarray | None:
    """The loss's calibrated probability of each row's ranked labels (N, k) (None: it has
    none), a column at a time as ``Loss.confidence`` takes them."""
    columns = [
        loss.confidence(preds.top_scores[:, j], preds.log_partition)
        for j in range(preds.top_scores.shape[1])
    ]
    present = [c for c in columns if c is not None]
    if len(present) < len(columns):
        return None
    return torch.stack(present, dim=1).double().cpu().numpy()


Labels = np.ndarray | torch.Tensor | LabelSets


def f1_of(
    test: Scored,
    test_labels: Labels,
    val: Scored | None,
    val_labels: Labels | None,
    num_labels: int,
    threshold: float,
) -> tuple[dict[str, float], dict[str, Any]] | None:
    """The test block's F1 entries and their thresholds (:func:`f1_block`): thresholding the
    top label of single-label rows, the whole top k of multi-label ones; None without
    probabilities."""
    if test.probabilities is None:
        return None
    width = test.ranked.shape[1] if isinstance(test_labels, LabelSets) else 1

    def split(scored: Scored, labels: Labels) -> Thresholded:
        assert scored.probabilities is not None
        if isinstance(labels, torch.Tensor):  # single-label ids as the cache reads them
            labels = labels.numpy()
        return Thresholded.of(
            scored.ranked[:, :width], scored.probabilities[:, :width], _truth(labels), num_labels
        )

    tuned = None
    if val is not None and val.probabilities is not None and val_labels is not None:
        tuned = split(val, val_labels)
    return f1_block(split(test, test_labels), tuned, threshold)


def _truth(labels: np.ndarray | LabelSets) -> tuple[np.ndarray, np.ndarray]:
    """Each test row's true labels as a CSR pair (indptr, indices)."""
    if isinstance(labels, LabelSets):
        return labels.csr_pair()
    return np.arange(labels.shape[0] + 1), labels


def _inverse_propensity(
    labels: np.ndarray | LabelSets, counts: np.ndarray, meta: dict[str, Any]
) -> np.ndarray:
    """q_l of the XC repository's propensity model (:func:`split_inverse_propensity`)."""
    return split_inverse_propensity(counts, meta, not isinstance(labels, LabelSets))


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
    groups: GroupThresholds,
) -> dict[str, Any]:
    """The ``test`` block of multi-label rows (module docstring)."""
    recall, support = label_recall(ranked, labels.csr_pair(), labels.num_classes)
    present = support > 0
    k = ranked.shape[1]
    out: dict[str, Any] = {"rows": len(labels)}
    out.update((key, ranking[key]) for key in ranking if key.split("@")[0] in ("P", "PSP"))
    out[f"macro_recall@{k}"] = float(recall[present].mean()) if present.any() else None
    for group, mask in shot_groups(counts, groups).items():
        chosen = recall[mask & present]
        out[group] = float(chosen.mean()) if chosen.size else None
        out[f"{group}_classes"] = int((mask & present).sum())
    top1 = torch.from_numpy(ranked[:, :1])
    correct = labels.contains(torch.arange(len(labels)), top1).squeeze(1).numpy()
    correct &= ranked[:, 0] >= 0
    out["ece"] = None if confidence is None else expected_calibration_error(confidence, correct)
    return out


def test_intervals(
    scored: Scored,
    labels: np.ndarray | LabelSets,
    counts: np.ndarray,
    meta: dict[str, Any],
    groups: GroupThresholds,
    f1: tuple[dict[str, float], dict[str, Any]] | None,
) -> dict[str, Any]:
    """The 95 % bootstrap interval of every scalar of the ``test`` and ``ranking`` blocks
    (:mod:`tailkit.evaluation.intervals`), as ``{"test": {...}, "ranking": {...}}`` of
    ``[low, high]`` with the method beside them."""
    truth = _truth(labels)
    chosen = intervals.metric_set(
        scored.ranked,
        scored.probabilities,
        scored.log_likelihood,
        truth,
        not isinstance(labels, LabelSets),
        counts,
        _inverse_propensity(labels, counts, meta),
        groups,
        None if f1 is None else f1[1],
    )
    found = intervals.Resampler(len(truth[0]) - 1).intervals(chosen)
    out: dict[str, Any] = {"test": {}, "ranking": {}}
    for name, interval in found.items():
        block, _, key = name.rpartition(".")
        out[block or "test"][key] = interval
    out["method"] = (
        f"percentile Poisson bootstrap over test rows: {intervals.RESAMPLES} resamples, "
        f"{intervals.LEVEL:.0%} level, seed {intervals.SEED}; means over labels through "
        "their linear expansion, each label's rows held"
    )
    return out


def write_margin_cdfs(directory: Path, cdfs: dict[str, np.ndarray]) -> None:
    """One ``margins-<group>.tsv`` per many/medium/few group, the header alone where the group
    has no margins (no test row, or a model that scores only its top k): git keeps no empty
    folder, so a fresh clone would lack a margin-less experiment's plot output and DVC would
    run its evaluate stage again."""
    with atomic_dir(directory) as tmp:
        for group in GROUPS:
            values = cdfs.get(group)
            pairs = () if values is None else zip(values, CDF_POINTS, strict=True)
            rows = "".join(f"{v:.6g}\t{q:.2f}\n" for v, q in pairs)
            (tmp / f"margins-{group}.tsv").write_text("margin\tcdf\n" + rows)


def write_results(
    layout: Layout,
    experiment: str,
    features: Path,
    meta: dict[str, Any],
    test: FeatureTable,
    adjusted: Scored,
    raw: Scored | None,
    train: dict[str, Any],
    plugins: dict[str, str],
    margins: dict[str, Any] | None,
    intra: dict[str, Any] | None,
    groups: GroupThresholds,
    f1: tuple[dict[str, float], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """``metrics/<experiment>.json`` and the per-class table, for either kind of model and
    either kind of label; ``groups`` split many/medium/few and are recorded beside them, and
    ``f1`` (:func:`f1_of`) joins the test block, its thresholds as ``f1_thresholds``."""
    counts = np.asarray(meta["train_counts"])
    labels = test.labels
    if isinstance(labels, LabelSets):
        ranking = _ranking(adjusted.ranked, labels, counts, meta)
        test_metrics = _multilabel_metrics(
            adjusted.ranked, labels, counts, ranking, adjusted.confidence, groups
        )
        metrics: dict[str, Any] = {
            "test": test_metrics,
            "groups": groups.as_dict(),
            "ranking": ranking,
            "train": train,
            "plugins": plugins,
        }
        if raw is not None:
            raw_ranking = _ranking(raw.ranked, labels, counts, meta)
            metrics["uncorrected"] = _multilabel_metrics(
                raw.ranked, labels, counts, raw_ranking, raw.confidence, groups
            )
    else:
        assert labels is not None  # read with every column
        y = labels.numpy()
        metrics = {
            "test": _metrics(
                adjusted.ranked, y, counts, adjusted.log_likelihood, adjusted.confidence, groups
            ),
            "groups": groups.as_dict(),
            "ranking": _ranking(adjusted.ranked, y, counts, meta),
            "train": train,
            "margins": margins,
            "intra_class_distance": intra,
            "plugins": plugins,
        }
        if raw is not None:
            metrics["uncorrected"] = _metrics(
                raw.ranked, y, counts, raw.log_likelihood, raw.confidence, groups
            )
    if f1 is not None:
        metrics["test"].update(f1[0])
        metrics["f1_thresholds"] = f1[1]
    assert labels is not None  # read with every column
    truth_of = labels if isinstance(labels, LabelSets) else labels.numpy()
    metrics["intervals"] = test_intervals(adjusted, truth_of, counts, meta, groups, f1)
    assert test.row_ids is not None  # read with every column
    # All or nothing: every file is written to its temporary first and the renames, which need
    # no space, come after the last write; a full disk or a kill midway leaves the previous
    # outputs whole, never a per-class table of one model beside the row outcomes of another.
    with ExitStack() as stack:
        folder = stack.enter_context(atomic_dir(layout.per_class(experiment).parent))
        plot, detail, shown = (
            stack.enter_context(atomic_path(p))
            for p in (
                layout.class_plot(experiment),
                layout.metrics_detail(experiment),
                layout.metrics(experiment),
            )
        )
        key = write_per_class_table(
            layout, experiment, features, meta, test, adjusted.ranked, groups,
            per_class=folder / layout.per_class(experiment).name, class_plot=plot,
        )  # fmt: skip
        outcomes = Outcomes(
            experiment=experiment,
            data_key=key,
            rows=test.row_ids.numpy(),
            truth=_truth(truth_of),
            single=not isinstance(labels, LabelSets),
            ranked=adjusted.ranked,
            log_likelihood=adjusted.log_likelihood,
            probabilities=adjusted.probabilities,
        )
        write_outcomes(folder / layout.outcomes(experiment).name, outcomes)
        write_metrics(detail, metrics)
        write_metrics(shown, headline(null_non_finite(metrics)))
    return metrics


def write_per_class_table(
    layout: Layout,
    experiment: str,
    features: Path,
    meta: dict[str, Any],
    test: FeatureTable,
    ranked: np.ndarray,
    groups: GroupThresholds,
    per_class: Path | None = None,
    class_plot: Path | None = None,
) -> str:
    """``per_class.parquet`` and its binned plot file (module docstring; at ``per_class`` and
    ``class_plot`` instead of the layout's paths where given); returns the data key of the rows
    it scored (:func:`tailkit.evaluation.per_class.data_key`)."""
    counts = np.asarray(meta["train_counts"])
    y_test, row_ids = test.labels, test.row_ids
    assert y_test is not None and row_ids is not None  # read with every column
    multilabel = isinstance(y_test, LabelSets)
    labels = y_test if isinstance(y_test, LabelSets) else y_test.numpy()
    truth = _truth(labels)
    # p_l = 1/q_l, for multi-label data only (single-label tables have no propensity column)
    propensity = 1.0 / _inverse_propensity(labels, counts, meta) if multilabel else None
    k = ranked.shape[1]
    results = per_label_results(ranked, truth, len(counts))
    frame = per_class_frame(read_labels(features), results, k, propensity, groups)
    key = data_key(counts, row_ids.numpy(), truth)
    table = per_class or layout.per_class(experiment)
    write_per_class(table, frame, experiment, k, key, multilabel, groups)
    write_class_plot(
        class_plot or layout.class_plot(experiment),
        frame,
        f"recall@{k}" if multilabel else "recall@1",
    )
    return key
