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
