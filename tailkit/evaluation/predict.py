"""Chunked prediction: top-k, the true label's score and the log-partition, never an N × C matrix.

Rows are encoded in query blocks, then scored in tiles of a block's rows against chunks of the
labels (sized for the CPU's caches there: :func:`device_label_chunk`); per tile a running top-k
and a running log-sum-exp are merged chunk by chunk, so memory is O(block × (chunk + k))
whatever C is. The loss's prediction-time adjustment (Bamler–Mandt's + log p_n(y|x), post-hoc
logit adjustment) is applied to each chunk; when the loss has one, the unadjusted scores are
reported too.

A conditional sampler's correction log p_n(y|x) (the adversarial tree's) is computed once per
row for all labels, not once per chunk (:meth:`PredictionContext.rows`): labels are scored in
the sampler's order (the tree's leaf order) and in chunks whose bounds it picks, and each chunk
asks it for exactly its own columns (the tree expands the subtrees under them); the running
top-k holds label ids, so equal scores rank by the lower label id in either order. What the
sampler holds per row bounds the block's rows by ``table_budget`` floats (the tree: its subtree
roots; a sampler that builds the whole table: C).
"""

from __future__ import annotations

import itertools
from contextlib import nullcontext
from dataclasses import dataclass

import numba
import torch

from tailkit.components import Encoder, Loss
from tailkit.evaluation.chunk_kernels import merge_chunk
from tailkit.evaluation.correction import PredictionContext, inverse_order, label_chunks
from tailkit.evaluation.topk import merge_topk
from tailkit.output.output_layer import OutputLayer

#: Floats of a block's per-row correction table (rows × C): 256 MiB.
TABLE_BUDGET = 1 << 26

#: Floats of a block's chunk of scores on a GPU (rows × chunk): 1 GiB in float32.
GPU_CHUNK_SCORES = 1 << 28

#: The widest label chunk on the CPU (:func:`device_label_chunk`).
CPU_LABEL_CHUNK = 4096
#: Floats of a CPU tile of scores (rows × chunk) per compute thread: 2 MiB, a core's L2
#: (:func:`tile_bounds`).
CPU_TILE_SCORES = 1 << 19
#: Rows a CPU tile may always hold, a guard for chunks wider than the tile (a sampler's
#: bounds); from a capped chunk a tile holds far more.
CPU_TILE_FLOOR = 16


