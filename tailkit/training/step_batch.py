"""One training step's inputs, from the epoch's row ids to the loss's batch.

The rows' features go to the device (augmented, when the encoder has a ``train_transform``),
the encoder embeds them (a label-sharded run: this process's slice under DDP, or the whole
batch on every rank, then gathered), and the output layer scores them: every label for a
full-mode loss (the (B, C) logits, or :class:`~tailkit.distributed.chunked_logits.ChunkedLogits`
when the layer is wider than the chunk and the loss is chunkable, whose backward updates the
layer's rows itself), or each row's positive and drawn negatives for a sampled loss. Whatever
the encoder or the sampler raises comes out as a :class:`~tailkit.errors.ComponentFault`, which
the stage names with the plugin.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import cast

import torch

from tailkit.components import FullBatch, SampledBatch, Sampler
from tailkit.distributed.ops import gather_rows, scale_gradient, sum_gradient, sum_over_ranks
from tailkit.distributed.world import ONE_PROCESS, World
from tailkit.errors import ComponentFault
from tailkit.labels import LabelSets
from tailkit.output.optim import RowSparseOptimizer
from tailkit.output.output_layer import OutputLayer, Rows

#: What a model's forward may raise for bad input or a bug of its own (a ComponentFault).
_MODEL_ERRORS = (RuntimeError, ValueError, TypeError, IndexError, KeyError, AttributeError)


@dataclass(frozen=True)
class StepScoring:
    """How every step of a run scores its batch (fixed for the run)."""

    layer: OutputLayer
    sampler: Sampler | None
    optimizer: RowSparseOptimizer
    log_prior: torch.Tensor
    negatives: int
    sample_gen: torch.Generator
    #: labels per chunk of a chunked full step; None: the logits held whole
    chunk_width: int | None
    #: GEMM inputs of a chunked step in bf16 (fp32 accumulation) instead of fp32
    bf16: bool
    world: World = ONE_PROCESS


def embed_rows(
    forward: Callable[[torch.Tensor], torch.Tensor],
    x: torch.Tensor,
    whole: torch.Tensor,
    idx: torch.Tensor,
    world: World,
    replicate: bool,
) -> torch.Tensor:
    """Φ of the global batch: this process's rows embedded and gathered in a sharded run, or
    the whole batch on every rank (``replicate``) with its gradient summed over the ranks."""
    try:
        if replicate:
            return sum_gradient(forward(whole), world)
        if world.sharded:  # every rank knows the split: no count exchange
            return gather_rows(forward(x), world, [len(p) for p in idx.tensor_split(world.size)])
        return forward(x)
    except _MODEL_ERRORS as exc:
        raise ComponentFault("model", f"forward raised {_brief(exc)}") from exc


def loss_batch(
    scoring: StepScoring,
    z: torch.Tensor,
    whole: torch.Tensor,
    y: torch.Tensor | LabelSets,
    *,
    epoch: int,
    step: int,
) -> tuple[FullBatch | SampledBatch | None, Rows | None]:
    """The loss's batch and the output rows it touches (None for a chunked step, whose
    backward updates the rows; a batch of None when no row has a label to learn from)."""
    layer, world = scoring.layer, scoring.world
    if scoring.sampler is None:
        rows: Rows | None = None
        if scoring.chunk_width is not None:
            update = partial(scoring.optimizer.step_range, step=step)
            chunked = layer.chunked(
                z, scoring.chunk_width, update, world, torch.bfloat16 if scoring.bf16 else None
            )
            # typed as the tensor it stands for: only a Loss.chunkable loss receives it
            logits = cast(torch.Tensor, chunked)
        else:
            logits, rows = layer.full(z)
        batch = FullBatch(
            labels=y.padded() if isinstance(y, LabelSets) else y,
            logits=logits,
            num_classes=layer.total_classes,
            label_start=layer.label_start,
            world=world,
            log_prior=scoring.log_prior,
            embeddings=z,
            epoch=epoch,
            step=step,
        )
        return batch, rows
    if isinstance(y, LabelSets) and y.indices.numel() == 0:
        return None, None  # no (row, positive) pair to score: nothing to learn from
    return sampled_input(
        layer,
        scoring.sampler,
        whole,
        z,
        y,
        scoring.negatives,
        scoring.sample_gen,
        log_prior=scoring.log_prior,
        epoch=epoch,
        step=step,
        world=world,
    )


def batch_inputs(
    x_train: torch.Tensor,
    idx: torch.Tensor,
    world: World,
    transform: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None,
    augment_gen: torch.Generator,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The encoder's input rows of a step and the whole global batch's (the sampler's input).

    One process: both are the batch. A sharded run encodes its own slice of the global batch;
    augmentation is drawn for the whole batch (so a row gets the crop it gets in one process)
    and sliced, and the sampler sees the whole batch, as every rank draws for all of it."""
    if not world.sharded:
        x = x_train.index_select(0, idx).to(device, non_blocking=True)
        if transform is not None:
            x = transform(x, augment_gen)
        return x, x
    whole = x_train.index_select(0, idx).to(device, non_blocking=True)
    if transform is not None:
        whole = transform(whole, augment_gen)
        return whole.tensor_split(world.size)[world.rank], whole
    mine = idx.tensor_split(world.size)[world.rank]
    return x_train.index_select(0, mine).to(device, non_blocking=True), whole


