"""Adagrad and SGD on a sparse input table (an ``EmbeddingBag(sparse=True)``), row by row; and
Adagrad on a whole output layer in one pass (:func:`apply_dense_adagrad`), or on the rows a
sampled step touched (:func:`apply_row_adagrad`).

Why hand-written: ``torch.optim.Adagrad`` on a sparse gradient coalesces it, then makes about
six passes over the touched rows of a table with 10^5–10^6 rows (add the squared values into
the accumulator, ``sparse_mask`` it back out, divide, add into the weights), each a scattered
read of rows that are no longer in cache, some through a per-row loop. On the default GeoNames
run (830,909 columns, 512 rows of 18 non-zeros a step, width 128) that was 15 ms of a 60 ms
step, more than the output layer's forward GEMM. Here one compiled pass sums each touched
row's gradient (its duplicates in the order they came) and updates its accumulator and weights
while the row is in cache.

The arithmetic is torch's: g = Σ duplicates, a ← a + g·g, w ← w − lr·g/(√a + ε), each step
rounded on its own (no fused multiply-add, so no instruction set changes a value). It is not
bit-identical to torch's, whose coalesce sums duplicates in another order and whose update
rounds differently; tests/output/test_sparse_rows.py compares it with ``torch.optim.Adagrad`` and
``SGD`` on the same gradients, and with a float64 formula.
Each row is summed and updated by one thread in a fixed order, so the result does not depend
on the thread count. Off the CPU the same update runs as torch ops.
"""

from __future__ import annotations

import numba
import numpy as np
import torch

from tailkit.native import kernel_cache  # noqa: F401  (before any cache=True kernel: its locator)


@numba.njit(cache=True, inline="always")
def _adagrad_row(row, acc_row, g, lr, eps):  # pragma: no cover
    """a ← a + g·g, w ← w − lr·g/(√a + ε) on one row, each step rounded on its own: the
    arithmetic of every Adagrad kernel here. Row views indexed from 0: the loop vectorises."""
    for c in range(g.shape[0]):
        a = acc_row[c] + g[c] * g[c]
        acc_row[c] = a
        row[c] = row[c] + (-lr) * (g[c] / (np.sqrt(a) + eps))


@numba.njit(parallel=True, cache=True)
def _update(table, acc, sorted_ids, order, starts, values, lr, eps, adagrad):  # pragma: no cover
    width = table.shape[1]
    for s in numba.prange(starts.shape[0] - 1):
        lo, hi = starts[s], starts[s + 1]
        row = sorted_ids[lo]
        g = values[order[lo]].copy()
        for j in range(lo + 1, hi):
            src = values[order[j]]
            for c in range(width):
                g[c] += src[c]
        if adagrad:
            _adagrad_row(table[row], acc[row], g, lr, eps)
        else:
            for c in range(width):
                table[row, c] = table[row, c] + (-lr) * g[c]


@numba.njit(parallel=True, cache=True)
def _update_all(table, acc, grad, lr, eps):  # pragma: no cover
    for r in numba.prange(table.shape[0]):
        _adagrad_row(table[r], acc[r], grad[r], lr, eps)


@numba.njit(parallel=True, cache=True)
def _update_listed(table, acc, ids, grad, lr, eps):  # pragma: no cover
    for r in numba.prange(ids.shape[0]):
        _adagrad_row(table[ids[r]], acc[ids[r]], grad[r], lr, eps)


_KERNEL_SCALARS: dict[torch.dtype, type[np.floating]] = {
    torch.float32: np.float32,
    torch.float64: np.float64,
}


def _kernel_scalar(table: torch.Tensor) -> type[np.floating] | None:
    """The NumPy scalar type the compiled kernels update ``table`` in (lr and eps are cast
    to it, as torch casts alpha and eps), or None where torch's ops do it: off the CPU, or a
    dtype the kernels are not compiled for."""
    return _KERNEL_SCALARS.get(table.dtype) if table.device.type == "cpu" else None


