"""Starting a label-sharded run: torchrun for the processes, the process group for each.

``train.distributed: {nproc_per_node: N, nnodes: 1}`` with N > 1 makes ``tailkit train``
start the same command again under ``torchrun --standalone --nproc-per-node N`` (torch's own
launcher; the DVC stage stays the one command it was) and wait for it: its exit code is the
job's, and torchrun ends the whole job when one process dies. Each process then joins the
process group torchrun describes (gloo on CPU, NCCL on CUDA). With ``nnodes`` > 1 the command is
run under torchrun on every host by hand or by a scheduler (README, "Beyond one process");
tailkit only joins.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist

from tailkit.distributed.world import ONE_PROCESS, World
from tailkit.errors import InvalidParameterError
from tailkit.params import DistributedParams


def under_launcher() -> bool:
    """Whether this process was started by torchrun (or another launcher that sets the
    process-group environment)."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def relaunch(settings: DistributedParams, argv: list[str]) -> int | None:
    """Run ``python -m tailkit <argv>`` under torchrun on this host and return its exit code;
    None when this process is to do the work itself (one process, or already launched)."""
    if settings.world_size == 1 or under_launcher():
        return None
    if settings.nnodes > 1:
        raise InvalidParameterError(
            f"train.distributed.nnodes: {settings.nnodes} hosts are started by running, on each, "
            f"`torchrun --nnodes {settings.nnodes} --nproc-per-node {settings.nproc_per_node} "
            "--rdzv-backend c10d --rdzv-endpoint HEAD:29400 -m tailkit "
            + " ".join(argv)
            + "` (README, 'Beyond one process')"
        )
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={settings.nproc_per_node}",
        "-m",
        "tailkit",
        *argv,
    ]
    return subprocess.run(command, check=False).returncode


def join_world(settings: DistributedParams, device: torch.device) -> World:
    """This process's place in the run: the process group torchrun set up, or one process."""
    if not under_launcher():
        return ONE_PROCESS
    size = int(os.environ["WORLD_SIZE"])
    if size != settings.world_size:
        raise InvalidParameterError(
            f"train.distributed: asks for {settings.world_size} processes, the launcher "
            f"started {size}"
        )
    if not dist.is_initialized():
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return World(dist.get_rank(), dist.get_world_size())


def leave_world(world: World) -> None:
    """Wait for every process, then take the process group down."""
    if world.sharded and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


@contextmanager
def joined_world(settings: DistributedParams, device: torch.device) -> Iterator[World]:
    """:func:`join_world` for the body, :func:`leave_world` after it, when it succeeded.

    A process whose body raised leaves without the barrier: the others may be inside a
    collective it will never join, so a barrier there waited forever (a rank that failed in
    its optimiser step hung the whole torchrun job). It exits with its error instead, and
    torchrun stops the others.
    """
    world = join_world(settings, device)
    yield world  # an exception propagates from here, past the barrier
    leave_world(world)
