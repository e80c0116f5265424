"""Evaluation metrics: single-label accuracy with the many/medium/few-shot split, calibration,
margins, and the Extreme Classification Repository's ranking metrics.

Groups follow the classifier-balancing convention (datasets-metrics.md §3.4): by *training*
count, many > 100, medium 20–100, few < 20 by default (``evaluate.groups``,
:class:`GroupThresholds`). A group's accuracy is the mean of its classes'
recalls (class-balanced), over the classes that occur in the evaluated split; a group with no
such class is reported as null. Balanced accuracy is the mean per-class recall over the
classes present (scikit-learn's ``balanced_accuracy_score``).

The ranking metrics (:func:`ranking_metrics`: P@k, nDCG@k, PSP@k, PSnDCG@k, R@k, coverage@k)
follow pyxclib's definitions (datasets-metrics.md §2), and RP@k LibMultiLabel's (R-precision:
the hits in the top k over min(k, |y|)): every test row counts, a row without true
labels contributes 0, PSP and PSnDCG are ratios of dataset averages against the best ranking by
inverse propensity, and rankings break score ties by the lower label id (:func:`topk_labels`),
as PECOS and the Matlab scripts do. They serve single-label rows (one true label) and
multi-label rows alike.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tailkit.groups import DEFAULT_GROUPS, GroupThresholds


def shot_groups(
    train_counts: np.ndarray, groups: GroupThresholds = DEFAULT_GROUPS
) -> dict[str, np.ndarray]:
    """Boolean masks over classes: many (> 100), medium (20–100), few (< 20) training rows, or
    the ``groups`` given."""
    return {
        "many": train_counts > groups.many_above,
        "medium": (train_counts >= groups.few_below) & (train_counts <= groups.many_above),
        "few": train_counts < groups.few_below,
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
    log_likelihood: np.ndarray | None,
    train_counts: np.ndarray,
    groups: GroupThresholds = DEFAULT_GROUPS,
) -> dict[str, Any]:
    """Accuracy (top-1, top-5), balanced accuracy, many/medium/few, log-likelihood (None for
    a model that scores only its top labels, as the wrapped tools do)."""
    num_classes = train_counts.shape[0]
    top1 = topk[:, 0]
    recall, support = per_class_recall(labels, top1, num_classes)
    present = support > 0
    out: dict[str, Any] = {
        "rows": int(labels.shape[0]),
        "accuracy": float((top1 == labels).mean()),
        "top5_accuracy": float((topk[:, :5] == labels[:, None]).any(axis=1).mean()),
        "balanced_accuracy": float(recall[present].mean()),
        "log_likelihood": None if log_likelihood is None else float(log_likelihood.mean()),
    }
    for group, mask in shot_groups(train_counts, groups).items():
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
    margins: np.ndarray,
    labels: np.ndarray,
    train_counts: np.ndarray,
    groups: GroupThresholds = DEFAULT_GROUPS,
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Per group (many/medium/few by training count): median, mean and the fraction of rows
    with a negative margin (misclassified), and the margin at each of :data:`CDF_POINTS`.

    Groups are per *row* here, by the row's true label (ELM's figure 3 pools the rows of each
    group). A group with no evaluated row gets None and no CDF.
    """
    summary: dict[str, Any] = {}
    cdfs: dict[str, np.ndarray] = {}
    for group, mask in shot_groups(train_counts, groups).items():
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


# --- Extreme Classification Repository ranking metrics -------------------------------------


def inverse_propensity(
    train_counts: np.ndarray, num_train: int, a: float = 0.55, b: float = 1.5
) -> np.ndarray:
    """q_l = 1/p_l = 1 + C·(N_l + B)^(−A), C = (ln N − 1)·(B + 1)^A (Jain, Prabhu, Varma 2016).

    ``train_counts`` are the training frequencies N_l, ``num_train`` the number of training
    points N (not the sum of the counts, for multi-label data). A label seen once gets ln N.
    """
    if num_train < 1:
        raise ValueError(f"inverse_propensity: num_train must be >= 1, got {num_train}")
    counts = np.asarray(train_counts, dtype=np.float64)
    c = (np.log(num_train) - 1.0) * (b + 1.0) ** a
    return 1.0 + c * (counts + b) ** (-a)


