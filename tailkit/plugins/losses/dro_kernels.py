"""Compiled CPU kernels of DRO-LT's prototype term (float32), around torch's two GEMMs.

Why hand-written: with the GEMMs left to torch, the term's value and gradient took about forty
small torch ops a step (unique, bincount, the class means, gathers, index_put, the (K, B)
passes of log-softmax and its gradient, the moving-average update), each a fixed 20–50 µs on
a 2-core CPU: 3–4 ms where CE's own loss takes 3, which put DRO-LT at 1.1–1.2× a CE step
(``benchmarks/bench_losses.py``). Here the batch's classes, their means and the moving-average
update are one serial pass over the batch, and each (K, B) pass is one parallel sweep over
the prototypes.

The computation is :class:`tailkit.plugins.losses.prototypes.BatchPrototypeDRO`'s: with μ_k the
prototype of the batch's k-th class, D_ki = ‖μ_k − z_i‖ (the cross term from a GEMM on points
centred on the prototypes' mean, each sample's own prototype again from direct differences,
exact at 0), s_ki = −(D_ki + [k = k(i)] ε_{y_i})/T, lse_k = log Σ_i e^(s_ki), and

    loss = −(1/K) Σ_i (s_{k(i) i} − lse_{k(i)}) / n_{k(i)},
    G_ki = ∂loss/∂s_ki = (e^(s_ki − lse_k) − [k = k(i)]/n_k)/K,
    ∂loss/∂ε_{y_i} = −G_{k(i) i}/T,  H_ki = −G_ki/(T·D_ki) (0 where D is 0 or floored),
    ∂loss/∂z_i = Σ_k H_ki (z_i − μ_k), a GEMM.

Each prototype's row is reduced by one thread in a fixed order, and the batch pass is serial,
so the values do not depend on the thread count.
"""

from __future__ import annotations

import math

import numba
import numpy as np

from tailkit.native import kernel_cache  # noqa: F401  (before any cache=True kernel: its locator)
from tailkit.native.fastmath import CLAMP_F32, exp_neg_f32
from tailkit.native.row_softmax import row_max

_ZERO = np.float32(0.0)
#: sqrt of float32's smallest normal: the floor of a distance from the GEMM form, whose
#: rounding near 0 is not a distance (no gradient flows through a floored entry).
FLOOR = np.float32(math.sqrt(np.finfo(np.float32).tiny))


@numba.njit(cache=True, inline="always", fastmath={"contract", "reassoc"})
def _centred(row, mid, out):
    """``out`` = ``row`` − ``mid``; returns its squared norm."""
    total = _ZERO
    for j in range(row.shape[0]):
        x = row[j] - mid[j]
        out[j] = x
        total += x * x
    return total


@numba.njit(cache=True, error_model="numpy", fastmath={"contract", "reassoc"})
def batch_prototypes(z, labels, prototypes, seen, epsilon, momentum, update):
    """The batch's classes and each sample's prototype, and the moving-average update.

    ``z`` (B, d) float32 and ``labels`` (B,) int64; ``prototypes`` (C, d) float32 and ``seen``
    (C,) bool are the loss's running state. The batch's distinct classes, ascending, are its
    prototypes k = 0..K−1: returns ``inverse`` (B,) (each sample's k), ``members`` (B,) (the
    samples by class, in no set order within a class: only independent per-sample rewrites
    read it) and ``starts`` (K + 1,) (class k's are
    ``members[starts[k]:starts[k + 1]]``), ``sizes`` (K,), ``points`` (K + B, d) float32 (the K
    current prototypes, then the B samples, all centred on the prototypes' mean), ``norms``
    (K + B,) float32 (their squared norms), ``own`` (B,) float32 (each sample's distance to its
    own prototype, from direct differences) and ``current`` (K, d) float32, the uncentred
    prototypes: a class's stored prototype if ``seen``, else its batch mean; and ``shift``
    (B,) float32, each sample's radius ε_{y_i} from ``epsilon`` (C,). With ``update``, each
    class's stored prototype then becomes m·current + (1 − m)·mean (its mean if unseen; m =
    ``momentum``) and it is marked seen. Every sum runs in a fixed order (a class's samples in
    sample order, the prototypes in class order), so the values do not depend on the threads.
    """
    b, d = z.shape
    members = np.argsort(labels)
    inverse = np.empty(b, dtype=np.int64)
    starts = np.empty(b + 1, dtype=np.int64)
    k = -1
    for p in range(b):
        if p == 0 or labels[members[p]] != labels[members[p - 1]]:
            k += 1
            starts[k] = p
        inverse[members[p]] = k
    count = k + 1
    starts = starts[: count + 1].copy()
    starts[count] = b
    sizes = starts[1:] - starts[:-1]
    classes = np.empty(count, dtype=np.int64)
    sums = np.zeros((count, d), dtype=np.float64)
    for i in range(b):
        k = inverse[i]
        classes[k] = labels[i]
        for j in range(d):
            sums[k, j] += z[i, j]
    current = np.empty((count, d), dtype=np.float32)
    centre = np.zeros(d, dtype=np.float64)
    keep, fresh = np.float32(momentum), np.float32(1.0 - momentum)
    for k in range(count):
        c = classes[k]
        share = 1.0 / sizes[k]
        for j in range(d):
            mean = np.float32(sums[k, j] * share)
            current[k, j] = prototypes[c, j] if seen[c] else mean
            centre[j] += current[k, j]
            if update:
                prototypes[c, j] = keep * current[k, j] + fresh * mean if seen[c] else mean
        if update:
            seen[c] = True
    mid = np.empty(d, dtype=np.float32)
    for j in range(d):
        mid[j] = centre[j] / count
    points = np.empty((count + b, d), dtype=np.float32)
    norms = np.empty(count + b, dtype=np.float32)
    own = np.empty(b, dtype=np.float32)
    shift = np.empty(b, dtype=np.float32)
    for r in range(count + b):
        if r < count:
            norms[r] = _centred(current[r], mid, points[r])
        else:
            i = r - count
            norms[r] = _centred(z[i], mid, points[r])
            shift[i] = epsilon[labels[i]]
            mine = current[inverse[i]]
            total = _ZERO
            for j in range(d):
                diff = z[i, j] - mine[j]
                total += diff * diff
            own[i] = np.sqrt(total)
    return inverse, members, starts, sizes, points, norms, own, current, shift


