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
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tailkit.components import Encoder, FullBatch, Loss, SampledBatch, Sampler
from tailkit.distributed.chunked_logits import chunk_width
from tailkit.distributed.world import ONE_PROCESS, World
from tailkit.errors import InvalidParameterError, TrainingDivergedError
from tailkit.evaluation.correction import PredictionContext
from tailkit.evaluation.metrics import label_recall, per_class_recall
from tailkit.evaluation.predict_sharded import predict_sharded
from tailkit.labels import LabelSets
from tailkit.output.optim import RowSparseOptimizer
from tailkit.output.output_layer import OutputLayer, Rows
from tailkit.training.cadence import checkpoint_interval
from tailkit.training.checkpoint import Checkpointer
from tailkit.training.cuda_graph import GraphedEncoder, wants_graphs
from tailkit.training.loop_state import (
    Learned,
    LoopState,
    refuse_non_finite,
    resume,
    save_checkpoint,
)
from tailkit.training.row_sampling import RowSampler
from tailkit.training.step_batch import StepScoring, batch_inputs, embed_rows, loss_batch

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
    tailkit/output/shards.py) every rank takes the same global batch, encodes its own slice
    of its rows with the encoder replicated under DDP (gradients summed, not averaged: each
    rank's rows carry their own part of the one global loss), gathers the embeddings of all,
    scores its own labels and runs the same loss, which combines the shards
    (``Loss.shardable``). Validation: every rank scores its own labels for all validation rows
    and the top-1 is merged (tailkit/evaluation/predict_sharded.py)."""
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
    steps_per_epoch, total = math.ceil(n / cfg.batch_size), cfg.total_steps(n)
    ctx = PredictionContext(log_prior_from_counts(class_counts).to(device), sampler=sampler)
    loss.train_rows = n  # before setup(): a loss's tables may need N (Loss.train_rows)
    loss.setup(class_counts.to(device=device, dtype=torch.float64))
    generators = (
        torch.Generator(device=device).manual_seed(cfg.seed + 1),  # the sampler's draws
        torch.Generator(device=device).manual_seed(cfg.seed + 2),  # augmentation
    )
    _attach(
        optimizer,
        cfg,
        encoder,
        layer,
        loss,
        sparse=sampler is not None,
        steps_per_epoch=steps_per_epoch,
        total=total,
    )
    learned = Learned(encoder, layer, loss, optimizer)
    checkpoint_every = checkpoint_interval(
        cfg.checkpoint_every,
        _tensor_bytes([layer.state_dict(), encoder.state_dict(), loss.state_dict(), optimizer]),
        cfg.step_work,
        cfg.checkpoint_budget,
    )
    width = _chunk_width(cfg, layer, loss, sampler)
    matmul = _matmul(cfg, device, width)
    scoring = StepScoring(
        layer=layer,
        sampler=sampler,
        optimizer=optimizer,
        log_prior=ctx.log_prior,
        negatives=cfg.negatives,
        sample_gen=generators[0],
        chunk_width=width,
        bf16=matmul == "bf16",
        world=world,
    )
    transform = getattr(encoder, "train_transform", None)
    state = LoopState()
    if checkpoint is not None:  # this process's rows of the layer and the optimiser's state
        state = resume(checkpoint, learned, generators, world, cfg.seed, cfg.batch_size)
    if not world.sharded and wants_graphs(encoder, device):
        forward = GraphedEncoder(encoder, _graph_samples(x_train, cfg, transform, device))
    # Each epoch's rows are a function of (seed, epoch): a resumed run rebuilds the
    # interrupted epoch's order without having saved it.
    rows_of = RowSampler(cfg.row_sampling, y_train, layer.total_classes, cfg.epochs)
    order = None
    tick = time.perf_counter()
    shown = _Shown(tick)
    with _tf32(matmul == "tf32" and device.type == "cuda"):
        while state.step < total:
            epoch, position = divmod(state.step, steps_per_epoch)
            if position == 0 or order is None:
                order = rows_of.epoch_rows(cfg.seed, epoch)
            idx = order[position * cfg.batch_size : (position + 1) * cfg.batch_size]
            state.examples += len(idx)
            x, whole = batch_inputs(x_train, idx, world, transform, generators[1], device)
            y = y_train.index_select(0, idx).to(device, non_blocking=True)
            z = embed_rows(forward, x, whole, idx, world, replicate)
            batch, rows = loss_batch(scoring, z, whole, y, epoch=epoch, step=state.step)
            if batch is not None:
                loss_value = _learn(cfg, loss, optimizer, batch, rows, state.step)
                state.add_loss(loss_value)
                shown.add(loss_value, len(idx))
            state.step += 1
            if progress is not None and shown.due():
                progress(state.step, total, shown.postfix())
            if state.step % cfg.eval_every == 0 or state.step == total:
                state.seconds += time.perf_counter() - tick
                # every rank scores its own labels; the top-1 is merged (a collective)
                state.point(
                    *_validate(encoder, layer, loss, ctx, x_val, y_val, layer.total_classes, world)
                )
                if progress is not None:
                    progress(state.step, total, shown.postfix())
                tick = time.perf_counter()
            if state.step % checkpoint_every == 0 and state.step < total:
                state.seconds += time.perf_counter() - tick
                if checkpoint is not None:
                    save_checkpoint(checkpoint, cfg.experiment, learned, state, generators, world)
                tick = time.perf_counter()
    refuse_non_finite(cfg.experiment, learned, state.step, "no model was saved", world)
    return TrainResult(state.step, state.seconds, state.curve, checkpoint_every, state.examples)


def _attach(
    optimizer: RowSparseOptimizer,
    cfg: LoopConfig,
    encoder: Encoder,
    layer: OutputLayer,
    loss: Loss,
    *,
    sparse: bool,
    steps_per_epoch: int,
    total: int,
) -> None:
    """Hand the optimiser what it trains: the layer's rows, the encoder's and the loss's dense
    parameters (a loss may learn some too, e.g. a log-normaliser) and sparse input tables."""
    dense = [*encoder.parameters(), *loss.parameters()]
    optimizer.attach(
        layer,
        [p for p in dense if p.requires_grad],
        steps_per_epoch=steps_per_epoch,
        total_steps=total,
        sparse=sparse,
        sparse_tables=[
            m.weight
            for m in encoder.modules()
            if isinstance(m, torch.nn.Embedding | torch.nn.EmbeddingBag)
            and m.sparse
            and m.weight.requires_grad
        ],
        owner=f"experiments.{cfg.experiment}.optimizer",
    )


def _learn(
    cfg: LoopConfig,
    loss: Loss,
    optimizer: RowSparseOptimizer,
    batch: FullBatch | SampledBatch,
    rows: Rows | None,
    step: int,
) -> float:
    """The loss's value, its backward and the optimiser's step; a non-finite loss stops the
    run before it touches a weight."""
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
    return loss_value


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
