"""Step time of each long-tail loss over plain softmax CE, measured side by side in one run.

    python benchmarks/bench_losses.py [--rounds 7] [--steps 10] [--batch 512] [--classes 3875]

One full training step as the loop runs it (mlp encoder 512 → 512 → 128, the core's output
layer built for the loss, forward, loss, backward, row-sparse Adagrad on the layer and Adagrad
on the encoder) for CE and each long-tail loss, on the GeoNames shape (C = 3,875, Zipf-like
counts, B = 512). Cases are interleaved (A B C … A B C …) for ``--rounds`` rounds of ``--steps``
steps; the median step time per case and its ratio to CE are printed (goal: ≤ 1.05), with the
machine's FP32 GEMM GFLOP/s for scale.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from bench_step import gemm_gflops  # benchmarks/ is the script's directory, on sys.path

from tailkit.registry import make_registry
from tailkit.testing.batches import full_batch
from tailkit.training.optim import RowSparseAdagrad
from tailkit.training.output_layer import OutputLayer

LOSSES = {
    "ce": {"name": "softmax"},
    "logit-adjusted": {"name": "logit-adjusted"},
    "logit-adjusted-posthoc": {"name": "logit-adjusted", "adjustment": "posthoc"},
    "balanced-softmax": {"name": "balanced-softmax"},
    "ldam-drw": {"name": "ldam", "drw_epoch": 0},
    "cb-focal": {"name": "cb-focal", "loss_type": "focal"},
    "cb-sigmoid": {"name": "cb-focal", "loss_type": "sigmoid"},
    "cb-softmax": {"name": "cb-focal", "loss_type": "softmax"},
    "elm": {"name": "elm"},
    "elm-memory": {"name": "elm", "positives": "memory"},
    "dro-lt": {"name": "dro-lt"},
}


class Case:
    def __init__(self, registry, spec: dict, args, counts: torch.Tensor) -> None:
        torch.manual_seed(0)
        self.loss = registry.build("losses", spec, "bench")
        self.loss.setup(counts)
        self.encoder = registry.build(
            "models", {"name": "mlp", "hidden": [512], "dim": 128}, "bench", args.features
        )
        gen = torch.Generator().manual_seed(0)
        self.layer = OutputLayer.for_loss(self.loss, args.classes, 128, generator=gen)
        self.opt = RowSparseAdagrad(lr=0.1)
        self.opt.attach(self.layer, [*self.encoder.parameters(), *self.loss.parameters()])
        # Labels drawn from the counts, as a shuffled epoch of a long-tailed set gives.
        self.batches = [
            (
                torch.randn(args.batch, args.features, generator=gen),
                torch.multinomial(counts, args.batch, replacement=True, generator=gen),
            )
            for _ in range(4)
        ]
        self.step_no = 0

    def step(self) -> None:
        x, y = self.batches[self.step_no % len(self.batches)]
        z = self.encoder(x)
        logits, rows = self.layer.full(z)
        batch = full_batch(labels=y, logits=logits, embeddings=z, epoch=1, step=self.step_no)
        self.loss(batch).backward()
        self.opt.step(rows, self.step_no)
        self.step_no += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--classes", type=int, default=3875)
    parser.add_argument("--features", type=int, default=512)
    parser.add_argument("--only", nargs="*", default=None, help="a subset of the loss names")
    args = parser.parse_args()

    registry = make_registry()
    ranks = torch.arange(1, args.classes + 1, dtype=torch.float64)
    counts = torch.clamp(torch.round(20000 * ranks**-1.1), min=1)
    names = args.only or list(LOSSES)
    if "ce" not in names:
        names = ["ce", *names]
    cases = {name: Case(registry, LOSSES[name], args, counts) for name in names}
    for case in cases.values():  # warm-up: allocator, first-call dispatch
        for _ in range(3):
            case.step()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, case in cases.items():
            t = time.perf_counter()
            for _ in range(args.steps):
                case.step()
            times[name].append((time.perf_counter() - t) / args.steps)

    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, FP32 GEMM "
        f"{gemm_gflops():.0f} GFLOP/s; B={args.batch}, C={args.classes}, mlp 512-512-128, "
        f"{args.rounds} rounds x {args.steps} steps, interleaved"
    )
    base = statistics.median(times["ce"])
    print(f"{'loss':<24}{'median ms':>10}{'IQR ms':>9}{'ratio to CE':>13}")
    for name, values in times.items():
        q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
        med = statistics.median(values)
        flag = "" if name == "ce" else ("  ok" if med / base <= 1.05 else "  > 1.05")
        print(f"{name:<24}{1e3 * med:>10.2f}{1e3 * (q[2] - q[0]):>9.2f}{med / base:>13.3f}{flag}")


if __name__ == "__main__":
    main()
