"""One row of an adjusted softmax, compiled: its maximum and its sum of exponentials.

The pieces the compiled softmax kernels share (the full step's cross-entropy,
tailkit/plugins/losses/softmax_kernels.py, and the chunked step's running statistics,
tailkit/distributed/chunk_kernels.py), so that both sum a row the same way: the maximum of
f + o over a 64-column stripe of running maxima, then Σ e^(f + o − m) with the vectorisable exp
of :mod:`tailkit.native.fastmath`, in float32 lanes over blocks of 1,024 columns and the blocks
in float64 (the float32 rounding then grows with the block, about 1e-7 · √(1024/8), not with
the row's length). An entry of −∞ contributes exactly 0; a NaN anywhere gives NaN.
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
MAX_STRIPE = 64
#: Columns summed in float32 lanes before the block's sum joins the row's float64 total: the
#: float32 rounding then grows with the block (about 1e-7 · √(1024/8)), not with C.
_BLOCK = 1024
_ZERO = np.float32(0.0)


@numba.njit(cache=True, fastmath={"nnan", "nsz"})
def row_max(f, o):
    """max over j of f[j] + o[j] (float32). Whole rows only: a loop that starts past the row's
    first column measured twice as slow."""
    n = f.shape[0]
    body = n - n % MAX_STRIPE
    most = np.full(MAX_STRIPE, -np.inf, dtype=np.float32)
    for start in range(0, body, MAX_STRIPE):
        fs, os = f[start : start + MAX_STRIPE], o[start : start + MAX_STRIPE]
        for j in range(MAX_STRIPE):
            most[j] = max(most[j], fs[j] + os[j])
    m = np.float32(-np.inf)
    for j in range(MAX_STRIPE):
        m = max(m, most[j])
    for j in range(body, n):
        m = max(m, f[j] + o[j])
    return m


@numba.njit(cache=True, error_model="numpy", fastmath={"contract", "reassoc"})
def sum_exp_but(f, o, skip, m):
    """Σ over j ≠ skip of e^(f[j] + o[j] − m) for a float32 m ≥ every f[j] + o[j]; −∞ entries
    give exactly 0, and a NaN anywhere in the row gives NaN (as torch's log-softmax does, so
    a diverged step is still seen). The skipped column is masked, not split off (see
    func:`row_max`)."""
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


@numba.njit(cache=True, inline="always")
def softmax_row_into(f, o, lse, g, out):
    """out[j] = g · e^(f[j] + o[j] − lse) over a row, for a float64 ``lse`` and a float32 g: the
    softmax part of the logits' gradient, in the full step's backward and the chunked one's
    (``out`` may be ``f`` itself). lse is split into a float32 head and tail (hi + lo), so
    that lse − a = (hi − a) + lo keeps the float64 log-sum-exp's digits: rounding it to
    float32 alone would cost ~1e-6 relative in every probability of a row whose log-sum-exp
    is near 10. Inlined, it takes its caller's fast-math flags."""
    hi = np.float32(lse)
    lo = np.float32(lse - np.float64(hi))
    for j in range(f.shape[0]):
        a = (hi - (f[j] + o[j])) + lo
        out[j] = (exp_neg_f32(a) if a < CLAMP_F32 else _ZERO) * g
