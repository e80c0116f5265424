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

from tailkit.atomic import write_json

NULL_REASON = "_null_reason"


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


def write_metrics(path: str | Path, data: Any) -> None:
    """Atomically write a metrics file (pretty, key-sorted JSON), non-finite numbers as null."""
    write_json(path, null_non_finite(data))
