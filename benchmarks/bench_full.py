"""The full-loss training step, materialised and chunked, against the machine's own GEMM rate.

    python benchmarks/bench_full.py [--device cpu|cuda] [--steps 3] [--repeats 3]
                                    [--dtype fp32 tf32 bf16] [--classes 100000]

A full-mode step over C labels needs three GEMMs of 2·B·C·d FLOPs each (the logits, the
embeddings' gradient, the layer's gradient), so its ceiling is 6·B·C·d FLOPs at the device's
matrix rate. Two steps are measured side by side, per case and dtype: ``materialised`` holds
the (B, C) logits and their gradient; ``chunked`` scores the labels ``AUTO_WIDTH`` at a time
and recomputes each chunk's logits in the backward (tailkit/distributed/chunked_logits.py:
four GEMMs, so at most 0.75 of the ceiling below). Per path this prints one line

    full: device=… C=… d=… B=… dtype=… path=… examples_per_s=… peak_gb=… step_gb=…
          plan_gb=… frac_of_peak_flops=… gemm_tflops=…

and then the two paths' ratios: ``time``, the chunked step's seconds over the materialised
one's, and ``step_memory``, the chunked ``step_gb`` over the materialised one.

- ``examples_per_s``: the training loop that ``dvc repro`` runs (tailkit/training/loop.py via
  bench_distributed.train_case: full softmax, Adagrad, random features through one learned
  d × d layer, so the step forms the embeddings' gradient as any model with parameters
  does), its own clock, validation excluded; on a CPU the median of ``--repeats`` runs of
  each path, the paths alternated;
- ``peak_gb``: on CUDA the allocator's peak over the case; on a CPU the peak RSS of the
  process the case runs in (a fresh one per case), its high-water mark reset before each run
  (/proc/self/clear_refs); ``step_gb``: that peak less the RSS the run started from (the
  interpreter, torch and the features are not the step's), what the goals compare;
- ``plan_gb``: what `tailkit plan` counts for one process (layer, optimiser state, a step's
  activations) with that path's ``label_chunk``;
- ``frac_of_peak_flops``: the step's 6·B·C·d FLOPs at the measured examples/s, over the
  rate of the step's three GEMMs over a chunk of labels in the same dtype measured in the same
  run (``gemm_tflops``: the roofline the step is held against, not a datasheet number).

``dtype`` is ``train.matmul``: fp32 (TF32 off), tf32 (fp32 storage, TF32 matmuls; CUDA only),
bf16 (the chunk GEMMs' inputs in bf16, float32 accumulation, statistics and updates; chunked
step only, so the materialised line says ``not-built``; the layer itself stays float32).
The cases follow the goals of the label-chunked step: on a CPU C = 10^5 and 10^6 at d = 128,
B = 512; on CUDA C = 10^6 at d = 512, B = 4,096.
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from bench_distributed import train_case

from tailkit.distributed.chunked_logits import AUTO_WIDTH
from tailkit.distributed.world import ONE_PROCESS
from tailkit.training.plan import plan

GEMM_CHUNK = 262_144  # labels in the calibration GEMMs (at most C): wide enough that a GPU's
# fp32 GEMMs reach the rate the step's full-width ones do (65,536 fell 14 % short on one)
ROWS_PER_BATCH = 4  # batches of distinct random rows the loop cycles through
DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16}
CASES = {"cpu": [(100_000, 128, 512), (1_000_000, 128, 512)], "cuda": [(1_000_000, 512, 4096)]}
#: the two full steps: the (B, C) logits held whole, and scored in chunks (train.label_chunk)
PATHS = {"materialised": None, "chunked": AUTO_WIDTH}


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


def step_case(
    classes: int,
    dim: int,
    batch: int,
    steps: int,
    device: torch.device,
    chunk: int | None,
    dtype: str = "fp32",
) -> dict:
    """examples/s and the allocator's peak (CUDA) of ``steps`` full-softmax steps, their
    output-layer GEMMs in ``dtype`` (train.matmul)."""
    train_case(
        ONE_PROCESS, 1000, dim, 2, None, batch=batch, rows=batch, device=device,
        label_chunk=chunk and min(chunk, 256), learned_encoder=True, matmul=dtype,
    )  # fmt: skip
    result, _, _ = train_case(
        ONE_PROCESS, classes, dim, steps, None, batch=batch, rows=batch * ROWS_PER_BATCH,
        device=device, label_chunk=chunk, learned_encoder=True, matmul=dtype,
    )  # fmt: skip
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None
    return {"examples_per_s": result.steps * batch / result.seconds, "peak": peak}


def _status_bytes(field: str) -> int:
    """A field of /proc/self/status in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise SystemExit(f"bench_full: no {field} in /proc/self/status")


