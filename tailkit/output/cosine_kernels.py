"""Compiled CPU kernel of the cosine layer's weight-gradient projection (LDAM's normalised
layer, full softmax).

Why hand-written: the gradient of ŵ_j = w_j/‖w_j‖ is the incoming gradient G_j projected off
w_j and divided by ‖w_j‖, (G_j − w_j⟨w_j, G_j⟩/‖w_j‖²)/‖w_j‖. torch forms it in three passes
over the C × d table (a batched 1 × d by d × 1 product for the C dot products, a broadcast
multiply-subtract, a broadcast divide) and two small (C, 1) ones: 0.24 ms at C = 3,875, d = 128
on a 2-core AVX-512 machine, where this one pass per row takes 0.09
(``benchmarks/bench_losses.py``'s LDAM step). Each row is one thread's, its dot product summed in
float32 lanes."""

from __future__ import annotations

import numba
import numpy as np

from tailkit.native import kernel_cache  # noqa: F401  (before any cache=True kernel: its locator)

_ZERO = np.float32(0.0)


@numba.njit(parallel=True, cache=True, error_model="numpy", fastmath={"contract", "reassoc"})
def project_rows(grad, w, norm, clamped):
    """``grad`` (C, d) float32 ← (G_j − w_j⟨w_j, G_j⟩/n_j²)/n_j in place, n = ``norm`` (C,)
    float32 (already clamped at ε); where ``clamped`` (C,) bool, G_j/n_j only (the map is
    w/ε there, as autograd's normalize has it)."""
    for j in numba.prange(grad.shape[0]):
        g, row, n = grad[j], w[j], norm[j]
        along = _ZERO
        for k in range(g.shape[0]):
            along += row[k] * g[k]
        along = _ZERO if clamped[j] else along / (n * n)
        for k in range(g.shape[0]):
            g[k] = (g[k] - row[k] * along) / n
