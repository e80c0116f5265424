"""What multi-label rows cost a training step, measured side by side in one run.

    python benchmarks/bench_multilabel.py [--repeats 7] [--classes 100000] [--rows 1024]

Rows carry Zipf-distributed label sets (mean ``--labels`` per row, as AmazonCat-13K's 5.04 or
EURLex-4K's 5.31). Three comparisons, each against the single-label step that scores the same
number of positives, interleaved (A B A B ...) so the shared machine's drift hits both alike:

1. sampled softmax, shared uniform negatives: a multi-label batch of B rows, trained as its
   P = Σ|Y_i| (row, positive) pairs with every own label masked, against a single-label
   batch of P rows (goal: ratio <= 1.25, the pair view and the set-membership hits cost little
   beside the GEMM and the sparse update);
2. the same with per-example negatives (B·|Y| × m draws);
3. full mode at C = 10^4: ``multilabel-ce`` on (B, k) padded lists and ``softmax`` (PAL-N)
   against single-label softmax on B rows (the same B × C logits; goal <= 1.5).

Also printed: the label bookkeeping alone (select, pairs, contains) as a share of the
multi-label sampled step.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from tailkit.labels import LabelSets
from tailkit.output.optim import RowSparseAdagrad
from tailkit.output.output_layer import OutputLayer
from tailkit.registry import make_registry
from tailkit.testing.batches import full_batch
from tailkit.training.step_batch import sampled_input


def zipf_label_sets(rows: int, classes: int, mean_labels: float, seed: int) -> LabelSets:
    rng = np.random.default_rng(seed)
    p = 1.0 / np.arange(1, classes + 1)
    p /= p.sum()
    sizes = np.maximum(rng.poisson(mean_labels - 1, size=rows) + 1, 1)
    sets = [np.unique(rng.choice(classes, size=s, p=p)).tolist() for s in sizes]
    return LabelSets.from_lists(sets, classes)


class Case:
    """One training step (forward, loss, backward, row-sparse Adagrad) on a fixed batch."""

    def __init__(self, registry, args, *, classes, loss, labels, shared=True, full=False):
        gen = torch.Generator().manual_seed(0)
        self.full = full
        self.layer = OutputLayer(classes, args.dim, generator=gen)
        self.opt = RowSparseAdagrad(lr=0.1)
        self.opt.attach(self.layer, [])
        rows = len(labels) if isinstance(labels, LabelSets) else labels.shape[0]
        self.z = torch.randn(rows, args.dim, generator=gen)
        self.y = labels
        self.loss = registry.build("losses", {"name": loss}, "bench")
        if not full:
            spec = {"name": "uniform", "shared": shared}
            self.sampler = registry.build("samplers", spec, "bench")
            self.sampler.fit(None, torch.zeros(1, dtype=torch.long), classes)
        self.m = args.negatives
        self.gen = gen
        self.step_no = 0

    def step(self) -> None:
        y = self.y
        if self.full:
            logits, rows = self.layer.full(self.z)
            labels = y.padded() if isinstance(y, LabelSets) else y
            batch = full_batch(labels=labels, logits=logits)
        else:
            batch, rows = sampled_input(
                self.layer, self.sampler, self.z, self.z, y, self.m, self.gen
            )
        self.loss(batch).backward()
        self.opt.step(rows, self.step_no)
        self.step_no += 1


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def side_by_side(cases: dict[str, Case], repeats: int) -> dict[str, float]:
    for case in cases.values():  # warm-up: allocations, first-touch pages
        case.step()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(repeats):
        for name, case in cases.items():
            times[name].append(timed(case.step))
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--classes", type=int, default=100_000)
    parser.add_argument("--rows", type=int, default=1024)
    parser.add_argument("--labels", type=float, default=5.0)
    parser.add_argument("--negatives", type=int, default=1024)
    parser.add_argument("--dim", type=int, default=128)
    args = parser.parse_args()
    torch.manual_seed(0)
    registry = make_registry()
    c = args.classes
    sets = zipf_label_sets(args.rows, c, args.labels, seed=1)
    pairs = int(sets.indices.numel())
    flat = sets.pairs()[1].clone()  # the same positives, one per row
    print(
        f"B = {args.rows} rows, {pairs} (row, label) pairs ({pairs / args.rows:.2f} per row), "
        f"C = {c:,}, m = {args.negatives}, d = {args.dim}, median of {args.repeats}"
    )

    for shared in (True, False):
        kind = "shared" if shared else "per-example"
        times = side_by_side(
            {
                "multi": Case(registry, args, classes=c, loss="sampled-softmax", labels=sets,
                              shared=shared),
                "single": Case(registry, args, classes=c, loss="sampled-softmax", labels=flat,
                               shared=shared),
            },
            args.repeats,
        )  # fmt: skip
        print(
            f"sampled softmax, {kind} negatives: multi-label {times['multi'] * 1e3:.1f} ms, "
            f"single-label on the {pairs} pairs {times['single'] * 1e3:.1f} ms, "
            f"ratio {times['multi'] / times['single']:.2f}"
        )
        if shared:
            bookkeeping = side_by_side_labels(sets, args, c)
            print(
                f"  label bookkeeping (select, pairs, contains): {bookkeeping * 1e3:.2f} ms = "
                f"{100 * bookkeeping / times['multi']:.1f} % of the multi-label step"
            )

    full_c = 10_000
    full_sets = zipf_label_sets(args.rows, full_c, args.labels, seed=2)
    single = full_sets.pairs()[1][torch.cumsum(full_sets.sizes, 0) - 1]  # one label per row
    times = side_by_side(
        {
            "multilabel-ce": Case(registry, args, classes=full_c, loss="multilabel-ce",
                                  labels=full_sets, full=True),
            "softmax PAL-N": Case(registry, args, classes=full_c, loss="softmax",
                                  labels=full_sets, full=True),
            "softmax single": Case(registry, args, classes=full_c, loss="softmax",
                                   labels=single, full=True),
        },
        args.repeats,
    )  # fmt: skip
    base = times["softmax single"]
    print(
        f"full mode, C = {full_c:,}, B = {args.rows}: "
        + ", ".join(f"{name} {t * 1e3:.1f} ms ({t / base:.2f}×)" for name, t in times.items())
    )


def side_by_side_labels(sets: LabelSets, args, classes: int) -> float:
    """Median time of the label work of one multi-label sampled step, alone."""
    order = torch.randperm(len(sets))
    neg = torch.randint(classes, (args.negatives,))

    def work() -> None:
        batch = sets.select(order)
        rows, _ = batch.pairs()
        batch.contains(rows, neg)

    work()
    return statistics.median(timed(work) for _ in range(args.repeats))


if __name__ == "__main__":
    main()
