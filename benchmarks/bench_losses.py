"""Step time and peak step memory of each long-tail loss over plain softmax CE, side by side.

    python benchmarks/bench_losses.py [--rounds 7] [--steps 10] [--batch 512] [--classes 3875]
                                      [--memory-steps 3] [--no-memory] [--only NAME ...]
                                      [--system-malloc] [--loss-only]

One full training step as the loop runs it (mlp encoder 512 → 512 → 128, the core's output
layer built for the loss, forward, loss, backward, row-sparse Adagrad on the layer and Adagrad
on the encoder) for CE and each long-tail loss, on the GeoNames shape (C = 3,875, Zipf-like
counts, B = 512; ``--classes 100000`` for the extreme shape, same B). Cases are interleaved
(A B C … B C A … C A B …: each round starts one case later) for ``--rounds`` rounds of
``--steps`` steps; ``ce-control``, CE again as a case of its own, shows the benchmark's own
error. Printed per case: the median step time and its IQR, and the median over rounds of the
case's time over CE's time *in the same round* (goal: ≤ 1.05) with that ratio's IQR: on a
shared machine whose load comes and goes, a round's ratio cancels the load of that round, where
the ratio of two medians would not. The
machine's FP32 GEMM GFLOP/s is printed for scale. The timing runs with glibc's malloc set up as
the ``tailkit`` command sets it for the stages (tailkit/native/allocator.py: freed blocks reused, not
faulted in anew; ``--system-malloc`` times glibc's defaults instead). ``--loss-only`` times
the loss's own forward and backward on fixed logits and embeddings instead of the step: the
part a loss adds, free of the GEMMs' share of a shared machine's noise.

Peak memory. torch's CPU tensors come from malloc, which tracemalloc does not see and which
keeps freed blocks for reuse, so neither Python's counters nor a process's RSS alone say what a
step needs. Each case therefore runs once more in a fresh subprocess with glibc told to serve
every block of 64 KiB or more by its own mmap (``MALLOC_MMAP_THRESHOLD_``, which also turns off
glibc's sliding threshold), so a freed tensor leaves the resident set at once and the resident
set follows the live tensors. After three warm-up steps (optimiser state, lazily sized buffers)
the kernel's high-water mark is reset (``/proc/self/clear_refs``), the resident size is read,
``--memory-steps`` steps run, and the *step peak* is the high-water mark minus that resting
size: every byte a step touches above the state it keeps between steps (logits, the loss's
temporaries, saved tensors, gradients), page-granular, Linux only. The memory ratio is that
peak over CE's (goal: ≤ 1.05). The state a loss keeps between steps (ELM's memory, DRO-LT's
prototypes) is a method's own, not a step's cost; it is printed beside, as the resting size
over CE's, in MB.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch
from bench_step import gemm_gflops  # benchmarks/ is the script's directory, on sys.path

from tailkit.native.allocator import TUNABLES
from tailkit.native.restart import restart_with_settled_environment
from tailkit.output.optim import RowSparseAdagrad
from tailkit.output.output_layer import OutputLayer
from tailkit.registry import make_registry
from tailkit.testing.batches import full_batch

LOSSES = {
    "ce": {"name": "softmax"},
    # CE again, as a case of its own: its ratio to CE is the benchmark's own error (A/A)
    "ce-control": {"name": "softmax"},
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

    def loss_step(self) -> float:
        """The loss alone, forward and backward, on the logits and embeddings of a batch fixed
        at the first call (``--loss-only``): its seconds, without the copies that make leaves."""
        if not hasattr(self, "fixed"):
            with torch.no_grad():
                self.fixed = [
                    (self.layer.full(self.encoder(x))[0], self.encoder(x), y)
                    for x, y in self.batches
                ]
        logits, z, y = self.fixed[self.step_no % len(self.fixed)]
        logits, z = logits.clone().requires_grad_(), z.clone().requires_grad_()
        t = time.perf_counter()
        batch = full_batch(labels=y, logits=logits, embeddings=z, epoch=1, step=self.step_no)
        self.loss(batch).backward()
        self.step_no += 1
        return time.perf_counter() - t


def zipf_counts(num_classes: int) -> torch.Tensor:
    ranks = torch.arange(1, num_classes + 1, dtype=torch.float64)
    return torch.clamp(torch.round(20000 * ranks**-1.1), min=1)


def resident_bytes(field: str) -> int:
    """``VmRSS`` (now) or ``VmHWM`` (the high-water mark) of this process, in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def peak_of_one_case(name: str, args) -> None:
    """Run in the subprocess: print the resting size and the step peak of ``name`` as JSON."""
    registry = make_registry()  # imports every plugin: not part of a case
    before = resident_bytes("VmRSS")
    case = Case(registry, LOSSES[name], args, zipf_counts(args.classes))
    for _ in range(3):
        case.step()
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # resets VmHWM to the current resident size
    resting = resident_bytes("VmRSS")
    for _ in range(args.memory_steps):
        case.step()
    peak = resident_bytes("VmHWM") - resting
    print(json.dumps({"resting": resting - before, "peak": peak}))


