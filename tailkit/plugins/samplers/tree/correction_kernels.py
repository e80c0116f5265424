"""Compiled CPU kernels of the label tree's prediction-time correction: log p_n(y|x) of every
label for a block of rows (Bamler & Mandt's + log p_n), laid out so that each bottom subtree
is expanded once per row while its weights sit in cache.

Why hand-written: the torch form builds the whole (B, C) table level by level and holds it; here
the top levels are expanded once per row (``subtree_roots``) and each label chunk expands only
the subtrees under its columns (``subtree_leaves``), in the column order of
``kernel_layout`` (labels by leaf), into the chunk's scores in the same pass.
"""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from tailkit.native import kernel_cache  # noqa: F401  (before any cache=True kernel: its locator)
from tailkit.native.fastmath import EXACT_ENOUGH, log_sigmoid_array, softplus_neg_f32
from tailkit.native.vector_width import prefer_512_bit_vectors

# --- every leaf at once (prediction's bias correction) --------------------------------------
#
# Evaluation adds log p_n(y|x) to all C scores of a row, so it needs every leaf's
# log-probability: one pass over the 2^D − 1 nodes, each child = parent + log σ(∓z). Choices
# that make that pass cost about what scoring the row costs:
# * the node logits z are computed for a group of rows against one block of node weights, so
#   the (2^D, k) weights stream from memory once per group, not once per row;
# * within the group, ``ROW_GROUP`` rows share each load of a node weight: the multiply-adds
#   of one input are four per load, not one;
# * log σ is a float32 polynomial in plain arithmetic (tailkit/native/fastmath.py), which LLVM
#   vectorises; a call to libm's exp/log1p would not be, and costs ~10 ns per node;
# * the nodes sit in *kernel order* (:func:`kernel_layout`): a node's two children are not
#   side by side but in the two halves of the next level (left children first), so a level's
#   children are two straight vector stores, not an interleaved pair that LLVM left scalar;
#   within a level (of the top tree, or of one bottom subtree) that puts a node at the
#   bit-reversal of its index. Level l starts at index 2^l, so the slices of the deep levels
#   start on cache lines, and every loop runs over unit-stride slices indexed from 0: an index
#   such as ``base + j`` may be negative as far as numba knows, and its wrap-around code kept
#   the loops it sat in scalar. Together 4.1–4.7 → 2.0–2.4 ns per node and row on one core of
#   an AVX-512 machine (C = 10^4, 10^5), the same float32 values (the previous heap-order kernel's,
#   bit for bit). Tried and dropped: eight inputs per sweep instead of four, and the leaves' copy
#   four rows per slot load (both within noise or slower);
# * a row's values do not depend on how many rows or labels a call covers (tests compare them
#   bit for bit): every row takes the same operations in the same vector lanes whichever group
#   slot it sits in (a short last group repeats its last row), the vectorised loops run over
#   node blocks whose bounds depend on the tree alone, and the only fast-math liberty is
#   fusing a·b + c into one FMA, which every path takes alike;
# * 512-bit vectors (tailkit/native/vector_width.py): LLVM's Intel tuning keeps loops at 256 bits,
#   and this kernel is vector loops end to end. With no re-association the width moves no
#   value (the same bits, checked against the 256-bit build at C = 10^5 and 10^6); one core of
#   an AVX-512 machine, C = 10^6, 256 rows in one call over all labels, medians of 5 side by side:
#   2.32 → 1.98 ms a row;
# * the leaves' parents only where a label needs them (:func:`kernel_layout`): a fitted tree
#   holds C labels in 2^⌈log2 C⌉ leaves, its balanced splits leave one or two labels under
#   each node of the last level, and a one-label node routes right with w = 0, so its child
#   is its parent plus a constant. Those nodes fall outside one run per subtree in kernel
#   order, and the run alone is computed. The last level is half the nodes, so a tree whose C
#   is just above a power of two does up to half the work: at C = 10^4 (452 of each
#   subtree's 2,048 last-level nodes computed) and 10^5 (1,077) the correction costs ~25 %
#   less, at 10^6 (1,858) a few percent; the same bits (tests compare the whole level's);
# * row blocks near-equal and a multiple of the threads in number (an odd count of 16-group
#   blocks left one core idle for a block's time: a 312-row tile, one of two that
#   bench_correction's 625 rows make at C = 10^5, was 5 blocks of up to 16 groups, now 6 of 13).

_ZERO = np.float32(0.0)


