"""Compiled CPU kernels of the adjusted softmax cross-entropy: the loss in one read of the logits,
the gradient in one read and one write.

Why hand-written: on the CPU a full-softmax step spends what is not GEMM in (B, C) passes, and
torch's ``log_softmax`` with its backward makes five or six of them (max, sum of exponentials,
the written log-probabilities, their exp, the scaling, the one-hot) and keeps a (B, C) tensor
for the backward; an offset table or a target margin (logit adjustment, balanced softmax,
LDAM, ELM, DRO-LT) adds one more pass and one more (B, C) tensor. Here the forward reads a row
twice while it sits in L2 (its max, then Σ e^(a − max) with the vectorisable exp of
:mod:`tailkit.native.fastmath`) and keeps only the row's log-sum-exp; the backward recomputes
e^(a − lse) as it writes the gradient. ``benchmarks/bench_losses.py`` measures the step.

With a_ij = f_ij + o_j (+ s_i at j = y_i), everything in float32 as torch would add it, the
exponentials summed in float32 lanes over blocks of 1,024 columns and the blocks in float64:
lse_i = m_i + log Σ_j e^(a_ij − m_i), ℓ_i = lse_i − a_{i y_i},
∂ℓ_i/∂f_ij = e^(a_ij − lse_i) − [j = y_i]. Each row is reduced by one thread in a fixed order,
so the values do not depend on the thread count. An entry with a = −∞ (balanced softmax's
unseen classes) contributes exactly 0 to the sum and to the gradient.
"""

from __future__ import annotations

import numba
import numpy as np

from tailkit.native import kernel_cache  # noqa: F401  (before any cache=True kernel: its locator)
from tailkit.native.fastmath import CLAMP_F32, exp_neg_f32

#: Running maxima kept in a block of memory, one per column of a 64-column stripe: LLVM does
#: not vectorise a max reduction (it needs a function-wide no-NaN attribute numba does not
#: set), but it does vectorise the element-wise max of a stripe into the block. 16 running
#: maxima unrolled instead stayed scalar, each stored back every step (the block may alias the
#: row as far as LLVM knows): 0.42 → 0.20 ns an entry, one core (B = 512, C = 3,875).
_MAX_STRIPE = 64
#: Columns summed in float32 lanes before the block's sum joins the row's float64 total: the
#: float32 rounding then grows with the block (about 1e-7 · √(1024/8)), not with C.
_BLOCK = 1024
_ZERO = np.float32(0.0)


@numba.njit(cache=True, fastmath={"nnan", "nsz"})
def _row_max(f, o):
    """max over j of f[j] + o[j] (float32). Whole rows only: a loop that starts past the row's
    first column measured twice as slow."""
    n = f.shape[0]
    body = n - n % _MAX_STRIPE
    most = np.full(_MAX_STRIPE, -np.inf, dtype=np.float32)
    for start in range(0, body, _MAX_STRIPE):
        fs, os = f[start : start + _MAX_STRIPE], o[start : start + _MAX_STRIPE]
        for j in range(_MAX_STRIPE):
            most[j] = max(most[j], fs[j] + os[j])
    m = np.float32(-np.inf)
    for j in range(_MAX_STRIPE):
        m = max(m, most[j])
    for j in range(body, n):
        m = max(m, f[j] + o[j])
    return m


@numba.njit(cache=True, error_model="numpy", fastmath={"contract", "reassoc"})
def _sum_exp_but(f, o, skip, m):
    """Σ over j ≠ skip of e^(f[j] + o[j] − m) for a float32 m ≥ every f[j] + o[j]; −∞ entries
    give exactly 0, and a NaN anywhere in the row gives NaN (as torch's log-softmax does, so
    a diverged step is still seen). The skipped column is masked, not split off (see
    :func:`_row_max`)."""
    n = f.shape[0]
    total = 0.0
    probe = _ZERO  # NaN if any entry is: the max and the compare above would drop it silently
    for start in range(0, n, _BLOCK):
        # slices indexed from 0: numba cannot tell that start + j ≥ 0, and its wrap-around
        # test for a negative index kept this loop scalar (1.6 → 1.0 ns an entry, one core)
        fb, ob = f[start : start + _BLOCK], o[start : start + _BLOCK]
        if start <= skip < start + _BLOCK:
            acc, part = _block_sum_exp_but(fb, ob, skip - start, m)
        else:
            acc, part = _block_sum_exp(fb, ob, m)
        total += np.float64(acc)
        probe += part
    return np.nan if np.isnan(probe) else total


