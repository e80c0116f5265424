"""The gathered rows' gradient of a step with per-example negatives, compiled for the CPU.

Why hand-written: a step with B × m per-example negatives (the tree sampler's, Bamler & Mandt)
scores each row against its own m gathered rows, and autograd's backward of that materialises
three dense tables to produce the rows' gradient: the (B, m, d) outer products of the batched
product's backward, and a zero (rows, d) table per gather (positives and negatives) that
``index_add_`` fills and that are then added. At B = 1,024, m = 16, d = 128 and C = 10^6 those
took ~3 ms of a 14 ms step on a 2-core AVX-512 machine (benchmarks/bench_sampler.py), moving some 50
MB. Here each gathered row's gradient is summed from the step's few contributions and written once.

The sums are autograd's bit for bit: each product g·z is one float32 multiplication, as the
backward of the batched product (an inner dimension of 1) and of the positive's elementwise
product form it; each row adds its negatives' products in flat (i, j) order to a zero row and
its positives' in row order, as ``index_add_`` does, and the two partial sums are then added,
as autograd adds the two gathers' tables. No fast-math: a fused multiply-add would round once
where autograd rounds twice.
"""

from __future__ import annotations

import numba
import numpy as np

from tailkit.native import kernel_cache  # noqa: F401  (before any cache=True kernel: its locator)
from tailkit.native.grouping import group_by

#: Gathered rows per parallel task: each task allocates one scratch row (an allocation per
#: row cost more than the sums at 16,000 rows).
_ROWS_PER_TASK = 256


@numba.njit(parallel=True, cache=True)
def per_example_rows_gradient(z, grad_pos, grad_neg, pos_idx, neg_idx, grad_weight, grad_bias):
    """``grad_weight`` (rows, d) and ``grad_bias`` (rows,) of the gathered rows, for
    pos_i = z_i·w[pos_idx[i]] + b[pos_idx[i]] and neg_ij = z_i·w[neg_idx[i, j]] + b[neg_idx[i, j]]
    with incoming gradients ``grad_pos`` (B,) and ``grad_neg`` (B, m); ``z`` (B, d). Row u gets
    (0 + Σ_i gp_i z_i) + (0 + Σ_(i,j) gn_ij z_i) over its positive rows in row order and its
    negatives in flat order (and likewise without z for the bias)."""
    rows, d = grad_weight.shape
    m = neg_idx.shape[1]
    pos_order, pos_starts = group_by(pos_idx, rows)
    neg_order, neg_starts = group_by(neg_idx.reshape(-1), rows)
    zero = grad_weight.dtype.type(0.0)
    blocks = (rows + _ROWS_PER_TASK - 1) // _ROWS_PER_TASK
    for block in numba.prange(blocks):
        neg_sum = np.empty(d, dtype=grad_weight.dtype)  # one scratch row per task, not per row
        for u in range(block * _ROWS_PER_TASK, min(rows, (block + 1) * _ROWS_PER_TASK)):
            out = grad_weight[u]
            neg_bias = zero
            for k in range(d):
                neg_sum[k] = zero
            for q in range(neg_starts[u], neg_starts[u + 1]):
                p = neg_order[q]
                g, zi = grad_neg[p // m, p % m], z[p // m]
                for k in range(d):
                    neg_sum[k] += g * zi[k]
                neg_bias += g
            pos_bias = zero
            for k in range(d):
                out[k] = zero
            for q in range(pos_starts[u], pos_starts[u + 1]):
                i = pos_order[q]
                g, zi = grad_pos[i], z[i]
                for k in range(d):
                    out[k] += g * zi[k]
                pos_bias += g
            for k in range(d):
                out[k] = out[k] + neg_sum[k]
            grad_bias[u] = pos_bias + neg_bias
