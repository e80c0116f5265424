"""Greedy, layer-by-layer fit of the Bamler–Mandt label tree (ICLR 2020, §3), compiled with numba.

The tree is a complete binary tree of depth D = ⌈log2 C⌉ whose internal node ν (heap numbering,
root 1, children 2ν and 2ν+1) routes an input right with probability σ(w_ν·x̃ + b_ν). Fitting
goes level by level; at each node, on the data points whose label lies under it:

1. e_y = Σ_{x ∈ D_y} x̃, the per-class feature sums; w starts as the unit dominant eigenvector of
   their covariance, and the labels are first split by e_y·w (lowest ⌊c/2⌋ to the left).
2. Newton ascent on θ = (w, b) of the node objective (concave for a fixed split)::

       L_ν(θ) = Σ_{x in node} log σ(ζ_y (w·x̃ + b)) − λ_n (‖w‖² + b²)

   We take the paper's regulariser literally: λ_n multiplies the plain squared norm, so the
   gradient carries −2λ_n θ. The reference code's ``--reg r`` carries −r θ, i.e. its r is our
   2λ_n (our default λ_n = 0.1 is its ``--reg 0.2``). Steps longer than 1 are cut to unit length
   (the reference's trust region) and halved until L_ν does not decrease, so the objective is
   monotone; b starts at minus the mean of x̃·w (as the reference; the paper says 0, which
   changes nothing but the number of steps, since the optimum for a fixed split is unique).
3. A discrete re-split, by ``split_rule``:

   - ``paper``: Δ_y = w·e_y + n_y b (Eq. 9) is the exact gain in L_ν of sending y right; the
     ⌈c/2⌉ labels of largest Δ_y go right, the rest left (balanced halves). If that changed the
     split, back to 2. Both steps maximise L_ν, so the alternation ends (capped at
     ``max_rounds``) at a local optimum.
   - ``reference``: what the released Julia code computes. It scores labels by e_y·w_init with
     the *initial* direction (its variable ``weight`` is never updated) and no n_y b term, and
     sends the ``clamp(#negative scores, c − half, half)`` lowest left. The split is thus fixed
     by the initial PCA projection's sign, and Newton only fits (w, b) to it. This usually gives
     a lower training likelihood (see docs/adversarial-sampling.md).
4. Trivial nodes: a node with no labels gets w = 0, b = 0 (it is unreachable); a node whose
   labels all go to one side (one label, or the reference rule's clamp at 0) gets w = 0,
   b = +1000, so σ = 1 routes right and the padding leaves on the left get p_n = 0 in float.

Points are physically regrouped by node at each level (a counting sort), so each node's data
is a contiguous slice and the nodes of one level are fitted in parallel (on threads: the compiled
node fit releases the GIL).
"""

from __future__ import annotations

import itertools
import math
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numba
import numpy as np

from tailkit.native import kernel_cache  # noqa: F401  (before any cache=True kernel: its locator)
from tailkit.native.grouping import group_by

#: The bias of a node that routes everything right (reference: 1000): σ(1000) == 1 in floating
#: point, so the padding side gets probability 0 and log p of a real label loses nothing.
ROUTE_RIGHT = 1000.0

PAPER, REFERENCE = 0, 1
SPLIT_RULES = {"paper": PAPER, "reference": REFERENCE}


@dataclass
class FittedTree:
    """Node parameters (heap node ν in row ν − 1) and the label ↔ leaf maps."""

    depth: int
    weight: np.ndarray  # (2^D − 1, k) float32
    bias: np.ndarray  # (2^D − 1,) float32
    leaf_of_label: np.ndarray  # (C,) int64
    label_of_leaf: np.ndarray  # (2^D,) int64, −1 for padding leaves
    stats: dict[str, float] = field(default_factory=dict)


def tree_depth(num_classes: int) -> int:
    """⌈log2 C⌉, at least 1 (a one-label tree still has a root that routes to it)."""
    return max(1, math.ceil(math.log2(num_classes))) if num_classes > 1 else 1


# --- the node objective and Newton ascent ---------------------------------------------------