def apply_dense_adagrad(
    table: torch.Tensor, acc: torch.Tensor, grad: torch.Tensor, lr: float, eps: float
) -> None:
    """Adagrad on every row of ``table`` from its dense gradient (a full-softmax step's output
    layer), with the arithmetic of :func:`apply_sparse_step`.

    torch's ``addcmul_`` / ``sqrt`` / ``addcdiv_`` make four passes over the table and a
    temporary as large: 2.4 ms a step for the synthetic XC set's 10,000 × 256 layer on the
    2-core AVX-512 machine, where this one pass takes 0.7 ms. Its values differ from torch's in the
    last bit now and then (torch's vectorised float32 ``sqrt`` is not always correctly rounded,
    and its ``addcmul_`` fuses the multiply-add); tests/output/test_sparse_rows.py compares both with
    a float64 formula.
    """
    with torch.no_grad():
        scalar = _kernel_scalar(table)
        if scalar is None or not (table.is_contiguous() and acc.is_contiguous()):
            acc.addcmul_(grad, grad)
            table.addcdiv_(grad, acc.sqrt().add_(eps), value=-lr)
            return
        if table.numel() == 0:  # a label shard that owns no labels
            return
        rows = table.shape[0]  # the kernel takes (rows, width): a bias vector is width 1
        _update_all(
            table.reshape(rows, -1).numpy(),
            acc.reshape(rows, -1).numpy(),
            grad.contiguous().reshape(rows, -1).numpy(),
            scalar(lr),
            scalar(eps),
        )


def apply_row_adagrad(
    table: torch.Tensor,
    acc: torch.Tensor,
    ids: torch.Tensor,
    grad: torch.Tensor,
    lr: float,
    eps: float,
) -> None:
    """Adagrad on rows ``ids`` (unique) of ``table`` from their gradient ``grad`` (one row per
    id; a bias is a table of width 1), with the arithmetic of :func:`apply_sparse_step`.

    A sampled step's output layer: torch's select, multiply-add, copy back, square root,
    divide and scattered add made six passes over the touched rows and four temporaries as
    large (0.79 ms of a 7 ms step at 1,024 rows of 1,024 shared negatives, d = 128, on a
    2-core AVX-512 machine); this is one pass. Each row is updated by one thread, so the values do
    not depend on the thread count; ids must be unique, as ``OutputLayer.sampled`` makes them.
    """
    with torch.no_grad():
        scalar = _kernel_scalar(table)
        if scalar is None or not (table.is_contiguous() and acc.is_contiguous()):
            a = acc.index_select(0, ids).addcmul_(grad, grad)
            acc.index_copy_(0, ids, a)
            table.index_add_(0, ids, grad / a.sqrt_().add_(eps), alpha=-lr)
            return
        if ids.numel() == 0:
            return
        _update_listed(
            table.reshape(table.shape[0], -1).numpy(),
            acc.reshape(acc.shape[0], -1).numpy(),
            ids.numpy(),
            grad.contiguous().reshape(ids.shape[0], -1).numpy(),
            scalar(lr),
            scalar(eps),
        )


def _torch_update(table, acc, ids, values, lr, eps) -> None:
    merged = torch.sparse_coo_tensor(ids[None], values, table.shape).coalesce()
    rows, g = merged.indices()[0], merged.values()
    if acc is not None:
        a = acc.index_select(0, rows).add_(g * g)
        acc.index_copy_(0, rows, a)
        g = g / a.sqrt_().add_(eps)
    table.index_add_(0, rows, g, alpha=-lr)


def apply_sparse_step(
    table: torch.Tensor,
    grad: torch.Tensor,
    lr: float,
    *,
    acc: torch.Tensor | None = None,
    eps: float = 1e-10,
) -> None:
    """Update ``table`` (rows × width) in place from its sparse COO gradient ``grad``: Adagrad
    with accumulator ``acc`` (same shape, updated too), or plain SGD when ``acc`` is None."""
    ids = grad._indices()[0]
    values = grad._values()
    if ids.numel() == 0:
        return
    with torch.no_grad():
        scalar = _kernel_scalar(table)
        if scalar is None:
            _torch_update(table, acc, ids, values, lr, eps)
            return
        ids_np = ids.numpy()
        order = np.argsort(ids_np, kind="stable")  # duplicates summed in the order they came
        sorted_ids = ids_np[order]
        starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1], True])
        _update(
            table.numpy(),
            (acc if acc is not None else table).numpy(),
            sorted_ids,
            order,
            starts,
            values.contiguous().numpy(),
            scalar(lr),  # in the table's precision, as torch casts alpha and eps
            scalar(eps),
            acc is not None,
        )