@numba.njit(parallel=True, cache=True, error_model="numpy", fastmath={"contract", "reassoc"})
def dro_forward(cross, norms, own, inverse, members, starts, shift, inv_t, lse):
    """The loss (float64), from ``cross`` (K, B) float32, the GEMM of the centred prototypes with
    the centred samples, and their squared ``norms`` (K + B,); the distances D are written over
    ``cross`` (a sample's distance to its own prototype is ``own``) and the log-sum-exps into
    ``lse`` (K,) float64. ``shift`` (B,) float32 is ε_{y_i}; ``inv_t`` is 1/T (float32). A
    distance from the GEMM form is floored at :data:`FLOOR` (its square root's gradient stays
    finite). The loss sums the samples' terms in sample order."""
    count, b = cross.shape
    sample_norms = norms[count:]
    zeros = np.zeros(b, dtype=np.float32)
    for k in numba.prange(count):
        row = cross[k]
        # −D_ki for every sample, then each of the class's own samples rewritten: a per-entry
        # test (is i one of k's?) kept this loop from vectorising cleanly (0.128 → 0.097 ms)
        neg = np.empty(b, dtype=np.float32)
        for i in range(b):
            dist = max(
                np.sqrt(max(norms[k] + sample_norms[i] - np.float32(2.0) * row[i], _ZERO)), FLOOR
            )
            row[i] = dist
            neg[i] = -dist
        for p in range(starts[k], starts[k + 1]):
            i = members[p]
            row[i] = own[i]
            neg[i] = -(own[i] + shift[i])
        # the maximum by softmax_kernels' stripes: a running max inside this loop kept it
        # scalar (0.28 → 0.16 ms for K = 211, B = 512, one core), as it had CE's (that
        # row_softmax.row_max; ``zeros`` is its offset row)
        top = row_max(neg, zeros) * inv_t  # max of s_ki: −x·(1/T) falls as x grows
        acc = _ZERO
        for i in range(b):
            a = top - neg[i] * inv_t
            acc += exp_neg_f32(a) if a < CLAMP_F32 else _ZERO
        lse[k] = np.float64(top) + math.log(np.float64(acc))
    total = 0.0
    for i in range(b):
        k = inverse[i]
        s = np.float64(-(cross[k, i] + shift[i]) * inv_t)
        total += (s - lse[k]) / (starts[k + 1] - starts[k])
    return -total / count


#: Samples per task of the backward's column sums: a block of each prototype's row at a time.
_COLUMN_BLOCK = 64


@numba.njit(parallel=True, cache=True, error_model="numpy", fastmath={"contract"})
def dro_backward(
    dist, z, labels, inverse, members, starts, shift, inv_t, lse, scale, weights, grad_z, grad_eps
):
    """The gradient of the loss scaled by ``scale`` (the incoming gradient): ``weights`` (K, B)
    float32 = H (H_ki = −G_ki/(T·D_ki), 0 where D_ki is at the floor), ``grad_z`` (B, d) float32
    = (Σ_k H_ki) z_i, to which the caller adds −Hᵀμ (a GEMM), and ``grad_eps`` (C,) float32, zero
    on entry, += −G_{k(i) i}/T per sample in sample order."""
    count, b = dist.shape
    per_class = np.float32(scale / count)
    for k in numba.prange(count):
        row, out = dist[k], weights[k]
        hi = np.float32(lse[k])
        lo = np.float32(lse[k] - np.float64(hi))
        for i in range(b):
            a = (hi + row[i] * inv_t) + lo
            g = (exp_neg_f32(a) if a < CLAMP_F32 else _ZERO) * per_class
            out[i] = -g * inv_t / row[i] if row[i] > FLOOR else _ZERO
        pull = per_class / np.float32(starts[k + 1] - starts[k])
        for p in range(starts[k], starts[k + 1]):  # the class's own samples, as in dro_forward
            i = members[p]
            a = (hi + (row[i] + shift[i]) * inv_t) + lo
            g = (exp_neg_f32(a) if a < CLAMP_F32 else _ZERO) * per_class - pull
            out[i] = -g * inv_t / row[i] if row[i] > FLOOR else _ZERO
    # Σ_k H_ki for a block of samples at a time, prototype by prototype: each i in a fixed order
    for block in numba.prange((b + _COLUMN_BLOCK - 1) // _COLUMN_BLOCK):
        first = block * _COLUMN_BLOCK
        width = min(_COLUMN_BLOCK, b - first)
        column = np.zeros(width, dtype=np.float32)
        for k in range(count):
            part = weights[k, first : first + width]
            for t in range(width):
                column[t] += part[t]
        for t in range(width):
            for j in range(z.shape[1]):
                grad_z[first + t, j] = column[t] * z[first + t, j]
    for i in range(b):
        # each sample's own pair: ε's gradient is −G/T there (H may be 0)
        k = inverse[i]
        a = np.float64(lse[k]) + np.float64((dist[k, i] + shift[i]) * inv_t)
        g = math.exp(-a) * per_class - per_class / np.float32(starts[k + 1] - starts[k])
        grad_eps[labels[i]] += np.float32(-g * inv_t)
