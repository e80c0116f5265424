"""The row-by-row update of sparse input tables (tailkit/output/sparse_rows.py) against torch's
optimisers, an independent dense formula, and itself under another thread count."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch

from tailkit.output.optim import RowSparseAdagrad, RowSparseSGD
from tailkit.output.output_layer import OutputLayer
from tailkit.output.sparse_rows import (
    _torch_update,
    apply_dense_adagrad,
    apply_row_adagrad,
    apply_sparse_step,
)
from tailkit.plugins.models.sparse import SparseLinear
from tailkit.sparse import SparseRows

ROWS, WIDTH = 500, 12


def _bag_grad(table: torch.nn.EmbeddingBag, seed: int) -> None:
    """A sparse gradient with many repeated rows (40 bags of 30 ids from 60 distinct)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 60, (1200,), generator=g) * 7 + seed % 3
    offsets = torch.arange(0, 1200, 30)
    weights = torch.rand(1200, generator=g, dtype=table.weight.dtype)
    table.zero_grad(set_to_none=True)
    out = table(ids, offsets, per_sample_weights=weights)
    (out.square().sum() + out.sum()).backward()


def _twins(dtype: torch.dtype) -> tuple[torch.nn.EmbeddingBag, torch.nn.EmbeddingBag]:
    torch.manual_seed(0)
    a = torch.nn.EmbeddingBag(ROWS, WIDTH, mode="sum", sparse=True).to(dtype)
    b = torch.nn.EmbeddingBag(ROWS, WIDTH, mode="sum", sparse=True).to(dtype)
    b.weight.data.copy_(a.weight.data)
    return a, b