def measure_memory(name: str, args) -> dict[str, int]:
    """The step peak and resting size of one case, from a fresh subprocess (see the docstring)."""
    command = [
        sys.executable,
        __file__,
        f"--batch={args.batch}",
        f"--classes={args.classes}",
        f"--features={args.features}",
        f"--memory-steps={args.memory_steps}",
        f"--peak-of={name}",
    ]
    env = {k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}  # glibc's defaults
    env["MALLOC_MMAP_THRESHOLD_"] = str(64 * 1024)
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def spread(values: list[float]) -> float:
    """The interquartile range (0 for a single value)."""
    if len(values) < 2:
        return 0.0
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--classes", type=int, default=3875)
    parser.add_argument("--features", type=int, default=512)
    parser.add_argument("--only", nargs="*", default=None, help="a subset of the loss names")
    parser.add_argument("--memory-steps", type=int, default=3)
    parser.add_argument("--no-memory", action="store_true", help="time only")
    parser.add_argument(
        "--loss-only",
        action="store_true",
        help="time the loss's forward and backward alone, on fixed logits (no GEMMs, no step)",
    )
    parser.add_argument("--peak-of", default=None, help=argparse.SUPPRESS)  # the subprocess
    parser.add_argument(
        "--system-malloc", action="store_true", help="time with glibc's malloc as it comes"
    )
    args = parser.parse_args()
    if args.peak_of is not None:
        peak_of_one_case(args.peak_of, args)
        return
    if not args.system_malloc:
        # Timed with malloc as the `tailkit` command runs the stages (tailkit/native/allocator.py);
        # the memory subprocesses start with glibc's defaults and their own setting.
        restart_with_settled_environment()

    registry = make_registry()
    counts = zipf_counts(args.classes)
    names = args.only or list(LOSSES)
    tuned = all(t in os.environ.get("GLIBC_TUNABLES", "") for t in TUNABLES)
    if "ce" not in names:
        names = ["ce", *names]
    # Memory first, one case at a time, before this process holds every case.
    skip_memory = args.no_memory or args.loss_only
    memory = {} if skip_memory else {name: measure_memory(name, args) for name in names}
    cases = {name: Case(registry, LOSSES[name], args, counts) for name in names}
    for case in cases.values():  # warm-up: allocator, first-call dispatch
        for _ in range(3):
            case.loss_step() if args.loss_only else case.step()
    times: dict[str, list[float]] = {name: [] for name in cases}
    order = list(cases)
    for round_no in range(args.rounds):
        # Each round starts one case later: a case's place in the round (what ran before it,
        # how warm the caches are) is the same for every case over len(order) rounds, where a
        # fixed order always ran CE first.
        shift = round_no % len(order)
        for name in order[shift:] + order[:shift]:
            case = cases[name]
            if args.loss_only:
                spent = sum(case.loss_step() for _ in range(args.steps))
            else:
                t = time.perf_counter()
                for _ in range(args.steps):
                    case.step()
                spent = time.perf_counter() - t
            times[name].append(spent / args.steps)

    print(
        f"torch {torch.__version__}, threads {torch.get_num_threads()}, FP32 GEMM "
        f"{gemm_gflops():.0f} GFLOP/s; B={args.batch}, C={args.classes}, mlp 512-512-128, "
        f"{args.rounds} rounds x {args.steps} steps, interleaved, "
        f"malloc {'keeps freed blocks' if tuned else 'as the system has it'}"
    )
    if args.loss_only:
        print("the loss alone, forward and backward on fixed logits: 'time / CE' is the loss's")
        print("time over CE's, and the last column the milliseconds it adds to a step")
    header = f"{'loss':<24}{'median ms':>10}{'IQR ms':>9}{'time / CE':>11}{'IQR':>7}"
    if memory:
        header += f"{'peak MB':>9}{'peak / CE':>11}{'resting MB':>12}"
    print(header)
    for name, values in times.items():
        med = statistics.median(values)
        per_round = [t / ce for t, ce in zip(values, times["ce"], strict=True)]
        ratio = statistics.median(per_round)
        line = f"{name:<24}{1e3 * med:>10.2f}{1e3 * spread(values):>9.2f}"
        line += f"{ratio:>11.3f}{spread(per_round):>7.3f}"
        ratios = [ratio]
        if memory:
            peak, ce_peak = memory[name]["peak"], memory["ce"]["peak"]
            line += f"{peak / 2**20:>9.1f}{peak / ce_peak:>11.3f}"
            line += f"{memory[name]['resting'] / 2**20:>12.1f}"
            ratios.append(peak / ce_peak)
        if args.loss_only:
            line += f"{1e3 * (med - statistics.median(times['ce'])):>+9.2f}"
        elif name != "ce":
            line += "  ok" if max(ratios) <= 1.05 else "  > 1.05"
        print(line)


if __name__ == "__main__":
    main()
