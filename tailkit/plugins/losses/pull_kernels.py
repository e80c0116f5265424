"""Compiled CPU kernels of ELM's in-batch pull term, over the same-class pairs only.

Why hand-written: the pull compares each row with the other rows of its class, about 10^4
pairs in a batch of 512 on a Zipf label set, but the torch version has to go through a
B × B Gram matrix, a second B × B product in the backward, and some twenty small indexing ops
to build the pair lists, 3–4 ms a step at C = 3,875, where the cross-entropy itself takes about
3. Here the rows are visited in label order: a class of n rows is a run of the sorted order,
and each anchor reads its n − 1 partners' rows directly (Σ n² · d multiply-adds, ~10^6), with
the softmax weights P of a run kept as an n × n block.

Per anchor i with partners j (same class, j ≠ i), on the embeddings a = z themselves (the
torch path centres them, a = z − mean(z), against the cancellation of its Gram form; the
differences here need no centre), as in :func:`tailkit.plugins.losses.pull.pull_terms`:

    v_ij = ‖a_i − a_j‖² − α_i,  Ω_i = log(1 + Σ_j e^(v_ij)),  P_ij = e^(v_ij − Ω_i),
    ∂(Σ_i g_i Ω_i)/∂a_i = 2 Σ_j (g_i P_ij + g_j P_ji)(a_i − a_j).

The squared distance is summed from the differences (no ‖a‖² + ‖b‖² − 2a·b cancellation).
Each anchor is reduced by one thread in a fixed order, so the values do not depend on the
thread count. The anchors are dealt to the threads in turn (thread t takes positions t, t + T,
…), not in halves: the label-sorted order puts a Zipf batch's big classes first (runs of 73 and
51 rows held 79 % of 10^4 pairs at C = 3,875), and contiguous halves left one thread with
nearly all of the work.

A partner whose float32 gradient weight w = 2(g_i P_ij + g_j P_ji) is subnormal (below 2^−126)
is skipped: its term w (a_i − a_j) lies below float32's resolution of any entry it would be
added to unless that entry is itself below ~1e−30, and a subnormal operand costs an FMA a
microcode assist on Intel cores (1,379 of 10^4 weights in that batch made the backward 5.6×
slower).
"""

from __future__ import annotations

import math

import numba
import numpy as np

from tailkit.native import kernel_cache  # noqa: F401  (before any cache=True kernel: its locator)
from tailkit.native.fastmath import exp_neg_f64

#: The smallest normal float32, 2^−126: a weight below it is skipped (module docstring).
_TINY = np.float32(np.finfo(np.float32).tiny)


@numba.njit(cache=True)
def class_runs(sorted_labels):
    """For each position of a label-sorted batch: the start and size of its class's run, and
    where the run's n × n block of pair weights begins (the blocks laid end to end). Returns
    (run_start, run_size, block_start, total block size)."""
    b = sorted_labels.shape[0]
    run_start = np.empty(b, dtype=np.int64)
    run_size = np.empty(b, dtype=np.int64)
    block_start = np.empty(b, dtype=np.int64)
    first = 0
    block = 0
    while first < b:
        last = first + 1
        while last < b and sorted_labels[last] == sorted_labels[first]:
            last += 1
        n = last - first
        for p in range(first, last):
            run_start[p] = first
            run_size[p] = n
            block_start[p] = block
        block += n * n
        first = last
    return run_start, run_size, block_start, block


@numba.njit(cache=True, inline="always", fastmath={"contract", "reassoc"})
def _squared_distance(x, y):
    """‖x − y‖² of two float32 rows, in float32 lanes. Rows, not a[i, k]: numba cannot tell
    that a computed i is not negative, and its wrap-around test per element kept the loop
    from vectorising."""
    acc = np.float32(0.0)
    for k in range(x.shape[0]):
        diff = x[k] - y[k]
        acc += diff * diff
    return acc


# fusion off: the second pass reads distances that other threads wrote in the first, and
# numba would fuse the two prange loops (same range) if it saw no dependence between them
# (numba takes a dict of parallel options; its type stubs say bool only)
@numba.njit(  # type: ignore[call-overload]
    parallel={"fusion": False}, cache=True, error_model="numpy", fastmath={"contract", "reassoc"}
)
def pull_forward(a, order, run_start, run_size, block_start, alpha, weights, omega, threads):
    """Ω (B,) float64 per row of ``a`` (B, d) float32, and the pair weights P: row order[p]'s
    weight on its run's q-th member at ``weights``[block_start[p] + r·n + q], r = p − its run's
    start (0 on the diagonal). A row alone in its class gets Ω = 0. ``threads``: numba's
    thread count (a cached kernel cannot ask for it), over which the anchors are dealt.

    Two passes. The first computes each unordered pair's squared distance once (‖a_i − a_j‖²
    and ‖a_j − a_i‖² are the same float32 sum) into both of its places in the run's block; the
    second turns each anchor's row of the block into v − max, its exponentials (a vectorised
    float64 exp: libm's is a call per pair) and P. The distances were half the forward."""
    b = order.shape[0]
    for t in numba.prange(threads):
        for p in range(t, b, threads):  # dealt in turn (module docstring)
            s, n = run_start[p], run_size[p]
            r = p - s
            block = weights[block_start[p] : block_start[p] + n * n]
            anchor = a[order[p]]
            block[r * n + r] = 0.0
            for q in range(r + 1, n):
                dist = np.float64(_squared_distance(anchor, a[order[s + q]]))
                block[r * n + q] = dist
                block[q * n + r] = dist
    for t in numba.prange(threads):
        for p in range(t, b, threads):
            i = order[p]
            s, n = run_start[p], run_size[p]
            r = p - s
            row = weights[block_start[p] + r * n : block_start[p] + (r + 1) * n]
            if n == 1:
                row[0] = 0.0
                omega[i] = 0.0
                continue
            shift = alpha[i]
            top = 0.0  # the 1 of log(1 + Σ e^v) is a v = 0 term: shift by max(0, max v)
            for q in range(n):
                if q != r:
                    top = max(top, row[q] - shift)
            total = math.exp(-top) + _exponentials(row, r, top, shift)
            for q in range(n):
                row[q] /= total
            row[r] = 0.0
            omega[i] = top + math.log(total)