@pytest.mark.parametrize("initial", [0.0, 0.1])
def test_adagrad_rows_equal_torch_adagrad(initial: float) -> None:
    ours, theirs = _twins(torch.float32)
    acc = torch.full_like(ours.weight, initial)
    reference = torch.optim.Adagrad(
        theirs.parameters(), lr=0.05, eps=1e-10, initial_accumulator_value=initial
    )
    for step in range(6):
        for table in (ours, theirs):
            _bag_grad(table, step)
        apply_sparse_step(ours.weight.data, ours.weight.grad, 0.05, acc=acc, eps=1e-10)
        reference.step()
    # float32 rounding of the duplicate sums' order aside, the same update
    torch.testing.assert_close(ours.weight, theirs.weight, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(acc, reference.state[theirs.weight]["sum"], rtol=1e-5, atol=1e-6)
    assert not torch.equal(ours.weight, _twins(torch.float32)[0].weight)  # it did move


def test_sgd_rows_equal_torch_sgd() -> None:
    ours, theirs = _twins(torch.float32)
    reference = torch.optim.SGD(theirs.parameters(), lr=0.3)
    for step in range(4):
        for table in (ours, theirs):
            _bag_grad(table, step)
        apply_sparse_step(ours.weight.data, ours.weight.grad, 0.3)
        reference.step()
    torch.testing.assert_close(ours.weight, theirs.weight, rtol=1e-5, atol=1e-6)


def test_adagrad_rows_follow_the_dense_formula_in_float64() -> None:
    ours, _ = _twins(torch.float64)
    w = ours.weight.detach().numpy().copy()
    acc_ref = np.full_like(w, 0.01)
    acc = torch.full_like(ours.weight, 0.01)
    for step in range(5):
        _bag_grad(ours, step)
        g = ours.weight.grad.to_dense().numpy()
        touched = np.unique(ours.weight.grad._indices()[0].numpy())
        acc_ref[touched] += g[touched] ** 2
        w[touched] -= 0.2 * g[touched] / (np.sqrt(acc_ref[touched]) + 1e-10)
        apply_sparse_step(ours.weight.data, ours.weight.grad, 0.2, acc=acc, eps=1e-10)
    np.testing.assert_allclose(ours.weight.detach().numpy(), w, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(acc.numpy(), acc_ref, rtol=1e-12, atol=0)


def _on_one_thread_and_all(update):
    """``update()``'s (table, accumulator) with numba on one thread, then on all of them."""
    results = []
    threads = numba.get_num_threads()
    try:
        for n in sorted({1, threads}):
            numba.set_num_threads(n)
            results.append(update())
    finally:
        numba.set_num_threads(threads)
    return results


def _assert_all_equal(results) -> None:
    for table, acc in results[1:]:
        assert torch.equal(table, results[0][0]) and torch.equal(acc, results[0][1])


def test_the_update_does_not_depend_on_the_thread_count() -> None:
    def update():
        table, _ = _twins(torch.float32)
        acc = torch.zeros_like(table.weight)
        for step in range(3):
            _bag_grad(table, step)
            apply_sparse_step(table.weight.data, table.weight.grad, 0.1, acc=acc)
        return table.weight.detach().clone(), acc

    _assert_all_equal(_on_one_thread_and_all(update))


@pytest.mark.parametrize("adagrad", [True, False])
def test_the_torch_path_off_the_cpu_kernel_gives_the_same_update(adagrad: bool) -> None:
    """The update CUDA tables (and dtypes the kernel does not take) get, run here on CPU."""
    ours, theirs = _twins(torch.float32)
    acc_ours = torch.full_like(ours.weight, 0.1) if adagrad else None
    acc_theirs = torch.full_like(theirs.weight, 0.1) if adagrad else None
    for step in range(4):
        for table in (ours, theirs):
            _bag_grad(table, step)
        apply_sparse_step(ours.weight.data, ours.weight.grad, 0.05, acc=acc_ours)
        grad = theirs.weight.grad
        _torch_update(
            theirs.weight.data, acc_theirs, grad._indices()[0], grad._values(), 0.05, 1e-10
        )
    torch.testing.assert_close(ours.weight, theirs.weight, rtol=1e-5, atol=1e-6)
    if adagrad:
        torch.testing.assert_close(acc_ours, acc_theirs, rtol=1e-5, atol=1e-6)


def test_an_empty_gradient_changes_nothing() -> None:
    table = torch.randn(5, 3)
    before = table.clone()
    grad = torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.long), torch.zeros(0, 3), (5, 3))
    apply_sparse_step(table, grad, 0.1, acc=torch.zeros(5, 3))
    assert torch.equal(table, before)


def _sparse_batch(seed: int) -> SparseRows:
    g = torch.Generator().manual_seed(seed)
    counts = torch.randint(1, 6, (16,), generator=g)
    indptr = torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])
    cols = [torch.randperm(ROWS, generator=g)[:c].sort().values for c in counts]
    return SparseRows(indptr, torch.cat(cols), torch.rand(int(indptr[-1]), generator=g), ROWS)


