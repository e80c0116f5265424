"""The sparse input layer: ``embedding_bag`` with sparse gradients against ``torch.sparse.mm``.

    python benchmarks/bench_sparse_input.py [--repeats 7] [--batch 512] [--width 256]

One training step of the first layer alone, x·E for a batch of CSR rows, then backward and the
Adagrad update of E, timed interleaved (median of ``repeats``) for three ways of computing it:

* ``bag-sparse``: what ``sparse-linear`` / ``sparse-mlp`` do: ``EmbeddingBag(mode="sum",
  sparse=True)`` with per-sample weights; the gradient touches the batch's columns only;
* ``bag-dense``: the same with ``sparse=False`` (a dense D × h gradient each step);
* ``sparse-mm``: ``torch.sparse.mm`` of the batch as a torch CSR tensor with the dense E (its
  gradient to E is dense too).

The cases are the two inputs tailkit meets: GeoNames' grid cells (830k columns, 18 per row)
and a TF-IDF bag of words (30k columns, 100 per row). The batch is gathered from the rows by
``SparseRows.index_select`` outside the timed region (the loop's batch source; its own rate is
printed). Ratios are side by side in one run; absolute times vary by ±40 % on shared machines.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import scipy.sparse as sp
import torch

from tailkit.sparse import SparseRows

torch.sparse.check_sparse_tensor_invariants.disable()

CASES = {"geocells": (830_000, 18), "tfidf": (30_000, 100)}


def rows(n: int, dim: int, per_row: int, seed: int = 0) -> SparseRows:
    rng = np.random.default_rng(seed)
    cols = np.sort(rng.choice(dim, size=(n, per_row)), axis=1)
    matrix = sp.csr_matrix(
        (np.full(n * per_row, per_row**-0.5, np.float32), cols.ravel(), np.arange(n + 1) * per_row),
        shape=(n, dim),
    )
    matrix.sum_duplicates()
    return SparseRows.from_scipy(matrix)


def step_fn(kind: str, dim: int, width: int):
    g = torch.Generator().manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(dim, width, generator=g) * width**-0.5)
    if kind.startswith("bag"):
        bag = torch.nn.EmbeddingBag(dim, width, mode="sum", sparse=kind == "bag-sparse")
        bag.weight = weight
        opt = torch.optim.Adagrad([weight], lr=0.1)

        def step(batch: SparseRows) -> None:
            indices, offsets, values = batch.bag()
            bag(indices, offsets, per_sample_weights=values).square().sum().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step
    opt = torch.optim.Adagrad([weight], lr=0.1)

    def step(batch: SparseRows) -> None:
        csr = torch.sparse_csr_tensor(batch.indptr, batch.indices, batch.values, size=batch.shape)
        torch.sparse.mm(csr, weight).square().sum().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--width", type=int, default=256)
    args = parser.parse_args()
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; batch {args.batch}, "
        f"width {args.width}; median of {args.repeats} steps (ms)"
    )
    print(
        f"{'case':<10} {'columns':>8} {'nnz/row':>7} {'batch/s':>9} {'bag-sparse':>11} "
        f"{'bag-dense':>10} {'sparse-mm':>10} {'mm/bag':>7}"
    )
    for case, (dim, per_row) in CASES.items():
        data = rows(20 * args.batch, dim, per_row)
        g = torch.Generator().manual_seed(1)
        batches = [
            data.index_select(0, torch.randint(len(data), (args.batch,), generator=g))
            for _ in range(args.repeats + 1)
        ]
        start = time.perf_counter()
        for _ in range(20):
            data.index_select(0, torch.randint(len(data), (args.batch,), generator=g))
        gather = 20 / (time.perf_counter() - start)
        kinds = ("bag-sparse", "bag-dense", "sparse-mm")
        steps = {kind: step_fn(kind, dim, args.width) for kind in kinds}
        times: dict[str, list[float]] = {kind: [] for kind in kinds}
        for kind in kinds:
            steps[kind](batches[0])  # warm-up: allocator, optimiser state
        for batch in batches[1:]:
            for kind in kinds:
                start = time.perf_counter()
                steps[kind](batch)
                times[kind].append(time.perf_counter() - start)
        ms = {kind: 1e3 * statistics.median(t) for kind, t in times.items()}
        print(
            f"{case:<10} {dim:>8,} {per_row:>7} {gather:>9,.0f} {ms['bag-sparse']:>11.2f} "
            f"{ms['bag-dense']:>10.2f} {ms['sparse-mm']:>10.2f} "
            f"{ms['sparse-mm'] / ms['bag-sparse']:>7.1f}"
        )


if __name__ == "__main__":
    main()