@numba.njit(cache=True, fastmath=True)
def _evaluate(x, zeta, theta, reg, grad, hess, with_hessian):
    """L_ν(θ); fills grad (k+1) and, if ``with_hessian``, the negative Hessian (k+1, k+1).

    One exp and one log1p per point: with e = exp(−|t|), log σ(t) = min(t, 0) − log1p(e) and
    σ(−t) is e/(1+e) or 1/(1+e). The Hessian is accumulated as a full rank-1 update (a
    contiguous, vectorisable loop) rather than a triangle.
    """
    n, k = x.shape
    k1 = k + 1
    grad[:] = 0.0
    if with_hessian:
        hess[:, :] = 0.0
    value = 0.0
    feat = np.empty(k1)
    feat[k] = 1.0
    for i in range(n):
        z = theta[k]
        for a in range(k):
            feat[a] = x[i, a]
            z += theta[a] * feat[a]
        t = zeta[i] * z
        e = math.exp(-abs(t))
        value += min(t, 0.0) - math.log1p(e)
        # d/dz log σ(ζz) = ζ σ(−ζz); the curvature σ(z)σ(−z) = e / (1+e)² whatever ζ.
        inv = 1.0 / (1.0 + e)
        s_neg = e * inv if t > 0.0 else inv
        g = zeta[i] * s_neg
        for a in range(k1):
            grad[a] += g * feat[a]
        if with_hessian:
            curv = e * inv * inv
            for a in range(k1):
                ca = curv * feat[a]
                for c in range(k1):
                    hess[a, c] += ca * feat[c]
    sq = 0.0
    for a in range(k1):
        sq += theta[a] * theta[a]
        grad[a] -= 2.0 * reg * theta[a]
        if with_hessian:
            hess[a, a] += 2.0 * reg
    return value - reg * sq


@numba.njit(cache=True, fastmath=True)
def _value(x, zeta, theta, reg):
    """L_ν(θ) alone: the cheap pass the line search needs after a rejected step."""
    n, k = x.shape
    value = 0.0
    for i in range(n):
        z = theta[k]
        for a in range(k):
            z += theta[a] * x[i, a]
        t = zeta[i] * z
        value += min(t, 0.0) - math.log1p(math.exp(-abs(t)))
    sq = 0.0
    for a in range(k + 1):
        sq += theta[a] * theta[a]
    return value - reg * sq


@numba.njit(cache=True)
def _solve_spd(a, rhs, out):
    """out = a⁻¹ rhs by Cholesky; a is symmetric positive definite (reg·I + PSD)."""
    n = rhs.shape[0]
    low = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1):
            s = a[i, j]
            for p in range(j):
                s -= low[i, p] * low[j, p]
            if i == j:
                low[i, i] = math.sqrt(max(s, 1e-300))
            else:
                low[i, j] = s / low[j, j]
    tmp = np.empty(n)
    for i in range(n):
        s = rhs[i]
        for p in range(i):
            s -= low[i, p] * tmp[p]
        tmp[i] = s / low[i, i]
    for i in range(n - 1, -1, -1):
        s = tmp[i]
        for p in range(i + 1, n):
            s -= low[p, i] * out[p]
        out[i] = s / low[i, i]


@numba.njit(cache=True)
def newton_fit(x, zeta, theta, reg, max_iter, trace, hess, hessian_ready=False):
    """Maximise L_ν over θ in place by damped Newton ascent; returns the number of steps.

    ``hess`` (k+1, k+1) holds the negative Hessian between calls: it depends on θ only, not on
    the split ζ (the curvature of log σ(ζz) is σ(z)σ(−z) either way), so after a re-split the
    previous fit's last Hessian, computed at a nearby θ, is reused (``hessian_ready``). It is
    recomputed after a step longer than 0.1 and every 8th step; in between the step is a Newton step with
    a slightly stale Hessian, which still ascends (the line search sees to it) on the exact
    gradient, so the optimum reached is the same. The 17 × 17 rank-1 update per point is ~90 %
    of a full pass, so this roughly halves the fit.

    ``trace`` (max_iter + 1,) receives L_ν after each accepted step (trace[0] at the start),
    NaN beyond the last one. Stops when the Newton decrement falls below 1e-10 (1 + |L_ν|), or
    when no step along the Newton direction increases L_ν (rounding level).
    """
    k1 = theta.shape[0]
    grad = np.empty(k1)
    grad_new = np.empty(k1)
    step = np.empty(k1)
    trial = np.empty(k1)
    trace[:] = np.nan
    value = _evaluate(x, zeta, theta, reg, grad, hess, not hessian_ready)
    trace[0] = value
    steps = 0
    since_hessian = 0
    for it in range(max_iter):
        _solve_spd(hess, grad, step)
        # The Newton decrement g·H⁻¹g is twice the gain a full step would bring near the
        # optimum; below the rounding noise of the sum over points there is nothing to gain.
        decrement = 0.0
        norm = 0.0
        for a in range(k1):
            decrement += grad[a] * step[a]
            norm += step[a] * step[a]
        norm = math.sqrt(norm)
        if decrement <= 1e-10 * (1.0 + abs(value)) or norm == 0.0:
            break
        if norm > 1.0:  # far from the optimum Newton overshoots; the reference's unit cap
            for a in range(k1):
                step[a] /= norm
        # The full step usually succeeds (one pass for value, gradient and Hessian); after a
        # rejection, trial values come from the cheap value-only pass.
        for a in range(k1):
            trial[a] = theta[a] + step[a]
        since_hessian += 1
        fresh = norm > 0.1 or since_hessian >= 8
        new_value = _evaluate(x, zeta, trial, reg, grad_new, hess, fresh)
        accepted = new_value >= value
        halvings = 0
        while not accepted and halvings < 30:
            halvings += 1
            for a in range(k1):
                step[a] *= 0.5
                trial[a] = theta[a] + step[a]
            new_value = _value(x, zeta, trial, reg)
            accepted = new_value >= value
        if not accepted:  # at machine precision: no step improves L_ν any more
            break
        if halvings > 0:
            fresh = True
            new_value = _evaluate(x, zeta, trial, reg, grad_new, hess, True)
        if fresh:
            since_hessian = 0
        theta[:] = trial
        grad[:] = grad_new
        value = new_value
        steps += 1
        trace[it + 1] = value
    return steps