def test_row_sparse_adagrad_owns_the_table_and_resumes_from_its_state() -> None:
    """The optimiser updates a sparse input table itself (torch's Adagrad gets none of it),
    the same as torch's would, and its checkpoint state carries the table's accumulator."""

    def run(steps: range, state: tuple[dict, dict] | None = None, models=None):
        torch.manual_seed(0)
        encoder, layer = models or (SparseLinear(ROWS, dim=WIDTH, sparse_grad=True), None)
        layer = layer or OutputLayer(7, WIDTH)
        opt = RowSparseAdagrad(lr=0.1, initial_accumulator=0.0)
        opt.attach(layer, list(encoder.parameters()), sparse_tables=[encoder.embed.weight])
        if state is not None:
            opt.load_state_dict(state[0])
            opt.load_row_tables(state[1])  # the output layer's accumulators
        for step in steps:
            logits, rows = layer.full(encoder(_sparse_batch(step)))
            torch.nn.functional.cross_entropy(logits, torch.arange(16) % 7).backward()
            opt.step(rows, step)
        return encoder, layer, opt

    encoder, _, opt = run(range(4))
    assert opt.dense is None and opt.sparse_tables == [encoder.embed.weight]
    assert len(opt.acc_tables) == 1 and opt.acc_tables[0].count_nonzero() > 0

    # torch's Adagrad on the same table, same gradients
    torch.manual_seed(0)
    twin = SparseLinear(ROWS, dim=WIDTH, sparse_grad=True)
    twin_layer = OutputLayer(7, WIDTH)
    reference = torch.optim.Adagrad(twin.parameters(), lr=0.1, initial_accumulator_value=0.0)
    layer_opt = RowSparseAdagrad(lr=0.1, initial_accumulator=0.0)
    layer_opt.attach(twin_layer, [])
    for step in range(4):
        logits, rows = twin_layer.full(twin(_sparse_batch(step)))
        torch.nn.functional.cross_entropy(logits, torch.arange(16) % 7).backward()
        layer_opt.step(rows, step)
        reference.step()
        reference.zero_grad(set_to_none=True)
    torch.testing.assert_close(encoder.embed.weight, twin.embed.weight, rtol=1e-5, atol=1e-6)

    # two steps, the state saved and loaded into a fresh optimiser, two more: the same model
    first_encoder, first_layer, first = run(range(2))
    state = (dict(first.state_dict()), {k: v.clone() for k, v in first.row_tables().items()})
    resumed_encoder, _, _ = run(range(2, 4), state, (first_encoder, first_layer))
    assert torch.equal(resumed_encoder.embed.weight, encoder.embed.weight)


def test_sgd_with_momentum_leaves_the_table_to_torch() -> None:
    encoder = SparseLinear(ROWS, dim=WIDTH, sparse_grad=True)
    opt = RowSparseSGD(lr=0.1, momentum=0.9)
    opt.attach(
        OutputLayer(7, WIDTH), list(encoder.parameters()), sparse_tables=[encoder.embed.weight]
    )
    assert opt.sparse_tables == [] and opt.dense is not None
    plain = RowSparseSGD(lr=0.1)
    plain.attach(
        OutputLayer(7, WIDTH), list(encoder.parameters()), sparse_tables=[encoder.embed.weight]
    )
    assert plain.sparse_tables == [encoder.embed.weight] and plain.dense is None


def _dense_case(dtype: torch.dtype, shape: tuple[int, ...] = (300, 17)):
    g = torch.Generator().manual_seed(5)
    table = torch.randn(shape, generator=g, dtype=dtype)
    acc = torch.rand(shape, generator=g, dtype=dtype) * 1e-3
    grads = [torch.randn(shape, generator=g, dtype=dtype) * 1e-2 for _ in range(4)]
    return table, acc, grads


