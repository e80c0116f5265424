"""Single-label metrics: accuracy, balanced accuracy and the many/medium/few-shot split.

Groups follow the classifier-balancing convention (datasets-metrics.md §3.4): by *training*
count, many > 100, medium 20–100, few < 20. A group's accuracy is the mean of its classes'
recalls (class-balanced), over the classes that occur in the evaluated split; a group with no
such class is reported as null. Balanced accuracy is the mean per-class recall over the
classes present (scikit-learn's ``balanced_accuracy_score``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

MANY_ABOVE = 100
FEW_BELOW = 20


def shot_groups(train_counts: np.ndarray) -> dict[str, np.ndarray]:
    """Boolean masks over classes: many (> 100), medium (20–100), few (< 20) training rows."""
    return {
        "many": train_counts > MANY_ABOVE,
        "medium": (train_counts >= FEW_BELOW) & (train_counts <= MANY_ABOVE),
        "few": train_counts < FEW_BELOW,
    }


def per_class_recall(
    labels: np.ndarray, predicted: np.ndarray, num_classes: int
) -> tuple[np.ndarray, np.ndarray]:
    """Recall per class and the number of evaluated rows per class (recall NaN where 0)."""
    support = np.bincount(labels, minlength=num_classes)
    correct = np.bincount(labels[predicted == labels], minlength=num_classes)
    with np.errstate(invalid="ignore", divide="ignore"):
        recall = correct / support
    return recall, support


def _mean_or_none(values: np.ndarray) -> float | None:
    return float(values.mean()) if values.size else None


def classification_metrics(
    labels: np.ndarray,
    topk: np.ndarray,
    log_likelihood: np.ndarray,
    train_counts: np.ndarray,
) -> dict[str, Any]:
    """Accuracy (top-1, top-5), balanced accuracy, many/medium/few, log-likelihood."""
    num_classes = train_counts.shape[0]
    top1 = topk[:, 0]
    recall, support = per_class_recall(labels, top1, num_classes)
    present = support > 0
    out: dict[str, Any] = {
        "rows": int(labels.shape[0]),
        "accuracy": float((top1 == labels).mean()),
        "top5_accuracy": float((topk[:, :5] == labels[:, None]).any(axis=1).mean()),
        "balanced_accuracy": float(recall[present].mean()),
        "log_likelihood": float(log_likelihood.mean()),
    }
    for group, mask in shot_groups(train_counts).items():
        out[group] = _mean_or_none(recall[mask & present])
        out[f"{group}_classes"] = int((mask & present).sum())
    return out


def expected_calibration_error(
    confidence: np.ndarray, correct: np.ndarray, bins: int = 15
) -> float:
    """ECE of top-1 predictions: Σ_b (n_b / N)·|accuracy_b − mean confidence_b| over ``bins``
    equal-width confidence bins on [0, 1] (Guo et al. 2017; a confidence of exactly 0 falls
    in the first bin, 1 in the last)."""
    confidence = np.clip(np.asarray(confidence, dtype=np.float64), 0.0, 1.0)
    correct = np.asarray(correct, dtype=np.float64)
    if confidence.size == 0:
        raise ValueError("expected_calibration_error: no predictions")
    which = np.minimum((confidence * bins).astype(np.int64), bins - 1)
    conf_sum = np.bincount(which, weights=confidence, minlength=bins)
    acc_sum = np.bincount(which, weights=correct, minlength=bins)
    return float(np.abs(acc_sum - conf_sum).sum() / confidence.size)


#: Points of the empirical CDF written per group (margins at these cumulative fractions).
CDF_POINTS = np.linspace(0.0, 1.0, 101)


def margin_summary(
    margins: np.ndarray, labels: np.ndarray, train_counts: np.ndarray
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Per group (many/medium/few by training count): median, mean and the fraction of rows
    with a negative margin (misclassified), and the margin at each of :data:`CDF_POINTS`.

    Groups are per *row* here, by the row's true label (ELM's figure 3 pools the rows of each
    group). A group with no evaluated row gets None and no CDF.
    """
    summary: dict[str, Any] = {}
    cdfs: dict[str, np.ndarray] = {}
    for group, mask in shot_groups(train_counts).items():
        values = margins[mask[labels]]
        if values.size == 0:
            summary[group] = None
            continue
        summary[group] = {
            "median": float(np.median(values)),
            "mean": float(values.mean()),
            "negative_fraction": float((values < 0).mean()),
            "rows": int(values.size),
        }
        cdfs[group] = np.quantile(values, CDF_POINTS)
    return summary, cdfs
