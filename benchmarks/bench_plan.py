"""`tailkit plan` against a real run: one process's peak device memory and examples/s.

    python benchmarks/bench_plan.py [--device cuda] [--dim 512] [--batch 4096]
                                    [--sampled 1000000 10000000] [--full 1000000]
                                    [--negatives 1024] [--steps 20]

For each size it trains with the loop that `dvc repro` runs (tailkit/training/loop.py): a
parameter-free linear encoder on random dense features (the output layer is what is measured),
Adagrad, sampled softmax with shared uniform negatives (``--sampled``) or the full softmax
(``--full``). Printed per case: the plan's per-process bytes (tailkit/training/plan.py,
output layer, optimiser state and a step's activations), the peak the device's allocator
reported over the run (``torch.cuda.max_memory_allocated``: the same tensors plus what a step
really allocates beyond the plan's count), and examples/s of the loop (its own clock; the loop
synchronises with the device every step). On a CPU the peak column is left empty: a process's
peak RSS spans every case run before (use bench_losses' subprocess measure for a CPU peak).
"""

from __future__ import annotations

import argparse

import torch
from bench_distributed import train_case

from tailkit.distributed.world import ONE_PROCESS
from tailkit.training.plan import plan

ROWS_PER_BATCH = 8  # batches of distinct random rows to cycle through


def _case(
    classes: int, dim: int, batch: int, negatives: int | None, steps: int, device: torch.device
) -> dict:
    result, _, _ = train_case(
        ONE_PROCESS, classes, dim, steps, negatives, batch=batch, rows=batch * ROWS_PER_BATCH,
        device=device,
    )  # fmt: skip
    # the allocator's peak over this case; a CPU process has only its lifetime's peak RSS,
    # which would carry an earlier case's
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    planned = plan(classes, dim, 1, batch_size=batch, negatives=negatives)
    return {
        "planned": planned.total_bytes,
        "layer_and_state": planned.layer_bytes + planned.optimizer_bytes,
        "peak": peak,
        "examples_per_second": result.steps * batch / result.seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--negatives", type=int, default=1024)
    parser.add_argument("--sampled", type=int, nargs="*", default=[1_000_000, 10_000_000])
    parser.add_argument("--full", type=int, nargs="*", default=[1_000_000])
    parser.add_argument("--steps", type=int, default=20)
    a = parser.parse_args()
    device = torch.device(a.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"{where}; d = {a.dim}, batch {a.batch:,}, fp32, Adagrad, {a.steps} steps a case")
    print("| mode | C | plan: layer + state | plan: total | measured peak | examples/s |")
    print("|---|---:|---:|---:|---:|---:|")
    _case(1000, a.dim, a.batch, a.negatives, 3, device)  # CUDA context, kernels, allocator
    cases = [(c, a.negatives) for c in a.sampled] + [(c, None) for c in a.full]
    for classes, negatives in cases:
        r = _case(classes, a.dim, a.batch, negatives, a.steps, device)
        mode = "full softmax" if negatives is None else f"sampled ({negatives:,} uniform)"
        peak = "–" if r["peak"] is None else f"{r['peak'] / 1e9:.2f} GB"
        print(
            f"| {mode} | {classes:,} | {r['layer_and_state'] / 1e9:.2f} GB | "
            f"{r['planned'] / 1e9:.2f} GB | "
            f"{peak} | "
            f"{r['examples_per_second']:,.0f} |",
            flush=True,
        )
        if device.type == "cuda":
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