def _cpu_cases(
    classes: int, dim: int, batch: int, steps: int, repeats: int, dtype: str = "fp32"
) -> dict:
    """Both paths of a CPU case in this process, alternated ``repeats`` times: each path's
    median examples/s, its peak RSS (the high-water mark reset before each run through
    /proc/self/clear_refs) and the RSS it started from."""
    paths = _paths(dtype)
    out: dict[str, dict] = {path: {"rates": [], "peak": 0, "base": 0} for path in paths}
    for _ in range(repeats):
        for path, chunk in paths.items():
            gc.collect()
            Path("/proc/self/clear_refs").write_text("5")
            base = _status_bytes("VmRSS")
            r = step_case(classes, dim, batch, steps, torch.device("cpu"), chunk, dtype)
            record = out[path]
            record["rates"].append(r["examples_per_s"])
            record["peak"] = max(record["peak"], _status_bytes("VmHWM"))
            record["base"] = max(record["base"], base)
    return {
        path: {
            "examples_per_s": statistics.median(r["rates"]),
            "peak": r["peak"],
            "base": r["base"],
        }
        for path, r in out.items()
    }


def _paths(dtype: str) -> dict[str, int | None]:
    """The paths built for ``dtype``: bf16 GEMMs exist for the chunked step only."""
    return {p: c for p, c in PATHS.items() if dtype != "bf16" or c is not None}


def _child_cases(classes: int, dim: int, batch: int, steps: int, repeats: int, dtype: str) -> dict:
    """A CPU case's runs in a fresh process, so the memory it reads is theirs alone."""
    case = [classes, dim, batch, steps, repeats, dtype]
    args = [sys.executable, __file__, "--child", json.dumps(case)]
    proc = subprocess.run(args, stdout=subprocess.PIPE, cwd=Path(__file__).parent, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"bench_full: the case C={classes} failed in its child process")
    records: dict = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=3, help="runs of each path (CPU)")
    parser.add_argument("--dtype", nargs="*", default=None)
    parser.add_argument("--classes", type=int, nargs="*", help="only these C")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.child:
        print(json.dumps(_cpu_cases(*json.loads(a.child))))
        return
    device = torch.device(a.device)
    on_cuda = device.type == "cuda"
    dtypes = a.dtype or (["fp32", "tf32", "bf16"] if on_cuda else ["fp32"])
    where = torch.cuda.get_device_name(device) if on_cuda else platform.processor() or "cpu"
    print(f"# {where}, torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    for classes, dim, batch in CASES[device.type]:
        if a.classes and classes not in a.classes:
            continue
        for dtype in dtypes:
            torch.backends.cuda.matmul.allow_tf32 = dtype == "tf32"
            rate = gemm_tflops(dim, batch, dtype, device, classes)
            head = f"full: device={device.type} C={classes} d={dim} B={batch} dtype={dtype}"
            if dtype == "bf16":
                print(f"{head} path=materialised examples_per_s=not-built gemm_tflops={rate:.3g}")
            if on_cuda:
                results = {}
                for path, chunk in _paths(dtype).items():
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats(device)
                    results[path] = step_case(classes, dim, batch, a.steps, device, chunk, dtype)
                    results[path]["base"] = 0
            else:
                results = _child_cases(classes, dim, batch, a.steps, a.repeats, dtype)
            for path, r in results.items():
                planned = plan(classes, dim, 1, batch_size=batch, label_chunk=PATHS[path])
                achieved = 6 * batch * classes * dim * r["examples_per_s"] / batch / 1e12
                own = r["peak"] - r["base"]
                print(
                    f"{head} path={path} examples_per_s={r['examples_per_s']:.0f} "
                    f"peak_gb={r['peak'] / 1e9:.2f} step_gb={own / 1e9:.3f} "
                    f"plan_gb={planned.total_bytes / 1e9:.3f} "
                    f"frac_of_peak_flops={achieved / rate:.2f} gemm_tflops={rate:.3g}",
                    flush=True,
                )
            if "materialised" not in results:
                continue
            fast, slow = results["chunked"], results["materialised"]
            print(
                f"{head} chunked/materialised: time="
                f"{slow['examples_per_s'] / fast['examples_per_s']:.2f} step_memory="
                f"{(fast['peak'] - fast['base']) / max(slow['peak'] - slow['base'], 1):.3f}",
                flush=True,
            )


if __name__ == "__main__":
    main()
