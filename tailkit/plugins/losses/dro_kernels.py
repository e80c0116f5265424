"""Compiled CPU kernels of DRO-LT's prototype loss: everything between its two GEMMs in one
pass per prototype row, forward and backward.

Why hand-written: with K prototypes (the classes of a batch, a few hundred at C = 3,875) and B
samples, the loss is a K × B table of distances turned into a softmax over the samples of each
prototype. torch spends a dozen (K, B) passes on it (square root, the exact positive pairs,
the radius, the scaling, log-softmax, the picks, and as many again in the backward) plus a
bincount and a gather, 3–4 ms a step, more than the cross-entropy over all C labels. Here the
GEMM of the cross terms stays with torch (it is the one part a GEMM does best), and a row of
the table is finished while it sits in L1.

Per prototype k with n_k positives (the samples of its class), D_ki = ‖μ_k − z_i‖ (from the
GEMM form, the positive pairs again from direct differences), s_ki = −(D_ki + ε_i·[i ∈ k])/T,
lse_k = log Σ_i e^(s_ki), loss_k = −Σ_{i ∈ k} (s_ki − lse_k)/n_k; and in the backward
G_ki = g(e^(s_ki − lse_k) − [i ∈ k]/n_k) and H_ki = −G_ki/(T·D_ki) (0 where D is at the
floor). Rows are reduced by one thread each in a fixed order.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from tailkit.fastmath import exp_nonpositive


@numba.njit(cache=True, error_model="numpy", fastmath={"contract"})
def _exact_distance(z, i, protos, k):
    acc = np.float32(0.0)
    for j in range(z.shape[1]):
        diff = z[i, j] - protos[k, j]
        acc += diff * diff
    return np.float32(math.sqrt(acc))


#: Reductions may be reordered (so the loops over a row vectorise) and assume no NaN (so max
#: does too); the order is fixed by the compiled code, so the values are still deterministic.
_FAST = {"contract", "reassoc", "nnan", "nsz"}


@numba.njit(parallel=True, cache=True, error_model="numpy", fastmath=_FAST)
def dro_forward(
    cross,
    sq_protos,
    sq_z,
    z,
    protos,
    owner,
    members,
    starts,
    radius,
    inv_t,
    tiny,
    dist,
    lse,
    losses,
):
    """Per prototype row k: ``dist`` (K, B) float32, ``lse`` (K,) float64 and ``losses`` (K,)
    float64 (0 for a prototype with no sample). ``cross`` (K, B) = centred μ·z, ``sq_*`` their
    squared norms, ``owner`` (B,) the row of each sample's class, ``members``[starts[k] :
    starts[k + 1]] the samples of row k, ``radius`` (B,) ε_{y_i}.

    The element-wise passes run over every column with the positives masked by a compare (so
    LLVM vectorises them); the few positive pairs are then visited through ``members``."""
    k_rows, b = cross.shape
    two = np.float32(2.0)
    for k in numba.prange(k_rows):
        row = dist[k]
        for i in range(b):
            row[i] = np.sqrt(max(sq_protos[k] + sq_z[i] - two * cross[k, i], tiny))
        top = -np.inf
        for i in range(b):
            top = max(top, -np.float64(row[i]) * inv_t)
        picked = 0.0
        for m in range(starts[k], starts[k + 1]):
            i = members[m]
            row[i] = _exact_distance(z, i, protos, k)
            s = -(np.float64(row[i]) + radius[i]) * inv_t
            picked += s
            top = max(top, s)
        total = 0.0
        for i in range(b):
            t = -np.float64(row[i]) * inv_t - top
            total += exp_nonpositive(t) if owner[i] != k else 0.0
        for m in range(starts[k], starts[k + 1]):
            i = members[m]
            total += exp_nonpositive(-(np.float64(row[i]) + radius[i]) * inv_t - top)
        lse[k] = top + math.log(total)
        count = starts[k + 1] - starts[k]
        losses[k] = -(picked - count * lse[k]) / count if count else 0.0


@numba.njit(parallel=True, cache=True, error_model="numpy", fastmath=_FAST)
def dro_backward(dist, owner, members, starts, radius, inv_t, floor, lse, scale, h, at_positive):
    """``h`` (K, B) float32 = −G/(T·D) (0 where D ≤ ``floor``), and ``at_positive`` (B,) float64
    = G at each sample's own prototype, for an incoming gradient ``scale`` of the mean loss."""
    k_rows, b = dist.shape
    for k in numba.prange(k_rows):
        row = h[k]
        for i in range(b):
            dk = np.float64(dist[k, i])
            g = scale * exp_nonpositive(-dk * inv_t - lse[k])
            row[i] = np.float32(0.0) if dk <= floor else np.float32(-g * inv_t / dk)
        count = starts[k + 1] - starts[k]
        for m in range(starts[k], starts[k + 1]):
            i = members[m]
            dk = np.float64(dist[k, i])
            s = -(dk + radius[i]) * inv_t
            g = scale * (exp_nonpositive(s - lse[k]) - 1.0 / count)
            at_positive[i] = g
            row[i] = np.float32(0.0) if dk <= floor else np.float32(-g * inv_t / dk)