@numba.njit(cache=True, error_model="numpy", fastmath={"contract", "reassoc"})
def _exponentials(row, r, top, shift):
    """row[q] ← e^(row[q] − shift − top) for every q, and their sum over q ≠ r (the diagonal,
    set to e^0 here, is left out)."""
    row[r] = top + shift
    for q in range(row.shape[0]):
        row[q] = exp_neg_f64(top - (row[q] - shift))
    before = 0.0
    for q in range(r):
        before += row[q]
    after = 0.0
    for q in range(r + 1, row.shape[0]):
        after += row[q]
    return before + after


@numba.njit(parallel=True, cache=True, error_model="numpy", fastmath={"contract"})
def pull_backward(a, order, run_start, run_size, block_start, weights, grad, out, threads):
    """``out`` (B, d) float32 = ∂(Σ_i grad_i Ω_i)/∂a: per row, 2 Σ_j (g_i P_ij + g_j P_ji)(a_i − a_j)
    over its class's other rows (0 for a row alone in its class); ``threads`` as in
    :func:`pull_forward`."""
    d = a.shape[1]
    b = order.shape[0]
    for t in numba.prange(threads):
        for p in range(t, b, threads):  # dealt in turn (module docstring)
            i = order[p]
            s, n = run_start[p], run_size[p]
            r = p - s
            row, ai = out[i], a[i]
            for k in range(d):
                row[k] = 0.0
            for q in range(n):
                if q == r:
                    continue
                j = order[s + q]
                both = grad[i] * weights[block_start[p] + r * n + q]
                both += grad[j] * weights[block_start[p] + q * n + r]
                w = np.float32(2.0 * both)
                if abs(w) < _TINY:  # zero or subnormal (module docstring)
                    continue
                aj = a[j]  # rows, as in _squared_distance
                for k in range(d):
                    row[k] += w * (ai[k] - aj[k])


@numba.njit(parallel=True, cache=True, error_model="numpy", fastmath={"contract", "reassoc"})
def memory_pull(z, labels, memory, filled, alpha, omega, jacobian):
    """ELM's pull against a per-class memory, read in place: per row i of ``z`` (B, d) float32
    with class c = labels[i], its partners are memory[c, m] (C, M, d) for m < filled[i].
    Ω_i (float64) → ``omega``, and ∂Ω_i/∂z_i = 2 Σ_m P_im (z_i − memory[c, m]) → ``jacobian``
    (B, d) float32. The distances do not depend on a common centre, so none is taken. The
    exponentials are :func:`_exponentials`' (a vectorised float64 exp), into one (B, M + 1)
    scratch table rather than an array allocated per row."""
    d = z.shape[1]
    scratch = np.empty((z.shape[0], memory.shape[1] + 1), dtype=np.float64)
    for i in numba.prange(z.shape[0]):
        c = labels[i]
        n = filled[i]
        row, zi = jacobian[i], z[i]
        for k in range(d):
            row[k] = 0.0
        if n == 0:
            omega[i] = 0.0
            continue
        # slot 0 holds the 1 of log(1 + Σ e^v) as v = 0 (left out of _exponentials' sum), the
        # partners' v from slot 1
        v = scratch[i, : n + 1]
        shift = alpha[i]
        top = 0.0
        for m in range(n):
            v[m + 1] = np.float64(_squared_distance(zi, memory[c, m]))
            top = max(top, v[m + 1] - shift)
        total = math.exp(-top) + _exponentials(v, 0, top, shift)
        for m in range(n):
            w = np.float32(2.0 * v[m + 1] / total)
            if w < _TINY:  # zero or subnormal (module docstring)
                continue
            slot = memory[c, m]
            for k in range(d):
                row[k] += w * (zi[k] - slot[k])
        omega[i] = top + math.log(total)


@numba.njit(cache=True)
def memory_write(z, labels, memory, written):
    """Write each row of ``z`` (B, d) into its class's ring of ``memory`` (C, M, d) in row order:
    row i of class c goes to slot written[c] mod M, then written[c] += 1, so a class with more
    than M rows in the batch keeps its last M (as :func:`tailkit.plugins.losses.pull.ring_slots`
    places them)."""
    size = memory.shape[1]
    for i in range(z.shape[0]):
        c = labels[i]
        memory[c, written[c] % size] = z[i]
        written[c] += 1
