"""Compiled CPU kernels of the sampled softmax: the loss in one read of the negative logits, the
gradient in one read and one write.

Why hand-written: the sampled step's only O(B·m) work besides its three GEMMs is this loss,
and in eager torch it was eight (B, m) passes and as many temporaries: the weights added, the
hits masked, the positive column concatenated, ``logsumexp``'s max, exp and sum, and a backward
of exp, a broadcast multiply (2.8 ms alone at B = m = 1,024 on an AVX-512 machine: torch runs that
broadcast pattern unvectorised) and the concatenation's and mask's own backwards. At B = m =
1,024 and d = 128 they took 7–8 ms of a 10 ms step whose GEMMs take 2.5 (bench_step.py).

Per row i, with a_ij = f_ij + w_ij (the negative logit plus its log weight, added in float32
as torch adds them) over the negatives j that are not accidental hits, and the positive p_i:
lse_i = M + log(e^(p_i − M) + Σ_j e^(a_ij − M)) with M the largest of them, ℓ_i = lse_i − p_i,
∂ℓ_i/∂p_i = e^(p_i − lse_i) − 1, ∂ℓ_i/∂f_ij = e^(a_ij − lse_i) (0 at a hit). The exponentials
are :mod:`tailkit.native.fastmath`'s vectorisable float32 ones, summed in float32 over the row (m is a
few thousand at most) and the row's total kept in float64, as the full-softmax kernels
(:mod:`~tailkit.plugins.losses.softmax_kernels`) do. One thread reduces a row in a fixed order,
so the values do not depend on the thread count. A NaN in a row's positive or in a negative
that is not a hit gives a NaN loss (torch's ``logsumexp`` does the same), so a diverged step
is still seen; a hit's logit is never read into the result, NaN or not.
"""

from __future__ import annotations

import numba
import numpy as np

from tailkit.native import kernel_cache  # noqa: F401  (before any cache=True kernel: its locator)
from tailkit.native.fastmath import CLAMP_F32, exp_neg_f32
from tailkit.native.row_softmax import MAX_STRIPE as _MAX_STRIPE

_ZERO = np.float32(0.0)
_NEG_INF = np.float32(-np.inf)


@numba.njit(cache=True, fastmath={"nnan", "nsz"})
def _masked_max(f, w, hit, start):
    """max over j of f[j] + w[j] where not hit[j], and ``start``. Running maxima per column of
    a stripe, as tailkit.native.row_softmax.row_max keeps them (the only max reduction LLVM vectorises
    for us); not inlined, so that these fastmath flags stay its own."""
    n = f.shape[0]
    body = n - n % _MAX_STRIPE
    most = np.full(_MAX_STRIPE, start, dtype=np.float32)
    for lo in range(0, body, _MAX_STRIPE):
        fs, ws = f[lo : lo + _MAX_STRIPE], w[lo : lo + _MAX_STRIPE]
        hs = hit[lo : lo + _MAX_STRIPE]
        for j in range(_MAX_STRIPE):
            most[j] = max(most[j], _NEG_INF if hs[j] else fs[j] + ws[j])
    m = start
    for j in range(_MAX_STRIPE):
        m = max(m, most[j])
    for j in range(body, n):
        m = max(m, _NEG_INF if hit[j] else f[j] + w[j])
    return m


@numba.njit(cache=True, error_model="numpy", fastmath={"contract", "reassoc"})
def _masked_sum_exp(f, w, hit, m):
    """Σ over the j that are not hits of e^(f[j] + w[j] − m) for m ≥ each of them, and the sum
    of the differences (NaN if any term is NaN: the max above would drop a NaN silently)."""
    acc = _ZERO
    probe = _ZERO
    for j in range(f.shape[0]):
        a = m - (f[j] + w[j])
        keep = not hit[j]
        acc += exp_neg_f32(a) if (keep and a < CLAMP_F32) else _ZERO
        probe += a if keep else _ZERO
    return acc, probe


@numba.njit(parallel=True, cache=True, error_model="numpy")
def sampled_softmax_forward(pos, neg, log_w, hits, lse, loss):
    """Per row: ``lse`` (B,) float64 and ``loss`` (B,) float32 of the positives ``pos`` (B,)
    against the negatives ``neg`` (B, m) weighted by ``log_w`` ((1, m): one row for all, or
    (B, m)), the entries where ``hits`` (B, m) is True left out."""
    rows = neg.shape[0]
    shared = log_w.shape[0] == 1
    for i in numba.prange(rows):
        f, h = neg[i], hits[i]
        w = log_w[0] if shared else log_w[i]
        p = pos[i]
        m = _masked_max(f, w, h, p)
        acc, probe = _masked_sum_exp(f, w, h, m)
        a = m - p
        total = np.float64(acc) + np.float64(exp_neg_f32(a) if a < CLAMP_F32 else _ZERO)
        row_lse = np.float64(m) + np.log(total)
        if np.isnan(probe + a):
            row_lse = np.nan
        lse[i] = row_lse
        loss[i] = np.float32(row_lse - np.float64(p))


@numba.njit(parallel=True, cache=True, error_model="numpy", fastmath={"contract"})
def sampled_softmax_backward(pos, neg, log_w, hits, lse, grad, grad_pos, grad_neg):
    """``grad_neg`` (B, m) = grad_i · e^(a_ij − lse_i), 0 at a hit, and ``grad_pos`` (B,) =
    grad_i · (e^(p_i − lse_i) − 1): the gradients of Σ_i grad_i ℓ_i.

    lse_i is split into a float32 head and tail (hi + lo), so that lse − a = (hi − a) + lo
    keeps the float64 log-sum-exp's digits (as the full-softmax backward does)."""
    rows = neg.shape[0]
    shared = log_w.shape[0] == 1
    for i in numba.prange(rows):
        f, h, out = neg[i], hits[i], grad_neg[i]
        w = log_w[0] if shared else log_w[i]
        hi = np.float32(lse[i])
        lo = np.float32(lse[i] - np.float64(hi))
        g = grad[i]
        for j in range(f.shape[0]):
            a = (hi - (f[j] + w[j])) + lo
            e = exp_neg_f32(a) if a < CLAMP_F32 else _ZERO
            out[j] = _ZERO if h[j] else e * g
        a = (hi - pos[i]) + lo
        grad_pos[i] = ((exp_neg_f32(a) if a < CLAMP_F32 else _ZERO) - np.float32(1.0)) * g
