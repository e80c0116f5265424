"""Compiled CPU kernels of the multilabel cross-entropy's two log-sum-exps (Su's ZLPR).

Why hand-written: per row, the loss needs log Σ_{j ∉ P} e^(s_j) over every negative column and
log Σ_{p ∈ P} e^(−s_p) over the few positives. torch builds a (B, C) positive mask, a masked
copy of the scores, logsumexp's max, exponentials and sum, and in the backward as many (B, C)
passes again: on the synthetic XC set's shape (B = 256, C = 10,000) the loss cost 42 ms a step,
as much as the three GEMMs of a 256-wide output layer. Here the forward reads a row twice while
it sits in L2 (its max over the negatives, then their Σ e^(s − max), the positives masked by a
per-row offset of −∞, with the cross-entropy kernel's row passes) and keeps the two
log-sum-exps of the row; the backward writes the gradient in one pass.

With ln_i = log Σ_{j ∉ P_i} e^(s_ij) and lp_i = log Σ_{p ∈ P_i, s_ip > −∞} e^(−s_ip) (a row's
list is padded with negative ids; the loss refuses repeats before it gets here),
∂ln_i/∂s_ij = e^(s_ij − ln_i) for a negative j and ∂lp_i/∂s_ip = −e^(−s_ip − lp_i).
An empty sum is −∞ with a zero gradient. The negatives' exponentials are summed in float32 lanes
over blocks of 1,024 columns and the blocks in float64; each row is reduced by one thread in a
fixed order, so the values do not depend on the thread count.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from tailkit.native import kernel_cache  # noqa: F401  (before any cache=True kernel: its locator)
from tailkit.native.fastmath import CLAMP_F32, exp_neg_f32

# The cross-entropy kernel's row passes, with a per-row offset of −∞ at the positives for the
# mask: a byte mask beside float32 lanes kept LLVM from vectorising the sum (10× slower).
from tailkit.native.row_softmax import row_max, sum_exp_but

_ZERO = np.float32(0.0)


@numba.njit(cache=True)
def _mark(penalty, ids_row, value):
    for p in range(ids_row.shape[0]):
        if ids_row[p] >= 0:
            penalty[ids_row[p]] = value


@numba.njit(parallel=True, cache=True, error_model="numpy")
def masked_lse_forward(scores, ids, log_neg, log_pos):
    """Per row of ``scores`` (B, C) float32 with positive ids ``ids`` (B, P) int64 (padding < 0):
    ``log_neg`` and ``log_pos`` (B,) float64 (module docstring)."""
    rows, width = scores.shape
    for i in numba.prange(rows):
        f = scores[i]
        penalty = np.zeros(width, dtype=np.float32)
        _mark(penalty, ids[i], -np.inf)
        m = row_max(f, penalty)
        # no finite negative: −∞, unless the row holds a NaN
        total = sum_exp_but(f, penalty, -1, m if m != -np.inf else _ZERO)
        log_neg[i] = np.float64(m) + np.log(total) if m != -np.inf else total - np.inf
        top = -np.inf
        nan = False
        for p in range(ids.shape[1]):
            y = ids[i, p]
            if y >= 0 and f[y] != -np.inf:
                nan |= np.isnan(f[y])
                top = max(top, -np.float64(f[y]))
        if nan or top == -np.inf:
            log_pos[i] = np.nan if nan else -np.inf
            continue
        total = 0.0
        for p in range(ids.shape[1]):
            y = ids[i, p]
            if y >= 0 and f[y] != -np.inf:
                total += math.exp(-np.float64(f[y]) - top)
        log_pos[i] = top + math.log(total)


@numba.njit(parallel=True, cache=True, error_model="numpy", fastmath={"contract"})
def masked_lse_backward(scores, ids, log_neg, log_pos, grad_neg, grad_pos, out):
    """``out`` (B, C) float32: the gradient of Σ_i (grad_neg_i ln_i + grad_pos_i lp_i) with
    respect to the scores. ln is split into a float32 head and tail (hi + lo) so that ln − s
    keeps the float64 digits (as the cross-entropy kernel does)."""
    rows, width = scores.shape
    for i in numba.prange(rows):
        f = scores[i]
        o = out[i]
        penalty = np.zeros(width, dtype=np.float32)
        _mark(penalty, ids[i], -np.inf)
        g = np.float32(grad_neg[i])
        if log_neg[i] == -np.inf or g == 0:
            for j in range(width):
                o[j] = _ZERO
        else:
            hi = np.float32(log_neg[i])
            lo = np.float32(log_neg[i] - np.float64(hi))
            for j in range(width):
                a = (hi - (f[j] + penalty[j])) + lo
                o[j] = exp_neg_f32(a) * g if a < CLAMP_F32 else _ZERO
        if log_pos[i] == -np.inf or grad_pos[i] == 0:
            continue
        for p in range(ids.shape[1]):
            y = ids[i, p]
            if y >= 0 and f[y] != -np.inf:
                o[y] += np.float32(-grad_pos[i] * math.exp(-np.float64(f[y]) - log_pos[i]))
