"""What a featurizer is given and must give back, checked around its fit and transform: the
dataset's modality against the featurizer's ``accepts``, finite dense inputs (named by row,
split and column before anything is fitted), and a transform's output against its declared
``output`` kind (dense float32, sparse CSR, image uint8).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp

from tailkit.csr import canonical, check_rows
from tailkit.errors import DataValidationError, InvalidParameterError, PluginError
from tailkit.params import Params
from tailkit.registry import Registry, featurizer_accepts


def check_modality(
    featurizer: Any, params: Params, features: str, modality: str, registry: Registry
) -> None:
    """A one-line error when the featurizer does not take the dataset's modality, naming the
    featurizers that do."""
    taken = tuple(featurizer_accepts(featurizer))
    if modality in taken:
        return
    fits = [c.name for c in registry.components("featurizers") if modality in c.traits["accepts"]]
    raise InvalidParameterError(
        f"featurize.{features}.name: featurizer {params.featurize[features]['name']!r} accepts "
        f"{', '.join(taken)} inputs, but dataset {params.dataset['name']!r} is {modality}; "
        f"featurizers for {modality} data: {', '.join(fits) or '(none installed)'}"
    )


#: Rows per block of the finiteness scan: its boolean mask stays a few MiB at any width.
_SCAN_ROWS = 1 << 14


def first_non_finite(x: np.ndarray, rows: np.ndarray | None = None) -> tuple[int, int] | None:
    """(i, j) of the first NaN or ±inf in a dense (N, D) array (row-major order), or None;
    ``rows`` restricts the scan to those rows (i then indexes ``rows``). Scanned in row blocks
    so that no (N, D) mask is ever built."""
    count = x.shape[0] if rows is None else rows.shape[0]
    for lo in range(0, count, _SCAN_ROWS):
        block = x[lo : lo + _SCAN_ROWS] if rows is None else x[rows[lo : lo + _SCAN_ROWS]]
        bad = ~np.isfinite(block)
        if bad.any():
            i, j = np.argwhere(bad)[0]
            return lo + int(i), int(j)
    return None


def check_finite_inputs(raw_inputs: Any, splits: dict[str, Any], dataset: str) -> None:
    """Refuse dense raw inputs holding NaN or ±inf in a row a split uses, naming the dataset
    row and column, before a featurizer is fitted on them (a NaN would otherwise surface as a
    traceback in some later stage: ECE at evaluation, a PCA's SVD, a diverged loss)."""
    if not (isinstance(raw_inputs, np.ndarray) and raw_inputs.dtype.kind == "f"):
        return
    for split, (rows, _) in splits.items():
        found = first_non_finite(raw_inputs, np.asarray(rows))
        if found is not None:
            i, j = found
            row = int(rows[i])
            raise DataValidationError(
                f"dataset {dataset!r}: row {row} (in the {split} split) has "
                f"{raw_inputs[row, j]} in column {j}; features must be finite: drop or impute "
                "such rows in the dataset"
            )


def as_output(x: Any, output: str, name: str, where: str = "") -> Any:
    """``transform``'s result in the cache's form for ``output``, or a one-line PluginError
    when it is not what the featurizer declared or holds a NaN or ±inf (``where`` follows
    "output" in the message, e.g. " (train split)")."""
    if sp.issparse(x):
        if output == "sparse":
            matrix = canonical(sp.csr_matrix(x, dtype=np.float32))
            try:  # a NaN or an id past D would reach every later stage; name the row now
                check_rows(matrix.indptr, matrix.indices, matrix.data, matrix.shape[1], where)
            except ValueError as exc:
                raise PluginError(f"featurizer {name!r} output{exc}") from exc
            return matrix
    elif output == "dense":
        array = np.asarray(x)
        if array.ndim == 2 and array.dtype.kind in "biuf":
            with np.errstate(over="ignore"):  # a value past float32's range: inf, caught below
                array = np.ascontiguousarray(array, dtype=np.float32)
            found = first_non_finite(array)
            if found is not None:
                i, j = found
                raise PluginError(
                    f"featurizer {name!r} output{where}: row {i}: value {array[i, j]} in column {j}"
                )
            return array
    elif output == "image":
        image = isinstance(x, np.ndarray) and x.ndim == 4 and x.shape[-1] == 3
        if image and x.dtype == np.uint8:
            return np.ascontiguousarray(x)  # the very array when already contiguous
    got = f"a sparse matrix of shape {x.shape}" if sp.issparse(x) else None
    got = got or f"{getattr(x, 'dtype', type(x).__name__)} of shape {getattr(x, 'shape', None)}"
    expected = {
        "dense": "an (N, D) real array",
        "image": "an (N, H, W, 3) uint8 array",
        "sparse": "a sparse (N, D) matrix",
    }[output]
    raise PluginError(
        f"featurizer {name!r} declares output {output!r} ({expected}) but transform returned {got}"
    )
