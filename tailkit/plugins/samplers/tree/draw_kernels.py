"""Compiled CPU kernels of the label tree: ancestral sampling and path log-probabilities.

Why hand-written: the same walk in eager torch (gather the node rows, dot, sigmoid, compare,
level by level) runs at 1–2 M draws/s at depth 20 on the 2-core machine (performance.md §4.4),
as slow as the training step it serves. Here one draw is D dependent steps of a 16-float dot
product, one exp and a compare, and the draws of a block advance level by level together so
the out-of-order core overlaps their cache misses on the deep levels.

Randomness: a counter-based generator (splitmix64 of seed + draw·D + level), so a draw does not
depend on how the work is split between threads, and the caller's ``torch.Generator`` supplies
the one 62-bit seed per call. Uniforms have 53 random bits.

Path probabilities are accumulated as a float64 product of the chosen branch probabilities,
renormalised into a log when it gets small, so sampling and :func:`path_log_prob` compute
bit-identical log q for the same (x, label).
"""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

from tailkit.native import kernel_cache  # noqa: F401  (before any cache=True kernel: its locator)
from tailkit.native.fastmath import exp_neg_f32

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_INV_2_53 = 1.0 / 9007199254740992.0
_SMALL = 1e-200  # below this the running product is folded into the log


@intrinsic
def _prefetch(typingctx, array, index):
    """Ask the cache for element ``index`` of a 1- or 2-D array (its row, for 2-D) ahead of its
    use (LLVM's prefetch: read, keep in every level); no effect on any value."""
    if not isinstance(array, types.Array) or not isinstance(index, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        array_type = signature.args[0]
        ary = context.make_array(array_type)(context, builder, args[0])
        at = context.cast(builder, args[1], signature.args[1], types.intp)
        zero = context.get_constant(types.intp, 0)
        indices = [at] + [zero] * (array_type.ndim - 1)
        pointer = cgutils.get_item_pointer(
            context, builder, array_type, ary, indices, wraparound=False
        )
        byte = ir.IntType(8).as_pointer()
        i32 = ir.IntType(32)
        declared = cgutils.get_or_insert_function(
            builder.module,
            ir.FunctionType(ir.VoidType(), [byte, i32, i32, i32]),
            "llvm.prefetch.p0",
        )
        flags = [ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)]
        builder.call(declared, [builder.bitcast(pointer, byte), *flags])
        return context.get_dummy_value()

    return types.void(array, index), codegen


@numba.njit(cache=True, inline="always", fastmath=True)
def _uniform(seed, counter):
    """splitmix64(seed + counter·γ) → a float64 in [0, 1) with 53 random bits."""
    z = seed + (counter + np.uint64(1)) * _GAMMA
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    z = z ^ (z >> np.uint64(31))
    return float(z >> np.uint64(11)) * _INV_2_53


@numba.njit(cache=True, inline="always", fastmath=True)
def _node_logit(xi, w, b):
    """b + w·xi for a row ``xi`` and a node's weight row ``w``: rows, so numba tests a node
    index for wrap-around once, not once per input."""
    z = b
    for a in range(xi.shape[0]):
        z += w[a] * xi[a]
    return z


@numba.njit(cache=True, inline="always", fastmath=True)
def _branch_probs(z, e):
    """(σ(−z), σ(z)) computed without cancellation from e = e^(−|z|). The draws' step and
    :func:`path_log_prob` both form them here, so a drawn label's log q is log_prob's bit for
    bit."""
    inv = 1.0 / (1.0 + e)
    if z >= 0.0:
        return e * inv, inv
    return inv, e * inv


@numba.njit(cache=True, inline="always", fastmath=True)
def _steps(z, e, node, prob, seed, base, depth, level, weight, bias):
    """One level's step of a row's draws: each goes right with probability σ(z[j]), and its
    path probability takes the branch's. e^(−|z|) first, for all the draws in one loop (the
    float32 polynomial exp of tailkit/native/fastmath.py, which vectorises; libm's exp per draw was
    most of a step's time), then the coin flips as selects, not branches."""
    m = z.shape[0]
    for j in range(m):
        e[j] = exp_neg_f32(abs(z[j]))
    for j in range(m):
        left, right = _branch_probs(z[j], e[j])
        u = _uniform(seed, (base + np.uint64(j)) * np.uint64(depth) + np.uint64(level))
        go = u < right
        node[j] = 2 * node[j] + (1 if go else 0)
        prob[j] *= right if go else left
    for j in range(m):
        # the next level's two candidates (rows 2ν − 1 and 2ν of the chosen ν's children) are
        # fetched a level early: at depth 20 the deep levels are cache misses
        child = 2 * node[j] - 1
        if child + 1 < weight.shape[0]:
            _prefetch(weight, child)
            _prefetch(weight, child + 1)
            _prefetch(bias, child)


