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

_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_INV_2_53 = 1.0 / 9007199254740992.0
_SMALL = 1e-200  # below this the running product is folded into the log


@numba.njit(cache=True, inline="always", fastmath=True)
def _uniform(seed, counter):
    """splitmix64(seed + counter·γ) → a float64 in [0, 1) with 53 random bits."""
    z = seed + (counter + np.uint64(1)) * _GAMMA
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    z = z ^ (z >> np.uint64(31))
    return float(z >> np.uint64(11)) * _INV_2_53


@numba.njit(cache=True, inline="always", fastmath=True)
def _node_logit(x, i, weight, bias, row):
    z = bias[row]
    for a in range(x.shape[1]):
        z += weight[row, a] * x[i, a]
    return z


@numba.njit(cache=True, inline="always", fastmath=True)
def _branch_probs(z):
    """(σ(−z), σ(z)) computed without cancellation: one exp of −|z|."""
    e = math.exp(-abs(z))
    inv = 1.0 / (1.0 + e)
    if z >= 0.0:
        return e * inv, inv
    return inv, e * inv


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
        base = np.uint64(i) * np.uint64(m)
        for level in range(depth):
            for j in range(m):
                nd = node[j]
                left, right = _branch_probs(_node_logit(x, i, weight, bias, nd - 1))
                u = _uniform(seed, (base + np.uint64(j)) * np.uint64(depth) + np.uint64(level))
                if u < right:
                    node[j] = 2 * nd + 1
                    prob[j] *= right
                else:
                    node[j] = 2 * nd
                    prob[j] *= left
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
            prob = 1.0
            log_acc = 0.0
            node = 1
            for level in range(depth):
                left, right = _branch_probs(_node_logit(x, i, weight, bias, node - 1))
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


# --- every leaf at once (prediction's bias correction) --------------------------------------
#
# Evaluation adds log p_n(y|x) to all C scores of a row, so it needs every leaf's
# log-probability: one pass over the 2^D − 1 nodes, each child = parent + log σ(±z). Three
# choices make that pass cost about what scoring the row costs:
# * the node logits z are computed for a group of rows against one block of node weights, so
#   the (2^D, k) weights stream from memory once per group, not once per row;
# * log σ is a polynomial in plain arithmetic (below), which LLVM vectorises; a call to libm's
#   exp/log1p would not be, and costs ~10 ns per node;
# * a row's values do not depend on how many rows or labels a call covers (tests compare them
#   bit for bit): the vectorised loops run over node blocks whose bounds depend on the tree
#   alone, so each node lands in the same vector lane or scalar remainder for every row; the
#   only fast-math liberty is fusing a·b + c into one FMA, which both paths take alike.

#: Multiply-adds may fuse; nothing is reordered or approximated.
_EXACT_ENOUGH = {"contract"}
#: Above this |z|, log(1 + e^(−|z|)) < 4.3e-18: the clamp changes nothing a float32 can hold.
_CLAMP = 40.0


