"""The full-loss training step against the machine's own GEMM rate: examples/s, peak memory, plan.

    python benchmarks/bench_full.py [--device cpu|cuda] [--steps 4] [--dtype fp32 tf32 bf16]

A full-mode step over C labels does three GEMMs of 2·B·C·d FLOPs each (the logits, the
embeddings' gradient, the layer's gradient), so its ceiling is 6·B·C·d FLOPs at the device's
matrix rate. Per case this prints one line

    full: device=… C=… d=… B=… dtype=… path=… examples_per_s=… peak_gb=… plan_gb=…
          frac_of_peak_flops=…

- ``examples_per_s``: the training loop that ``dvc repro`` runs (tailkit/training/loop.py via
  bench_distributed.train_case: full softmax, Adagrad, a parameter-free linear encoder on
  random features), its own clock, validation excluded;
- ``peak_gb``: on CUDA the allocator's peak over the case; on a CPU the case runs in a child
  process and this is that child's peak RSS (features, layer, state and the step's tensors);
- ``plan_gb``: what `tailkit plan` counts for one process;
- ``frac_of_peak_flops``: the step's 6·B·C·d FLOPs a step at the measured examples/s, over the
  rate of the step's three GEMMs over a chunk of labels in the same dtype measured in the same run
  (``gemm_tflops``: the roofline the step is held against, not a datasheet number).

``dtype``: fp32 (TF32 off), tf32 (fp32 storage, TF32 matmuls; CUDA only), bf16 (the GEMM
calibration only: the step has no BF16 layer yet, so a bf16 step line says ``not built``).
The cases follow the goals of the label-chunked step: on a CPU C = 10^5 and 10^6 at d = 128,
B = 512; on CUDA C = 10^6 at d = 512, B = 4,096.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch
from bench_distributed import train_case

from tailkit.distributed.plan import plan
from tailkit.distributed.world import ONE_PROCESS

GEMM_CHUNK = 262_144  # labels in the calibration GEMMs (at most C): wide enough that a GPU's
# fp32 GEMMs reach the rate the step's full-width ones do (65,536 fell 14 % short on one)
ROWS_PER_BATCH = 4  # batches of distinct random rows the loop cycles through
DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16}
CASES = {"cpu": [(100_000, 128, 512), (1_000_000, 128, 512)], "cuda": [(1_000_000, 512, 4096)]}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def gemm_tflops(
    dim: int, batch: int, dtype: str, device: torch.device, classes: int, repeats: int = 5
) -> float:
    """The median rate, in TFLOP/s, of a step's three GEMMs over min(C, GEMM_CHUNK) labels: the
    logits Z·Wᵀ, the embeddings' gradient G·W and the layer's gradient Gᵀ·Z (6·B·C·d FLOPs)."""
    width = min(classes, GEMM_CHUNK)
    gen = torch.Generator().manual_seed(0)
    z = torch.randn(batch, dim, generator=gen).to(device, DTYPES[dtype])
    w = torch.randn(width, dim, generator=gen).to(device, DTYPES[dtype])
    g = torch.randn(batch, width, generator=gen).to(device, DTYPES[dtype])

    def three() -> None:
        z @ w.T, g @ w, g.T @ z

    three()  # warm-up: kernels chosen, memory allocated
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        three()
        _sync(device)
        times.append(time.perf_counter() - start)
    times.sort()
    return 6 * batch * dim * width / times[len(times) // 2] / 1e12


def step_case(classes: int, dim: int, batch: int, steps: int, device: torch.device) -> dict:
    """examples/s and the allocator's peak (CUDA) of ``steps`` full-softmax steps."""
    train_case(ONE_PROCESS, 1000, dim, 2, None, batch=batch, rows=batch, device=device)
    result, _, _ = train_case(
        ONE_PROCESS, classes, dim, steps, None, batch=batch, rows=batch * ROWS_PER_BATCH,
        device=device,
    )  # fmt: skip
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return {"examples_per_s": result.steps * batch / result.seconds, "peak": peak}


def _child_case(classes: int, dim: int, batch: int, steps: int) -> dict:
    """A CPU case in a fresh process, so its peak RSS is its own (os.wait4 gives the child's)."""
    args = [sys.executable, __file__, "--child", json.dumps([classes, dim, batch, steps])]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, cwd=Path(__file__).parent)
    out = proc.stdout.read() if proc.stdout else b""
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"bench_full: the case C={classes} failed in its child process")
    record = json.loads(out.decode().strip().splitlines()[-1])
    record["peak"] = usage.ru_maxrss * 1024
    return record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--dtype", nargs="*", default=None)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        classes, dim, batch, steps = json.loads(a.child)
        print(json.dumps(step_case(classes, dim, batch, steps, torch.device("cpu"))))
        return
    device = torch.device(a.device)
    on_cuda = device.type == "cuda"
    dtypes = a.dtype or (["fp32", "tf32", "bf16"] if on_cuda else ["fp32"])
    where = torch.cuda.get_device_name(device) if on_cuda else "cpu"
    print(f"# {where}, torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    for classes, dim, batch in CASES[device.type]:
        planned = plan(classes, dim, 1, batch_size=batch).total_bytes / 1e9
        for dtype in dtypes:
            torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
            rate = gemm_tflops(dim, batch, dtype, device, classes)
            head = f"full: device={device.type} C={classes} d={dim} B={batch} dtype={dtype}"
            if dtype == "bf16":
                print(f"{head} path=materialised examples_per_s=not-built gemm_tflops={rate:.3g}")
                continue
            if on_cuda:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
                r = step_case(classes, dim, batch, a.steps, device)
            else:
                r = _child_case(classes, dim, batch, a.steps)
            achieved = 6 * batch * classes * dim * r["examples_per_s"] / batch / 1e12
            print(
                f"{head} path=materialised examples_per_s={r['examples_per_s']:.0f} "
                f"peak_gb={r['peak'] / 1e9:.2f} plan_gb={planned:.2f} "
                f"frac_of_peak_flops={achieved / rate:.2f} gemm_tflops={rate:.3g}",
                flush=True,
            )


if __name__ == "__main__":
    main()
