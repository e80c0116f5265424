"""Label-sharded training at 1 and 2 processes on this machine: examples/s and per-process memory.

    python benchmarks/bench_distributed.py [--classes 1000000] [--dim 32] [--steps 60]

Each configuration runs the training loop (tailkit/training/loop.py) for ``--steps`` steps on
random dense features through a parameter-free linear encoder, with one process (all threads)
and with two gloo processes (one thread each, the labels split between them), and prints, per
process count:

- examples/s of the loop (validation excluded, as the learning curve counts it);
- the bytes the process holds of the output layer and its Adagrad state (its shard's tensors),
  which must halve at two processes;
- the process's peak RSS (features, the shard, its state and a step's tensors: a process
  draws only its own initial rows).

Configurations: sampled softmax with 256 shared uniform negatives at C = ``--classes``, and the
full softmax at C / 10 (its (B, C) logits make 10^6 too slow for a quick run on 2 cores).
On 2 CPU cores two processes share the same cores one process uses, so examples/s measures the
overhead of the collectives, not a speed-up; on W GPUs each process has its own.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tailkit.distributed.world import ONE_PROCESS, World
from tailkit.output.optim import RowSparseAdagrad
from tailkit.output.output_layer import OutputLayer
from tailkit.registry import make_registry
from tailkit.training.loop import LoopConfig, TrainResult, train

ROWS, BATCH = 20_000, 512
CPU = torch.device("cpu")


def train_case(
    world: World,
    classes: int,
    dim: int,
    steps: int,
    negatives: int | None,
    *,
    batch: int = BATCH,
    rows: int = ROWS,
    device: torch.device = CPU,
    label_chunk: int | None = None,
    learned_encoder: bool = False,
    matmul: str = "fp32",
) -> tuple[TrainResult, OutputLayer, RowSparseAdagrad]:
    """``steps`` steps of the loop on random features through a parameter-free linear encoder:
    sampled softmax with ``negatives`` shared uniform negatives, or the full softmax (None),
    its labels scored ``label_chunk`` at a time when that is set. ``learned_encoder``: one
    learned d × d layer instead (an MLP without hidden layers), so that the step also forms
    the embeddings' gradient, as every model with parameters needs."""
    registry = make_registry()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(rows, dim, generator=gen)
    y = torch.randint(classes, (rows,), generator=gen)
    counts = torch.bincount(y, minlength=classes).double()
    model = (
        {"name": "mlp", "hidden": [], "dim": dim, "final_relu": False}
        if learned_encoder
        else {"name": "linear"}
    )
    torch.manual_seed(0)
    encoder = registry.build("models", model, "bench", dim).to(device)
    sampled = negatives is not None
    loss = registry.build(
        "losses", {"name": "sampled-softmax"} if sampled else {"name": "softmax"}, "bench"
    )
    sampler = None
    if sampled:
        sampler = registry.build("samplers", {"name": "uniform"}, "bench")
        sampler.fit(None, y, classes)
        sampler = sampler.to(device)
    shard = world.label_range(classes) if world.sharded else None
    layer = OutputLayer.for_loss(loss, classes, dim, device=device, generator=gen, rows=shard)
    optimizer = RowSparseAdagrad(lr=0.1)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    result = train(
        cfg=LoopConfig(
            "bench",
            epochs=10**6,
            batch_size=batch,
            negatives=negatives or 0,
            max_steps=steps,
            eval_every=10**9,
            checkpoint_every=10**9,
            label_chunk=label_chunk,
            matmul=matmul,
        ),
        encoder=encoder,
        layer=layer,
        loss=loss,
        sampler=sampler,
        optimizer=optimizer,
        x_train=x,
        y_train=y,
        x_val=x[:256],
        y_val=y[:256],
        class_counts=counts,
        world=world,
    )
    return result, layer, optimizer


def _case(world: World, classes: int, dim: int, steps: int, sampled: bool) -> dict:
    result, layer, optimizer = train_case(world, classes, dim, steps, 256 if sampled else None)
    held = sum(t.numel() * t.element_size() for t in layer.state_dict().values())
    held += sum(t.numel() * t.element_size() for t in optimizer.row_tables().values())
    return {
        "examples_per_second": result.steps * BATCH / result.seconds,
        "layer_and_state_bytes": held,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def _worker(rank: int, size: int, rendezvous: str, out: str, args: tuple) -> None:
    torch.set_num_threads(max(1, torch.get_num_threads() // size))
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=size)
    try:
        record = _case(World(rank, size), *args)
        Path(out, f"rank-{rank}.json").write_text(json.dumps(record))
    finally:
        dist.destroy_process_group()


def _run(size: int, args: tuple) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        if size == 1:
            return [_case(ONE_PROCESS, *args)]
        mp.spawn(_worker, args=(size, f"{tmp}/rdzv", tmp, args), nprocs=size)
        return [json.loads(Path(tmp, f"rank-{r}.json").read_text()) for r in range(size)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--classes", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--steps", type=int, default=60)
    a = parser.parse_args()
    print(
        "| mode | C | processes | examples/s | layer + Adagrad per process | peak RSS per process |"
    )
    print("|---|---|---|---|---|---|")
    for sampled, classes in ((True, a.classes), (False, a.classes // 10)):
        for size in (1, 2):
            records = _run(size, (classes, a.dim, a.steps, sampled))
            rate = min(r["examples_per_second"] for r in records)
            held = max(r["layer_and_state_bytes"] for r in records)
            rss = max(r["peak_rss_bytes"] for r in records)
            mode = "sampled (256 uniform)" if sampled else "full softmax"
            print(f"| {mode} | {classes:,} | {size} | {rate:,.0f} | {held / 1e6:,.1f} MB | "
                  f"{rss / 1e9:.2f} GB |")  # fmt: skip


if __name__ == "__main__":
    main()