def device_label_chunk(label_chunk: int, rows: int, device: torch.device) -> int:
    """The label chunk prediction uses on ``device`` for blocks of ``rows`` rows.

    On the CPU at most :data:`CPU_LABEL_CHUNK` (evaluate.label_chunk when narrower), with the
    rows tiled to match (:func:`tile_bounds`). A row's chunk of scores is read several times:
    by the merge's maximum, its Σ e^(s − max) and its top-k screen, and with the tree's
    correction once more before them; 4,096 floats (16 KiB) stay in L1 through those passes,
    16,384 do not. The tile bounds what the GEMM writes before the merge reads it. Measured on
    a 2-core AVX-512 machine at C = 10^6, d = 32 (ms a row, scoring with top-5; rows × chunk):
    2,048 × 16,384 0.96, 256 × 16,384 1.13, 64 × 16,384 0.94 (the width decides), 256 × 4,096
    0.75-0.79, 512 × 4,096 0.75, 128 × 4,096 0.85, 512 × 2,048 0.75, 1,024 × 1,024 0.80; with
    the correction 2.16 → 2.02. At C = 3,875 the shape made no difference.

    The chunking moves the log-partition's float32 rounding (each chunk's log-sum-exp is
    rounded, then folded in): where C > 4,096 and a wider chunk was asked for, it differs from
    that chunk's by a few ulps. The top-k, its scores and the true label's score do not move.

    On a GPU each chunk costs some fifteen kernel launches (GEMM, top-k's sort and merge, the
    log-sum-exp's max, exp and sum, the gathers), each of a few µs, and narrow chunks leave
    it waiting on them: measured on an H200 at C = 10^6 with the tree's
    correction, 16,384-label chunks took 0.97 ms a row, 131,072 0.27 and 1,048,576 0.17
    (scoring alone 0.057 / 0.040 / 0.037). So there the chunk widens until a block's scores
    fill :data:`GPU_CHUNK_SCORES`; the loss's adjustment, the top-k and the log-sum-exp make
    copies of a chunk, so prediction then holds a few GiB at its peak (lower
    ``evaluate.batch_size`` on a small GPU: the chunk follows the rows).
    """
    if device.type != "cuda":
        return min(label_chunk, CPU_LABEL_CHUNK)
    return max(label_chunk, GPU_CHUNK_SCORES // max(1, rows))


def tile_bounds(rows: int, widest_chunk: int, device: torch.device) -> list[int]:
    """Bounds of the tiles a block of ``rows`` rows is scored in, against label chunks at most
    ``widest_chunk`` wide: on a GPU the block whole; on the CPU as few tiles as hold at most
    :data:`CPU_TILE_SCORES` floats of scores per compute thread each (or
    :data:`CPU_TILE_FLOOR` rows, if more), of near-equal size (they differ by at most one
    row). Per thread, so that a machine with more cores gets taller tiles and its threads
    work to share: the tree's correction splits a tile into 64-row tasks per subtree, and a
    4,096-label chunk is one subtree.

    A block's rows are encoded together and then scored tile by tile, so the encoder sees the
    blocks it always saw. A row's correction, top-k and log-partition do not depend on the rows
    beside it, and neither does the GEMM's rounding of its scores for two rows or more; a
    one-row product takes another kernel (a matrix-vector product) and rounds otherwise, which
    the equal split avoids wherever the block has two rows."""
    if device.type == "cuda" or rows <= 1:
        return [0, rows]
    floats = CPU_TILE_SCORES * max(1, numba.get_num_threads())
    most = max(CPU_TILE_FLOOR, floats // max(1, widest_chunk))
    tiles = -(-rows // most)
    return [i * rows // tiles for i in range(tiles + 1)]


@dataclass
class Predictions:
    """Per row: top-k label ids (N, k) by descending score and their scores (N, k), the true
    label's score (N,) and log Σ_j exp(score_j) over all labels (N,).

    ``log_likelihood`` is the softmax log p(true label); ``margins`` the logit margin
    γ(x, y) = f_y(x) − max_{y' ≠ y} f_{y'}(x) (ELM), both from the same (adjusted) scores.
    """

    topk: torch.Tensor
    top_scores: torch.Tensor
    true_score: torch.Tensor
    log_partition: torch.Tensor

    @property
    def log_likelihood(self) -> torch.Tensor:
        return self.true_score - self.log_partition

    def margins(self, labels: torch.Tensor) -> torch.Tensor:
        """γ per row; needs k ≥ 2 (the best other label is the first or the second of top-k)."""
        labels = labels.to(self.topk.device)
        first_is_true = self.topk[:, 0] == labels
        best_other = torch.where(first_is_true, self.top_scores[:, 1], self.top_scores[:, 0])
        return self.true_score - best_other


class _Accumulator:
    def __init__(self, rows: int, k: int, device: torch.device, dtype: torch.dtype) -> None:
        def empty(*shape: int) -> torch.Tensor:
            return torch.full(shape, float("-inf"), dtype=dtype, device=device)

        self.top_scores, self.lse, self.true_score = empty(rows, k), empty(rows), empty(rows)
        self.top_ids = torch.full((rows, k), -1, dtype=torch.long, device=device)

    def add(
        self,
        scores: torch.Tensor,
        start: int,
        chunk_labels: torch.Tensor,
        labels: torch.Tensor | None,
    ) -> None:
        """Fold in the scores of columns ``start`` … of the block, whose label ids are
        ``chunk_labels``; ``labels`` are the rows' true columns (positions, like ``start``)."""
        if scores.device.type == "cpu" and scores.dtype == torch.float32:
            # one compiled pass: ~5× torch.topk + a float64 logsumexp (chunk_kernels.py)
            merge_chunk(
                scores.contiguous().numpy(),
                chunk_labels.numpy(),
                self.top_scores.numpy(),
                self.top_ids.numpy(),
                self.lse.numpy(),
            )
        else:
            self.top_scores, self.top_ids = merge_topk(
                self.top_scores, self.top_ids, scores, chunk_labels, self.top_scores.shape[1]
            )
            # The log-partition sums C terms: in float32 its last bits moved between runs (one
            # thread's half of one block came out ~30 ulps off in some runs, the ranking
            # never). Summed in float64 and rounded once, run-to-run noise stays far below
            # float32's ulp.
            part = torch.logsumexp(scores.double(), dim=1).to(scores.dtype)
            self.lse = torch.logaddexp(self.lse, part)
        if labels is None:
            return
        local = labels - start
        inside = (local >= 0) & (local < scores.shape[1])
        if inside.any():
            rows = inside.nonzero().squeeze(1)
            self.true_score[rows] = scores[rows, local[rows]]

    def result(self) -> Predictions:
        return Predictions(self.top_ids, self.top_scores, self.true_score, self.lse)


def _columns(
    order: torch.Tensor | None, start: int, stop: int, device: torch.device
) -> torch.Tensor:
    """The label ids of columns ``start`` … ``stop`` − 1: a slice of the sampler's order, else
    a range."""
    if order is not None:
        return order[start:stop]
    return torch.arange(start, stop, device=device)


def _score_rows(
    *,
    layer: OutputLayer,
    loss: Loss,
    ctx: PredictionContext,
    xb: torch.Tensor,
    z: torch.Tensor,
    yb: torch.Tensor | None,
    bounds: list[int],
    order: torch.Tensor | None,
    first: int,
    per_row: bool,
    totals: tuple[_Accumulator, _Accumulator | None],
    into: slice,
) -> None:
    """Score the embeddings ``z`` of rows ``xb`` (true columns ``yb``) chunk by chunk and write
    their adjusted and raw predictions into rows ``into`` of ``totals``."""
    device, dtype = z.device, layer.weight.dtype
    k = totals[0].top_ids.shape[1]
    acc_adj = _Accumulator(xb.shape[0], k, device, dtype)
    acc_raw = _Accumulator(xb.shape[0], k, device, dtype) if totals[1] is not None else None
    with ctx.rows(xb, layer.num_classes) if per_row else nullcontext():
        for start, stop in itertools.pairwise(bounds):
            scores = layer.scores(z, start, stop)
            # Top-k ids are label ids from the start, so equal scores rank by label id even
            # when the columns come in the sampler's order.
            ids = _columns(order, start, stop, device)
            if first:  # a shard's columns under their global ids
                ids = ids + first
            if acc_raw is not None:
                acc_raw.add(scores, start, ids, yb)
            if loss.adjusts_scores:
                chunk_ids = ctx.chunk_ids(start, stop, device)
                if first:  # not otherwise: add_log_q knows the ids it handed out
                    chunk_ids = chunk_ids + first
                scores = loss.adjust_scores(scores, xb, chunk_ids, ctx)
            acc_adj.add(scores, start, ids, yb)
    for total, part in zip(totals, (acc_adj, acc_raw), strict=True):
        if total is not None and part is not None:
            total.top_ids[into] = part.top_ids
            total.top_scores[into] = part.top_scores
            total.lse[into] = part.lse
            total.true_score[into] = part.true_score


@torch.no_grad()
def predict(
    encoder: Encoder,
    layer: OutputLayer,
    loss: Loss,
    ctx: PredictionContext,
    x: torch.Tensor,
    labels: torch.Tensor | None,
    *,
    k: int = 5,
    batch_size: int = 2048,
    label_chunk: int = 65536,
    table_budget: int = TABLE_BUDGET,
    unadjusted: bool = True,
) -> tuple[Predictions, Predictions | None]:
    """Adjusted predictions, and unadjusted ones when the loss adjusts scores and
    ``unadjusted`` asks for them (else None: validation needs only the adjusted ranking, and
    the second top-k and log-partition would double the work after the GEMM).

    ``labels`` (N,) fill ``true_score``; multi-label rows have no single true label, so they
    pass None and ``true_score`` stays −inf. ``table_budget`` caps the floats a
    block's per-row correction holds (module docstring).
    """
    device = layer.weight.device
    n, num_classes = x.shape[0], layer.num_classes
    # A label shard (tailkit/output/shards.py) scores its own labels under their global
    # ids; tailkit.evaluation.predict_sharded merges the shards.
    first = layer.label_start
    if first and loss.adjusts_scores and ctx.per_row_correction:
        raise ValueError("a per-row correction (a conditional sampler's) is not sharded")
    if first and labels is not None:
        labels = labels - first  # positions among this shard's columns (others fall outside)
    k = min(k, num_classes)
    adjusted = _Accumulator(n, k, device, layer.weight.dtype)
    raw = (
        _Accumulator(n, k, device, layer.weight.dtype)
        if loss.adjusts_scores and unadjusted
        else None
    )
    per_row = loss.adjusts_scores and ctx.per_row_correction
    order = position = None
    if per_row:
        batch_size = ctx.block_rows(batch_size, num_classes, table_budget)
    label_chunk = device_label_chunk(label_chunk, min(batch_size, n), device)
    if per_row:
        order = ctx.label_order()
        bounds = ctx.chunk_bounds(num_classes, label_chunk)  # the sampler's, e.g. subtrees
    else:
        bounds = label_chunks(num_classes, label_chunk)
    if order is not None:
        # columns in the sampler's table order: each chunk's correction is a slice, not a
        # gather of C scattered floats per row; true labels are mapped to their columns
        order = order.to(device)
        layer = layer.reordered(order)
        position = inverse_order(order)
    widest = max((b - a for a, b in itertools.pairwise(bounds)), default=1)
    encoder.eval()
    for lo in range(0, n, batch_size):
        xb = x[lo : lo + batch_size].to(device, non_blocking=True)
        yb = None if labels is None else labels[lo : lo + batch_size].to(device)
        if yb is not None and position is not None:
            yb = position[yb]
        z = encoder(xb)
        for t, end in itertools.pairwise(tile_bounds(xb.shape[0], widest, device)):
            rows = slice(t, end)
            _score_rows(
                layer=layer,
                loss=loss,
                ctx=ctx,
                xb=xb[rows],
                z=z[rows],
                yb=None if yb is None else yb[rows],
                bounds=bounds,
                order=order,
                first=first,
                per_row=per_row,
                totals=(adjusted, raw),
                into=slice(lo + t, lo + end),
            )
    encoder.train()
    return adjusted.result(), raw.result() if raw is not None else None