# --- one node ----------------------------------------------------------------------------------


@numba.njit(cache=True)
def _dominant_direction(emb):
    """Unit dominant eigenvector of the covariance of the rows of ``emb`` (c, k).

    Cyclic Jacobi rotations on the k × k covariance: exact to machine precision, and no LAPACK
    call inside the parallel region (OpenBLAS is not safe to call from numba's OpenMP threads).
    Its sign is made deterministic (largest component positive); the sign only mirrors the split.
    """
    c, k = emb.shape
    mean = np.zeros(k)
    for i in range(c):
        for a in range(k):
            mean[a] += emb[i, a]
    mean /= c
    cov = np.zeros((k, k))
    for i in range(c):
        for a in range(k):
            da = emb[i, a] - mean[a]
            for b in range(k):
                cov[a, b] += da * (emb[i, b] - mean[b])
    vecs = np.eye(k)
    for _ in range(100):
        off = 0.0
        diag = 0.0
        for p in range(k):
            diag += cov[p, p] * cov[p, p]
            for q in range(p + 1, k):
                off += cov[p, q] * cov[p, q]
        if off <= 1e-30 * diag or off == 0.0:
            break
        for p in range(k - 1):
            for q in range(p + 1, k):
                if cov[p, q] == 0.0:
                    continue
                theta = (cov[q, q] - cov[p, p]) / (2.0 * cov[p, q])
                t = (1.0 if theta >= 0 else -1.0) / (abs(theta) + math.sqrt(theta * theta + 1.0))
                cs = 1.0 / math.sqrt(t * t + 1.0)
                sn = t * cs
                for r in range(k):  # columns p, q of cov ← cov · J
                    a_rp, a_rq = cov[r, p], cov[r, q]
                    cov[r, p] = cs * a_rp - sn * a_rq
                    cov[r, q] = sn * a_rp + cs * a_rq
                for r in range(k):  # rows p, q ← Jᵀ · cov
                    a_pr, a_qr = cov[p, r], cov[q, r]
                    cov[p, r] = cs * a_pr - sn * a_qr
                    cov[q, r] = sn * a_pr + cs * a_qr
                for r in range(k):
                    v_rp, v_rq = vecs[r, p], vecs[r, q]
                    vecs[r, p] = cs * v_rp - sn * v_rq
                    vecs[r, q] = sn * v_rp + cs * v_rq
    top = 0
    for p in range(1, k):
        if cov[p, p] > cov[top, top]:
            top = p
    out = vecs[:, top].copy()
    big = 0
    for a in range(1, k):
        if abs(out[a]) > abs(out[big]):
            big = a
    if out[big] < 0:
        out = -out
    return out


@numba.njit(cache=True)
def _project(emb, w, bias_per_row, out):
    """out[i] = emb[i]·w + bias_per_row[i] (a loop, not BLAS: see _dominant_direction)."""
    c, k = emb.shape
    for i in range(c):
        s = bias_per_row[i]
        for a in range(k):
            s += emb[i, a] * w[a]
        out[i] = s