@numba.njit(cache=True, inline="always", error_model="numpy", fastmath=_EXACT_ENOUGH)
def _log_sigmoid(z):
    """log σ(z) for a float64 z, absolute error below 1e-9, in vectorisable arithmetic.

    log σ(z) = min(z, 0) − log1p(e), e = e^(−|z|). e is (e^(−|z|/32))^32 with a degree-14
    Taylor polynomial on [0, 1.25] (relative error 2e-11 before the five squarings, 7e-10
    after); log1p(e) = 2·atanh(s), s = e/(2+e) ≤ 1/3, summed to s^19 (error < 1e-11).

    evaluation/chunk_kernels.py has the same scaled-Taylor exp (degree 10 there, for a float32
    result). Each module keeps its own on purpose: numba's on-disk cache is keyed on the
    calling module's source, so a compiled kernel would not notice an edit to a helper it
    inlined from another module.
    """
    a = min(abs(z), _CLAMP)
    u = -a * 0.03125
    p = 1.0 / 87178291200.0  # 1/14!
    p = p * u + 1.0 / 6227020800.0
    p = p * u + 1.0 / 479001600.0
    p = p * u + 1.0 / 39916800.0
    p = p * u + 1.0 / 3628800.0
    p = p * u + 1.0 / 362880.0
    p = p * u + 1.0 / 40320.0
    p = p * u + 1.0 / 5040.0
    p = p * u + 1.0 / 720.0
    p = p * u + 1.0 / 120.0
    p = p * u + 1.0 / 24.0
    p = p * u + 1.0 / 6.0
    p = p * u + 0.5
    p = p * u + 1.0
    e = p * u + 1.0
    e = e * e
    e = e * e
    e = e * e
    e = e * e
    e = e * e
    s = e / (2.0 + e)
    s2 = s * s
    q = 1.0 / 19.0
    q = q * s2 + 1.0 / 17.0
    q = q * s2 + 1.0 / 15.0
    q = q * s2 + 1.0 / 13.0
    q = q * s2 + 1.0 / 11.0
    q = q * s2 + 1.0 / 9.0
    q = q * s2 + 1.0 / 7.0
    q = q * s2 + 1.0 / 5.0
    q = q * s2 + 1.0 / 3.0
    q = q * s2 + 1.0
    return min(z, 0.0) - 2.0 * s * q


@numba.njit(cache=True, error_model="numpy", fastmath=_EXACT_ENOUGH)
def log_sigmoid(z, out):
    """The kernel's log σ over an array (float64 in, float64 out), for tests."""
    for i in range(z.shape[0]):
        out[i] = _log_sigmoid(z[i])


#: Levels of a subtree evaluated while it sits in cache: 2^12 − 1 nodes, their weights
#: (16 × 4,095 × 4 B = 256 KiB) in L2 for every row of the block, a row's partial heap
#: (32 KiB) beside them. 11 and 13 levels measured within 5 % of it; 9 levels, 20 % slower
#: (per-level loop overheads).
SUBTREE_DEPTH = 12


@numba.njit(cache=True, inline="always", error_model="numpy", fastmath=_EXACT_ENOUGH)
def _expand_level(x, i, weight_t, bias, first, width, heap, base, z, left, right):
    """Children of the ``width`` nodes first+1 … first+width (rows first … of the weights),
    whose log-probabilities sit at heap[base : base + width], into heap[base + width + …]."""
    k = x.shape[1]
    for j in range(width):
        z[j] = bias[first + j]
    # four inputs per sweep: z is loaded and stored k/4 times, not k; the additions still
    # run a = 0, 1, 2, … in order, so the rounding is that of one multiply-add per input
    quads = k - k % 4
    for a in range(0, quads, 4):
        x0, x1, x2, x3 = x[i, a], x[i, a + 1], x[i, a + 2], x[i, a + 3]
        w0 = weight_t[a, first : first + width]  # unit-stride views: the loop vectorises
        w1 = weight_t[a + 1, first : first + width]
        w2 = weight_t[a + 2, first : first + width]
        w3 = weight_t[a + 3, first : first + width]
        for j in range(width):
            z[j] = z[j] + w0[j] * x0 + w1[j] * x1 + w2[j] * x2 + w3[j] * x3
    for a in range(quads, k):
        xa = x[i, a]
        w = weight_t[a, first : first + width]
        for j in range(width):
            z[j] += w[j] * xa
    for j in range(width):
        zz = np.float64(z[j])
        ls = _log_sigmoid(zz)
        right[j] = np.float32(ls)
        left[j] = np.float32(ls - zz)
    child = base + width
    for j in range(width):
        parent = heap[base + j]
        heap[child + 2 * j] = parent + left[j]
        heap[child + 2 * j + 1] = parent + right[j]


