"""Recognising a featurizer's input kind, and the one-line error for the wrong one."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np
import scipy.sparse as sp

# Rows per chunk are chosen so one chunk's float64 temporary holds about this many values
# (32 MiB), whatever N is.
CHUNK_VALUES = 4 * 1024 * 1024


def describe(inputs: Any) -> str:
    """What a featurizer was handed, e.g. ``a float32 array of shape (40, 3)``."""
    if sp.issparse(inputs):
        return f"a sparse {inputs.format} matrix of {inputs.dtype} with shape {inputs.shape}"
    if isinstance(inputs, np.ndarray):
        kind = "an object" if inputs.dtype == object else f"a {inputs.dtype}"
        return f"{kind} array of shape {inputs.shape}"
    return f"a {type(inputs).__name__}"


def wrong_kind(featurizer: str, expected: str, inputs: Any) -> ValueError:
    return ValueError(f"featurizer {featurizer!r} accepts {expected}; got {describe(inputs)}")


def is_dense_2d(inputs: Any) -> bool:
    """A real-valued (N, D) array."""
    return (
        isinstance(inputs, np.ndarray)
        and inputs.ndim == 2
        and (np.issubdtype(inputs.dtype, np.floating) or np.issubdtype(inputs.dtype, np.integer))
    )


def is_pixel_array(inputs: Any) -> bool:
    """Decoded images: (N, H, W, 3) uint8, channels last."""
    return (
        isinstance(inputs, np.ndarray)
        and inputs.dtype == np.uint8
        and inputs.ndim == 4
        and inputs.shape[-1] == 3
    )


def is_path_array(inputs: Any) -> bool:
    """Image files: an (N,) object array of str or os.PathLike."""
    return (
        isinstance(inputs, np.ndarray)
        and inputs.dtype == object
        and inputs.ndim == 1
        and all(isinstance(p, str | os.PathLike) for p in inputs)
    )


def row_chunks(n: int, width: int) -> Iterator[slice]:
    """Consecutive row slices covering [0, n), each about CHUNK_VALUES / width rows."""
    step = max(1, CHUNK_VALUES // max(1, width))
    for start in range(0, n, step):
        yield slice(start, min(n, start + step))


def check_counts(values: np.ndarray, rows: np.ndarray, featurizer: str) -> None:
    """Refuse values that are not non-negative integer counts, naming the first such row and
    value: weighting weights again (the XC repository's files hold TF-IDF already) distorts
    them silently. ``rows`` gives each value's row (a CSR matrix's expanded indptr)."""
    bad = np.flatnonzero((values < 0) | (values != np.floor(values)))
    if bad.size:
        first = bad[0]
        raise ValueError(
            f"featurizer {featurizer!r} takes integer counts; row {int(rows[first])} holds "
            f"{float(values[first]):.6g}. Values already weighted (the Extreme Classification "
            "Repository's TF-IDF files) go through 'sparse-identity'; set counts: false to "
            "weight them anyway"
        )


def csr_rows(matrix: sp.csr_matrix) -> np.ndarray:
    """The row of each stored value of a CSR matrix."""
    return np.repeat(np.arange(matrix.shape[0]), np.diff(matrix.indptr))


def frequent_columns(df: np.ndarray, min_df: int, max_features: int | None) -> np.ndarray:
    """The sorted columns held by at least ``min_df`` training rows (``df`` per column) and,
    under ``max_features``, only that many of them, the most frequent: the vocabulary cut of
    TF-IDF. A stable sort on −df keeps the lower column among equal frequencies, so the cut is
    the same on every machine. May be empty (the caller names its featurizer)."""
    keep = np.flatnonzero(df >= min_df)
    if max_features is not None and keep.size > max_features:
        order = np.argsort(-df[keep], kind="stable")[:max_features]
        keep = np.sort(keep[order])
    return keep
