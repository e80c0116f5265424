"""Micro- and Macro-F1 of thresholded predictions, at a given threshold and at the threshold
that is best on the validation split.

A row's predicted labels are those of its ranking (the top 1 for single-label rows, the top k
for multi-label ones) whose calibrated probability (``Loss.confidence``: softmax, σ(s), σ(2s))
is at least the threshold; a row may predict nothing. Per label l, TP_l, FP_l and FN_l count
(row, label) pairs, FN including true labels outside the ranking. Then

* Micro-F1 = 2 ΣTP / (2 ΣTP + ΣFP + ΣFN), 0 when there is no true and no predicted pair;
* Macro-F1 = the mean over labels of 2 TP_l / (2 TP_l + FP_l + FN_l), over the labels that
  are true for some row or predicted for some row (a label in neither has F1 0/0). That is
  scikit-learn's ``f1_score(average="macro")`` on single-label rows, which averages over
  ``unique_labels(y_true, y_pred)``; on indicator matrices it averages over every column
  unless given these as ``labels=``, and XC test sets leave most labels out.

With every row predicting its top label (threshold 0, one label per row), Micro-F1 is the
accuracy. The tuned threshold is searched on :data:`GRID` (0, 0.01, …, 1) separately for each
F1, on the validation split, and the test split is then scored at it; ties between thresholds
go to the lowest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from tailkit.evaluation.metrics import ranked_hits

#: Thresholds the validation search tries.
GRID = np.round(np.linspace(0.0, 1.0, 101), 2)


@dataclass(frozen=True)
class Thresholded:
    """What F1 needs of one split: each row's ranking (N, k), their probabilities (N, k), which
    ranked labels are true (N, k), and the number of true (row, label) pairs per label (C,)."""

    ranked: np.ndarray
    probabilities: np.ndarray
    hits: np.ndarray
    support: np.ndarray

    @classmethod
    def of(
        cls,
        ranked: np.ndarray,
        probabilities: np.ndarray,
        truth: tuple[np.ndarray, np.ndarray],
        num_labels: int,
    ) -> Thresholded:
        """From a ranking, its probabilities and the true labels as a CSR pair (indptr,
        indices); -1 in ``ranked`` pads a row with fewer labels and is never predicted."""
        hits = ranked_hits(ranked, truth, num_labels)
        support = np.bincount(np.asarray(truth[1], dtype=np.int64), minlength=num_labels)
        return cls(ranked, np.asarray(probabilities, dtype=np.float64), hits, support)

    def counts(self, threshold: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """TP, FP and FN per label at ``threshold``."""
        predicted = (self.probabilities >= threshold) & (self.ranked >= 0)
        size = self.support.shape[0]
        tp = np.bincount(self.ranked[predicted & self.hits], minlength=size)
        fp = np.bincount(self.ranked[predicted & ~self.hits], minlength=size)
        return tp, fp, self.support - tp

    def f1(self, threshold: float) -> tuple[float, float]:
        """(Micro-F1, Macro-F1) at ``threshold`` (module docstring)."""
        tp, fp, fn = self.counts(threshold)
        denominator = 2 * tp + fp + fn
        total = int(denominator.sum())
        micro = 2 * int(tp.sum()) / total if total else 0.0
        present = denominator > 0  # true for some row or predicted for some row
        per_label = 2 * tp[present] / denominator[present]
        macro = float(per_label.mean()) if per_label.size else 0.0
        return micro, macro


def best_thresholds(val: Thresholded) -> tuple[float, float]:
    """The :data:`GRID` thresholds of the best validation Micro-F1 and Macro-F1 (the lowest
    of equals)."""
    curve = np.array([val.f1(float(t)) for t in GRID])
    return float(GRID[np.argmax(curve[:, 0])]), float(GRID[np.argmax(curve[:, 1])])


def f1_block(
    test: Thresholded, val: Thresholded | None, threshold: float
) -> tuple[dict[str, float], dict[str, Any]]:
    """The test block's F1 entries and the thresholds they were taken at: both F1s at
    ``threshold`` and, given the validation split, each at its own best validation threshold
    (``*_tuned``)."""
    micro, macro = test.f1(threshold)
    values = {"micro_f1": micro, "macro_f1": macro}
    used: dict[str, Any] = {"predicted": f"top-{test.ranked.shape[1]}", "threshold": threshold}
    if val is not None:
        micro_t, macro_t = best_thresholds(val)
        values.update(micro_f1_tuned=test.f1(micro_t)[0], macro_f1_tuned=test.f1(macro_t)[1])
        used.update(micro_tuned=micro_t, macro_tuned=macro_t)
    return values, used
