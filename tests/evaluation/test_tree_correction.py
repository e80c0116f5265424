"""Prediction's tree correction at the cost of scoring: log p_n(·|x) once per row, exact.

Random trees (random node weights, labels on a random subset of the leaves) stand in for a
fitted one, so C can be any size, 70,001 included (a 2^17-leaf tree with 61,071 padding
leaves). The brute force scores every label at once in float64 and adds the whole
``log_prob_all`` table; prediction runs with row blocks, label chunks and a table budget that
divide neither C nor the rows.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from tailkit.components import Loss
from tailkit.evaluation import predict as predict_module
from tailkit.evaluation.correction import PredictionContext
from tailkit.evaluation.predict import predict
from tailkit.output.output_layer import OutputLayer
from tailkit.plugins.losses.negative_sampling import NegativeSampling
from tailkit.plugins.models.linear import Linear
from tailkit.testing.trees import random_tree


def _setup(num_classes: int, rows: int, dim: int = 6, seed: int = 0):
    torch.manual_seed(seed)
    sampler = random_tree(num_classes, dim, k=4, seed=seed)
    encoder = Linear(dim)
    layer = OutputLayer(num_classes, dim, generator=torch.Generator().manual_seed(seed))
    layer.bias.normal_(generator=torch.Generator().manual_seed(seed + 1))
    x = torch.randn(rows, dim, generator=torch.Generator().manual_seed(seed + 2))
    labels = torch.randint(num_classes, (rows,), generator=torch.Generator().manual_seed(seed))
    return sampler, encoder, layer, x, labels


@pytest.mark.parametrize(
    ("num_classes", "label_chunk", "batch_size", "budget"),
    [(2, 1, 3, 4), (3, 2, 5, 7), (1000, 77, 13, 5000), (70_001, 9_999, 11, 300_000)],
)
def test_corrected_topk_equals_the_dense_computation(
    monkeypatch, num_classes, label_chunk, batch_size, budget
):
    monkeypatch.setattr(predict_module, "CPU_LABEL_CHUNK", 1 << 30)  # the chunks as asked
    rows = 23
    sampler, encoder, layer, x, labels = _setup(num_classes, rows)
    loss = NegativeSampling()
    ctx = PredictionContext(log_prior=torch.zeros(num_classes), sampler=sampler)
    k = min(5, num_classes)
    sampler.leaf_columns = 0
    got, raw = predict(
        encoder,
        layer,
        loss,
        ctx,
        x,
        labels,
        k=k,
        batch_size=batch_size,
        label_chunk=label_chunk,
        table_budget=budget,
    )
    # one whole-tree pass per row, however many label chunks each row went through
    assert sampler.full_tree_rows == rows
    # brute force: every label at once, in float64, plus the whole table in one call
    with torch.no_grad():
        z = encoder(x).double()
        dense = z @ layer.weight.double().t() + layer.bias.double()
        corrected = dense + sampler.log_prob_all(x).double()
    top, ids = corrected.topk(k, dim=1)
    torch.testing.assert_close(got.top_scores.double(), top, rtol=0, atol=1e-4)
    distinct = (
        (top[:, :-1] - top[:, 1:]).min(dim=1).values > 1e-3
        if k > 1
        else torch.ones(rows, dtype=torch.bool)
    )
    assert distinct.sum() > rows // 2
    assert torch.equal(got.topk[distinct], ids[distinct])
    torch.testing.assert_close(
        got.true_score.double(), corrected.gather(1, labels[:, None]).squeeze(1), rtol=0, atol=1e-4
    )
    torch.testing.assert_close(
        got.log_partition.double(), torch.logsumexp(corrected, dim=1), rtol=0, atol=1e-4
    )
    # the unadjusted ranking is the plain scores'
    torch.testing.assert_close(
        raw.top_scores.double(), dense.topk(k, dim=1).values, rtol=0, atol=1e-4
    )


def test_each_block_reads_the_exact_table_of_its_rows(monkeypatch) -> None:
    """Bit for bit: the correction a chunk adds is the whole table's columns for its rows.
    70,001 labels: 32 bottom subtrees of 4,096 leaves, so chunks span several of them (the
    CPU's chunk cap raised to let them)."""
    monkeypatch.setattr(predict_module, "CPU_LABEL_CHUNK", 5000)
    num_classes, rows = 70_001, 29
    sampler, encoder, layer, x, labels = _setup(num_classes, rows, seed=3)
    table = sampler.log_prob_all(x)
    seen = []

    class Recorder(Loss):
        def adjust_scores(self, scores, xb, ids, ctx):
            out = ctx.add_log_q(torch.zeros_like(scores), xb, ids)
            seen.append((xb, ids, out))
            return scores + out

    ctx = PredictionContext(log_prior=torch.zeros(num_classes), sampler=sampler)
    predict(
        encoder,
        layer,
        Recorder(),
        ctx,
        x,
        labels,
        k=3,
        batch_size=8,
        label_chunk=5000,
        table_budget=5 * 32,  # the kernel holds 32 subtree roots per row: 5 rows per block
    )
    bounds = sampler.chunk_bounds(num_classes, 5000)
    assert len(bounds) > 10 and all(b - a <= 5000 for a, b in itertools.pairwise(bounds))
    assert len(seen) == 6 * (len(bounds) - 1)  # ⌈29 / 5⌉ row blocks × the chunks
    covered = torch.full((rows, num_classes), float("nan"))
    for xb, ids, out in seen:
        block = next(i for i in range(0, rows, 5) if torch.equal(x[i : i + len(xb)], xb))
        assert torch.equal(out, table[block : block + len(xb)][:, ids])
        covered[block : block + len(xb)][:, ids] = out
    assert torch.equal(covered, table)


def test_outside_prediction_log_q_is_computed_directly() -> None:
    sampler, _, _, x, _ = _setup(50, 4)
    ctx = PredictionContext(log_prior=torch.zeros(50), sampler=sampler)
    ids = torch.tensor([3, 49, 0])
    got = ctx.add_log_q(torch.zeros(4, 3), x, ids)
    np.testing.assert_array_equal(got.numpy(), sampler.log_prob(x, ids).numpy())


def test_fused_addition_equals_scores_plus_columns() -> None:
    """The CPU kernel's scores + log p (one pass, at subtree-aligned columns) is bit for bit
    the table's columns added to the scores; unaligned columns fall back to that sum."""
    num_classes, rows = 70_001, 9  # 9 rows: two full row groups of the kernel and one short
    sampler, _, _, x, _ = _setup(num_classes, rows)
    columns = sampler.correction_columns(x)
    bounds = sampler.chunk_bounds(num_classes, 9_999)
    assert len(bounds) > 3  # several chunks, each of whole subtrees
    for start, stop in [*itertools.pairwise(bounds), (5, 12_345)]:
        scores = torch.randn(rows, stop - start, generator=torch.Generator().manual_seed(start))
        before = scores.clone()
        fused = columns.added_to(scores, start, stop)
        assert torch.equal(fused, scores + columns.columns(start, stop))
        assert torch.equal(scores, before)  # a new tensor; the scores are left as they were


def _reversed_bits(value: int, bits: int) -> int:
    return int(format(value, f"0{bits}b")[::-1], 2) if bits else 0


def test_kernel_layout_places_every_node_where_the_kernels_read_it() -> None:
    """correction_kernels.kernel_layout against its definition, node by node: level L starts at
    2^L; a top level holds node i of the level at the bit-reversal of i; a bottom level holds
    each subtree's nodes in turn, each at the bit-reversal of its index within the subtree.
    Depth 14 with 12-level subtrees: a 2-level top tree over 4 subtrees."""
    from tailkit.plugins.samplers.tree.correction_kernels import SUBTREE_DEPTH, kernel_layout

    depth, num_classes = 14, 9_000
    sub, top = SUBTREE_DEPTH, 14 - SUBTREE_DEPTH
    sampler = random_tree(num_classes, 3, k=2)
    assert sampler.depth == depth
    weight = np.stack([np.arange((1 << depth) - 1), -np.arange((1 << depth) - 1)], 1)
    bias = np.arange((1 << depth) - 1, dtype=np.float32) + 0.5
    label_of_leaf = sampler._table("label_of_leaf").numpy()
    layout = kernel_layout(weight, bias, label_of_leaf, depth)
    weight_k, bias_k, slot, first_out = layout[:4]
    assert weight_k.shape == (2, 1 << depth) and weight_k.flags.c_contiguous
    for node in range(0, (1 << depth) - 1, 7):
        level = (node + 1).bit_length() - 1
        i = node + 1 - (1 << level)
        if level < top:
            at = (1 << level) + _reversed_bits(i, level)
        else:
            below = level - top
            r, j = divmod(i, 1 << below)
            at = (1 << level) + (r << below) + _reversed_bits(j, below)
        assert weight_k[:, at].tolist() == [node, -node]
        assert bias_k[at] == node + 0.5
    leaves = np.flatnonzero(label_of_leaf >= 0)
    assert slot.dtype == np.uint32
    # the leaf's place in its subtree's heap: leaves start at 2^S, bit-reversed (no node of
    # these weights passes through: only node 0 has w = 0, and it is no leaf's parent)
    assert slot.tolist() == [
        (1 << sub) + _reversed_bits(int(leaf) % (1 << sub), sub) for leaf in leaves
    ]
    per_subtree = [int(((leaves >> sub) == r).sum()) for r in range(1 << top)]
    assert first_out.tolist() == [0, *np.cumsum(per_subtree).tolist()]


def _loss_and_context(sampler, num_classes: int, corrected: bool):
    """Negative sampling with the tree's correction, or a loss that adjusts nothing."""
    loss = NegativeSampling() if corrected else Loss()
    ctx = PredictionContext(
        log_prior=torch.zeros(num_classes), sampler=sampler if corrected else None
    )
    return loss, ctx


def _both_returned(got, want):
    """The (adjusted, raw) predictions of two predict calls, pair by pair, where both
    returned them (one returning None means both must)."""
    for g, w in zip(got, want, strict=True):
        assert (g is None) == (w is None)
        if w is not None:
            yield g, w


@pytest.mark.parametrize("corrected", [True, False])
def test_tiles_of_a_block_predict_what_the_whole_block_does(monkeypatch, corrected) -> None:
    """Bit for bit: scoring a block's rows tile by tile (the CPU's cache-sized tiles, here
    13-14 rows of 40-row blocks) gives every row the predictions of the block scored whole."""
    num_classes, rows = 5_000, 50
    sampler, encoder, layer, x, labels = _setup(num_classes, rows, seed=5)
    loss, ctx = _loss_and_context(sampler, num_classes, corrected)

    def run(tile_floats: int):
        monkeypatch.setattr(predict_module, "CPU_TILE_SCORES", tile_floats)
        return predict(encoder, layer, loss, ctx, x, labels, k=5, batch_size=40, label_chunk=1500)

    sampler.leaf_columns = 0
    tiled = run(1)  # the floor's 16 rows: tiles of 13, 13 and 14 rows, then 10
    assert sampler.full_tree_rows == (rows if corrected else 0)  # still one pass per row
    whole = run(1 << 30)
    for got, want in _both_returned(tiled, whole):
        for name in ("topk", "top_scores", "true_score", "log_partition"):
            assert torch.equal(getattr(got, name), getattr(want, name)), name


@pytest.mark.parametrize("corrected", [True, False])
def test_the_cpu_chunk_cap_moves_only_the_log_partition(monkeypatch, corrected) -> None:
    """20,000 labels asked in chunks of 16,384: the CPU scores them in chunks of at most
    4,096. Ranking, its scores and the true label's score are those of the wide chunks bit
    for bit; the log-partition, whose chunks are rounded to float32 and then folded, within
    a few float32 ulps."""
    num_classes, rows = 20_000, 64
    sampler, encoder, layer, x, labels = _setup(num_classes, rows, seed=7)
    loss, ctx = _loss_and_context(sampler, num_classes, corrected)

    def run(cap: int):
        monkeypatch.setattr(predict_module, "CPU_LABEL_CHUNK", cap)
        return predict(encoder, layer, loss, ctx, x, labels, k=5, label_chunk=16_384)

    capped, wide = run(4096), run(1 << 30)
    for got, want in _both_returned(capped, wide):
        for name in ("topk", "top_scores", "true_score"):
            assert torch.equal(getattr(got, name), getattr(want, name)), name
        # absolute as well as relative: a log-partition near 0 carries the rounding of the
        # chunks' own log-sum-exps, values of order 1
        torch.testing.assert_close(got.log_partition, want.log_partition, rtol=1e-6, atol=1e-6)


def _leaves_of_every_subtree(sampler, x, pass_through=True, threads=None):
    """correction_kernels.subtree_leaves over all labels, in leaf order (B, C), with the sampler's
    kernel layout, or with one that computes every node of the last level, as the kernel did
    before it skipped any (``pass_through=False``)."""
    import numba

    from tailkit.plugins.samplers.tree.correction_kernels import (
        kernel_layout,
        subtree_leaves,
        subtree_roots,
    )

    t = sampler._kernel_tables()
    if not pass_through:
        tables = (sampler._table(name).numpy() for name in ("weight", "bias", "label_of_leaf"))
        t = kernel_layout(*tables, sampler.depth, pass_through=False)
    xt = sampler.whiten(x).numpy()
    roots = np.empty((xt.shape[0], t.first_out.shape[0] - 1), dtype=np.float32)
    subtree_roots(xt, t.weight, t.bias, sampler.depth, roots)
    out = np.full((xt.shape[0], sampler.num_classes), np.nan, dtype=np.float32)  # none left
    subtree_leaves(
        xt, t.weight, t.bias, sampler.depth, roots, 0, roots.shape[1], t.slot, t.first_out,
        t.computed, t.delta, out,
        np.empty((0, 0), dtype=np.float32), threads or numba.get_num_threads(),
    )  # fmt: skip
    return out


def _deterministic(sampler):
    """The same tree with every w = 0 and b = ±1000 or more: each node routes one way whatever
    x, every log σ is a constant, and the leaves' log p are sums of terms of ~1e-18, where a
    pass-through child's constant shows in the last bits."""
    state = sampler.state_dict()
    g = torch.Generator().manual_seed(7)
    weight, bias = state["weight"].clone(), state["bias"].clone()
    live = weight.abs().sum(dim=1) > 0
    weight[live] = 0.0
    sign = torch.where(torch.rand(int(live.sum()), generator=g) < 0.5, 1.0, -1.0)
    bias[live] = sign * (1000.0 + 1000.0 * torch.rand(int(live.sum()), generator=g))
    state["weight"], state["bias"] = weight, bias
    sampler.load_state_dict(state)
    return sampler


def _ordinary_biases_where_one_label(sampler):
    """The same tree with w = 0 at every one-label node of the last level, wherever its label
    is (in a tree of the fit's shape, outside the computed ranges; in a scattered one, inside
    them too). Their biases are ordinary (normal, scale 3, a few of ±1000 and ±0), so log σ(±b) is no clamped
    constant and must come out of kernel_layout as the kernel itself forms it."""
    state = sampler.state_dict()
    depth = sampler.depth
    labelled = (state["label_of_leaf"] >= 0).reshape(-1, 2)
    one = torch.nonzero(labelled.sum(dim=1) == 1).squeeze(1) + (1 << (depth - 1)) - 1
    g = torch.Generator().manual_seed(11)
    bias = 3.0 * torch.randn(one.numel(), generator=g)
    bias[::7], bias[1::7], bias[2::11], bias[3::11] = 1000.0, -1000.0, 0.0, -0.0
    state["weight"] = state["weight"].clone()
    state["bias"] = state["bias"].clone()
    state["weight"][one] = 0.0
    state["bias"][one] = bias
    sampler.load_state_dict(state)
    return sampler


@pytest.mark.parametrize("num_classes", [3, 1000, 4097, 70_001, 100_000])
@pytest.mark.parametrize("shape", ["fitted", "deterministic", "biased", "scattered"])
def test_pass_through_nodes_give_the_bits_of_the_whole_last_level(num_classes, shape):
    """A fitted tree's one-label nodes of the last level (w = 0, b = +1000) are not computed:
    their child is the parent plus a constant. Bit for bit what computing every node of that
    level gives, for trees of the fit's shape; for the same trees routed deterministically,
    where the constant moves the sums' last bits; for the fit's shape with ordinary biases at
    the one-label nodes (their log σ from kernel_layout, not a clamped constant); and for
    labels on random leaves with such nodes anywhere, some inside the range the kernel
    computes (computed there as any node)."""
    from tailkit.plugins.samplers.tree.correction_kernels import SUBTREE_DEPTH

    fitted = shape != "scattered"
    sampler = random_tree(num_classes, 6, k=4, seed=num_classes, fitted_shape=fitted)
    if shape == "deterministic":
        sampler = _deterministic(sampler)
    if shape in ("biased", "scattered"):
        sampler = _ordinary_biases_where_one_label(sampler)
    t = sampler._kernel_tables()
    width = 1 << (min(sampler.depth, SUBTREE_DEPTH) - 1)
    lo, hi = t.computed[:, 0], t.computed[:, 1]
    if fitted:
        # the two-label parents, C − 2^(D−1) of them, are one run at each subtree's end
        assert ((hi == width) | (lo == hi)).all()
        assert int((hi - lo).sum()) == num_classes - (1 << (sampler.depth - 1))
    x = torch.randn(37, 6, generator=torch.Generator().manual_seed(3))  # 37: a short group
    if shape == "scattered":  # more pass-through nodes than the ranges leave out: some inside
        last = sampler._table("weight")[(1 << (sampler.depth - 1)) - 1 :]
        passing = int((last == 0).all(dim=1).sum())
        assert passing > last.shape[0] - int((hi - lo).sum()) or num_classes < 1000
    skipping = _leaves_of_every_subtree(sampler, x)
    whole = _leaves_of_every_subtree(sampler, x, pass_through=False)
    assert np.array_equal(skipping.view(np.int32), whole.view(np.int32))
    if shape == "deterministic":
        assert (np.abs(skipping[skipping > -1]) < 1e-15).any()  # the tiny sums were there


def test_a_fitted_tree_has_its_one_label_nodes_where_the_kernel_skips_them() -> None:
    """The fit's own trees: a one-label node has w = 0 exactly, and the two-label nodes of
    the last level are one run at the end of each subtree's part of it, so the kernel skips
    every other node; the result is what the whole level gives, bit for bit."""
    from tailkit.plugins.samplers.tree import TreeSampler

    num_classes, dim = 300, 5  # 512 leaves: 212 of the 256 parents hold one label
    g = torch.Generator().manual_seed(0)
    y = torch.arange(num_classes).repeat(8)
    x = torch.randn(num_classes, dim, generator=g)[y] + 0.3 * torch.randn(y.numel(), dim)
    sampler = TreeSampler(k=4)
    sampler.fit(x, y, num_classes)
    t = sampler._kernel_tables()
    width = 1 << (sampler.depth - 1)
    assert t.computed.tolist() == [[width - (num_classes - width), width]]
    rows = x[:29]
    skipping = _leaves_of_every_subtree(sampler, rows)
    whole = _leaves_of_every_subtree(sampler, rows, pass_through=False)
    assert np.array_equal(skipping.view(np.int32), whole.view(np.int32))
    # and through the sampler's own call (tree.py hands the kernel its tables)
    assert torch.equal(sampler.log_prob_all_ordered(rows), torch.from_numpy(whole))


@pytest.mark.parametrize("rows", [1, 5, 37, 130, 1921])
def test_every_row_group_is_expanded_once_however_the_blocks_are_cut(rows) -> None:
    """subtree_leaves cuts a call's row groups into near-equal blocks, as many as a multiple
    of the threads it is told of: every row comes out, with the same bits, for any count."""
    sampler = random_tree(9_000, 6, k=4, seed=1, fitted_shape=True)
    x = torch.randn(rows, 6, generator=torch.Generator().manual_seed(rows))
    first = _leaves_of_every_subtree(sampler, x, threads=1)
    assert np.isfinite(first).all() and (first <= 0).all()
    for threads in (2, 3, 7, 64):
        again = _leaves_of_every_subtree(sampler, x, threads=threads)
        assert np.array_equal(first.view(np.int32), again.view(np.int32))