@numba.njit(parallel=True, cache=True, error_model="numpy", fastmath=_EXACT_ENOUGH)
def subtree_roots(x, weight_t, bias, depth, out):
    """log p(node | x) of the roots of the bottom subtrees (the nodes of level
    depth − SUBTREE_DEPTH, or the root) for every row of ``x`` (B, k) → ``out`` (B, roots).

    ``weight_t`` is the node weights transposed, (k, 2^depth − 1) contiguous. A node's value
    is parent + log σ(∓z), summed root to leaf in float32 as the level-wise torch path sums
    them; :func:`subtree_leaves` goes on from here.
    """
    rows = x.shape[0]
    top = depth - min(depth, SUBTREE_DEPTH)
    roots = 1 << top
    for i in numba.prange(rows):
        heap = np.empty(2 * roots, dtype=np.float32)
        z = np.empty(max(roots // 2, 1), dtype=np.float32)
        left = np.empty_like(z)
        right = np.empty_like(z)
        heap[0] = 0.0
        for level in range(top):
            first = (1 << level) - 1
            _expand_level(x, i, weight_t, bias, first, 1 << level, heap, first, z, left, right)
        for r in range(roots):
            out[i, r] = heap[roots - 1 + r]


@numba.njit(parallel=True, cache=True, error_model="numpy", fastmath=_EXACT_ENOUGH)
def subtree_leaves(x, weight_t, bias, depth, root_lp, r_lo, r_hi, leaf_used, first_out, out):
    """log p(leaf | x) of the labelled leaves of bottom subtrees ``r_lo`` … ``r_hi`` − 1, in
    leaf order, for every row → ``out`` (B, first_out[r_hi] − first_out[r_lo]) float32.

    ``root_lp`` is :func:`subtree_roots`' output; ``leaf_used`` (2^depth,) marks the leaves
    that hold a label; ``first_out`` (roots + 1,) is the column of each subtree's first
    labelled leaf (a prefix count of ``leaf_used``). Each subtree is expanded for every row
    while its weights sit in cache, and only its labelled leaves are written.
    """
    rows = x.shape[0]
    sub = min(depth, SUBTREE_DEPTH)
    roots = 1 << (depth - sub)
    offset = first_out[r_lo]
    for r in numba.prange(r_lo, r_hi):
        heap = np.empty(2 << sub, dtype=np.float32)
        z = np.empty(1 << (sub - 1) if sub > 0 else 1, dtype=np.float32)
        left = np.empty_like(z)
        right = np.empty_like(z)
        leaf0 = r << sub
        leaves = (1 << sub) - 1
        full = first_out[r + 1] - first_out[r] == 1 << sub
        for i in range(rows):
            heap[0] = root_lp[i, r]
            for level in range(sub):
                # the subtree's level ``level``: heap rows (roots + r)·2^level − 1 … of the tree
                first = ((roots + r) << level) - 1
                base = (1 << level) - 1
                _expand_level(x, i, weight_t, bias, first, 1 << level, heap, base, z, left, right)
            col = first_out[r] - offset
            if full:  # no padding leaf: a straight copy
                out[i, col : col + (1 << sub)] = heap[leaves : leaves + (1 << sub)]
                continue
            for j in range(1 << sub):
                if leaf_used[leaf0 + j]:
                    out[i, col] = heap[leaves + j]
                    col += 1


@numba.njit(parallel=True, cache=True)
def whiten_rows(x, mean, transform, out):
    """out = (x − μ)·Tᵀ for dense rows x (B, D), T (k, D), accumulated in float64 in a fixed
    order per row: a GEMM's rounding depends on how many rows it gets, and the tree's
    log-probabilities of a row must not depend on which rows were scored with it."""
    rows, dim = x.shape
    k = transform.shape[0]
    for i in numba.prange(rows):
        for a in range(k):
            acc = 0.0
            for j in range(dim):
                acc += (np.float64(x[i, j]) - np.float64(mean[j])) * np.float64(transform[a, j])
            out[i, a] = acc
