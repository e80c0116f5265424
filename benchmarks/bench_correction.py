"""The adversarial tree's bias correction at prediction against scoring alone, in one run.

    python benchmarks/bench_correction.py [--labels 10000 100000 1000000] [--dims 32 256]
                                          [--device cpu|cuda]

Evaluation of a negative-sampling model adds log p_n(y|x) of the label tree to every one of the
C scores of a row (Bamler & Mandt's unbiased prediction). Per row this costs one pass over the
tree's 2^D − 1 nodes (a k = 16 dot product and a log σ each), against C dot products of length
d, a top-k and a log-sum-exp for the scores. For C = 10^4, 10^5, 10^6 and d = 32, 256 it times
:func:`tailkit.evaluation.predict.predict` (exact top-5, the evaluate stage's label chunk)
with and without the correction on the same rows, interleaved, and prints the medians of the
marginal cost of a row (a call on 2R rows minus a call on R, over R: a call's fixed cost, the
leaf-ordered copy of the output layer, is spread over all of an evaluation's rows) and their
ratio. Label chunks of 16,384 as the million-labels study asks, which the CPU narrows to
4,096 and scores in cache-sized tiles of rows (evaluation/predict.py: device_label_chunk,
tile_bounds); on a GPU they widen. Goal: corrected ÷ uncorrected ≤ 2.0 at d = 32 and ≤ 1.2
at d = 256.

Timed with malloc as the `tailkit` command runs the evaluate stage (tailkit/native/allocator.py): a
fresh (rows × chunk) block of scores is then reused, not faulted in anew.

The tree has random weights in the shape a fit gives it (tailkit.testing.trees, fitted_shape):
its evaluation cost depends on C and k only, and on that shape, since the kernel skips the
one-label nodes of the last level a fit leaves (tree/correction_kernels.kernel_layout). Before
2026-11-28 the bench put labels on random leaves instead, which made the tree cost ~25 % more
at C = 10^4 and 10^5 than a fitted one.
Timings on shared machines move by ±40 %: read the ratios, which come from the same run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tailkit.components import Loss
from tailkit.evaluation.correction import PredictionContext
from tailkit.evaluation.predict import predict
from tailkit.native.restart import restart_with_settled_environment
from tailkit.output.output_layer import OutputLayer
from tailkit.plugins.losses.negative_sampling import NegativeSampling
from tailkit.plugins.models.linear import Linear
from tailkit.testing.trees import random_tree


class _Uncorrected(Loss):
    """Scores as they are: the cost of scoring, top-k and log-partition alone."""


def _rows(num_classes: int, dim: int) -> int:
    # about 0.5–3 s per measurement at either width
    return max(256, min(8192, 4 * 10**9 // (num_classes * max(dim, 64))))


def measure(
    num_classes: int,
    dim: int,
    repeats: int,
    label_chunk: int,
    device: torch.device,
    rows: int | None = None,
) -> dict[str, float]:
    torch.manual_seed(0)
    rows = rows or _rows(num_classes, dim)
    sampler = random_tree(num_classes, dim, fitted_shape=True).to(device)
    layer = OutputLayer(num_classes, dim, device=device, generator=torch.Generator().manual_seed(0))
    encoder = Linear(dim).to(device)
    x = torch.randn(rows, dim)
    prior = torch.zeros(num_classes, device=device)
    runs = {
        "uncorrected": (_Uncorrected(), PredictionContext(log_prior=prior)),
        "corrected": (NegativeSampling(), PredictionContext(log_prior=prior, sampler=sampler)),
    }
    times: dict[str, list[float]] = {name: [] for name in runs}
    half = x[: rows // 2]
    for _ in range(repeats + 1):  # the first round warms caches and compiled kernels
        for name, (loss, ctx) in runs.items():
            spent = []
            for part in (half, x):
                start = time.perf_counter()
                predict(
                    encoder,
                    layer,
                    loss,
                    ctx,
                    part,
                    None,
                    k=5,
                    label_chunk=label_chunk,
                    unadjusted=False,
                )
                if device.type == "cuda":
                    torch.cuda.synchronize()
                spent.append(time.perf_counter() - start)
            # the marginal cost of a row: what a call costs once (the leaf-ordered copy of
            # the output layer, C × d) drops out, as it does over an evaluation's rows
            times[name].append((spent[1] - spent[0]) / (rows - rows // 2))
    per_row = {name: statistics.median(t[1:]) * 1e3 for name, t in times.items()}
    return {**per_row, "rows": rows, "ratio": per_row["corrected"] / per_row["uncorrected"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--labels", type=int, nargs="*", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--dims", type=int, nargs="*", default=[32, 256])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--label-chunk", type=int, default=16384)
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: the torch path there")
    parser.add_argument("--rows", type=int, default=None, help="rows a call (default: by size)")
    args = parser.parse_args()
    restart_with_settled_environment()
    device = torch.device(args.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(
        f"{where}, torch threads: {torch.get_num_threads()}; medians of {args.repeats}, ms per row"
    )
    print("| C | d | rows | uncorrected | corrected | ratio | goal |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for dim in args.dims:
        goal = 2.0 if dim <= 32 else 1.2
        for num_classes in args.labels:
            r = measure(num_classes, dim, args.repeats, args.label_chunk, device, args.rows)
            print(
                f"| {num_classes:,} | {dim} | {r['rows']} | {r['uncorrected']:.3f} | "
                f"{r['corrected']:.3f} | {r['ratio']:.2f} | ≤ {goal} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
