"""One compiled pass per score chunk on the CPU: running top-k and log-sum-exp together.

Why hand-written: evaluation at large C spends its time on what follows the GEMM, not in it.
At C = 10^6 and d = 32 a row's scores take ~4 ms, while ``torch.topk`` plus a float64
``torch.logsumexp`` of the same chunk took ~18 ms (the cast alone writes 8 bytes per label, and
libm's exp is not vectorised). Here a row's chunk is read three times while it sits in L2: its
max, Σ e^(s − max) with a vectorisable polynomial exp, and a compare against the k-th best so
far, screened 256 columns at a time by a vectorised count (almost always zero, so the
element-wise test and the insertion sort of the running top-k almost never run).
``benchmarks/bench_correction.py`` times prediction with it.

Determinism: each row is reduced by one thread, in an order fixed by the chunk's length, so a
row's values do not depend on how many rows share the call. The exponentials are float32 (the
polynomial of tailkit/native/fastmath.py, shifted by the row's float32 maximum), summed in float32
lanes over blocks of 1,024 columns and the blocks in float64: a row's sum is within ~3e-7
relative of a float64 sum of float64 exponentials (what this kernel computed before, at twice
the cost of the whole merge), so a float32 log-partition moves by 0–2 ulps.
"""

from __future__ import annotations

import numba
import numpy as np

from tailkit.native import kernel_cache  # noqa: F401  (before any cache=True kernel: its locator)
from tailkit.native.fastmath import CLAMP_F32, exp_neg_f32

#: Running maxima, one per column of a 64-column stripe (see tailkit.native.row_softmax.MAX_STRIPE: the
#: element-wise max of a stripe into them vectorises, 16 unrolled maxima did not).
_MAX_STRIPE = 64


@numba.njit(cache=True, fastmath={"nnan", "nsz"})
def _row_max(s):
    n = s.shape[0]
    body = n - n % _MAX_STRIPE
    most = np.full(_MAX_STRIPE, -np.inf, dtype=s.dtype)
    for start in range(0, body, _MAX_STRIPE):
        stripe = s[start : start + _MAX_STRIPE]
        for j in range(_MAX_STRIPE):
            most[j] = max(most[j], stripe[j])
    m = -np.inf
    for j in range(_MAX_STRIPE):
        m = max(m, np.float64(most[j]))
    for j in range(body, n):
        m = max(m, np.float64(s[j]))
    return m


#: Columns whose exponentials are summed in float32 lanes before joining the row's float64
#: total (the float32 rounding then grows with the block, not with the chunk).
_SUM_BLOCK = 1024
_ZERO = np.float32(0.0)


@numba.njit(cache=True, error_model="numpy", fastmath={"contract", "reassoc"})
def _sum_exp(s, m):
    """Σ e^(s[j] − m) for the row's float32 maximum m: the float32 polynomial exp of
    tailkit/native/fastmath.py in float32 lanes, blocks of 1,024 added in float64. The float64
    exp it replaced was 0.44 of the merge's 0.64 ns a label (two cores); this takes 0.16, and
    a row's sum moves by at most ~3e-7 relative (a float32 log-partition by 0–2 ulps)."""
    mf = np.float32(m)
    total = 0.0
    probe = _ZERO  # NaN if any entry is: the compare below would drop it silently
    for start in range(0, s.shape[0], _SUM_BLOCK):
        block = s[start : start + _SUM_BLOCK]
        acc = _ZERO
        for j in range(block.shape[0]):
            a = mf - block[j]
            acc += exp_neg_f32(a) if a < CLAMP_F32 else _ZERO
            probe += a
        total += np.float64(acc)
    return np.nan if np.isnan(probe) else total


#: Columns screened at once for a top-k candidate. Past the first chunks almost no block of 256
#: holds one, so the element-wise test runs on a few blocks per row: the top-k pass went from
#: 1.2 to ~0.1 ns a label (C = 10^6, 2 cores), a third of the pass after the GEMM.
_SCREEN = 256


@numba.njit(cache=True, inline="always")
def _count_at_least(s, lo, hi, floor):
    # a slice indexed from 0: numba cannot tell that an index from range(lo, hi) is ≥ 0, and
    # its wrap-around test for a negative one kept the loop scalar (0.62 → 0.18 ns a column)
    block = s[lo:hi]
    count = 0
    for j in range(block.shape[0]):
        count += block[j] >= floor
    return count


@numba.njit(parallel=True, cache=True, error_model="numpy")
def merge_chunk(scores, labels, top_scores, top_ids, lse):
    """Fold a chunk of scores (B, c) float32, column j = label ``labels[j]`` (int64), into the
    running top-k (``top_scores`` (B, k) float32 descending, ``top_ids`` (B, k) int64) and the
    running log Σ exp (``lse`` (B,) float32), in place. Empty top-k slots hold id −1 and fill
    first; equal scores rank by the lower label id, whatever order the columns and chunks come
    in (the tree sampler's leaf order is not the label order); NaN scores give a NaN
    log-sum-exp and never enter the top-k."""
    rows, width = scores.shape
    k = top_scores.shape[1]
    for i in numba.prange(rows):
        s = scores[i]
        m = _row_max(s)
        if m == -np.inf:
            part = -np.inf
        elif np.isnan(m) or m == np.inf:
            part = m
        else:
            part = m + np.log(_sum_exp(s, m))
        old = np.float64(lse[i])
        if np.isnan(part) or np.isnan(old):
            lse[i] = np.nan
        elif part > -np.inf:
            hi, lo = max(old, part), min(old, part)
            if lo == -np.inf or hi == np.inf:
                lse[i] = np.float32(hi)
            else:
                lse[i] = np.float32(hi + np.log1p(np.exp(lo - hi)))
        best = top_scores[i]
        ids = top_ids[i]
        floor = best[k - 1]
        for lo in range(0, width, _SCREEN):
            hi = min(width, lo + _SCREEN)
            # Only v ≥ the k-th best can enter a full top-k (NaN never does): a vectorised
            # count skips the block's element-wise test, which is branchy and scalar.
            if ids[k - 1] >= 0 and _count_at_least(s, lo, hi, floor) == 0:
                continue
            for j in range(lo, hi):
                v = s[j]
                # The tie test runs only when v equals the k-th best: the hot compare is one.
                if (
                    v > floor
                    or (ids[k - 1] < 0 and not np.isnan(v))
                    or (v == floor and labels[j] < ids[k - 1])
                ):
                    label = labels[j]
                    pos = k - 1
                    while pos > 0 and (
                        ids[pos - 1] < 0
                        or best[pos - 1] < v
                        or (best[pos - 1] == v and ids[pos - 1] > label)
                    ):
                        best[pos] = best[pos - 1]
                        ids[pos] = ids[pos - 1]
                        pos -= 1
                    best[pos] = v
                    ids[pos] = label
                    floor = best[k - 1]
