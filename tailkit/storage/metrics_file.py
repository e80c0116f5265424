"""Metrics JSON that never fails on a number JSON cannot hold.

A mean log-likelihood is −∞ when the model or a proposal gives a true label probability 0, and
a metric over an empty group is NaN; JSON has neither. Such a value is written as ``null`` with
``<key>_null_reason`` beside it ("nan", "inf" or "-inf"), so the stage finishes, ``dvc metrics
diff`` shows the change, and a reader sees why the number is missing rather than a crash
(``json.dumps(allow_nan=False)``) or a file only Python can parse (``NaN``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from tailkit.storage.atomic import write_json

NULL_REASON = "_null_reason"

#: The metrics ``metrics/<experiment>.json`` keeps, per block: what a reader compares first
#: and what the report's comparison table shows (single-label accuracy, balanced accuracy,
#: groups, top-5 and ECE; multi-label P@k, PSP@k and macro recall), so that ``dvc exp show``
#: and ``dvc metrics diff`` stay a screen wide. Everything else (ranking tables, margins,
#: intra-class distances, row and class counts, provenance) is in ``metrics/detail/``.
HEADLINE: dict[str, tuple[str, ...]] = {
    "test": (
        "accuracy",
        "balanced_accuracy",
        "many",
        "medium",
        "few",
        "top5_accuracy",
        "ece",
        *(f"{m}@{k}" for m in ("P", "PSP") for k in (1, 3, 5)),
        "macro_recall@5",
        "macro_f1_tuned",
    ),
    "uncorrected": ("accuracy", "balanced_accuracy", "P@1", "PSP@1"),
}


def _reason(value: float) -> str:
    return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")


def null_non_finite(data: Any) -> Any:
    """``data`` with every non-finite float replaced by None; in a mapping, the reason goes to
    ``<key>_null_reason`` (in a list there is no place for it: the null alone)."""
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            if isinstance(value, float) and not math.isfinite(value):
                out[key] = None
                out[f"{key}{NULL_REASON}"] = _reason(value)
            else:
                out[key] = null_non_finite(value)
        return out
    if isinstance(data, list | tuple):
        return [
            None if isinstance(v, float) and not math.isfinite(v) else null_non_finite(v)
            for v in data
        ]
    return data


def headline(metrics: dict[str, Any]) -> dict[str, Any]:
    """The :data:`HEADLINE` keys of ``metrics``, nested as there (a ``null`` and its reason
    are kept together); blocks and keys the metrics lack are left out."""
    out: dict[str, Any] = {}
    for block, keys in HEADLINE.items():
        values = metrics.get(block)
        if not isinstance(values, dict):
            continue
        kept = {
            k: v
            for k, v in values.items()
            if k in keys or (k.endswith(NULL_REASON) and k.removesuffix(NULL_REASON) in keys)
        }
        if kept:
            out[block] = kept
    return out


def write_metrics(path: str | Path, data: Any) -> None:
    """Atomically write a metrics file (pretty, key-sorted JSON), non-finite numbers as null."""
    write_json(path, null_non_finite(data))