#: Levels of a subtree evaluated while it sits in cache: 2^12 − 1 nodes, their weights
#: (16 × 4,095 × 4 B = 256 KiB) in L2 for every row of the block, a row group's partial heaps
#: (4 × 32 KiB) beside them. 11 and 13 levels measured within 5 % of it; 9 levels, 20 % slower
#: (per-level loop overheads).
SUBTREE_DEPTH = 12
#: Rows that share each load of a node weight (4: 16 input values and 4 weights in registers).
ROW_GROUP = 4
#: Row groups per parallel task of :func:`subtree_leaves`: 64 rows re-read a subtree's weights
#: (256 KiB) once, a few percent of their expansion.
GROUPS_PER_TASK = 16


def _bit_reversed(values: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """Each value's lowest ``bits`` bits in reverse order (elementwise; bits ≤ 62)."""
    out = np.zeros_like(values)
    for b in range(int(bits.max(initial=0))):
        inside = b < bits
        bit = (values >> b) & 1
        out |= np.where(inside, bit << np.maximum(bits - 1 - b, 0), 0)
    return out


class KernelLayout(NamedTuple):
    """The tree in the order the all-leaves kernels read it (:func:`kernel_layout`)."""

    weight: np.ndarray  # (k, 2^D) float32 node weights, transposed, in kernel order
    bias: np.ndarray  # (2^D,) float32
    slot: np.ndarray  # (C,) uint32: each labelled leaf's index in its subtree's row heap
    first_out: np.ndarray  # (roots + 1,) int64: the first column of each bottom subtree
    computed: np.ndarray  # (roots, 2) int64: the positions [lo, hi) of the last level computed
    delta: np.ndarray  # (roots, 2^(S−1)) float32: a pass-through node's constant log σ


def kernel_layout(
    weight: np.ndarray,
    bias: np.ndarray,
    label_of_leaf: np.ndarray,
    depth: int,
    *,
    pass_through: bool = True,
) -> KernelLayout:
    """The tree's tables in the order the all-leaves kernels read them.

    ``weight`` (2^D − 1, k) and ``bias`` in heap order (node n's children 2n + 1, 2n + 2),
    ``label_of_leaf`` (2^D,) with −1 at padding leaves. The node weights come transposed,
    (k, 2^D) float32, and the biases (2^D,), with node n at its kernel index (column 0 unused):
    level L starts at 2^L; a top level (L < D − SUBTREE_DEPTH) holds its nodes at the
    bit-reversal of their index in the level, a bottom level holds each subtree's nodes in
    turn, each at the bit-reversal of its index within the subtree's level.

    The last level of nodes (the leaves' parents) is where a fitted tree's padding sits: its
    balanced splits leave 1 or 2 labels under each, and a one-label node routes right with
    w = 0, b = +1000 (fit.py). Such a *pass-through* node's logit is b for every finite x
    (an infinite x̃ would make 0·x̃ NaN in the full computation), so its labelled child is
    parent + a constant log σ (``delta``, by position in the level) and needs no dot product
    and no log σ; a node with no labelled child needs nothing. In kernel
    order (bit-reversed) a fitted tree's two-label nodes are one run at the end of each
    subtree's part of the level, so the kernel computes the positions ``computed[r]`` = [lo,
    hi) of subtree r, the smallest range holding every node that is neither, as it computes a
    whole level, and writes each pass-through child outside it in its left child's place.

    ``slot`` is each labelled leaf's index in its subtree's row heap, in leaf order (the column
    order of the correction): 2^S + p for the left child of the node at position p of the last
    level and for a pass-through child outside ``computed``, 2^S + 2^(S−1) + p for any other
    right child (S the subtree depth). ``first_out`` is the first column of each subtree.
    ``pass_through=False`` computes every node of the last level, as the kernel did before
    (tests compare the two).
    """
    sub = min(depth, SUBTREE_DEPTH)
    top = depth - sub
    nodes = (1 << depth) - 1
    n = np.arange(nodes, dtype=np.int64)
    level = np.floor(np.log2(n + 1)).astype(np.int64)
    level += (1 << (level + 1)) <= n + 1  # float log2 of 2^L − 1 may round up to L
    level -= (1 << level) > n + 1
    index = n + 1 - (1 << level)
    below = np.maximum(level - top, 0)  # levels into a bottom subtree (0 in the top tree)
    local = index & ((1 << below) - 1)
    subtree = index >> below
    in_top = level < top
    position = np.where(
        in_top,
        _bit_reversed(index, level),
        (subtree << below) + _bit_reversed(local, below),
    )
    kernel_index = (1 << level) + position
    k = weight.shape[1]
    weight_k = np.zeros((k, 1 << depth), dtype=np.float32)
    weight_k[:, kernel_index] = weight.T
    bias_k = np.zeros(1 << depth, dtype=np.float32)
    bias_k[kernel_index] = bias
    # the last level: which nodes the kernel must compute
    width, roots = 1 << (sub - 1), 1 << top
    parent = (1 << (depth - 1)) - 1 + np.arange(1 << (depth - 1), dtype=np.int64)  # heap ids
    labelled = (label_of_leaf >= 0).reshape(-1, 2)  # (left, right) child of each
    halves = np.empty((2, parent.size), dtype=np.float32)
    log_sigmoid_array(np.asarray(bias, dtype=np.float32)[parent], halves)  # the kernel's form
    passes = ~np.asarray(weight)[parent].any(axis=1) & (labelled.sum(axis=1) == 1)
    passes &= pass_through
    needed = labelled.any(axis=1) & ~passes
    at = position[parent]  # r·2^(S−1) + position within the subtree's part
    p_of = at & (width - 1)
    delta = np.zeros((roots, width), dtype=np.float32)
    delta.reshape(-1)[at] = np.where(passes, np.where(labelled[:, 1], halves[0], halves[1]), 0)
    lo = np.full(roots, width, dtype=np.int64)
    hi = np.zeros(roots, dtype=np.int64)
    r_of = at >> (sub - 1)
    np.minimum.at(lo, r_of[needed], p_of[needed])
    np.maximum.at(hi, r_of[needed], p_of[needed] + 1)
    lo = np.minimum(lo, hi)  # a subtree with nothing to compute: an empty range
    if not pass_through:
        lo[:], hi[:] = 0, width
    outside = passes & ((p_of < lo[r_of]) | (p_of >= hi[r_of]))  # inside: computed as any
    leaf = np.flatnonzero(label_of_leaf >= 0)
    pair, right = leaf >> 1, leaf & 1
    slot = (1 << sub) + np.where(outside[pair], 0, right * width) + p_of[pair]
    per_subtree = np.bincount(leaf >> sub, minlength=roots)
    first_out = np.concatenate([[0], np.cumsum(per_subtree)]).astype(np.int64)
    return KernelLayout(
        weight_k, bias_k, slot.astype(np.uint32), first_out, np.stack([lo, hi], axis=1), delta
    )


@numba.njit(cache=True, inline="always")
def _row_group(x, rows, g, xg):
    """Rows g·4 … of ``x`` into ``xg`` (4, k); a short last group repeats its last row."""
    for s in range(ROW_GROUP):
        i = min(g * ROW_GROUP + s, rows - 1)
        for a in range(x.shape[1]):
            xg[s, a] = x[i, a]


@numba.njit(cache=True, inline="always", error_model="numpy", fastmath=EXACT_ENOUGH)
def _node_logits(xg, weight_k, bias_k, first, count, z):
    """z[s, :count] = the logits of the nodes whose weights are columns first … first + count
    − 1 of ``weight_k`` (kernel order), for each row slot s of the group ``xg`` (4, k)."""
    k = xg.shape[1]
    z0, z1, z2, z3 = z[0, :count], z[1, :count], z[2, :count], z[3, :count]
    b = bias_k[first : first + count]
    for j in range(count):
        z0[j] = b[j]
        z1[j] = b[j]
        z2[j] = b[j]
        z3[j] = b[j]
    # four inputs per sweep, four rows per weight load; each z still adds a = 0, 1, 2, … in
    # order, so the rounding is that of one multiply-add per input, whatever the grouping
    quads = k - k % 4
    for a in range(0, quads, 4):
        w0 = weight_k[a, first : first + count]  # unit-stride views: the loop vectorises
        w1 = weight_k[a + 1, first : first + count]
        w2 = weight_k[a + 2, first : first + count]
        w3 = weight_k[a + 3, first : first + count]
        x00, x01, x02, x03 = xg[0, a], xg[0, a + 1], xg[0, a + 2], xg[0, a + 3]
        x10, x11, x12, x13 = xg[1, a], xg[1, a + 1], xg[1, a + 2], xg[1, a + 3]
        x20, x21, x22, x23 = xg[2, a], xg[2, a + 1], xg[2, a + 2], xg[2, a + 3]
        x30, x31, x32, x33 = xg[3, a], xg[3, a + 1], xg[3, a + 2], xg[3, a + 3]
        for j in range(count):
            v0, v1, v2, v3 = w0[j], w1[j], w2[j], w3[j]
            z0[j] = z0[j] + v0 * x00 + v1 * x01 + v2 * x02 + v3 * x03
            z1[j] = z1[j] + v0 * x10 + v1 * x11 + v2 * x12 + v3 * x13
            z2[j] = z2[j] + v0 * x20 + v1 * x21 + v2 * x22 + v3 * x23
            z3[j] = z3[j] + v0 * x30 + v1 * x31 + v2 * x32 + v3 * x33
    for a in range(quads, k):
        w = weight_k[a, first : first + count]
        for s in range(ROW_GROUP):
            xa = xg[s, a]
            zs = z[s, :count]
            for j in range(count):
                zs[j] += w[j] * xa


@numba.njit(cache=True, inline="always", error_model="numpy", fastmath=EXACT_ENOUGH)
def _expand(xg, weight_k, bias_k, first, count, parents, left, right, z):
    """The children of ``count`` nodes whose weights are columns first … of ``weight_k``
    (kernel order) and whose log-probabilities are ``parents`` (4, ≥ count), for each row
    slot s of the group ``xg`` (4, k): left children into ``left``, right into ``right``."""
    _node_logits(xg, weight_k, bias_k, first, count, z)
    for s in range(ROW_GROUP):
        zs, up = z[s, :count], parents[s, :count]
        lefts, rights = left[s, :count], right[s, :count]
        for j in range(count):
            zz = zs[j]
            sp = softplus_neg_f32(abs(zz))
            parent = up[j]
            lefts[j] = parent + (min(-zz, _ZERO) - sp)
            rights[j] = parent + (min(zz, _ZERO) - sp)


@numba.njit(cache=True, inline="always", error_model="numpy", fastmath=EXACT_ENOUGH)
def _expand_level(xg, weight_k, bias_k, first, width, heap, z):
    """The children of a level's ``width`` nodes, whose weights are columns first … of
    ``weight_k`` (kernel order) and whose log-probabilities sit at heap[s, width : 2·width]
    for each row slot s of the group ``xg`` (4, k): left children into heap[s, 2·width :
    3·width], right children into heap[s, 3·width : 4·width]."""
    parents = heap[:, width : 2 * width]
    left, right = heap[:, 2 * width : 3 * width], heap[:, 3 * width : 4 * width]
    _expand(xg, weight_k, bias_k, first, width, parents, left, right, z)


@numba.njit(parallel=True, cache=True, error_model="numpy", fastmath=EXACT_ENOUGH)
def subtree_roots(x, weight_k, bias_k, depth, out):
    """log p(node | x) of the roots of the bottom subtrees (the nodes of level
    depth − SUBTREE_DEPTH, or the root) for every row of ``x`` (B, k) → ``out`` (B, roots),
    in subtree order.

    ``weight_k`` and ``bias_k`` are :func:`kernel_layout`'s. A node's value is
    parent + log σ(∓z), summed root to leaf in float32 as the level-wise torch path sums them;
    :func:`subtree_leaves` goes on from here.
    """
    rows = x.shape[0]
    top = depth - min(depth, SUBTREE_DEPTH)
    roots = 1 << top
    for g in numba.prange((rows + ROW_GROUP - 1) // ROW_GROUP):
        prefer_512_bit_vectors()  # the same values at any width (tailkit/native/vector_width.py)
        xg = np.empty((ROW_GROUP, x.shape[1]), dtype=np.float32)
        _row_group(x, rows, g, xg)
        heap = np.empty((ROW_GROUP, 2 * roots), dtype=np.float32)
        z = np.empty((ROW_GROUP, max(roots // 2, 1)), dtype=np.float32)
        heap[:, 1] = 0.0
        for level in range(top):
            _expand_level(xg, weight_k, bias_k, 1 << level, 1 << level, heap, z)
        for s in range(min(ROW_GROUP, rows - g * ROW_GROUP)):
            for r in range(roots):
                # the level's node at position p is the bit-reversal of p
                p = 0
                for b in range(top):
                    p |= ((r >> b) & 1) << (top - 1 - b)
                out[g * ROW_GROUP + s, r] = heap[s, roots + p]


@numba.njit(parallel=True, cache=True, error_model="numpy", fastmath=EXACT_ENOUGH)
def subtree_leaves(
    x, weight_k, bias_k, depth, root_lp, r_lo, r_hi, slot, first_out, computed, delta, out, plus,
    threads,
):  # fmt: skip
    """log p(leaf | x) of the labelled leaves of bottom subtrees ``r_lo`` … ``r_hi`` − 1, in
    leaf order, for every row → ``out`` (B, first_out[r_hi] − first_out[r_lo]) float32; plus
    ``plus`` (the same shape) when it is not empty, which spares prediction a second pass
    over the (B, chunk) table to add it to the scores (the same float32 sums either way).

    ``root_lp`` is :func:`subtree_roots`' output; the other tables are :func:`kernel_layout`'s
    (a numba signature with a NamedTuple cannot be cached, so they come one by one). Each
    subtree is expanded for every row while its weights sit in cache, its last level only
    where a labelled leaf needs it, and only its labelled leaves are written. ``threads``
    (numba's count; asked in here, the kernel could not be cached) sizes the tasks.
    """
    rows = x.shape[0]
    sub = min(depth, SUBTREE_DEPTH)
    top = depth - sub
    offset = first_out[r_lo]
    adding = plus.size > 0
    groups = (rows + ROW_GROUP - 1) // ROW_GROUP
    # tasks are (subtree, block of row groups): a label chunk spans only a few subtrees (a
    # CPU chunk of 4,096 labels is one), too few to keep every core busy on their own. The
    # blocks are near-equal and a multiple of the threads in number: 78 groups in blocks of
    # 16 would be 5 tasks, 3 on one thread while the other waits after 2
    threads = max(threads, 1)
    blocks = (groups + GROUPS_PER_TASK - 1) // GROUPS_PER_TASK
    blocks = min(groups, (blocks + threads - 1) // threads * threads)
    per_block, longer = divmod(groups, max(blocks, 1))  # the first ``longer`` take one more
    width = 1 << (sub - 1)
    for task in numba.prange((r_hi - r_lo) * blocks):
        prefer_512_bit_vectors()  # the same values at any width (tailkit/native/vector_width.py)
        r = r_lo + task // blocks
        block = task % blocks
        g_lo = block * per_block + min(block, longer)
        g_hi = g_lo + per_block + (1 if block < longer else 0)
        shift = delta[r]
        xg = np.empty((ROW_GROUP, x.shape[1]), dtype=np.float32)
        heap = np.empty((ROW_GROUP, 2 << sub), dtype=np.float32)
        z = np.empty((ROW_GROUP, width), dtype=np.float32)
        lo, hi = first_out[r], first_out[r + 1]
        slots = slot[lo:hi]
        for g in range(g_lo, g_hi):
            _row_group(x, rows, g, xg)
            for s in range(ROW_GROUP):
                heap[s, 1] = root_lp[min(g * ROW_GROUP + s, rows - 1), r]
            for level in range(sub):
                # the subtree's level ``level``: kernel columns 2^(top + level) + r·2^level …
                first = (1 << (top + level)) + (r << level)
                span = 1 << level
                begin, end = 0, span
                if level == sub - 1:  # the leaves' parents: only those a label needs
                    begin, end = computed[r, 0], computed[r, 1]
                    for s in range(ROW_GROUP):
                        up, down = heap[s, span : 2 * span], heap[s, 2 * span : 3 * span]
                        for p in range(begin):  # pass-through children (kernel_layout)
                            down[p] = up[p] + shift[p]
                        for p in range(end, span):
                            down[p] = up[p] + shift[p]
                _expand(
                    xg, weight_k, bias_k, first + begin, end - begin,
                    heap[:, span + begin : span + end],
                    heap[:, 2 * span + begin : 2 * span + end],
                    heap[:, 3 * span + begin : 3 * span + end],
                    z,
                )  # fmt: skip
            for s in range(min(ROW_GROUP, rows - g * ROW_GROUP)):
                i = g * ROW_GROUP + s
                leaves = heap[s]  # slot indexes the row heap from 0
                row = out[i, lo - offset : hi - offset]
                if adding:
                    add = plus[i, lo - offset : hi - offset]
                    for c in range(hi - lo):
                        row[c] = add[c] + leaves[slots[c]]
                else:
                    for c in range(hi - lo):
                        row[c] = leaves[slots[c]]
