"""Compiled CPU kernels of a sampled batch's accidental hits: where a drawn negative is the row's
own label.

Why hand-written: hits are rare (about m/C per row for uniform draws), yet the batch carries
them as a dense (B, m) bool mask that the loss kernels read. For draws shared by the batch,
torch found them through a sort of the draws, two ``searchsorted`` and four small ops to scatter
the few pairs (0.19 ms at B = m = 1,024 alone on a 2-core AVX-512 machine, 0.47 ms inside a sampled
step, whose GEMMs take 3); for per-example draws, torch's broadcast compare of a (B, 1) column
against a (B, m) table runs element by element. Here the shared case is one sort and a binary
search per row, and the per-example case one vectorised compare per row.

Both fill every entry of ``out``, so it may come from ``torch.empty``; the mask is exact (equal
ids), so it is the same whatever the thread count.
"""

from __future__ import annotations

import numba
import numpy as np

from tailkit.native import kernel_cache  # noqa: F401  (before any cache=True kernel: its locator)


@numba.njit(parallel=True, cache=True)
def shared_hit_mask(neg, labels, out):
    """``out`` (B, m) bool ← neg[j] == labels[i], for draws ``neg`` (m,) shared by the rows
    with ``labels`` (B,) (int64 both). The draws are sorted once; each row then clears its
    mask and binary-searches its label (the rows split between the threads)."""
    order = np.argsort(neg)
    drawn = neg[order]
    m = drawn.shape[0]
    for i in numba.prange(labels.shape[0]):
        mask, label = out[i], labels[i]
        for j in range(m):
            mask[j] = False
        at = np.searchsorted(drawn, label)
        while at < m and drawn[at] == label:  # a label drawn more than once
            mask[order[at]] = True
            at += 1


@numba.njit(parallel=True, cache=True)
def per_row_hit_mask(neg, labels, out):
    """``out`` (B, m) bool ← neg[i, j] == labels[i], for per-example draws ``neg`` (B, m)."""
    for i in numba.prange(neg.shape[0]):
        draws, mask, label = neg[i], out[i], labels[i]
        for j in range(draws.shape[0]):
            mask[j] = draws[j] == label
