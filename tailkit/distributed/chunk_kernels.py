"""Compiled CPU kernels of the chunked full step: a chunk folded into each row's running
log-sum-exp, and a chunk's logits turned into their gradient, each in one pass over the chunk.

Why hand-written: in torch the fold is four passes over the (B, width) chunk (the maximum,
the subtraction, the exp, the sum) and the gradient three, each streaming the chunk through
memory; here a row of the chunk is read while it sits in L1/L2, with the sums of
:mod:`tailkit.native.row_softmax` (those of the full step's compiled cross-entropy).
``benchmarks/bench_full.py`` times the step.

Each row is reduced by one thread in a fixed order, so the values do not depend on the thread
count. The running total is float64, rescaled by e^(old max − new max) when a chunk raises a
row's maximum.
"""

from __future__ import annotations

import numba
import numpy as np

from tailkit.native import kernel_cache  # noqa: F401  (before any cache=True kernel: its locator)
from tailkit.native.row_softmax import row_max, softmax_row_into, sum_exp_but


@numba.njit(parallel=True, cache=True, error_model="numpy")
def fold_chunk(logits, addend, top, total):
    """Fold a chunk of logits (B, w) float32, column j moved by ``addend[j]`` (w,) float32, into
    the running maximum ``top`` (B,) float32 and ``total`` (B,) float64 = Σ e^(a − top) over
    the columns folded so far, in place."""
    for i in numba.prange(logits.shape[0]):
        f = logits[i]
        old = top[i]
        new = max(old, row_max(f, addend))
        if new == -np.inf:  # every entry so far is −∞: nothing to add
            continue
        part = sum_exp_but(f, addend, -1, new)
        scale = np.exp(np.float64(old) - np.float64(new)) if old > -np.inf else 0.0
        total[i] = total[i] * scale + part
        top[i] = new


@numba.njit(parallel=True, cache=True, error_model="numpy", fastmath={"contract"})
def chunk_gradient(logits, addend, lse, grad):
    """In place, ``logits`` (B, w) float32 ← grad_i · e^(logits_ij + addend_j − lse_i), the
    softmax part of the logits' gradient, for float64 ``lse`` (B,) and float32 ``grad`` (B,),
    with the full step's arithmetic (:func:`tailkit.native.row_softmax.softmax_row_into`)."""
    for i in numba.prange(logits.shape[0]):
        softmax_row_into(logits[i], addend, lse[i], grad[i], logits[i])
