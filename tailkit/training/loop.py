"""The training loop, top to bottom.

    tailkit train --experiment <name>      # or: dvc repro train@<name>

Batches come from tensors already in memory (each epoch's row order and ``index_select``),
never from a per-item DataLoader. The order is a seeded ``randperm`` unless the experiment sets
``row_sampling`` to one of Kang et al.'s class-aware samplers (training/row_sampling.py). An encoder with a ``train_transform(x,
generator)`` method (the ResNet's crop-and-flip augmentation) gets each training batch on the
device first, drawing from the loop's own seeded generator, which is checkpointed with the rest
of the state; validation batches are never transformed. Each step either scores all C labels (a
``full`` loss) or asks the sampler for negatives and scores only those rows (a ``sampled``
loss); the optimiser then updates only the rows the step touched. Every ``eval_every`` steps a
fixed validation subset is scored, with the loss's prediction-time adjustment, for the learning
curve. Training time in the curve excludes those evaluations.

Multi-label rows (:class:`~tailkit.labels.LabelSets`) reach a full-mode loss as (B, k) −1-padded
label lists, and a sampled loss as the batch's (row, positive) pairs: each pair is scored
against negatives drawn for it, a negative that is any label of its row is an accidental hit,
and a batch whose rows have no label at all makes no update. The validation curve then reports
P@1 as ``val_accuracy`` and the mean over labels of the share of their rows whose top-1 is that
label as ``val_balanced_accuracy``; with one label per row both are the single-label metrics.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, cast

import numpy as np
import torch

from tailkit.components import Encoder, FullBatch, Loss, SampledBatch, Sampler
from tailkit.distributed.chunked_logits import chunk_width
from tailkit.distributed.ops import gather_rows, scale_gradient, sum_gradient, sum_over_ranks
from tailkit.distributed.predict import predict_sharded
from tailkit.distributed.world import ONE_PROCESS, World
from tailkit.errors import ComponentFault, InvalidParameterError, TrainingDivergedError
from tailkit.evaluation.correction import PredictionContext
from tailkit.evaluation.metrics import label_recall, per_class_recall
from tailkit.labels import LabelSets
from tailkit.pipeline.finite import first_non_finite
from tailkit.training.cadence import checkpoint_interval
from tailkit.training.checkpoint import Checkpointer
from tailkit.training.cuda_graph import GraphedEncoder, wants_graphs
from tailkit.training.optim import RowSparseOptimizer
from tailkit.training.output_layer import OutputLayer, Rows
from tailkit.training.row_sampling import RowSampler

CURVE_COLUMNS = ("step", "seconds", "loss", "val_accuracy", "val_balanced_accuracy")


@dataclass
class LoopConfig:
    experiment: str
    epochs: float
    batch_size: int
    negatives: int = 0
    max_steps: int | None = None
    eval_every: int = 100
    #: steps between checkpoints, or "auto": from the checkpoint's bytes and ``step_work``
    #: (the step's multiply-adds), so writing costs at most ``checkpoint_budget`` (cadence.py)
    checkpoint_every: int | str = 500
    checkpoint_budget: float = 0.05
    step_work: float = 1.0
    seed: int = 0
    #: which rows an epoch visits (training/row_sampling.py): "instance" is a seeded
    #: permutation; "class-balanced", "square-root" and "progressive" are Kang et al.'s samplers
    row_sampling: str = "instance"
    #: a full-mode step over more labels than this scores them this many at a time without
    #: holding the (B, C) logits; "auto" by their size (distributed/chunked_logits.py
    #: chunk_width); None: never
    label_chunk: int | str | None = None
    #: the output layer's GEMMs: "fp32", "tf32" (CUDA), "bf16" (chunked full steps) or
    #: "auto" (tf32 on CUDA, else fp32): :func:`_matmul`
    matmul: str = "fp32"

    def total_steps(self, rows: int) -> int:
        """Steps of a run over ``rows`` training rows: ⌈epochs × batches per epoch⌉, capped."""
        total = math.ceil(self.epochs * math.ceil(rows / self.batch_size))
        return total if self.max_steps is None else min(total, self.max_steps)


@dataclass
class TrainResult:
    steps: int
    seconds: float
    curve: list[dict[str, float]] = field(default_factory=list)
    checkpoint_every: int = 0
    #: Rows the steps saw (a batch larger than the rows sees them all, not batch_size).
    examples: int = 0

    @property
    def examples_per_second(self) -> int:
        return round(self.examples / max(self.seconds, 1e-9))


def _validate(
    encoder, layer, loss, ctx, x_val, y_val, num_classes, world=ONE_PROCESS
) -> tuple[float, float]:
    multilabel = isinstance(y_val, LabelSets)
    preds, _ = predict_sharded(
        encoder,
        layer,
        loss,
        ctx,
        x_val,
        None if multilabel else y_val,
        world,
        k=1,
        unadjusted=False,
    )
    return validation_scores(preds.topk[:, 0].cpu(), y_val, num_classes)


def validation_scores(
    top1: torch.Tensor, y_val: torch.Tensor | LabelSets, num_classes: int
) -> tuple[float, float]:
    """The learning curve's two numbers from each validation row's top-1 label: accuracy and
    balanced accuracy, or for multi-label rows P@1 and the label-averaged top-1 share."""
    if isinstance(y_val, LabelSets):
        hit = y_val.contains(torch.arange(len(y_val)), top1.unsqueeze(1)).squeeze(1).numpy()
        hit &= top1.numpy() >= 0  # −1: a tool that returned no label (its key is row·C − 1)
        recall, support = label_recall(top1.numpy()[:, None], y_val.csr_pair(), num_classes)
        return float(hit.mean()), float(recall[support > 0].mean())
    y, top = y_val.numpy(), top1.numpy()
    recall, support = per_class_recall(y, top, num_classes)
    return float((top == y).mean()), float(recall[support > 0].mean())


def validation_rows(rows: int, seed: int, count: int) -> torch.Tensor:
    """The validation rows of the learning curve: a seeded pick of ``count`` (``train.val_rows``)
    of ``rows``, the same for every experiment, whichever way it trains."""
    pick = torch.randperm(rows, generator=torch.Generator().manual_seed(seed))
    return pick[:count]


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


def train(
    *,
    cfg: LoopConfig,
    encoder: Encoder,
    layer: OutputLayer,
    loss: Loss,
    sampler: Sampler | None,
    optimizer: RowSparseOptimizer,
    x_train: torch.Tensor,
    y_train: torch.Tensor | LabelSets,
    x_val: torch.Tensor,
    y_val: torch.Tensor | LabelSets,
    class_counts: torch.Tensor,
    checkpoint: Checkpointer | None = None,
    progress: Callable[[int, int, dict[str, float]], None] | None = None,
    world: World = ONE_PROCESS,
) -> TrainResult:
    """Train for ``cfg``'s steps. ``progress(step, total, postfix)``, when given, is called
    about once a second and at each validation, with the mean loss and the examples per second
    since its last call as ``postfix`` (a progress bar's text).

    In a label-sharded run (``world`` of W processes, ``layer`` this rank's shard:
    tailkit/distributed/layer.py) every rank takes the same global batch, encodes its own slice
    of its rows with the encoder replicated under DDP (gradients summed, not averaged: each
    rank's rows carry their own part of the one global loss), gathers the embeddings of all,
    scores its own labels and runs the same loss, which combines the shards
    (``Loss.shardable``). Validation: every rank scores its own labels for all validation rows
    and the top-1 is merged (tailkit/distributed/predict.py)."""
    # A sharded run encodes its own slice of the batch under DDP, or, for an encoder without
    # dense parameters (sparse-linear's input table, or none), the whole batch on every rank:
    # DDP would all-reduce that table's sparse gradients (a gather of every rank's rows, ~30 ms
    # a step on 2 cores), while replicas that see the whole batch and its summed embedding
    # gradient take the same step with no exchange but that gradient's (B × d) all-reduce.
    replicate = world.sharded and not _dense_parameters(encoder)
    if world.sharded:
        _check_shardable(cfg, loss, sampler)
    forward: Any = _replicated(encoder, world) if world.sharded and not replicate else encoder
    device = layer.weight.device
    n = x_train.shape[0]
    steps_per_epoch = math.ceil(n / cfg.batch_size)
    total = cfg.total_steps(n)
    ctx = PredictionContext(
        log_prior=log_prior_from_counts(class_counts).to(device), sampler=sampler
    )
    loss.train_rows = n  # before setup(): a loss's tables may need N (Loss.train_rows)
    loss.setup(class_counts.to(device=device, dtype=torch.float64))
    sample_gen = torch.Generator(device=device).manual_seed(cfg.seed + 1)
    # A loss may learn parameters too (e.g. a log-normaliser); they train with the encoder's.
    dense = [*encoder.parameters(), *loss.parameters()]
    optimizer.attach(
        layer,
        [p for p in dense if p.requires_grad],
        steps_per_epoch=steps_per_epoch,
        total_steps=total,
        sparse=sampler is not None,
        sparse_tables=[
            m.weight
            for m in encoder.modules()
            if isinstance(m, torch.nn.Embedding | torch.nn.EmbeddingBag)
            and m.sparse
            and m.weight.requires_grad
        ],
        owner=f"experiments.{cfg.experiment}.optimizer",
    )
    checkpoint_every = checkpoint_interval(
        cfg.checkpoint_every,
        _tensor_bytes([layer.state_dict(), encoder.state_dict(), loss.state_dict(), optimizer]),
        cfg.step_work,
        cfg.checkpoint_budget,
    )
    chunk_width = _chunk_width(cfg, layer, loss, sampler)
    matmul = _matmul(cfg, device, chunk_width)
    transform = getattr(encoder, "train_transform", None)
    augment_gen = torch.Generator(device=device).manual_seed(cfg.seed + 2)

    step, seconds, curve, examples = 0, 0.0, [], 0
    running, running_n = 0.0, 0
    state = None
    if checkpoint is not None:  # this process's rows of the layer and the optimiser's state
        state = checkpoint.load(
            label_start=layer.label_start,
            label_stop=layer.label_start + layer.num_classes,
            world=world,
        )
    if state is not None:
        step, seconds, curve = state["step"], state["seconds"], state["curve"]
        # a checkpoint from before rows were counted: full batches, the old estimate
        examples = state.get("examples", step * cfg.batch_size)
        if tables := state["rows"]:  # this process's rows; none for a rank without labels
            layer.load_state_dict({"weight": tables["layer.weight"], "bias": tables["layer.bias"]})
            optimizer.load_row_tables(
                {k.removeprefix("optimizer."): v for k, v in tables.items() if k[:6] != "layer."}
            )
        encoder.load_state_dict(state["encoder"])
        loss.load_state_dict(state["loss"])
        optimizer.load_state_dict(state["optimizer"])
        _restore_rank_rng(state, world, cfg.seed, step)
        sample_gen.set_state(state["sample_gen"])
        if state.get("augment_gen") is not None:
            augment_gen.set_state(state["augment_gen"])
        running, running_n = state["running"]

    def refuse_non_finite(consequence: str) -> None:
        """One line naming the first NaN or infinite tensor of the state, on every rank."""
        bad = first_non_finite(
            {
                "layer": layer.state_dict(),
                "encoder": encoder.state_dict(),
                "loss": loss.state_dict(),
                "optimizer": {**optimizer.state_dict(), **optimizer.row_tables()},
            }
        )
        if world.sharded:  # every rank stops together, naming the first rank's finding
            found: list[Any] = [None] * world.size
            torch.distributed.all_gather_object(found, bad, group=world.group)
            bad = next((b for b in found if b is not None), None)
        if bad is not None:
            raise TrainingDivergedError(
                f"experiments.{cfg.experiment}: {bad} is not finite after step {step}; "
                f"{consequence}; lower optimizer.lr or check the loss's gradient"
            )

    def save_checkpoint() -> None:
        if checkpoint is None:
            return
        refuse_non_finite("no checkpoint was written")
        rows = {"layer.weight": layer.weight, "layer.bias": layer.bias}
        rows.update({f"optimizer.{k}": v for k, v in optimizer.row_tables().items()})
        checkpoint.save(
            {
                "step": step,
                "seconds": seconds,
                "curve": curve,
                "encoder": encoder.state_dict(),
                "loss": loss.state_dict(),
                "optimizer": optimizer.state_dict(),
                # dropout and other draws from the global generators, one state per process
                "rng": _gathered(torch.get_rng_state(), world),
                "cuda_rng": (
                    _gathered(torch.cuda.get_rng_state(), world)
                    if torch.cuda.is_available()
                    else None
                ),
                "sample_gen": sample_gen.get_state(),
                "augment_gen": augment_gen.get_state(),
                "running": (running, running_n),
                "examples": examples,
            },
            rows,
            label_start=layer.label_start,
            world=world,
        )

    if not world.sharded and wants_graphs(encoder, device):
        forward = GraphedEncoder(encoder, _graph_samples(x_train, cfg, transform, device))
    # Each epoch's rows are a function of (seed, epoch): a resumed run rebuilds the
    # interrupted epoch's order without having saved it.
    rows_of = RowSampler(cfg.row_sampling, y_train, layer.total_classes, cfg.epochs)
    order = None
    tick = time.perf_counter()
    shown = _Shown(tick)
    with _tf32(matmul == "tf32" and device.type == "cuda"):
        while step < total:
            epoch, position = divmod(step, steps_per_epoch)
            if position == 0 or order is None:
                order = rows_of.epoch_rows(cfg.seed, epoch)
            idx = order[position * cfg.batch_size : (position + 1) * cfg.batch_size]
            examples += len(idx)
            x, whole = _batch_inputs(x_train, idx, world, transform, augment_gen, device)
            y = y_train.index_select(0, idx).to(device, non_blocking=True)
            try:
                if replicate:
                    z = sum_gradient(forward(whole), world)
                elif world.sharded:  # every rank knows the split: no count exchange
                    z = gather_rows(
                        forward(x), world, [len(p) for p in idx.tensor_split(world.size)]
                    )
                else:
                    z = forward(x)
            except (
                RuntimeError,
                ValueError,
                TypeError,
                IndexError,
                KeyError,
                AttributeError,
            ) as exc:
                raise ComponentFault("model", f"forward raised {_brief(exc)}") from exc

            batch: FullBatch | SampledBatch | None
            rows: Rows | None = None
            if sampler is None:
                if chunk_width is not None:  # the layer's update happens in the backward
                    # typed as the tensor it stands for: only a Loss.chunkable loss receives it
                    logits = cast(
                        torch.Tensor,
                        layer.chunked(
                            z,
                            chunk_width,
                            partial(optimizer.step_range, step=step),
                            world,
                            torch.bfloat16 if matmul == "bf16" else None,
                        ),
                    )
                else:
                    logits, rows = layer.full(z)
                batch = FullBatch(
                    labels=y.padded() if isinstance(y, LabelSets) else y,
                    logits=logits,
                    num_classes=layer.total_classes,
                    label_start=layer.label_start,
                    world=world,
                    log_prior=ctx.log_prior,
                    embeddings=z,
                    epoch=epoch,
                    step=step,
                )
            elif isinstance(y, LabelSets) and y.indices.numel() == 0:
                batch = None  # no (row, positive) pair to score: nothing to learn from
            else:
                batch, rows = sampled_input(
                    layer,
                    sampler,
                    whole,
                    z,
                    y,
                    cfg.negatives,
                    sample_gen,
                    log_prior=ctx.log_prior,
                    epoch=epoch,
                    step=step,
                    world=world,
                )
            if batch is not None:
                value = loss(batch)
                loss_value = value.item()
                if not math.isfinite(loss_value):
                    raise TrainingDivergedError(
                        f"experiments.{cfg.experiment}: loss became {loss_value} at step {step + 1}; "
                        "lower optimizer.lr or check the inputs"
                    )
                value.backward()
                if rows is None:  # chunked: the layer's rows were updated chunk by chunk
                    optimizer.step_dense(step)
                else:
                    optimizer.step(rows, step)
                running += loss_value
                running_n += 1
                shown.add(loss_value, len(idx))
            step += 1
            if progress is not None and shown.due():
                progress(step, total, shown.postfix())

            if step % cfg.eval_every == 0 or step == total:
                seconds += time.perf_counter() - tick
                # every rank scores its own labels; the top-1 is merged (a collective)
                acc, bal = _validate(
                    encoder, layer, loss, ctx, x_val, y_val, layer.total_classes, world
                )
                curve.append(
                    {
                        "step": step,
                        "seconds": round(seconds, 4),
                        "loss": running / max(running_n, 1),
                        "val_accuracy": acc,
                        "val_balanced_accuracy": bal,
                    }
                )
                running, running_n = 0.0, 0
                if progress is not None:
                    progress(step, total, shown.postfix())
                tick = time.perf_counter()
            if step % checkpoint_every == 0 and step < total:
                seconds += time.perf_counter() - tick
                save_checkpoint()
                tick = time.perf_counter()

    refuse_non_finite("no model was saved")
    return TrainResult(
        steps=step,
        seconds=seconds,
        curve=curve,
        checkpoint_every=checkpoint_every,
        examples=examples,
    )


def _chunk_width(
    cfg: LoopConfig, layer: OutputLayer, loss: Loss, sampler: Sampler | None
) -> int | None:
    """Labels per chunk of a chunked full step, or None for the materialised (B, C) logits:
    a full-mode step over more of this process's labels than ``cfg.label_chunk`` is chunked
    when the loss says it can be (``Loss.chunkable``); one that cannot says so once."""
    width = chunk_width(cfg.label_chunk, cfg.batch_size, layer.num_classes)
    if sampler is not None or width is None:
        return None
    if not getattr(loss, "chunkable", False):
        held = 2 * cfg.batch_size * layer.num_classes * layer.weight.element_size()
        print(
            f"experiments.{cfg.experiment}: loss {type(loss).__name__} reaches the logits "
            f"other than through their row statistics (Loss.chunkable), so its step holds "
            f"the {cfg.batch_size} × {layer.num_classes:,} logits and their gradient "
            f"({held / 1e9:.2f} GB) instead of chunks of {width:,} labels",
            flush=True,
        )
        return None
    return width


def _matmul(cfg: LoopConfig, device: torch.device, chunk_width: int | None) -> str:
    """The output layer's GEMM precision this run takes: ``cfg.matmul`` with "auto" resolved
    (tf32 on CUDA, else fp32). bf16 is built for the chunked full step only: another step
    runs its GEMMs in float32 and says so once."""
    matmul = cfg.matmul
    if matmul == "auto":
        return "tf32" if device.type == "cuda" else "fp32"
    if matmul == "bf16" and chunk_width is None:
        print(
            f"experiments.{cfg.experiment}: train.matmul bf16 is built for the chunked full "
            "step only (train.label_chunk); this step's GEMMs run in float32",
            flush=True,
        )
        return "fp32"
    return matmul


@contextmanager
def _tf32(enabled: bool) -> Iterator[None]:
    """CUDA's float32 matmuls on TF32 tensor cores inside the block, as they were after it."""
    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = enabled or before
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = before


def _batch_inputs(
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


def _graph_samples(
    x_train: torch.Tensor,
    cfg: LoopConfig,
    transform: Callable[[torch.Tensor, torch.Generator], torch.Tensor] | None,
    device: torch.device,
) -> list[torch.Tensor]:
    """An encoder input of each batch shape an epoch holds (the batch, the last shorter one),
    transformed as training batches are, with a generator of their own: capture (cuda_graph.py)
    records shapes and kernels, and must not draw from the run's augmentation stream."""
    n = x_train.shape[0]
    sizes = {min(cfg.batch_size, n), n % cfg.batch_size} - {0}
    generator = torch.Generator(device=device).manual_seed(0)
    samples = []
    for size in sorted(sizes, reverse=True):
        x = x_train[:size].to(device)
        samples.append(transform(x, generator) if transform is not None else x)
    return samples


def _check_shardable(cfg: LoopConfig, loss: Loss, sampler: Sampler | None) -> None:
    where = f"experiments.{cfg.experiment}"
    if sampler is not None:
        # A sampled loss sees one process's batch (sampled_input): any one trains sharded,
        # but the model-based sampler would need every label's score on every rank.
        if sampler.conditions_on == "scores":
            raise InvalidParameterError(
                f"{where}.sampler: a sampler that draws from the model's own scores needs every "
                "label's score on every rank, which label-sharded training (train.distributed) "
                "does not gather; use another sampler or one process"
            )
        return
    if not loss.shardable:
        raise InvalidParameterError(
            f"{where}.loss: {type(loss).__name__} cannot reduce over a label shard "
            "(Loss.shardable); run it in one process (train.distributed.nproc_per_node: 1)"
        )


def _gathered(state: torch.Tensor, world: World) -> list[torch.Tensor]:
    """Every process's ``state`` (a generator's), in rank order."""
    if not world.sharded:
        return [state]
    every: list[Any] = [None] * world.size
    torch.distributed.all_gather_object(every, state, group=world.group)
    return every


def _restore_rank_rng(state: dict[str, Any], world: World, seed: int, step: int) -> None:
    """Put back this process's global generators (dropout's draws) as the checkpoint left
    them; a run resumed with another number of processes has no such state for each rank,
    so each seeds its own from (seed, step, rank) instead."""
    saved, cuda = state["rng"], state["cuda_rng"]
    if len(saved) == world.size:
        torch.set_rng_state(saved[world.rank])
        if cuda is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state(cuda[world.rank])
        return
    if world.rank == 0:
        print(
            f"train: the checkpoint was written by {len(saved)} process(es), this run has "
            f"{world.size}: the global random streams (dropout) restart from (seed, step, rank)",
            file=sys.stderr,
        )
    torch.manual_seed(hash((seed, step, world.rank)) & (2**63 - 1))


def _dense_parameters(encoder: Encoder) -> bool:
    """Whether ``encoder`` trains any parameter other than a sparse-gradient input table."""
    sparse = {
        id(m.weight)
        for m in encoder.modules()
        if isinstance(m, torch.nn.Embedding | torch.nn.EmbeddingBag) and m.sparse
    }
    return any(p.requires_grad and id(p) not in sparse for p in encoder.parameters())


def _replicated(encoder: Encoder, world: World) -> torch.nn.Module:
    """``encoder`` under DDP with its gradients summed over the ranks instead of averaged (an
    encoder without trainable parameters, such as ``linear`` on given features, as it is)."""
    from torch.nn.parallel import DistributedDataParallel

    if not any(p.requires_grad for p in encoder.parameters()):
        return encoder

    ddp = DistributedDataParallel(encoder, process_group=world.group, broadcast_buffers=False)

    def summed(group, bucket):  # no annotations: DDP checks them against dist.GradBucket
        work = torch.distributed.all_reduce(bucket.buffer(), group=group, async_op=True)
        return work.get_future().then(lambda done: done.value()[0])

    ddp.register_comm_hook(world.group, summed)
    return ddp


class _Shown:
    """What the progress bar shows since its last update: mean loss and examples per second.
    Only consulted when a bar is on; ``due`` reads the clock, so it is asked once a step."""

    def __init__(self, now: float) -> None:
        self.since, self.loss, self.steps, self.examples = now, 0.0, 0, 0

    def add(self, loss_value: float, examples: int) -> None:
        self.loss += loss_value
        self.steps += 1
        self.examples += examples

    def due(self) -> bool:
        return time.perf_counter() - self.since >= 1.0

    def postfix(self) -> dict[str, float]:
        now = time.perf_counter()
        out = {}
        if self.steps:
            out["loss"] = self.loss / self.steps
            out["ex/s"] = self.examples / max(now - self.since, 1e-9)
        self.since, self.loss, self.steps, self.examples = now, 0.0, 0, 0
        return out


def _tensor_bytes(obj: Any) -> int:
    """Bytes of the tensors inside nested dicts, lists and optimisers (a checkpoint's size)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, RowSparseOptimizer):
        return _tensor_bytes(obj.state_dict()) + _tensor_bytes(obj.row_tables())
    if isinstance(obj, dict):
        return sum(_tensor_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(_tensor_bytes(v) for v in obj)
    return 0


def log_prior_from_counts(counts: np.ndarray | torch.Tensor) -> torch.Tensor:
    """log π from training counts (a class with no rows gets -inf)."""
    counts = np.asarray(counts.cpu() if isinstance(counts, torch.Tensor) else counts, np.float64)
    with np.errstate(divide="ignore"):
        return torch.from_numpy(np.log(counts / counts.sum())).float()


def curve_to_tsv(curve: list[dict[str, Any]]) -> str:
    lines = ["\t".join(CURVE_COLUMNS)]
    for row in curve:
        lines.append(
            "\t".join(
                f"{row[c]:.6g}" if isinstance(row[c], float) else str(row[c]) for c in CURVE_COLUMNS
            )
        )
    return "\n".join(lines) + "\n"
