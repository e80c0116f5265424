"""The processes of a run and the labels each one owns.

A run of W processes (torchrun, or one process: W = 1, today's behaviour) splits the output
layer by label: rank r owns a contiguous range of labels, their rows, biases and optimizer
state. Ranges are whole blocks of :data:`LABEL_BLOCK` labels (rank r gets blocks
⌊r·nb/W⌋ … ⌊(r+1)·nb/W⌋ − 1 of the nb blocks), so a shard edge always falls on a block edge
and files written per block do not depend on W (docs: the distributed design note, §3.1).
At W = 1 every collective of :mod:`tailkit.distributed.ops` is the identity, so a loss has one
code path whatever W is.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Labels per block: the unit a shard is made of (shards hold whole blocks).
LABEL_BLOCK = 4096


@dataclass(frozen=True)
class World:
    """This process's ``rank`` among ``size`` processes of ``group`` (None: the default group)."""

    rank: int = 0
    size: int = 1
    group: Any = None

    @property
    def sharded(self) -> bool:
        """Whether there is more than one process (the collectives then communicate)."""
        return self.size > 1

    def label_range(self, num_classes: int, block: int = LABEL_BLOCK) -> tuple[int, int]:
        """[start, stop) of the labels this rank owns, out of ``num_classes``."""
        return shard_range(num_classes, self.rank, self.size, block)


#: One process, every label its own: what a run without torch.distributed is.
ONE_PROCESS = World()


def shard_range(
    num_classes: int, rank: int, size: int, block: int = LABEL_BLOCK
) -> tuple[int, int]:
    """[start, stop) of the labels rank ``rank`` of ``size`` owns: whole blocks of ``block``
    labels, the blocks split as evenly as they go (the last block may be short; a rank may own
    none when there are fewer blocks than ranks)."""
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not one of {size} processes")
    blocks = -(-num_classes // block)
    first, last = rank * blocks // size, (rank + 1) * blocks // size
    return min(first * block, num_classes), min(last * block, num_classes)


def current_world() -> World:
    """The default process group as a :class:`World`, or one process when none is set up."""
    import torch.distributed as dist  # here: World itself is read by stages that import no torch

    if dist.is_available() and dist.is_initialized():
        return World(dist.get_rank(), dist.get_world_size())
    return ONE_PROCESS
