"""The feature cache at speed: Parquet → torch load rate against a numpy memmap of the same
array, and the batch source's rows/s against the training step's examples/s, in one run.

    python benchmarks/bench_cache.py [--rows 500000] [--dim 128] [--repeats 5]

1. Load: one (rows × dim) float32 array written once with :func:`tailkit.storage.feature_cache.write_features`
   (zstd, BYTE_STREAM_SPLIT) and once with ``np.save``; then, interleaved, ``read_features``
   (decode to a torch tensor, zero-copy from Arrow) against ``np.load(mmap_mode="r")`` copied
   into a torch tensor (what a trainer needs: the whole array in memory). Both read from the
   warm page cache; GB/s is array bytes over the median time.
2. Batches: the training loop's batch source (``randperm`` once per epoch, then
   ``index_select`` of B rows of x and y from the in-memory tensors) in rows/s, divided by the
   examples/s of real training steps measured in the same run (goal: ≥ 10, so feeding the step
   costs under a tenth of it): the default GeoNames step (full softmax, C = 3,875, d = 512,
   B = 512) and a sampled-softmax step at C = 10^5 (benchmarks/bench_step.py's case).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from tailkit.registry import make_registry
from tailkit.storage.feature_cache import read_features, write_features

sys.path.insert(0, str(Path(__file__).parent))
from bench_step import StepCase


def elapsed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def load_rates(rows: int, dim: int, repeats: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, dim), dtype=np.float32)
    labels = rng.integers(0, 1000, rows)
    gb = x.nbytes / 1e9
    with tempfile.TemporaryDirectory() as tmp:
        parquet, npy = Path(tmp) / "train.parquet", Path(tmp) / "train.npy"
        write_features(parquet, x, labels, np.arange(rows), {"bench": True})
        np.save(npy, x)

        def from_parquet() -> torch.Tensor:
            return read_features(parquet).x

        def from_memmap() -> torch.Tensor:
            return torch.from_numpy(np.array(np.load(npy, mmap_mode="r")))

        assert torch.equal(from_parquet(), from_memmap())
        times: dict[str, list[float]] = {"parquet": [], "memmap": []}
        for _ in range(repeats):  # interleaved: drift hits both alike
            times["parquet"].append(elapsed(from_parquet))
            times["memmap"].append(elapsed(from_memmap))
        p, m = (statistics.median(times[k]) for k in ("parquet", "memmap"))
        print(
            f"load {rows:,} × {dim} float32 ({gb:.2f} GB; Parquet file "
            f"{parquet.stat().st_size / 1e9:.2f} GB): Parquet→torch {gb / p:.2f} GB/s, "
            f"memmap→torch {gb / m:.2f} GB/s, Parquet/memmap time {p / m:.2f}"
        )


def batch_rate(x: torch.Tensor, y: torch.Tensor, batch: int, seconds: float = 1.0) -> float:
    """Rows/s of the loop's batch source over whole epochs of a seeded permutation."""
    g = torch.Generator().manual_seed(0)
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        perm = torch.randperm(x.shape[0], generator=g)
        for i in range(0, x.shape[0] - batch + 1, batch):
            idx = perm[i : i + batch]
            x.index_select(0, idx)
            y.index_select(0, idx)
            done += batch
    return done / (time.perf_counter() - start)


def step_rate(case: StepCase, batch: int, repeats: int) -> float:
    case.step()  # warm-up
    return batch / statistics.median(elapsed(case.step) for _ in range(repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=500_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    load_rates(args.rows, args.dim, args.repeats)

    registry = make_registry()
    cases = {
        "default GeoNames step (full softmax, C=3,875, d=512, B=512)": (
            StepCase(registry, 3875, True, argparse.Namespace(dim=512, batch=512, negatives=0)),
            512,
            512,
        ),
        "sampled softmax (uniform, m=1024, C=1e5, d=128, B=1024)": (
            StepCase(
                registry, 100_000, False, argparse.Namespace(dim=128, batch=1024, negatives=1024)
            ),
            1024,
            128,
        ),
    }
    g = torch.Generator().manual_seed(0)
    for name, (case, batch, dim) in cases.items():
        x = torch.randn(200_000, dim, generator=g)
        y = torch.randint(0, 1000, (200_000,), generator=g)
        rows_per_s = statistics.median(batch_rate(x, y, batch) for _ in range(args.repeats))
        examples_per_s = step_rate(case, batch, args.repeats * 4)
        print(
            f"{name}: batch source {rows_per_s:,.0f} rows/s, step {examples_per_s:,.0f} "
            f"examples/s, ratio {rows_per_s / examples_per_s:.1f} (goal >= 10)"
        )


if __name__ == "__main__":
    main()
