"""The Bamler–Mandt tree: exact probabilities, draws that follow them, and a fit that works.

Probabilities are checked against an independent float64 numpy walk of the fitted tables, the
draws against those probabilities by chi-square, the fit against its objective and against a
planted hierarchy, and the tables against the depth-2 worked vector of algorithms.md §12.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numba
import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from tailkit.pipeline.parallel_repro import THREAD_VARIABLES
from tailkit.plugins.samplers.tree import TreeSampler
from tailkit.plugins.samplers.tree.fit import fit_tree, newton_fit, tree_depth
from tailkit.plugins.samplers.tree.pca import WhitenedPCA
from tailkit.testing import check_sampler

C = 13  # not a power of two: 16 leaves, 3 of them padding
DIM = 6


def clustered(num_classes: int, n: int, dim: int, seed: int, spread: float = 2.0):
    g = torch.Generator().manual_seed(seed)
    centers = torch.randn(num_classes, dim, generator=g) * spread
    # A long tail: label i has weight 1 / (i + 1).
    weights = 1.0 / torch.arange(1, num_classes + 1, dtype=torch.float64)
    y = torch.multinomial(weights, n, replacement=True, generator=g)
    if n >= num_classes:
        y[:num_classes] = torch.arange(num_classes)  # every label seen
    return centers[y] + torch.randn(n, dim, generator=g), y


@pytest.fixture(scope="module")
def sampler() -> TreeSampler:
    x, y = clustered(C, 4000, DIM, seed=0)
    s = TreeSampler(k=4)
    s.fit(x, y, C)
    return s


def numpy_log_prob(s: TreeSampler, x: np.ndarray) -> np.ndarray:
    """Independent float64 walk: log p(leaf | x) for every leaf, (B, 2^D), by enumeration."""
    mean = s._table("mean").double().numpy()
    transform = s._table("transform").double().numpy()
    w = s._table("weight").double().numpy()
    b = s._table("bias").double().numpy()
    xt = (x.astype(np.float64) - mean) @ transform.T
    z = xt @ w.T + b  # (B, 2^D − 1)
    depth = s.depth
    out = np.zeros((x.shape[0], 1 << depth))
    for leaf in range(1 << depth):
        node = 1
        for level in range(depth):
            bit = (leaf >> (depth - 1 - level)) & 1
            t = z[:, node - 1] if bit else -z[:, node - 1]
            out[:, leaf] += -np.logaddexp(0.0, -t)  # log σ(t)
            node = 2 * node + bit
    return out


def test_the_sampler_contract() -> None:
    check_sampler(TreeSampler, k=3)
    check_sampler(TreeSampler, k=3, split_rule="reference")


def test_label_probabilities_are_exact_and_sum_to_one(sampler: TreeSampler) -> None:
    x, _ = clustered(C, 64, DIM, seed=1)
    expected_leaves = numpy_log_prob(sampler, x.numpy())
    leaf_of_label = sampler._table("leaf_of_label").numpy()
    expected = expected_leaves[:, leaf_of_label]
    # All three code paths: dense level-wise, compiled path walk, torch path walk.
    dense = sampler.log_prob(x, torch.arange(C)).double().numpy()
    per_row = sampler.log_prob(x, torch.arange(C).expand(64, C)).double().numpy()
    walk = sampler._path_log_prob_torch(
        sampler.whiten(x), sampler._table("leaf_of_label").expand(64, C)
    )
    for got in (dense, per_row, walk.double().numpy()):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # The float64 reference itself: real labels carry all the mass, padding none.
    totals = np.exp(expected).sum(axis=1)
    np.testing.assert_allclose(totals, 1.0, atol=1e-12)
    padding = np.setdiff1d(np.arange(1 << sampler.depth), leaf_of_label)
    assert padding.size == (1 << sampler.depth) - C
    assert np.exp(expected_leaves[:, padding]).max() == 0.0


def test_padding_leaves_are_never_sampled(sampler: TreeSampler) -> None:
    x, y = clustered(C, 200, DIM, seed=2)
    ids, log_q = sampler.sample(x, y, 2000, torch.Generator().manual_seed(0))
    assert ids.shape == (200, 2000)
    assert int(ids.min()) >= 0 and int(ids.max()) < C
    assert torch.isfinite(log_q).all()
    ids_t, _ = sampler._sample_torch(sampler.whiten(x), 500, torch.Generator().manual_seed(0))
    assert int(ids_t.min()) >= 0 and int(ids_t.max()) < C


def chi_square_pvalue(ids: np.ndarray, probs: np.ndarray) -> float:
    observed = np.bincount(ids, minlength=probs.size)
    expected = probs * ids.size
    keep = expected > 5
    obs, exp = observed[keep], expected[keep]
    if (~keep).any():  # pool the rare labels into one bin
        obs = np.append(obs, observed[~keep].sum())
        exp = np.append(exp, expected[~keep].sum())
    exp *= obs.sum() / exp.sum()
    return chisquare(obs, exp).pvalue


def test_a_million_draws_follow_exp_log_prob(sampler: TreeSampler) -> None:
    """One input, 10^6 draws: frequencies against p_n(·|x) of the float64 reference walk."""
    x, y = clustered(C, 1, DIM, seed=3)
    ids, _ = sampler.sample(x, y, 1_000_000, torch.Generator().manual_seed(5))
    probs = np.exp(numpy_log_prob(sampler, x.numpy())[0, sampler._table("leaf_of_label")])
    assert chi_square_pvalue(ids.numpy().ravel(), probs) > 1e-3


def test_draws_over_many_inputs_follow_the_mixture(sampler: TreeSampler) -> None:
    """1000 inputs × 1000 draws each, on both code paths: counts against Σ_x p_n(·|x)."""
    x, y = clustered(C, 1000, DIM, seed=4)
    probs = np.exp(numpy_log_prob(sampler, x.numpy())[:, sampler._table("leaf_of_label")])
    mixture = probs.mean(axis=0)
    ids, _ = sampler.sample(x, y, 1000, torch.Generator().manual_seed(6))
    assert chi_square_pvalue(ids.numpy().ravel(), mixture) > 1e-3
    ids_t, _ = sampler._sample_torch(sampler.whiten(x), 200, torch.Generator().manual_seed(6))
    assert chi_square_pvalue(ids_t.numpy().ravel(), mixture) > 1e-3


def test_sampled_log_q_is_log_prob_of_the_sampled_ids(sampler: TreeSampler) -> None:
    x, y = clustered(C, 300, DIM, seed=5)
    ids, log_q = sampler.sample(x, y, 64, torch.Generator().manual_seed(1))
    # The compiled kernels share their arithmetic: bit-identical.
    assert torch.equal(sampler.log_prob(x, ids), log_q)
    ids_t, log_q_t = sampler._sample_torch(sampler.whiten(x), 64, torch.Generator())
    torch.testing.assert_close(sampler.log_prob(x, ids_t), log_q_t, rtol=1e-5, atol=1e-5)


def test_same_seed_same_draws_whatever_the_batch_split(sampler: TreeSampler) -> None:
    x, y = clustered(C, 50, DIM, seed=6)
    a = sampler.sample(x, y, 32, torch.Generator().manual_seed(3))
    b = sampler.sample(x, y, 32, torch.Generator().manual_seed(3))
    c = sampler.sample(x, y, 32, torch.Generator().manual_seed(4))
    assert torch.equal(a[0], b[0]) and not torch.equal(a[0], c[0])


# --- the worked vector ---------------------------------------------------------------------------


def test_depth_two_worked_example() -> None:
    """algorithms.md §12: z_root = 1.0, z_2 = −0.5, z_3 = 2.0 (right = bit 1)."""
    s = TreeSampler(k=1)
    s.load_state_dict(
        {
            "num_classes": 4,
            "depth": 2,
            "mean": torch.zeros(1),
            "transform": torch.zeros(1, 1),
            "weight": torch.zeros(3, 1),
            "bias": torch.tensor([1.0, -0.5, 2.0]),
            "leaf_of_label": torch.arange(4),
            "label_of_leaf": torch.arange(4),
        }
    )
    expected = torch.tensor([-1.787339, -2.287339, -2.440190, -0.440190])
    x = torch.zeros(3, 1)
    torch.testing.assert_close(s.log_prob(x, torch.arange(4))[0], expected, atol=1e-6, rtol=0)
    torch.testing.assert_close(
        s.log_prob(x, torch.arange(4).expand(3, 4))[2], expected, atol=1e-6, rtol=0
    )
    probs = expected.double().exp()
    np.testing.assert_allclose(probs.numpy(), [0.167405, 0.101536, 0.087144, 0.643914], atol=1e-6)
    ids, _ = s.sample(torch.zeros(1, 1), torch.zeros(1), 400_000, torch.Generator())
    assert chi_square_pvalue(ids.numpy().ravel(), probs.numpy()) > 1e-3


# --- fitting -------------------------------------------------------------------------------------


def node_objective(x: np.ndarray, zeta: np.ndarray, theta: np.ndarray, lam: float) -> float:
    """Independent float64 L_ν = Σ log σ(ζ(w·x + b)) − λ(‖w‖² + b²)."""
    z = x.astype(np.float64) @ theta[:-1] + theta[-1]
    return float(-np.logaddexp(0.0, -zeta * z).sum() - lam * (theta @ theta))


def test_newton_increases_the_node_objective_monotonically_to_its_maximum() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3000, 5)).astype(np.float32)
    w_true = rng.normal(size=5) * 2.0
    zeta = np.where(x @ w_true + 0.3 + rng.logistic(size=3000) > 0, 1.0, -1.0)
    theta = np.zeros(6)
    theta[0] = 5.0  # a poor start, so that the step cap and the line search are exercised
    trace = np.empty(101)
    steps = newton_fit(x, zeta, theta, 0.1, 100, trace, np.empty((6, 6)))
    values = trace[: steps + 1]
    assert steps >= 3
    # Non-decreasing up to the rounding of a sum over 3000 points.
    assert np.all(np.diff(values) >= -1e-12 * np.abs(values[1:])), values
    assert values[-1] == pytest.approx(node_objective(x, zeta, theta, 0.1), rel=1e-12)
    # A maximum: the gradient of the independent objective vanishes, every nudge lowers it.
    for a, eps in itertools.product(range(6), (1e-4, -1e-4)):
        nudged = theta.copy()
        nudged[a] += eps
        assert node_objective(x, zeta, nudged, 0.1) < values[-1]


def test_regulariser_convention_is_the_papers() -> None:
    """λ_n(‖w‖² + b²): with no data the objective is −λ‖θ‖², whose curvature is 2λ."""
    x = np.zeros((0, 3), dtype=np.float32)
    theta = np.array([1.0, -2.0, 0.5, 3.0])
    trace = np.empty(11)
    newton_fit(x, np.zeros(0), theta, 0.25, 10, trace, np.empty((4, 4)))
    assert trace[0] == pytest.approx(-0.25 * (1 + 4 + 0.25 + 9))
    np.testing.assert_allclose(theta, 0.0, atol=1e-12)


def lca_depth(leaf_a: int, leaf_b: int, depth: int) -> int:
    """Depth of the lowest common ancestor of two leaves (0 = root)."""
    shared = 0
    for level in range(depth):
        shift = depth - 1 - level
        if (leaf_a >> shift) != (leaf_b >> shift):
            break
        shared += 1
    return shared


@pytest.mark.parametrize("rule", ["paper", "reference"])
def test_fit_groups_a_planted_hierarchy(rule: str) -> None:
    """8 well-separated super-clusters of 8 labels each: siblings end up under one subtree."""
    g = torch.Generator().manual_seed(0)
    supers = torch.randn(8, 10, generator=g) * 8.0
    centers = supers.repeat_interleave(8, dim=0) + torch.randn(64, 10, generator=g)
    y = torch.arange(64).repeat(60)
    x = centers[y] + 0.5 * torch.randn(y.numel(), 10, generator=g)
    s = TreeSampler(k=8, split_rule=rule)
    s.fit(x, y, 64)
    leaves = s._table("leaf_of_label").numpy()
    depth = s.depth
    same = [lca_depth(leaves[a], leaves[b], depth) for a, b in itertools.combinations(range(64), 2)
            if a // 8 == b // 8]  # fmt: skip
    # A perfect grouping puts each super-cluster in one depth-3 subtree: LCA depth ≥ 3. A random
    # leaf assignment gives a mean sibling LCA depth of about 1 (half the pairs split at the
    # root, a quarter at level 1, ...).
    rng = np.random.default_rng(0)
    shuffled = rng.permutation(leaves)
    chance = [
        lca_depth(shuffled[a], shuffled[b], depth)
        for a, b in itertools.combinations(range(64), 2)
        if a // 8 == b // 8
    ]
    assert np.mean(chance) < 1.3
    assert np.mean(same) >= 2.9, (rule, np.mean(same))
    # And it is a good conditional model: the true label is far likelier than uniform.
    held_out = centers + 0.5 * torch.randn(64, 10, generator=g)
    log_p = s.log_prob(held_out, torch.arange(64).unsqueeze(1)).squeeze(1)
    assert float(log_p.mean()) > np.log(1 / 64) + 1.5


def test_paper_rule_reaches_at_least_the_reference_likelihood() -> None:
    x, y = clustered(40, 6000, 8, seed=7, spread=1.0)
    lls = {}
    for rule in ("paper", "reference"):
        s = TreeSampler(k=8, split_rule=rule)
        s.fit(x, y, 40)
        lls[rule] = float(s.log_prob(x, y.unsqueeze(1)).mean())
    assert lls["paper"] >= lls["reference"] - 0.02, lls


def test_every_label_gets_its_own_leaf_and_unseen_labels_work() -> None:
    x, y = clustered(20, 500, 4, seed=8)
    y[y == 7] = 6  # label 7 never appears in training
    tree = fit_tree(WhitenedPCA(4).fit(x.numpy()).transform(x.numpy()), y.numpy(), 21)
    assert tree.depth == tree_depth(21) == 5
    assert np.unique(tree.leaf_of_label).size == 21
    assert np.array_equal(tree.label_of_leaf[tree.leaf_of_label], np.arange(21))
    assert (tree.label_of_leaf == -1).sum() == 32 - 21


def test_the_fit_does_not_depend_on_the_thread_count() -> None:
    """Nodes of a level run on a thread pool in batches; each is fitted by one thread alone."""
    x, y = clustered(300, 9000, 8, seed=3, spread=1.0)
    features = WhitenedPCA(8).fit(x.numpy()).transform(x.numpy())
    before = numba.get_num_threads()
    try:
        fits = []
        for threads in (1, numba.config.NUMBA_NUM_THREADS):
            numba.set_num_threads(threads)
            fits.append(fit_tree(features, y.numpy(), 300))
    finally:
        numba.set_num_threads(before)
    one, many = fits
    assert one.stats["newton_steps"] == many.stats["newton_steps"] > 0
    for table in ("weight", "bias", "leaf_of_label", "label_of_leaf"):
        assert np.array_equal(getattr(one, table), getattr(many, table)), table


def test_one_label_and_two_labels() -> None:
    x = torch.randn(50, 3)
    for c in (1, 2):
        s = TreeSampler(k=2)
        s.fit(x, torch.arange(50) % c, c)
        lp = s.log_prob(x, torch.arange(c))
        torch.testing.assert_close(lp.exp().sum(1), torch.ones(50))
        ids, _ = s.sample(x, torch.zeros(50, dtype=torch.int64), 8, torch.Generator())
        assert int(ids.max()) < c


def test_whitened_pca_is_the_correlation_matrix_pca() -> None:
    rng = np.random.default_rng(0)
    mix = rng.normal(size=(7, 7))
    x = (rng.normal(size=(5000, 7)) @ mix * np.arange(1, 8) + 3.0).astype(np.float32)
    pca = WhitenedPCA(4).fit(x)
    xt = pca.transform(x).astype(np.float64)
    np.testing.assert_allclose(np.cov(xt.T), np.eye(4), atol=1e-3)
    # The reference notebook: eigenvectors of the correlation matrix, largest first, scaled by
    # 1/sqrt(var · eigval). Same directions up to sign.
    std = x.std(axis=0, dtype=np.float64)
    corr = np.corrcoef(x.T.astype(np.float64))
    vals, vecs = np.linalg.eigh(corr)
    top = vecs[:, ::-1][:, :4]
    ref = ((x - x.mean(axis=0, dtype=np.float64)) / std) @ top / np.sqrt(vals[::-1][:4])
    for a in range(4):
        cos = abs(np.corrcoef(ref[:, a], xt[:, a])[0, 1])
        assert cos > 0.9999, (a, cos)


def test_bad_input_is_a_clear_error() -> None:
    s = TreeSampler()
    with pytest.raises(ValueError, match="needs the training features"):
        s.fit(None, torch.zeros(3, dtype=torch.int64), 3)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        s.fit(torch.randn(3, 2), torch.tensor([0, 1, 5]), 3)
    with pytest.raises(RuntimeError, match="call fit"):
        s.sample(torch.randn(2, 2), torch.zeros(2), 3, torch.Generator())


def test_all_leaves_kernel_matches_the_level_wise_sums_and_the_path_walks(sampler) -> None:
    """The CPU kernel (one pass over every node, polynomial log σ) against two independent
    computations: the torch level-wise heap (torch's logsigmoid) and the float64 path walks."""
    x, _ = clustered(C, 40, DIM, seed=9)
    every = sampler.log_prob_all(x)
    levelwise = sampler._leaf_log_prob(sampler.whiten(x))[:, sampler._table("leaf_of_label")]
    torch.testing.assert_close(every, levelwise, rtol=0, atol=2e-5)
    walks = sampler.log_prob(x, torch.arange(C).expand(x.shape[0], C))  # (B, n): path walks
    torch.testing.assert_close(every, walks, rtol=0, atol=2e-5)


def test_all_leaves_values_do_not_depend_on_the_rows_or_labels_asked(sampler) -> None:
    """Bit for bit: a row's log-probabilities are the same alone, in any block, for any subset
    of labels (prediction splits rows and labels by memory budget)."""
    x, _ = clustered(C, 37, DIM, seed=10)  # 37: not a multiple of the kernel's row group
    every = sampler.log_prob_all(x)
    for lo, hi in ((0, 1), (3, 4), (5, 22), (22, 37)):
        assert torch.equal(sampler.log_prob_all(x[lo:hi]), every[lo:hi])
    labels = torch.tensor([C - 1, 0, 7, 7, 3])
    assert torch.equal(sampler.log_prob(x, labels), every[:, labels])


def test_whitened_pca_does_not_depend_on_blas_threads() -> None:
    """The fit pins BLAS to one thread: given two threads or one, the same bytes (a threaded
    dot product sums in another order; tailkit repro gives a sampler's fit either)."""
    import scipy.sparse as sp
    from threadpoolctl import threadpool_limits

    rng = np.random.default_rng(3)
    sparse = sp.random(4000, 60000, density=4e-4, format="csr", random_state=rng)
    dense = rng.standard_normal((20000, 96))
    for x in (sparse, dense):
        fits = []
        for threads in (2, 1):
            with threadpool_limits(limits=threads):
                pca = WhitenedPCA(8).fit(x)
                fits.append((pca.mean.tobytes(), pca.transform_matrix.tobytes(),
                             pca.transform(x[:500]).tobytes()))  # fmt: skip
        assert fits[0] == fits[1]


_PCA_IN_A_FRESH_PROCESS = """
import hashlib
import numpy as np
import scipy.sparse as sp
from tailkit.plugins.samplers.tree.pca import WhitenedPCA

rng = np.random.default_rng(3)
x = sp.random(4000, 60000, density=4e-4, format="csr", random_state=rng)
# k = 16, the default tree's: with k = 8 the two thread counts agreed even without the fix
pca = WhitenedPCA(16).fit(x)
digest = hashlib.sha256()
for part in (pca.mean, pca.transform_matrix, pca.transform(x[:500])):
    digest.update(np.ascontiguousarray(part).tobytes())
print(digest.hexdigest())
"""


def test_whitened_pca_ignores_thread_variables_in_a_fresh_process() -> None:
    """As above, in the state a stage starts in: a new process whose thread variables say one
    thread or two, and no scikit-learn imported yet. threadpoolctl limits only the BLAS
    libraries already loaded, so a limit set before scikit-learn's import (which brings
    ARPACK's OpenBLAS) left the sparse fit on two threads; the in-process test above cannot
    see that, pytest having imported scikit-learn long before."""
    digests = []
    for threads in ("2", "1"):
        env = {**os.environ, **dict.fromkeys(THREAD_VARIABLES, threads)}
        out = subprocess.run(
            [sys.executable, "-c", _PCA_IN_A_FRESH_PROCESS],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        digests.append(out.stdout.strip())
    assert digests[0] == digests[1]


def test_sparse_whitening_does_not_depend_on_torch_threads() -> None:
    """x̃ = x·Tᵀ − μ·Tᵀ for sparse rows: μ·Tᵀ sums over every input dimension (830,909 on the
    default GeoNames cells), and ``mean @ t`` split that sum between torch's threads, so the
    adversarial model trained on x̃ had other bytes on one thread than on two."""
    import scipy.sparse as sp

    from tailkit.sparse import SparseRows
    from tailkit.testing.trees import random_tree

    dim, rows = 400_000, 64
    rng = np.random.default_rng(0)
    columns = np.sort(rng.choice(dim, (rows, 6)), axis=1).reshape(-1)
    matrix = sp.csr_matrix(
        (rng.random(rows * 6, dtype=np.float32), columns, np.arange(0, rows * 6 + 1, 6)),
        shape=(rows, dim),
    )
    matrix.sum_duplicates()
    x = SparseRows.from_scipy(matrix)
    sampler = random_tree(100, dim)
    before = torch.get_num_threads()
    whitened = []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            sampler._shift = sampler._whitened = None  # recomputed under this count
            whitened.append(sampler.whiten(x))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(whitened[0], whitened[1])
    dense = torch.from_numpy(matrix.toarray()).double()
    mean, transform = sampler._table("mean").double(), sampler._table("transform").double()
    torch.testing.assert_close(
        whitened[0].double(), (dense - mean) @ transform.t(), rtol=1e-5, atol=1e-5
    )


def test_whitening_gives_a_row_the_same_bits_in_any_block() -> None:
    """whiten_rows sums each of a row's k outputs over the inputs in order, the k sums side by
    side: a row's whitened values, and so its tree log-probabilities, do not depend on the
    rows it comes with."""
    from tailkit.plugins.samplers.tree.draw_kernels import whiten_rows

    rng = np.random.default_rng(5)
    rows, dim, k = 40, 300, 16
    x = rng.standard_normal((rows, dim)).astype(np.float32)
    mean = rng.standard_normal(dim).astype(np.float32)
    transform = rng.standard_normal((k, dim)).astype(np.float32)
    transform_t = np.ascontiguousarray(transform.T)
    together = np.empty((rows, k), dtype=np.float32)
    whiten_rows(x, mean, transform_t, together)
    for i in range(rows):
        alone = np.empty((1, k), dtype=np.float32)
        whiten_rows(x[i : i + 1], mean, transform_t, alone)
        np.testing.assert_array_equal(alone[0], together[i])
    exact = (x.astype(np.float64) - mean) @ transform.T.astype(np.float64)
    np.testing.assert_allclose(together, exact, rtol=1e-6, atol=1e-5)


def test_whitening_is_reused_only_for_the_same_unmodified_batch() -> None:
    """A step whitens its batch for the draws and again for the positives' log q: the second
    call reuses the first's x̃, but never for another object or after an in-place change."""
    from tailkit.testing.trees import random_tree

    sampler = random_tree(100, 12)
    x = torch.randn(8, 12, generator=torch.Generator().manual_seed(0))
    first = sampler.whiten(x)
    assert sampler.whiten(x) is first
    twin = x.clone()
    assert sampler.whiten(twin) is not first and torch.equal(sampler.whiten(twin), first)
    x[3].mul_(2.0)  # in place: the version counter moves
    again = sampler.whiten(x)
    assert again is not first and not torch.equal(again, first)
    sampler._whitened = None
    assert torch.equal(sampler.whiten(x), again)  # what a fresh whitening gives
    rows = x[2:5]  # a view shares its base's version counter
    view_first = sampler.whiten(rows)
    x[3].mul_(0.5)
    assert not torch.equal(sampler.whiten(rows), view_first)


def test_whitening_memo_sees_sparse_rows_inference_mode_and_changes_to_its_result() -> None:
    from tailkit.sparse import SparseRows
    from tailkit.testing.trees import random_tree

    sampler = random_tree(100, 12)
    x = torch.randn(8, 12, generator=torch.Generator().manual_seed(1))
    first = sampler.whiten(x)
    clean = first.clone()
    first.add_(1.0)  # a caller that changed x̃: not handed out again
    again = sampler.whiten(x)
    assert again is not first and torch.equal(again, clean)
    with torch.inference_mode():  # no version counters: whitened every time, no error
        frozen = x.clone()
        a, b = sampler.whiten(frozen), sampler.whiten(frozen)
        assert a is not b and torch.equal(a, b)
        ids, log_q = sampler.sample(frozen, torch.zeros(8, dtype=torch.int64), 4, torch.Generator())
        assert ids.shape == log_q.shape == (8, 4)
    import scipy.sparse as sp

    dense = torch.randn(5, 12, generator=torch.Generator().manual_seed(2)).numpy()
    rows = SparseRows.from_scipy(sp.csr_matrix(dense))
    sparse_first = sampler.whiten(rows)
    assert sampler.whiten(rows) is sparse_first
    rows.values.mul_(3.0)
    assert not torch.equal(sampler.whiten(rows), sparse_first)
