"""The row-sparse output layer and its optimisers against dense autograd references."""

from __future__ import annotations

import pytest
import torch

from tailkit.output.optim import RowSparseAdagrad, RowSparseSGD
from tailkit.output.output_layer import OutputLayer


def _layer(c=50, d=8, seed=0):
    return OutputLayer(c, d, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("shared", [True, False])
def test_sampled_logits_match_dense_gather(shared):
    g = torch.Generator().manual_seed(1)
    layer = _layer()
    layer.bias.uniform_(-1, 1, generator=g)
    z = torch.randn(6, 8, generator=g)
    y = torch.tensor([0, 3, 3, 7, 49, 0])
    neg = torch.randint(50, (5,) if shared else (6, 5), generator=g)
    neg[0] = 3  # a hit for rows 1 and 2, and a duplicate of a positive row
    out = layer.sampled(z, y, neg)
    w, b = layer.weight, layer.bias
    torch.testing.assert_close(out.pos, (z * w[y]).sum(1) + b[y])
    if shared:
        torch.testing.assert_close(out.neg, z @ w[neg].T + b[neg])
        assert out.hits.equal(neg[None, :] == y[:, None])
    else:
        torch.testing.assert_close(out.neg, torch.einsum("bmd,bd->bm", w[neg], z) + b[neg])
        assert out.hits.equal(neg == y[:, None])
    # each touched row appears once, so gradients arrive summed over duplicates
    assert out.rows.ids.unique().numel() == out.rows.ids.numel()


def _dense_reference(layer, z, y, neg, loss_fn):
    w = layer.weight.clone().requires_grad_()
    b = layer.bias.clone().requires_grad_()
    pos = (z * w[y]).sum(1) + b[y]
    negl = z @ w[neg].T + b[neg]
    loss_fn(pos, negl).backward()
    return w.grad, b.grad


def _sampled_loss(pos, neg):
    return (torch.logsumexp(torch.cat([pos[:, None], neg], 1), 1) - pos).sum()


def test_sgd_matches_dense_autograd_step_and_leaves_other_rows():
    g = torch.Generator().manual_seed(2)
    layer = _layer()
    z = torch.randn(4, 8, generator=g)
    y = torch.tensor([1, 2, 2, 5])
    neg = torch.tensor([2, 9, 9, 11])
    gw, gb = _dense_reference(layer, z, y, neg, _sampled_loss)
    before_w, before_b = layer.weight.clone(), layer.bias.clone()
    opt = RowSparseSGD(lr=0.5)
    opt.attach(layer, [])
    out = layer.sampled(z, y, neg)
    _sampled_loss(out.pos, out.neg).backward()
    opt.step(out.rows, 0)
    torch.testing.assert_close(layer.weight, before_w - 0.5 * gw)
    torch.testing.assert_close(layer.bias, before_b - 0.5 * gb)
    untouched = torch.ones(50, dtype=torch.bool)
    untouched[[1, 2, 5, 9, 11]] = False
    assert layer.weight[untouched].equal(before_w[untouched])


def test_adagrad_matches_torch_adagrad_on_touched_rows():
    g = torch.Generator().manual_seed(3)
    layer = _layer()
    ref_w = layer.weight.clone().requires_grad_()
    ref_b = layer.bias.clone().requires_grad_()
    ref_opt = torch.optim.Adagrad([ref_w, ref_b], lr=0.3, eps=1e-10, initial_accumulator_value=1e-8)
    opt = RowSparseAdagrad(lr=0.3, eps=1e-10, initial_accumulator=1e-8)
    opt.attach(layer, [])
    for step in range(4):
        z = torch.randn(5, 8, generator=g)
        y = torch.randint(50, (5,), generator=g)
        neg = torch.randint(50, (7,), generator=g)
        out = layer.sampled(z, y, neg)
        _sampled_loss(out.pos, out.neg).backward()
        opt.step(out.rows, step)
        ref_opt.zero_grad()
        pos = (z * ref_w[y]).sum(1) + ref_b[y]
        _sampled_loss(pos, z @ ref_w[neg].T + ref_b[neg]).backward()
        ref_opt.step()
    # Torch's dense Adagrad divides by sqrt(acc)+eps on every row, but an untouched row has
    # zero gradient there too, so lazy and dense updates agree everywhere.
    torch.testing.assert_close(layer.weight, ref_w.detach(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(layer.bias, ref_b.detach(), rtol=1e-5, atol=1e-6)


def test_full_logits_and_step():
    g = torch.Generator().manual_seed(4)
    layer = _layer(c=20)
    z = torch.randn(3, 8, generator=g)
    y = torch.tensor([0, 4, 19])
    w = layer.weight.clone().requires_grad_()
    b = layer.bias.clone().requires_grad_()
    torch.nn.functional.cross_entropy(z @ w.T + b, y).backward()
    expected = layer.weight - 0.1 * w.grad
    opt = RowSparseSGD(lr=0.1)
    opt.attach(layer, [])
    logits, rows = layer.full(z)
    torch.nn.functional.cross_entropy(logits, y).backward()
    opt.step(rows, 0)
    torch.testing.assert_close(layer.weight, expected)


def test_learning_rate_decay_follows_bamler_mandt_schedule():
    opt = RowSparseSGD(lr=0.02, decay_steps=100.0, decay_power=0.5)
    assert opt.learning_rate(0) == pytest.approx(0.02)
    assert opt.learning_rate(300) == pytest.approx(0.02 * (100 / 400) ** 0.5)
    assert RowSparseSGD(lr=0.3).learning_rate(10**6) == 0.3


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("frozen_encoder", [False, True])
def test_full_logits_equal_addmm_bit_for_bit(dtype: torch.dtype, frozen_encoder: bool) -> None:
    """The full layer's written-out backward gives autograd's addmm values and gradients."""
    gen = torch.Generator().manual_seed(4)
    layer = OutputLayer(37, 6, generator=gen)
    layer.weight, layer.bias = layer.weight.to(dtype), torch.randn(37, generator=gen, dtype=dtype)
    z0 = torch.randn(9, 6, generator=gen, dtype=dtype)
    upstream = torch.randn(9, 37, generator=gen, dtype=dtype)
    z = z0.clone().requires_grad_(not frozen_encoder)
    logits, rows = layer.full(z)
    logits.backward(upstream)
    ref_z = z0.clone().requires_grad_(not frozen_encoder)
    ref_w = layer.weight.clone().requires_grad_()
    ref_b = layer.bias.clone().requires_grad_()
    ref = torch.addmm(ref_b, ref_z, ref_w.t())
    ref.backward(upstream)
    assert torch.equal(logits, ref)
    assert torch.equal(rows.weight.grad, ref_w.grad) and torch.equal(rows.bias.grad, ref_b.grad)
    assert z.grad is None if frozen_encoder else torch.equal(z.grad, ref_z.grad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cosine_logits_gradients_equal_autograd_normalize(dtype: torch.dtype) -> None:
    """The cosine layer's written-out backward (float32 on the CPU: the compiled projection of
    cosine_kernels; float64: torch) against autograd through ``zs @ F.normalize(w).T`` in
    float64, with a row of norm below ε (the clamp binds: its gradient is G/ε, no projection)
    and rows of very different norms."""
    from tailkit.output.output_layer import _CosineLogits

    g = torch.Generator().manual_seed(4)
    c, d, b = 700, 24, 9
    w = torch.randn(c, d, generator=g, dtype=torch.float64)
    w[3] *= 1e-14
    w[5] *= 1e3
    w[6] *= 1e-3
    zs = torch.randn(b, d, generator=g, dtype=torch.float64)
    grad = torch.randn(b, c, generator=g, dtype=torch.float64)
    w64, zs64 = w.clone().requires_grad_(), zs.clone().requires_grad_()
    (zs64 @ torch.nn.functional.normalize(w64, dim=1, eps=1e-12).T).backward(grad)
    wx = w.to(dtype).requires_grad_()
    zx = zs.to(dtype).requires_grad_()
    out = _CosineLogits.apply(zx, wx, 1e-12)
    out.backward(grad.to(dtype))
    tol = {"rtol": 2e-5, "atol": 1e-5} if dtype == torch.float32 else {"rtol": 1e-10, "atol": 1e-14}
    scale = w64.grad.abs().amax(dim=1, keepdim=True).clamp_min(1e-300)
    torch.testing.assert_close(wx.grad.double() / scale, w64.grad / scale, **tol)
    torch.testing.assert_close(zx.grad.double(), zs64.grad, **tol)


def _per_example_step(
    compiled, monkeypatch, *, classes, rows, m, d, dtype, z_grad=True, shard=None
):
    """Scores, the gathered rows' gradients and z's gradient of one per-example sampled step
    with the compiled rows gradient (tailkit/output/row_gradient_kernels.py) or without;
    z is an encoder's output (not a leaf), its input's gradient is returned."""
    from tailkit.output import output_layer

    layer = OutputLayer(classes, d, generator=torch.Generator().manual_seed(1), rows=shard)
    layer.weight, layer.bias = layer.weight.to(dtype), layer.bias.to(dtype)
    g = torch.Generator().manual_seed(2)
    layer.bias.uniform_(-1, 1, generator=g)
    x = torch.randn(rows, d, generator=g, dtype=dtype).requires_grad_(z_grad)
    z = x * 0.5 + 0.25
    y = torch.randint(classes, (rows,), generator=g)
    neg = torch.randint(classes, (rows, m), generator=g)  # repeats and hits at small C
    with monkeypatch.context() as patch:
        if not compiled:
            patch.setattr(output_layer, "_compiled_rows_gradient", lambda *args: False)
        out = layer.sampled(z, y, neg)
    # the path asked for is the path taken
    assert (type(out.neg.grad_fn).__name__ == "_PerExampleScoresBackward") == compiled
    weights = (
        torch.randn(rows, generator=g, dtype=dtype),
        torch.randn(rows, m, generator=g, dtype=dtype),
    )
    ((out.pos * weights[0]).sum() + (out.neg * weights[1]).sum()).backward()
    return out.pos, out.neg, out.rows.weight.grad, out.rows.bias.grad, x.grad


@pytest.mark.parametrize(
    ("classes", "rows", "m", "d", "dtype", "z_grad"),
    [
        (40, 64, 16, 8, torch.float32, True),  # many repeated rows, positives among negatives
        (100_000, 300, 16, 128, torch.float32, True),  # few repeats
        (30, 7, 5, 3, torch.float64, True),
        (20, 40, 3, 4, torch.float32, False),  # a frozen encoder: no gradient for z
        (10, 1, 1, 2, torch.float32, True),
        (10, 0, 4, 2, torch.float32, True),  # no rows
        (10, 3, 0, 2, torch.float32, True),  # no negatives
    ],
)
def test_per_example_rows_gradient_is_autograds_bit_for_bit(
    monkeypatch, classes, rows, m, d, dtype, z_grad
):
    shape = {"classes": classes, "rows": rows, "m": m, "d": d, "dtype": dtype, "z_grad": z_grad}
    fused = _per_example_step(True, monkeypatch, **shape)
    torch_ops = _per_example_step(False, monkeypatch, **shape)
    for a, b in zip(fused, torch_ops, strict=True):
        assert (a is None and b is None) or torch.equal(a, b)


def test_per_example_rows_gradient_on_a_label_shard_is_autograds(monkeypatch) -> None:
    """A label shard scores the labels it owns and zero rows for the others
    (OutputLayer.sampled): the gathered rows then come from index_copy, not a leaf."""
    shape = {"classes": 60, "rows": 32, "m": 8, "d": 6, "dtype": torch.float32, "shard": (20, 45)}
    fused = _per_example_step(True, monkeypatch, **shape)
    torch_ops = _per_example_step(False, monkeypatch, **shape)
    assert fused[2].abs().sum() > 0  # owned rows received gradient
    for a, b in zip(fused, torch_ops, strict=True):
        assert torch.equal(a, b)


def test_per_example_rows_gradient_passes_gradcheck() -> None:
    from tailkit.output.output_layer import _PerExampleScores

    g = torch.Generator().manual_seed(3)
    z = torch.randn(5, 3, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(6, 3, generator=g, dtype=torch.float64, requires_grad=True)
    bias = torch.randn(6, generator=g, dtype=torch.float64, requires_grad=True)
    pos_idx = torch.tensor([0, 2, 2, 5, 1])
    neg_idx = torch.tensor([[1, 1, 3], [0, 4, 2], [5, 5, 5], [3, 0, 1], [2, 4, 0]])
    assert torch.autograd.gradcheck(
        lambda *t: _PerExampleScores.apply(*t, pos_idx, neg_idx), (z, weight, bias)
    )


def test_per_example_rows_gradient_is_the_same_on_one_thread_and_on_all(monkeypatch) -> None:
    import numba

    # ~4,000 gathered rows: 16 parallel tasks of 256
    shape = {"classes": 20_000, "rows": 256, "m": 16, "d": 32, "dtype": torch.float32}
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = _per_example_step(True, monkeypatch, **shape)
    finally:
        numba.set_num_threads(before)
    every = _per_example_step(True, monkeypatch, **shape)
    assert all(torch.equal(a, b) for a, b in zip(one, every, strict=True))


@pytest.mark.parametrize(
    ("n", "low", "high"),
    [
        (17_408, 0, 1_000_000),  # a per-example step's ids at C = 10^6: two radix passes
        (2_048, 0, 3_875),
        (1_000, 0, 2**40),  # four passes
        (500, -(2**62), 2**62),  # negative values included
        (500, -(2**63), 2**63 - 1),  # the whole int64 range: the span wraps past 2^63
        (7, 5, 6),  # one distinct value: span 0
        (1, 0, 10),
        (0, 0, 10),
    ],
)
def test_unique_ids_are_torch_uniques(n, low, high):
    from tailkit.output.output_layer import unique_ids
    from tailkit.output.unique_kernels import unique_inverse

    g = torch.Generator().manual_seed(n)
    values = torch.randint(low, high, (n,), generator=g)
    if n > 2 and high - low > 2**62:  # the extremes themselves
        values[0], values[1] = low, high
    want_ids, want_inverse = torch.unique(values, return_inverse=True)
    kernel = tuple(torch.from_numpy(a) for a in unique_inverse(values.numpy()))
    for ids, inverse in (unique_ids(values), kernel):
        assert ids.dtype == inverse.dtype == torch.int64
        assert torch.equal(ids, want_ids) and torch.equal(inverse, want_inverse)
