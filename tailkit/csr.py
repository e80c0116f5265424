"""CSR rows as scipy holds them: the canonical form and the checks every reader of sparse rows
applies (the feature cache, featurizer outputs, datasets). Apart from
:class:`~tailkit.sparse.SparseRows` and :class:`~tailkit.labels.LabelSets`, the torch
containers, so that the stages that deal rows and write features import no torch: a column id
outside ``[0, D)``, ids not strictly increasing within a row, or a non-finite value is a
one-line error naming the first bad row.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, TypeGuard

import numpy as np
import scipy.sparse as sp

if TYPE_CHECKING:
    from tailkit.labels import LabelSets


def is_label_sets(labels: Any) -> TypeGuard[LabelSets]:
    """Whether ``labels`` is a :class:`~tailkit.labels.LabelSets` (multi-label rows), asked
    without importing that module and torch with it: an instance exists only once it is."""
    module = sys.modules.get("tailkit.labels")
    return module is not None and isinstance(labels, module.LabelSets)


def canonical(matrix: sp.spmatrix | sp.sparray) -> sp.csr_matrix:
    """``matrix`` as CSR with each row's ids sorted and duplicates summed: the same buffers when
    it already is, else a copy (the caller's matrix is never modified)."""
    matrix = sp.csr_matrix(matrix)
    if not matrix.has_canonical_format:
        matrix = matrix.copy()
        matrix.sum_duplicates()
    return matrix


def check_rows(
    indptr: np.ndarray, indices: np.ndarray, values: np.ndarray, dim: int, where: str
) -> None:
    """Raise ``ValueError("<where>: row r: …")`` for the first row that breaks CSR's rules.

    The rules: ``indptr`` starts at 0 and never decreases; every id lies in ``[0, dim)``; ids
    strictly increase within a row (sorted, no duplicates), which is what lets the cache encode
    them as deltas and every reader trust them; values are finite. Vectorised: O(nnz).
    """
    indptr = np.asarray(indptr, dtype=np.int64)
    indices, values = np.asarray(indices), np.asarray(values)
    if indices.size != values.size:
        raise ValueError(f"{where}: {indices.size} column ids but {values.size} values")
    if indptr.size == 0 or indptr[0] != 0 or indptr[-1] != indices.size:
        raise ValueError(f"{where}: row pointer does not span the {indices.size} stored ids")
    shrinking = np.flatnonzero(np.diff(indptr) < 0)
    if shrinking.size:
        raise ValueError(f"{where}: row {shrinking[0]}: row pointer decreases")

    def row_of(position: int) -> int:
        return int(np.searchsorted(indptr, position, side="right") - 1)

    outside = np.flatnonzero((indices < 0) | (indices >= dim))
    if outside.size:
        p = outside[0]
        raise ValueError(f"{where}: row {row_of(p)}: column id {indices[p]} outside [0, {dim})")
    # ids must rise between neighbours of one row; a row's first id follows the previous row's
    # last, so those positions are exempt.
    rising = np.diff(indices.astype(np.int64)) > 0
    rising[indptr[1:-1][(indptr[1:-1] > 0) & (indptr[1:-1] < indices.size)] - 1] = True
    unsorted = np.flatnonzero(~rising)
    if unsorted.size:
        p = unsorted[0] + 1
        raise ValueError(
            f"{where}: row {row_of(p)}: column ids not strictly increasing "
            f"({indices[p - 1]} then {indices[p]}); sort each row and sum duplicates"
        )
    bad = np.flatnonzero(~np.isfinite(values))
    if bad.size:
        p = bad[0]
        raise ValueError(f"{where}: row {row_of(p)}: value {values[p]} in column {indices[p]}")
