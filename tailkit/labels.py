"""Multi-label label sets: each row's label ids in CSR form, and the views a step needs.

Single-label data stays a plain (N,) int64 tensor everywhere; multi-label data (the XC
repository's rows, with any number of labels, none included) is a :class:`LabelSets`. A training
step sees one of two views of a batch of label sets:

* :meth:`LabelSets.padded`: (B, k) int64 ids padded with −1, k the batch's largest set, the form
  full-mode multi-label losses take (``multilabel-ce``'s sparse targets);
* :meth:`LabelSets.pairs`: every (row, positive) pair of the batch, the pick-all-labels reduction
  (Menon et al. 2019, "Multilabel reductions: what is my loss optimising?") through which a
  sampled loss trains on multi-label rows: each positive is scored against the row's negatives,
  and :meth:`LabelSets.contains` marks a negative that is *any* of the row's labels as an
  accidental hit (every true label is a positive and masked as a hit).

Membership tests use one sorted array of keys row·C + label and a binary search, so no B × C (or
pairs × m × k) indicator is ever built.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import scipy.sparse as sp
import torch


@dataclass(frozen=True)
class LabelSets:
    """Per row, a sorted set of label ids: ``indices[indptr[i]:indptr[i + 1]]`` (int64 tensors).

    ``num_classes`` bounds the ids. Rows may be empty.
    """

    indptr: torch.Tensor
    indices: torch.Tensor
    num_classes: int

    def __post_init__(self) -> None:
        if self.indptr.ndim != 1 or self.indptr.numel() < 1 or int(self.indptr[0]) != 0:
            raise ValueError("LabelSets: indptr must be 1-D and start at 0")
        if int(self.indptr[-1]) != self.indices.numel():
            raise ValueError(
                f"LabelSets: indptr ends at {int(self.indptr[-1])} but there are "
                f"{self.indices.numel()} label ids"
            )
        if self.indices.numel() and (
            int(self.indices.min()) < 0 or int(self.indices.max()) >= self.num_classes
        ):
            raise ValueError(f"LabelSets: label ids must lie in [0, {self.num_classes})")

    # ------------------------------------------------------------------ construction

    @classmethod
    def _unchecked(cls, indptr: torch.Tensor, indices: torch.Tensor, num_classes: int):
        # For sets derived from checked ones (a batch's rows, a device copy): the O(nnz) range
        # check, and on a GPU its synchronisation, would run every step for nothing.
        out = object.__new__(cls)
        object.__setattr__(out, "indptr", indptr)
        object.__setattr__(out, "indices", indices)
        object.__setattr__(out, "num_classes", num_classes)
        return out

    @classmethod
    def from_csr(cls, matrix: sp.spmatrix, num_classes: int | None = None) -> LabelSets:
        """From an (N, C) 0/1 indicator; ids sorted and duplicates merged per row."""
        csr = sp.csr_matrix(matrix)
        csr.sum_duplicates()
        csr.sort_indices()
        return cls(
            torch.from_numpy(csr.indptr.astype(np.int64)),
            torch.from_numpy(csr.indices.astype(np.int64)),
            int(num_classes if num_classes is not None else csr.shape[1]),
        )

    @classmethod
    def from_lists(cls, rows: list[list[int]], num_classes: int) -> LabelSets:
        sets = [sorted({int(v) for v in row}) for row in rows]
        indptr = np.zeros(len(sets) + 1, dtype=np.int64)
        indptr[1:] = np.cumsum([len(s) for s in sets])
        flat = np.fromiter((v for s in sets for v in s), dtype=np.int64, count=int(indptr[-1]))
        return cls(torch.from_numpy(indptr), torch.from_numpy(flat), num_classes)

    @classmethod
    def from_arrow(cls, column: pa.ListArray, num_classes: int) -> LabelSets:
        """From a ``list<int32>`` column (a sliced array's offsets are rebased); a null id is a
        ValueError."""
        offsets = column.offsets.to_numpy().astype(np.int64)
        if offsets.size == 0:  # an empty list array may have no offsets at all
            offsets = np.zeros(1, dtype=np.int64)
        flat = column.flatten()
        if flat.null_count:
            raise ValueError(f"{flat.null_count} null label ids")
        ids = flat.to_numpy().astype(np.int64)
        return cls(torch.from_numpy(offsets - offsets[0]), torch.from_numpy(ids), num_classes)

    def to_arrow(self) -> pa.ListArray:
        """The ``list<int32>`` column the split and feature files store."""
        offsets = pa.array(self.indptr.numpy().astype(np.int32))
        ids = pa.array(self.indices.numpy().astype(np.int32))
        element = pa.field("element", pa.int32(), nullable=False)
        return pa.ListArray.from_arrays(offsets, ids, type=pa.list_(element))

    # ------------------------------------------------------------------ facts

    def __len__(self) -> int:
        return self.indptr.numel() - 1

    @property
    def shape(self) -> tuple[int]:
        """(N,), so code that asks a label tensor for its row count works on both kinds."""
        return (len(self),)

    @property
    def sizes(self) -> torch.Tensor:
        """Labels per row (N,)."""
        return self.indptr[1:] - self.indptr[:-1]

    def counts(self) -> np.ndarray:
        """Rows carrying each label (C,), the training frequency N_l of a label."""
        return np.bincount(self.indices.numpy(), minlength=self.num_classes)

    def to_csr(self) -> sp.csr_matrix:
        data = np.ones(self.indices.numel(), dtype=np.float32)
        return sp.csr_matrix(
            (data, self.indices.numpy(), self.indptr.numpy()), shape=(len(self), self.num_classes)
        )

    def csr_pair(self) -> tuple[np.ndarray, np.ndarray]:
        """(indptr, indices) as NumPy, the form :func:`ranking_metrics` takes."""
        return self.indptr.numpy(), self.indices.numpy()

    # ------------------------------------------------------------------ selection

    def select(self, rows: torch.Tensor | np.ndarray) -> LabelSets:
        """The label sets of ``rows``, in that order."""
        rows = torch.as_tensor(rows, dtype=torch.int64)
        rows = rows.to(self.indptr.device)
        start, sizes = self.indptr[rows], self.sizes[rows]
        indptr = torch.zeros(rows.numel() + 1, dtype=torch.int64, device=rows.device)
        torch.cumsum(sizes, 0, out=indptr[1:])
        # Position of each output id in ``indices``: its row's start plus its rank in the row.
        rank = torch.arange(int(indptr[-1]), device=rows.device)
        rank = rank - torch.repeat_interleave(indptr[:-1], sizes)
        source = torch.repeat_interleave(start, sizes) + rank
        return LabelSets._unchecked(indptr, self.indices[source], self.num_classes)

    def __getitem__(self, rows: torch.Tensor | np.ndarray) -> LabelSets:
        return self.select(rows)

    def index_select(self, dim: int, rows: torch.Tensor) -> LabelSets:
        """``select`` under the name a label tensor uses, so batch code serves both kinds."""
        if dim != 0:
            raise ValueError("LabelSets: only rows (dim 0) can be selected")
        return self.select(rows)

    def to(self, device: torch.device | str, non_blocking: bool = False) -> LabelSets:
        return LabelSets._unchecked(
            self.indptr.to(device, non_blocking=non_blocking),
            self.indices.to(device, non_blocking=non_blocking),
            self.num_classes,
        )

    # ------------------------------------------------------------------ the views of a batch

    def padded(self) -> torch.Tensor:
        """(N, k) label ids, each row's set then −1, k the largest set (at least 1)."""
        sizes = self.sizes
        width = max(int(sizes.max()) if len(self) else 0, 1)
        out = torch.full((len(self), width), -1, dtype=torch.int64, device=self.indices.device)
        rows = torch.repeat_interleave(torch.arange(len(self), device=sizes.device), sizes)
        rank = torch.arange(self.indices.numel(), device=sizes.device) - self.indptr[rows]
        out[rows, rank] = self.indices
        return out

    def pairs(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, label) of every positive: two (P,) int64 tensors, P = Σ set sizes, row-major."""
        rows = torch.repeat_interleave(
            torch.arange(len(self), device=self.indices.device), self.sizes
        )
        return rows, self.indices

    def contains(self, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Whether ``ids[i, j]`` is one of row ``rows[i]``'s labels: bool, the shape of ``ids``
        ((P, m), or (m,) broadcast to (P, m) for a shared draw)."""
        if ids.ndim == 1:
            return self.contains_shared(ids).index_select(0, rows)
        c = self.num_classes
        own_rows, labels = self.pairs()
        keys = own_rows * c + labels  # sorted: rows ascending, ids sorted within a row
        query = rows.unsqueeze(1) * c + ids
        if keys.numel() == 0:
            return torch.zeros(query.shape, dtype=torch.bool, device=query.device)
        pos = torch.searchsorted(keys, query).clamp(max=keys.numel() - 1)
        return keys[pos] == query

    def contains_shared(self, ids: torch.Tensor) -> torch.Tensor:
        """(N, m) bool: whether the shared draw's ``ids[j]`` is one of row i's labels.

        Looks each row's labels up among the m sorted ids (a draw may repeat an id) instead of
        each of the N·m (row, id) pairs among the labels: O((nnz + m) log m + N·m) with the
        N·m term a plain fill, 5× less work than the pairwise search at m = 1024 (bench_multilabel).
        """
        out = torch.zeros(len(self), ids.numel(), dtype=torch.bool, device=ids.device)
        own_rows, labels = self.pairs()
        if labels.numel() == 0 or ids.numel() == 0:
            return out
        sorted_ids, order = ids.sort()
        lo = torch.searchsorted(sorted_ids, labels)
        found = torch.searchsorted(sorted_ids, labels, right=True) - lo
        which = torch.repeat_interleave(torch.arange(labels.numel(), device=ids.device), found)
        if which.numel() == 0:
            return out
        # The k-th copy of a label among the sorted ids sits at lo + k.
        start = torch.cumsum(found, 0) - found
        offset = torch.arange(which.numel(), device=ids.device) - start[which]
        out[own_rows[which], order[lo[which] + offset]] = True
        return out
