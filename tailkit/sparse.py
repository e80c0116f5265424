"""Sparse feature rows (CSR) that batch like a tensor: the input of the sparse encoders.

A TF-IDF bag of words or a set of grid cells has 10^4–10^6 columns and a few to a few hundred
non-zeros per row; densified, one batch of 512 rows over 10^6 columns is 2 GB. :class:`SparseRows`
keeps the rows as CSR (``indptr``, ``indices``, ``values``) from the Parquet cache to the first
layer, and offers the few tensor operations the training loop, evaluation and the samplers use on
their inputs: ``shape``, ``len``, ``index_select(0, ids)``, slicing and integer-tensor indexing,
``to(device)``. A batch is gathered with vectorised index arithmetic (no Python loop over rows),
and its ``bag()`` is what ``torch.nn.functional.embedding_bag`` takes, so x·W for a (D, d) W is
one ``embedding_bag`` call (:meth:`matmul`) that never materialises a dense row.

torch's own ``sparse_csr_tensor`` is not used as the container: it has no ``index_select`` over
rows on CPU, and its beta invariant checks cost a full pass per construction.

:func:`~tailkit.csr.check_rows` is the validation every reader of sparse rows applies (cache,
featurizer outputs, datasets); it and :func:`~tailkit.csr.canonical` live in :mod:`tailkit.csr`,
which imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

from tailkit.csr import canonical


@dataclass(frozen=True)
class SparseRows:
    """N rows of a CSR matrix with D columns.

    ``indptr`` (N + 1,) and ``indices`` (nnz,) are int32 or int64 (the cache hands over its
    int32 buffers without a copy; a gathered batch is int64, as ``embedding_bag`` prefers);
    ``values`` (nnz,) float32. Within a row, ids are strictly increasing
    (:func:`~tailkit.csr.check_rows`).
    Treat the tensors as read-only: they may view the cache's decoded Arrow buffers.
    """

    indptr: torch.Tensor
    indices: torch.Tensor
    values: torch.Tensor
    dim: int

    # --- the tensor-like surface -------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, int]:
        return (self.indptr.shape[0] - 1, self.dim)

    def __len__(self) -> int:
        return self.indptr.shape[0] - 1

    @property
    def device(self) -> torch.device:
        return self.values.device

    @property
    def nnz(self) -> int:
        return int(self.indices.shape[0])

    def to(self, device: torch.device | str, non_blocking: bool = False) -> SparseRows:
        device = torch.device(device)
        if device == self.device:
            return self
        return SparseRows(
            self.indptr.to(device, non_blocking=non_blocking),
            self.indices.to(device, non_blocking=non_blocking),
            self.values.to(device, non_blocking=non_blocking),
            self.dim,
        )

    def index_select(self, axis: int, rows: torch.Tensor) -> SparseRows:
        """The given rows, in the given order (repeats allowed), as int64 CSR."""
        if axis != 0:
            raise ValueError("SparseRows selects rows only (axis 0)")
        rows = rows.to(device=self.indptr.device, dtype=torch.int64).reshape(-1)
        starts = self.indptr.index_select(0, rows).to(torch.int64)
        lengths = self.indptr.index_select(0, rows + 1).to(torch.int64) - starts
        indptr = torch.zeros(rows.shape[0] + 1, dtype=torch.int64, device=rows.device)
        torch.cumsum(lengths, 0, out=indptr[1:])
        total = int(indptr[-1])
        # Position j of the batch's values comes from starts[r] + (j − indptr[r]) for its row r.
        shift = torch.repeat_interleave(starts - indptr[:-1], lengths, output_size=total)
        source = torch.arange(total, device=rows.device) + shift
        return SparseRows(
            indptr,
            self.indices.index_select(0, source).to(torch.int64),
            self.values.index_select(0, source),
            self.dim,
        )

    def __getitem__(self, key: slice | torch.Tensor | np.ndarray) -> SparseRows:
        if isinstance(key, slice):
            start, stop, step = key.indices(len(self))
            if step == 1:
                return self._rows_between(start, max(start, stop))
            key = torch.arange(start, stop, step)
        return self.index_select(0, torch.as_tensor(key))

    def _rows_between(self, start: int, stop: int) -> SparseRows:
        # A contiguous block is a view of the buffers, with its row pointer rebased to 0.
        lo, hi = int(self.indptr[start]), int(self.indptr[stop])
        return SparseRows(
            self.indptr[start : stop + 1] - lo,
            self.indices[lo:hi],
            self.values[lo:hi],
            self.dim,
        )

    # --- arithmetic ------------------------------------------------------------------------

    def bag(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(indices, offsets, per_sample_weights) for ``embedding_bag(mode="sum")``, int64."""
        return self.indices.to(torch.int64), self.indptr[:-1].to(torch.int64), self.values

    def matmul(self, weight: torch.Tensor) -> torch.Tensor:
        """x · W for a (D, d) ``weight``: (N, d), without densifying x (an empty row gives 0)."""
        if weight.dim() != 2 or weight.shape[0] != self.dim:
            raise ValueError(
                f"cannot multiply {self.shape} rows by a weight of {tuple(weight.shape)}"
            )
        indices, offsets, values = self.bag()
        return F.embedding_bag(
            indices, weight, offsets, mode="sum", per_sample_weights=values.to(weight.dtype)
        )

    def to_dense(self) -> torch.Tensor:
        n = len(self)
        rows = torch.repeat_interleave(
            torch.arange(n, device=self.device), self.indptr.diff().to(torch.int64)
        )
        out = torch.zeros(n, self.dim, dtype=self.values.dtype, device=self.device)
        out[rows, self.indices.to(torch.int64)] = self.values
        return out

    # --- conversions -----------------------------------------------------------------------

    @classmethod
    def from_scipy(cls, matrix: sp.csr_matrix | sp.csr_array) -> SparseRows:
        """Shares ``matrix``'s buffers where their dtypes allow (float32 values)."""
        matrix = canonical(matrix)
        return cls(
            torch.from_numpy(np.asarray(matrix.indptr)),
            torch.from_numpy(np.asarray(matrix.indices)),
            torch.from_numpy(np.asarray(matrix.data, dtype=np.float32)),
            int(matrix.shape[1]),
        )

    def to_scipy(self) -> sp.csr_matrix:
        return sp.csr_matrix(
            (self.values.cpu().numpy(), self.indices.cpu().numpy(), self.indptr.cpu().numpy()),
            shape=self.shape,
        )


def __getattr__(name: str) -> object:
    """``check_rows``, moved to :mod:`tailkit.csr`, for one release (tailkit._moved)."""
    from tailkit._moved import moved_attribute

    return moved_attribute(__name__, name)