def split_inverse_propensity(
    train_counts: np.ndarray, meta: dict[str, Any], single_label: bool
) -> np.ndarray:
    """:func:`inverse_propensity` of a split, with the dataset's (A, B) as subsample recorded
    them in its meta.json (Jain et al.'s defaults where it recorded none); N is the training
    rows, their label count for one label per row."""
    counts = np.asarray(train_counts)
    num_train = int(counts.sum()) if single_label else int(meta["train_rows"])
    if "propensity" in meta:
        a, b = meta["propensity"]
        return inverse_propensity(counts, num_train, a, b)
    return inverse_propensity(counts, num_train)


def topk_labels(scores: np.ndarray, k: int) -> np.ndarray:
    """The k best label ids per row (N, k) of dense ``scores`` (N, L), ranked by (−score, id)."""
    order = np.argsort(-np.asarray(scores), axis=1, kind="stable")
    return order[:, : min(k, order.shape[1])]


def _csr_truth(true_labels, num_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """(indptr, indices) of the true label sets: from a list of id lists or a CSR pair."""
    if isinstance(true_labels, tuple):
        indptr, indices = (np.asarray(t, dtype=np.int64) for t in true_labels)
    else:
        sets = [np.unique(np.asarray(row, dtype=np.int64)) for row in true_labels]
        indptr = np.zeros(len(sets) + 1, dtype=np.int64)
        indptr[1:] = np.cumsum([len(row) for row in sets])
        indices = np.concatenate(sets) if sets else np.zeros(0, dtype=np.int64)
    if indptr.shape[0] != num_rows + 1:
        raise ValueError(
            f"ranking_metrics: {indptr.shape[0] - 1} rows of true labels for {num_rows} rankings"
        )
    return indptr, indices


def label_recall(ranked: np.ndarray, true_labels, num_labels: int) -> tuple[np.ndarray, np.ndarray]:
    """Per label: the share of the rows carrying it whose ranked labels (N, k) include it (NaN
    where no row carries it), and the number of those rows — the multi-label counterpart of
    :func:`per_class_recall` (the same for one label per row and k = 1). ``true_labels`` as in
    :func:`ranking_metrics`."""
    indptr, indices = _csr_truth(true_labels, ranked.shape[0])
    rows = np.repeat(np.arange(ranked.shape[0]), np.diff(indptr))
    found = (ranked[rows] == indices[:, None]).any(axis=1)
    support = np.bincount(indices, minlength=num_labels)
    hits = np.bincount(indices[found], minlength=num_labels)
    with np.errstate(invalid="ignore", divide="ignore"):
        return hits / support, support


def ranked_hits(ranked: np.ndarray, true_labels, num_labels: int) -> np.ndarray:
    """(N, K) booleans: whether each ranked label is one of its row's true labels (-1 padding
    never is). ``true_labels`` as in :func:`ranking_metrics`."""
    ranked = np.asarray(ranked, dtype=np.int64)
    n = ranked.shape[0]
    indptr, indices = _csr_truth(true_labels, n)
    rows = np.repeat(np.arange(n), np.diff(indptr))
    # Membership of (row, label) pairs through one sorted key array: no N × L matrix.
    true_keys = np.sort(rows * num_labels + indices)
    if not len(true_keys):
        return np.zeros(ranked.shape, dtype=bool)
    keys = np.arange(n)[:, None] * num_labels + ranked
    pos = np.searchsorted(true_keys, keys).clip(max=len(true_keys) - 1)
    return (ranked >= 0) & (true_keys[pos] == keys)


def propensity_gains(
    ranked: np.ndarray,
    hits: np.ndarray,
    truth: tuple[np.ndarray, np.ndarray],
    inv_propensity: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(gains, best), both (N, K): q of each ranked label that is a hit (0 otherwise), and q of
    the best achievable ranking, each row's true labels by decreasing q (PSP@k and PSnDCG@k
    divide by it). ``truth`` is the CSR pair (indptr, indices)."""
    indptr, indices = truth
    n, width = ranked.shape
    sizes = np.diff(indptr)
    rows = np.repeat(np.arange(n), sizes)
    q = np.asarray(inv_propensity, dtype=np.float64)
    gains = np.where(hits, q[ranked.clip(min=0)], 0.0)
    order = np.lexsort((-q[indices], rows))
    best = q[indices][order]
    rank_in_row = np.arange(len(indices)) - np.repeat(indptr[:-1], sizes)
    best_top = np.zeros((n, width))
    keep = rank_in_row < width
    best_top[rows[order][keep], rank_in_row[keep]] = best[keep]
    return gains, best_top


def ranking_metrics(
    ranked: np.ndarray,
    true_labels,
    num_labels: int,
    ks: tuple[int, ...] = (1, 3, 5),
    inv_propensity: np.ndarray | None = None,
) -> dict[str, float]:
    """P@k, nDCG@k, R@k, RP@k, coverage@k and, given ``inv_propensity`` q (L,), PSP@k and
    PSnDCG@k.

    ``ranked`` (N, K) holds each row's predicted label ids best first (−1 pads a row with fewer
    than K predictions; padding is a miss). ``true_labels`` is a list of N id lists, or a CSR
    pair (indptr, indices). Keys are e.g. ``"P@1"``, ``"PSnDCG@5"``.
    """
    ranked = np.asarray(ranked, dtype=np.int64)
    n, width = ranked.shape
    if max(ks) > width:
        raise ValueError(f"ranking_metrics: k = {max(ks)} needs {max(ks)} ranked labels per row")
    indptr, indices = _csr_truth(true_labels, n)
    sizes = np.diff(indptr)
    hits = ranked_hits(ranked, (indptr, indices), num_labels)
    discount = 1.0 / np.log2(np.arange(2, width + 2))
    ideal = np.cumsum(discount)  # ideal[j] = Σ_{i ≤ j} 1/log2(i + 2)
    true_sets = set(indices.tolist())
    out: dict[str, float] = {}
    if inv_propensity is not None:
        gains, best_top = propensity_gains(ranked, hits, (indptr, indices), inv_propensity)
    for k in ks:
        found = hits[:, :k].sum(axis=1)
        norm = ideal[np.clip(np.minimum(k, sizes) - 1, 0, None)]  # rows without labels: dcg 0
        dcg = (hits[:, :k] * discount[:k]).sum(axis=1)
        out[f"P@{k}"] = float(found.mean() / k)
        out[f"nDCG@{k}"] = float((dcg / norm).mean())
        out[f"R@{k}"] = float((found / np.maximum(sizes, 1)).mean())
        # R-precision (LibMultiLabel's RP@k): a row with fewer than k labels can reach 1
        out[f"RP@{k}"] = float((found / np.maximum(np.minimum(sizes, k), 1)).mean())
        covered = {int(v) for v in ranked[:, :k][hits[:, :k]]}
        out[f"coverage@{k}"] = len(covered) / len(true_sets) if true_sets else 0.0
        if inv_propensity is not None:
            out[f"PSP@{k}"] = float(gains[:, :k].sum() / best_top[:, :k].sum())
            ps_dcg = (gains[:, :k] * discount[:k]).sum(axis=1) / norm
            ideal_dcg = (best_top[:, :k] * discount[:k]).sum(axis=1) / norm
            out[f"PSnDCG@{k}"] = float(ps_dcg.mean() / ideal_dcg.mean())
    return out