@numba.njit(cache=True)
def _balanced_split(score, left_count, side):
    """side[i] = 0 for the ``left_count`` lowest scores (ties by index), else 1."""
    order = np.argsort(score, kind="mergesort")
    for r in range(order.shape[0]):
        side[order[r]] = 0 if r < left_count else 1


@numba.njit(cache=True)
def _fit_node(x, local_label, n_labels, leaves, reg, rule, max_rounds, max_iter, theta, side):
    """Fit one node on its points ``x`` (n, k) whose labels are ``local_label`` in [0, c).

    Writes θ = (w, b) and side (c,) (0 left, 1 right); returns (rounds, newton steps).
    """
    n, k = x.shape
    c = n_labels
    theta[:] = 0.0
    if c == 0:
        return 0, 0
    if c == 1:
        side[0] = 1
        theta[k] = ROUTE_RIGHT
        return 0, 0
    emb = np.zeros((c, k))
    counts = np.zeros(c)
    for i in range(n):
        y = local_label[i]
        counts[y] += 1.0
        for a in range(k):
            emb[y, a] += x[i, a]
    half = leaves // 2
    w_init = _dominant_direction(emb)
    proj = np.empty(c)
    _project(emb, w_init, np.zeros(c), proj)
    _balanced_split(proj, c // 2, side)
    for a in range(k):
        theta[a] = w_init[a]
    if n > 0:
        mean_score = 0.0
        for i in range(n):
            for a in range(k):
                mean_score += x[i, a] * w_init[a]
        theta[k] = -mean_score / n
    negatives = 0  # the reference rule's left count: labels with a negative initial score
    for i in range(c):
        if proj[i] < 0.0:
            negatives += 1
    zeta = np.empty(n)
    trace = np.empty(max_iter + 1)
    hess = np.empty((k + 1, k + 1))
    new_side = np.empty(c, dtype=np.int64)
    delta = np.empty(c)
    rounds = 0
    steps = 0
    while True:
        rounds += 1
        for i in range(n):
            zeta[i] = 1.0 if side[local_label[i]] == 1 else -1.0
        steps += newton_fit(x, zeta, theta, reg, max_iter, trace, hess, rounds > 1)
        if rounds >= max_rounds:
            break
        if rule == PAPER:
            _project(emb, theta[:k], counts * theta[k], delta)
            _balanced_split(delta, c // 2, new_side)
        else:
            left = min(max(negatives, c - half), half)
            _balanced_split(proj, left, new_side)
        changed = False
        for i in range(c):
            if new_side[i] != side[i]:
                changed = True
        side[:] = new_side
        if not changed:
            break
    left = 0
    for i in range(c):
        left += 1 - side[i]
    if left == 0 or left == c:  # one side empty: route everything right, deterministically
        side[:] = 1
        theta[:] = 0.0
        theta[k] = ROUTE_RIGHT
    return rounds, steps


# --- one level ---------------------------------------------------------------------------------


def _fit_level(
    pool, threads, x, labels, label_node, level, depth, reg, rule, max_rounds, max_iter, w, b
):
    """Fit the 2^level nodes of one level; moves each label to its child in ``label_node``.

    ``reg`` (2^level,) is λ_n per node. The nodes run on ``pool``'s threads in batches (the
    compiled fit releases the GIL), each batch a contiguous range of nodes, several per thread
    so that large and small nodes even out. Threads rather than a numba ``prange``: a parallel
    numba function compiles its whole call tree a second time (another 21 s on the 2-core dev
    VM, paid by every fresh install and after every edit of this module), and the nodes of a
    level are independent, so the result does not depend on the thread count.
    """
    first = 1 << level
    count = first
    leaves = 1 << (depth - level)
    point_order, point_start = group_by(label_node[labels] - first, count)
    label_order, label_start = group_by(label_node - first, count)
    local = np.empty(label_node.shape[0], dtype=np.int64)
    rounds = np.zeros(count, dtype=np.int64)
    steps = np.zeros(count, dtype=np.int64)
    batch = max(1, count // (8 * threads))
    edges = [*range(0, count, batch), count]

    def fit_batch(bounds: tuple[int, int]) -> None:
        _fit_nodes(
            bounds[0], bounds[1], first, leaves, x, labels, label_node, point_order,
            point_start, label_order, label_start, local, reg, rule, max_rounds, max_iter, w, b,
            rounds, steps,
        )  # fmt: skip

    list(pool.map(fit_batch, itertools.pairwise(edges)))
    return rounds, steps


@numba.njit(cache=True, nogil=True)
def _fit_nodes(
    start, stop, first, leaves, x, labels, label_node, point_order, point_start, label_order,
    label_start, local, reg, rule, max_rounds, max_iter, w, b, rounds, steps,
):  # fmt: skip
    """Fit nodes ``first + start`` … ``first + stop − 1`` of a level, one after the other, each
    on its points (gathered contiguous), and move their labels to their children in
    ``label_node``. Nodes of a level touch disjoint labels, points and rows of ``w``/``b``, so
    batches of them run in parallel."""
    k = x.shape[1]
    for j in range(start, stop):
        node = first + j
        mine = label_order[label_start[j] : label_start[j + 1]]
        for r in range(mine.shape[0]):
            local[mine[r]] = r
        pts = point_order[point_start[j] : point_start[j + 1]]
        xs = np.empty((pts.shape[0], k), dtype=x.dtype)
        ls = np.empty(pts.shape[0], dtype=np.int64)
        for r in range(pts.shape[0]):
            xs[r] = x[pts[r]]
            ls[r] = local[labels[pts[r]]]
        theta = np.empty(k + 1)
        side = np.zeros(mine.shape[0], dtype=np.int64)
        rounds[j], steps[j] = _fit_node(
            xs, ls, mine.shape[0], leaves, reg[j], rule, max_rounds, max_iter, theta, side
        )
        w[node - 1] = theta[:k]
        b[node - 1] = theta[k]
        for r in range(mine.shape[0]):
            label_node[mine[r]] = 2 * node + side[r]


def fit_tree(
    features: np.ndarray,
    labels: np.ndarray,
    num_classes: int,
    *,
    reg: float = 0.1,
    split_rule: str = "paper",
    frequency_reg: bool = False,
    max_rounds: int = 50,
    max_newton: int = 100,
) -> FittedTree:
    """Fit the tree on whitened features (N, k) and labels (N,) in [0, C).

    ``frequency_reg`` multiplies λ_n at a node by its number of labels (the reference's
    ``--frequency_reg``; off by default, as it is unknown whether the paper used it).
    """
    x = np.ascontiguousarray(features, dtype=np.float32)
    y = np.ascontiguousarray(labels, dtype=np.int64)
    if x.ndim != 2 or y.shape != (x.shape[0],):
        raise ValueError(f"features (N, k) and labels (N,) expected, got {x.shape}, {y.shape}")
    if y.size and (y.min() < 0 or y.max() >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes})")
    if split_rule not in SPLIT_RULES:
        raise ValueError(f"split_rule must be one of {sorted(SPLIT_RULES)}, got {split_rule!r}")
    depth = tree_depth(num_classes)
    k = x.shape[1]
    w = np.zeros(((1 << depth) - 1, k))
    b = np.zeros((1 << depth) - 1)
    label_node = np.ones(num_classes, dtype=np.int64)
    rounds_total, steps_total, start = 0, 0, time.perf_counter()
    threads = numba.get_num_threads()
    with ThreadPoolExecutor(max_workers=threads) as pool:
        for level in range(depth):
            lam = np.full(1 << level, float(reg))
            if frequency_reg:
                lam *= np.maximum(np.bincount(label_node - (1 << level), minlength=1 << level), 1)
            rounds, steps = _fit_level(
                pool, threads, x, y, label_node, level, depth, lam, SPLIT_RULES[split_rule],
                max_rounds, max_newton, w, b,
            )  # fmt: skip
            rounds_total += int(rounds.sum())
            steps_total += int(steps.sum())
    leaf_of_label = label_node - (1 << depth)
    label_of_leaf = np.full(1 << depth, -1, dtype=np.int64)
    label_of_leaf[leaf_of_label] = np.arange(num_classes)
    if np.unique(leaf_of_label).size != num_classes:  # capacity makes this impossible
        raise AssertionError("two labels share a leaf")
    return FittedTree(
        depth=depth,
        weight=w.astype(np.float32),
        bias=b.astype(np.float32),
        leaf_of_label=leaf_of_label,
        label_of_leaf=label_of_leaf,
        stats={
            "fit_tree_seconds": time.perf_counter() - start,
            "discrete_rounds": rounds_total,
            "newton_steps": steps_total,
        },
    )