@numba.njit(parallel=True, cache=True, fastmath=True)
def sample_paths(x, weight, bias, label_of_leaf, depth, m, seed, out_ids, out_log_q):
    """Draw ``m`` labels per row of ``x`` (B, k): ids (B, m) int64 and log q (B, m) float32.

    Node ν (heap numbering) is row ν − 1 of ``weight``/``bias``; going right (bit 1) has
    probability σ(w·x + b), and the leaf is the last node minus 2^depth.
    """
    rows = x.shape[0]
    seed = np.uint64(seed)
    leaves = 1 << depth
    for i in numba.prange(rows):
        node = np.ones(m, dtype=np.int64)
        prob = np.ones(m)
        log_acc = np.zeros(m)
        z = np.empty(m, dtype=x.dtype)
        e = np.empty(m, dtype=np.float32)
        xi = x[i]
        base = np.uint64(i) * np.uint64(m)
        for level in range(depth):
            # A level in two passes over the row's draws: first every node logit, then every
            # step. One pass per draw made each level one chain of dependent work (load, dot,
            # exp, divide, compare) that the core did not overlap across draws; apart, the
            # draws' loads (cache misses at depth 20) and their arithmetic overlap: 1.3-1.5x
            # the draws/s on two cores at C = 10^4 … 10^6, the same draws bit for bit (with
            # an if/else per step instead of the selects below, no faster than one pass).
            for j in range(m):
                z[j] = _node_logit(xi, weight[node[j] - 1], bias[node[j] - 1])
            _steps(z, e, node, prob, seed, base, depth, level, weight, bias)
            for j in range(m):
                if prob[j] < _SMALL:
                    log_acc[j] += math.log(prob[j])
                    prob[j] = 1.0
        for j in range(m):
            out_ids[i, j] = label_of_leaf[node[j] - leaves]
            out_log_q[i, j] = log_acc[j] + math.log(prob[j])


@numba.njit(parallel=True, cache=True, fastmath=True)
def path_log_prob(x, weight, bias, leaf, depth, out):
    """log p(leaf | x) for leaves (B, n) given per row, or (1, n) shared by all rows → (B, n)."""
    rows = x.shape[0]
    n = leaf.shape[1]
    per_row = 1 if leaf.shape[0] > 1 else 0
    leaves = 1 << depth
    for i in numba.prange(rows):
        r = i * per_row
        for j in range(n):
            target = leaf[r, j] + leaves
            # the path is known before it is walked: ask for all of its nodes at once, so the
            # deep levels' cache misses overlap instead of coming one after the other
            for level in range(depth):
                _prefetch(weight, (target >> (depth - level)) - 1)
                _prefetch(bias, (target >> (depth - level)) - 1)
            prob = 1.0
            log_acc = 0.0
            node = 1
            for level in range(depth):
                z = _node_logit(x[i], weight[node - 1], bias[node - 1])
                left, right = _branch_probs(z, exp_neg_f32(abs(z)))
                if (target >> (depth - 1 - level)) & 1:
                    node = 2 * node + 1
                    prob *= right
                else:
                    node = 2 * node
                    prob *= left
                if prob < _SMALL:
                    log_acc += math.log(prob) if prob > 0.0 else -math.inf
                    prob = 1.0
            out[i, j] = log_acc + math.log(prob)


@numba.njit(parallel=True, cache=True)
def whiten_rows(x, mean, transform_t, out):
    """out = (x − μ)·Tᵀ for dense rows x (B, D), with ``transform_t`` = Tᵀ (D, k) contiguous,
    accumulated in float64 in a fixed order per row: a GEMM's rounding depends on how many
    rows it gets, and the tree's log-probabilities of a row must not depend on which rows were
    scored with it.

    Each of a row's k sums runs over j = 0, 1, … in order, but the k sums advance together (the
    inner loop over Tᵀ's row j vectorises): one sum at a time, each was a chain of D dependent
    additions, 1.3 ms of a 1,024-row draw at D = 128 (two cores), longer than the draws
    themselves; now ~0.3 ms, the same values bit for bit (and 17 → 6 ms for μ·Tᵀ over the
    830,909 GeoNames cells)."""
    rows, dim = x.shape
    k = transform_t.shape[1]
    for i in numba.prange(rows):
        acc = np.zeros(k)
        xi = x[i]
        for j in range(dim):
            centred = np.float64(xi[j]) - np.float64(mean[j])
            weights = transform_t[j]
            for a in range(k):
                acc[a] = acc[a] + centred * np.float64(weights[a])
        row = out[i]
        for a in range(k):
            row[a] = acc[a]
