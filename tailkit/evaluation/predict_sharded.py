"""Prediction over a label-sharded layer: each rank scores its own labels in chunks (the
single-process :func:`tailkit.evaluation.predict.predict`, under global label ids), then the
ranks' top-k, log-partitions and true-label scores are merged, so every rank ends with what one
process computes over all labels: the same top-k ids (higher score first, equal scores to the
lower id), the log-partition up to float rounding, the true score exactly.

A loss that adds a conditional sampler's per-row correction (the adversarial tree's log p_n)
scores labels in the sampler's table order, which a label range does not follow; there the
ranks split the rows instead: each gathers the whole layer and predicts its own slice of the
rows over all labels, and the slices are stacked. A row's predictions do not depend on the rows
beside it, so this is one process's result bit for bit, at the memory cost of the whole layer
on every rank (as the tree's tables already are).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from tailkit.components import Encoder, Loss
from tailkit.distributed.ops import all_gather_rows
from tailkit.distributed.world import World
from tailkit.evaluation.correction import PredictionContext
from tailkit.evaluation.predict import Predictions, predict
from tailkit.evaluation.topk_merge import merge_logsumexp, merge_topk
from tailkit.output.output_layer import OutputLayer
from tailkit.output.shards import whole_layer


def _merged(part: Predictions, k: int, world: World) -> Predictions:
    rows, have = part.topk.shape
    scores = torch.full((rows, k), float("-inf"), dtype=part.top_scores.dtype)
    ids = torch.full((rows, k), -1, dtype=torch.long)
    scores[:, :have], ids[:, :have] = part.top_scores.cpu(), part.topk.cpu()  # a short shard
    top_scores, top_ids = merge_topk(scores, ids, k, world)
    true_score = part.true_score.cpu().clone()  # −inf on every rank but the label's owner
    dist.all_reduce(true_score, op=dist.ReduceOp.MAX, group=world.group)
    return Predictions(
        top_ids, top_scores, true_score, merge_logsumexp(part.log_partition.cpu(), world)
    )


@torch.no_grad()
def predict_sharded(
    encoder: Encoder,
    layer: OutputLayer,
    loss: Loss,
    ctx: PredictionContext,
    x: torch.Tensor,
    labels: torch.Tensor | None,
    world: World,
    *,
    k: int = 5,
    batch_size: int = 2048,
    label_chunk: int = 65536,
    unadjusted: bool = True,
) -> tuple[Predictions, Predictions | None]:
    """:func:`~tailkit.evaluation.predict.predict` over every rank's labels, on every rank (the
    rows ``x`` are the same on all: each encodes them)."""
    k = min(k, layer.total_classes)
    if world.sharded and loss.adjusts_scores and ctx.per_row_correction:
        return _by_rows(encoder, layer, loss, ctx, x, labels, world, k=k, batch_size=batch_size,
                        label_chunk=label_chunk, unadjusted=unadjusted)  # fmt: skip
    adjusted, raw = predict(encoder, layer, loss, ctx, x, labels, k=k, batch_size=batch_size,
                            label_chunk=label_chunk, unadjusted=unadjusted)  # fmt: skip
    if not world.sharded:
        return adjusted, raw
    return _merged(adjusted, k, world), None if raw is None else _merged(raw, k, world)


def _stacked(part: Predictions, world: World) -> Predictions:
    """Every rank's predictions of its own rows, stacked in rank order (= row order)."""
    fields = (part.topk, part.top_scores, part.true_score, part.log_partition)
    return Predictions(*(all_gather_rows(f.cpu().contiguous(), world)[0] for f in fields))


def _by_rows(
    encoder: Encoder,
    layer: OutputLayer,
    loss: Loss,
    ctx: PredictionContext,
    x: torch.Tensor,
    labels: torch.Tensor | None,
    world: World,
    **options,
) -> tuple[Predictions, Predictions | None]:
    """Each rank predicts its slice of the rows over the whole layer (module docstring)."""
    whole = whole_layer(layer, world)
    rows = torch.arange(x.shape[0]).tensor_split(world.size)[world.rank]
    mine = x.index_select(0, rows)
    adjusted, raw = predict(encoder, whole, loss, ctx, mine,
                            None if labels is None else labels.index_select(0, rows), **options)  # fmt: skip
    return _stacked(adjusted, world), None if raw is None else _stacked(raw, world)