@pytest.mark.parametrize("shape", [(300, 17), (300,)])  # an output layer's weights, its biases
def test_dense_adagrad_follows_the_formula_in_float64(shape: tuple[int, ...]) -> None:
    table, acc, grads = _dense_case(torch.float64, shape)
    w, a = table.numpy().copy(), acc.numpy().copy()
    for grad in grads:
        a += grad.numpy() ** 2
        w -= 0.3 * grad.numpy() / (np.sqrt(a) + 1e-10)
        apply_dense_adagrad(table, acc, grad, 0.3, 1e-10)
    np.testing.assert_allclose(table.numpy(), w, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(acc.numpy(), a, rtol=1e-13, atol=0)


def test_dense_adagrad_equals_torch_adagrad_in_float32_and_its_own_torch_path() -> None:
    table, acc, grads = _dense_case(torch.float32)
    param = torch.nn.Parameter(table.clone())
    reference = torch.optim.Adagrad([param], lr=0.3, eps=1e-10)
    reference.state[param]["sum"].copy_(acc)
    fallback_table, fallback_acc = table.clone(), acc.clone()
    for grad in grads:
        apply_dense_adagrad(table, acc, grad, 0.3, 1e-10)
        param.grad = grad.clone()
        reference.step()
        # the torch ops the kernel replaces (the path off the CPU)
        fallback_acc.addcmul_(grad, grad)
        fallback_table.addcdiv_(grad, fallback_acc.sqrt().add_(1e-10), value=-0.3)
    for other, other_acc in ((param.detach(), reference.state[param]["sum"]), (fallback_table, fallback_acc)):  # fmt: skip
        torch.testing.assert_close(table, other, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(acc, other_acc, rtol=1e-6, atol=0)


def test_dense_adagrad_leaves_an_empty_label_shard_alone() -> None:
    for shape in ((0, 5), (0,)):
        table, acc = torch.empty(shape), torch.empty(shape)
        apply_dense_adagrad(table, acc, torch.empty(shape), 0.1, 1e-10)
        assert table.shape == shape


def test_dense_adagrad_does_not_depend_on_the_thread_count() -> None:
    def update():
        table, acc, grads = _dense_case(torch.float32, (2000, 64))
        for grad in grads:
            apply_dense_adagrad(table, acc, grad, 0.1, 1e-10)
        return table, acc

    _assert_all_equal(_on_one_thread_and_all(update))


def _row_case(dtype: torch.dtype, width: int | None = 17):
    """A sampled step's rows: 40 unique ids of a 300-row table, four steps of gradients."""
    table, acc, _ = _dense_case(dtype, (300, width) if width else (300,))
    g = torch.Generator().manual_seed(6)
    ids = torch.randperm(300, generator=g)[:40]
    shape = (40, width) if width else (40,)
    grads = [torch.randn(shape, generator=g, dtype=dtype) * 1e-2 for _ in range(4)]
    return table, acc, ids, grads


@pytest.mark.parametrize("width", [17, None])  # an output layer's weights, its biases
def test_row_adagrad_follows_the_formula_in_float64_and_leaves_other_rows(width) -> None:
    table, acc, ids, grads = _row_case(torch.float64, width)
    w, a = table.numpy().copy(), acc.numpy().copy()
    rows = ids.numpy()
    for grad in grads:
        a[rows] += grad.numpy() ** 2
        w[rows] -= 0.3 * grad.numpy() / (np.sqrt(a[rows]) + 1e-10)
        apply_row_adagrad(table, acc, ids, grad, 0.3, 1e-10)
    np.testing.assert_allclose(table.numpy(), w, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(acc.numpy(), a, rtol=1e-13, atol=0)
    untouched = np.setdiff1d(np.arange(300), rows)
    before, before_acc, _, _ = _row_case(torch.float64, width)
    assert np.array_equal(table.numpy()[untouched], before.numpy()[untouched])
    assert np.array_equal(acc.numpy()[untouched], before_acc.numpy()[untouched])


def test_row_adagrad_equals_its_torch_path_in_float32() -> None:
    table, acc, ids, grads = _row_case(torch.float32)
    fallback_table, fallback_acc = table.clone(), acc.clone()
    for grad in grads:
        apply_row_adagrad(table, acc, ids, grad, 0.3, 1e-10)
        # the torch ops the kernel replaces (the path off the CPU)
        a = fallback_acc.index_select(0, ids).addcmul_(grad, grad)
        fallback_acc.index_copy_(0, ids, a)
        fallback_table.index_add_(0, ids, grad / a.sqrt_().add_(1e-10), alpha=-0.3)
    torch.testing.assert_close(table, fallback_table, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(acc, fallback_acc, rtol=1e-6, atol=0)


def test_row_adagrad_does_not_depend_on_the_thread_count() -> None:
    def update():
        table, acc, ids, grads = _row_case(torch.float32)
        for grad in grads:
            apply_row_adagrad(table, acc, ids, grad, 0.1, 1e-10)
        return table, acc

    _assert_all_equal(_on_one_thread_and_all(update))