def sampled_input(
    layer: OutputLayer,
    sampler: Sampler,
    x: torch.Tensor,
    z: torch.Tensor,
    y: torch.Tensor | LabelSets,
    negatives: int,
    generator: torch.Generator,
    *,
    log_prior: torch.Tensor,
    epoch: int = 0,
    step: int = 0,
    world: World = ONE_PROCESS,
) -> tuple[SampledBatch, Rows]:
    """A batch's :class:`SampledBatch` and the output rows it touches.

    Negatives are drawn for each row (or shared by the batch) and only the positive and
    negative rows of the output layer are scored. Multi-label ``y`` is taken as its
    (row, positive) pairs, with every label of a pair's row marked as an accidental hit
    (module docstring). ``log_prior``, ``epoch`` and ``step`` fill the batch's fields of those
    names.

    In a label-sharded run (``world``, ``layer`` this rank's shard) ``x``, ``z`` and ``y`` are
    the whole global batch on every rank and ``generator`` is seeded alike on all, so every
    rank draws the same negatives with the same log q; each scores the rows it owns, and the
    logits are summed over the ranks, which gives every rank one process's batch, so any
    sampled loss runs unchanged. Its gradient reaches each rank's own rows only; a term the
    loss computes from ``batch.embeddings`` alone is replicated, so its gradient is scaled by
    1/W (the embeddings' gradients are summed over the ranks).
    """
    pair_rows = None
    if isinstance(y, LabelSets):
        sets = y
        pair_rows, y = sets.pairs()
        z = z.index_select(0, pair_rows)
    if sampler.conditions_on == "scores":
        # The model-based proposal sees the current scores, never the parameters.
        with torch.no_grad():
            given = layer.full(z.detach())[0]
    else:
        given = x if pair_rows is None else x.index_select(0, pair_rows)
    neg, neg_log_q = sampler.sample(given, y, negatives, generator)
    if neg.device.type == "cpu" or step == 0:  # a check syncs a GPU: its first batch only
        check_sampled_ids(neg, neg_log_q, layer.total_classes)
    pos_log_q = sampler.log_prob(given, y.unsqueeze(1)).squeeze(1)
    scored = layer.sampled(z, y, neg)
    pos, negative, embeddings = scored.pos, scored.neg, z
    if world.sharded:  # one all-reduce for both
        both = sum_over_ranks(torch.cat([pos.unsqueeze(1), negative], 1), world)
        # contiguous, as one process's are: a strided view can take another reduction path
        pos, negative = both[:, 0].contiguous(), both[:, 1:].contiguous()
        embeddings = scale_gradient(z, 1.0 / world.size)
    batch = SampledBatch(
        labels=y,
        pos_logits=pos,
        neg_logits=negative,
        pos_log_q=pos_log_q,
        neg_log_q=neg_log_q,
        hits=scored.hits if pair_rows is None else sets.contains(pair_rows, neg),
        neg_ids=neg,
        sampler_conditional=sampler.conditional,
        embeddings=embeddings,
        log_prior=log_prior,
        epoch=epoch,
        step=step,
    )
    return batch, scored.rows


def check_sampled_ids(neg: torch.Tensor, log_q: torch.Tensor, num_classes: int) -> None:
    """Refuse a sampler's draw that the output layer cannot score: ids that are not integers
    in [0, C), or log q of another shape (an out-of-range id would otherwise surface as an
    IndexError inside index_select, or a device-side assert on a GPU)."""
    if neg.dtype not in (torch.int64, torch.int32) or neg.shape != log_q.shape:
        raise ComponentFault(
            "sampler",
            f"sample returned ids of {neg.dtype} {tuple(neg.shape)} and log q of "
            f"{tuple(log_q.shape)}; expected integer ids and log q of the same shape",
        )
    if neg.numel():
        low, high = torch.aminmax(neg)
        if int(low) < 0 or int(high) >= num_classes:
            bad = int(low) if int(low) < 0 else int(high)
            raise ComponentFault(
                "sampler", f"sample returned label id {bad}, outside [0, {num_classes})"
            )


def _brief(exc: BaseException) -> str:
    """``TypeError: message`` on one line, at most 200 characters."""
    text = " ".join(str(exc).split())
    text = text if len(text) <= 200 else text[:197] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
