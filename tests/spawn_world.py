"""Run a check in W gloo processes on this CPU (the tests of tailkit/distributed)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from tailkit.distributed.world import World


def _worker(rank: int, size: int, rendezvous: str, check: Callable[..., None], args: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=size)
    try:
        check(World(rank, size), *args)
    finally:
        dist.destroy_process_group()


def run_world(tmp_path: Path, check: Callable[..., None], size: int = 2, *args: Any) -> None:
    """``check(world, *args)`` in ``size`` gloo processes; a failed assertion in any fails the
    test (``check`` must be a module-level function: the processes are spawned)."""
    mp.spawn(_worker, args=(size, str(tmp_path / "rendezvous"), check, args), nprocs=size)
