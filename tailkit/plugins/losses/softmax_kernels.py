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
from tailkit.native.row_softmax import row_max, softmax_row_into, sum_exp_but

_ZERO = np.float32(0.0)


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
        m = max(row_max(f, offsets), target)
        a = m - target
        total = sum_exp_but(f, offsets, y, m) + np.float64(
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
    for i in numba.prange(logits.shape[0]):
        f = logits[i]
        o = out[i]
        g = grad[i]
        softmax_row_into(f, offsets, lse[i], g, o)
        hi = np.float32(lse[i])
        lo = np.float32(lse[i] - np.float64(hi))
        y = labels[i]
        a = (hi - ((f[y] + offsets[y]) + shift[i])) + lo
        o[y] = ((exp_neg_f32(a) if a < CLAMP_F32 else _ZERO) - np.float32(1.0)) * g
