"""The output layer of a label-sharded run: each rank's rows, and the whole layer back.

A training run builds each rank's rows directly (``OutputLayer.for_loss(..., rows=...)``): the
rank draws the rows before its own from the same seeded generator and throws them away, block
by block, so it starts from the bits one process starts from whatever W is, without the whole
layer in memory. :func:`shard_layer` cuts a whole layer that is already in memory (a trained
model that evaluation read). :func:`whole_layer` gathers the rows back in label order, for validation and for the model
file rank 0 writes, which is then the same file one process writes.
"""

from __future__ import annotations

import torch

from tailkit.distributed.ops import all_gather_rows
from tailkit.distributed.world import LABEL_BLOCK, World
from tailkit.output.output_layer import OutputLayer


def shard_layer(layer: OutputLayer, world: World, block: int = LABEL_BLOCK) -> OutputLayer:
    """This rank's rows of a whole ``layer`` (copies), knowing where they sit among all."""
    if not world.sharded:
        return layer
    start, stop = world.label_range(layer.num_classes, block)
    shard = layer.with_weight(layer.weight[start:stop])
    shard.bias = layer.bias[start:stop].clone()
    shard.label_start, shard.total_classes = start, layer.num_classes
    return shard


def whole_layer(shard: OutputLayer, world: World) -> OutputLayer:
    """Every rank's rows of a sharded layer, in label order, on every rank (rank order is
    label order: :func:`~tailkit.distributed.world.shard_range` hands ranges out in turn)."""
    if not world.sharded:
        return shard
    packed = torch.cat([shard.weight, shard.bias.unsqueeze(1)], dim=1)
    rows, _ = all_gather_rows(packed, world)
    whole = shard.with_weight(rows[:, :-1])
    whole.bias = rows[:, -1].clone()
    whole.label_start, whole.total_classes = 0, shard.total_classes
    return whole