# Two copies of one loop: the mask's lane-by-lane compare of 64-bit indices cost more than the
# exponentials (the sum 1.02 → 0.84 ms a batch on one core, B = 512, C = 3,875), and only the
# label's block needs it. Same lanes, same order, so the same sums as masking every block.
@numba.njit(cache=True, error_model="numpy", fastmath={"contract", "reassoc"})
def _block_sum_exp(fb, ob, m):
    acc = _ZERO
    probe = _ZERO
    for j in range(fb.shape[0]):
        a = m - (fb[j] + ob[j])
        acc += exp_neg_f32(a) if a < CLAMP_F32 else _ZERO
        probe += a
    return acc, probe


@numba.njit(cache=True, error_model="numpy", fastmath={"contract", "reassoc"})
def _block_sum_exp_but(fb, ob, skip, m):
    acc = _ZERO
    probe = _ZERO
    for j in range(fb.shape[0]):
        a = m - (fb[j] + ob[j])
        acc += exp_neg_f32(a) if (a < CLAMP_F32 and j != skip) else _ZERO
        probe += a
    return acc, probe


@numba.njit(parallel=True, cache=True, error_model="numpy")
def cross_entropy_forward(logits, offsets, labels, shift, lse, loss):
    """Per row of ``logits`` (B, C) float32: ``lse`` (B,) float64 and ``loss`` (B,) float32, with
    ``offsets`` (C,) added to every row and ``shift`` (B,) to each row's label entry."""
    for i in numba.prange(logits.shape[0]):
        f = logits[i]
        y = labels[i]
        target = (f[y] + offsets[y]) + shift[i]
        # max over the unshifted row and the shifted target: an upper bound of every term
        # summed, above the largest by at most |shift|
        m = max(_row_max(f, offsets), target)
        a = m - target
        total = _sum_exp_but(f, offsets, y, m) + np.float64(
            exp_neg_f32(a) if a < CLAMP_F32 else _ZERO
        )
        row_lse = np.float64(m) + np.log(total)
        lse[i] = row_lse
        loss[i] = np.float32(row_lse - np.float64(target))


@numba.njit(parallel=True, cache=True, error_model="numpy", fastmath={"contract"})
def cross_entropy_backward(logits, offsets, labels, shift, lse, grad, out):
    """``out`` (B, C) float32 = grad_i · (e^(a_ij − lse_i) − [j = y_i]), the gradient of
    Σ_i grad_i ℓ_i with respect to the logits.

    lse_i is split into a float32 head and tail (hi + lo), so that lse − a = (hi − a) + lo
    keeps the float64 log-sum-exp's digits: rounding lse to float32 alone would cost ~1e-6
    relative in every probability of a row whose log-sum-exp is near 10.
    """
    rows, width = logits.shape
    for i in numba.prange(rows):
        f = logits[i]
        o = out[i]
        hi = np.float32(lse[i])
        lo = np.float32(lse[i] - np.float64(hi))
        g = grad[i]
        for j in range(width):
            a = (hi - (f[j] + offsets[j])) + lo
            o[j] = (exp_neg_f32(a) if a < CLAMP_F32 else _ZERO) * g
        y = labels[i]
        a = (hi - ((f[y] + offsets[y]) + shift[i])) + lo
        o[y] = ((exp_neg_f32(a) if a < CLAMP_F32 else _ZERO) - np.float32(1.0)) * g
