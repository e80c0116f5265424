"""A full-mode batch's logits that never exist whole: the output layer scored label chunk by chunk.

A full softmax step over C labels holds the (B, C) logits and their gradient, which at C = 10^6
and B = 4,096 is 33 GB in float32 before the layer itself. The losses of the softmax family
need the logits only through two reductions per row: the log-sum-exp of the adjusted logits
a_ij = f_ij + o_j (+ s_i at the row's label, LDAM's margin) over every label, and the adjusted
logits of the row's own labels. :class:`ChunkedLogits` computes those two from the embeddings
and the layer's rows, ``width`` labels at a time, with an online log-sum-exp (per row a running
maximum and Σ exp(a − max), rescaled when the maximum grows), so a step holds one (B, width)
chunk whatever C is.

The backward runs over the chunks again: each chunk's logits are recomputed (one more GEMM:
four of 2·B·C·d FLOPs a step instead of three, the price of not holding the logits, as in Cut
Cross-Entropy), turned into their gradient g_lse·softmax(a) + g_pick·[j is the row's label],
and used at once: the embeddings' gradient accumulates G_c·W_c, and the chunk's rows get
G_cᵀ·z and the column sums of G_c, which the core hands to the output layer's optimiser
(``apply_rows``) before the next chunk, so no C × d gradient exists either. Each chunk's rows
are updated after their last use in the step, so the result is the materialised step's up to
the order of float additions.

In a label-sharded run (``world``) each rank chunks its own labels and the per-row statistics
are combined across the ranks once (a maximum, a sum and the picks' sum), as
:mod:`tailkit.distributed.ops` does for materialised shards.

A loss reaches these logits only through :func:`tailkit.plugins.losses.fused_softmax.
batch_cross_entropy` and :func:`~tailkit.plugins.losses.softmax.pick_all_labels` (the softmax
family), or through :meth:`ChunkedLogits.label_sums` (the one-vs-all family: a sum of per-label
terms, whose gradient the backward takes chunk by chunk with autograd), and says so with
``Loss.chunkable``; the logits are reduced once per step, since the backward applies the
layer's update.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

from tailkit.distributed.chunk_kernels import chunk_gradient, fold_chunk
from tailkit.distributed.ops import _all_reduce, finite_or_zero
from tailkit.distributed.world import ONE_PROCESS, World

#: Labels per chunk under ``label_chunk: auto``: a (B, 4,096) float32 chunk at B = 512 is 8 MB,
#: and on the CPU wider chunks measured no faster (benchmarks/bench_full.py).
AUTO_WIDTH = 4096
#: ``auto`` chunks once the (B, C) logits would hold this many numbers (512 MB in float32):
#: below it the materialised step's three GEMMs beat the chunked step's four (on 2 CPU cores,
#: B = 512, the chunked step took 1.16× the time at C = 10^5 and 0.79× at 10^6, for a fifth
#: of the memory at both).
AUTO_FROM = 2**27


def chunk_width(setting: int | str | None, batch_size: int, num_classes: int) -> int | None:
    """Labels per chunk of a full step over ``num_classes`` labels (this process's), or None
    for the materialised logits: ``setting`` is ``train.label_chunk`` (an int, "auto" or
    None)."""
    if setting is None:
        return None
    if setting == "auto":
        return AUTO_WIDTH if batch_size * num_classes >= AUTO_FROM else None
    width = int(setting)
    return width if num_classes > width else None


#: What the backward hands the core for each chunk: its first and one-past-last row of the
#: layer (this process's rows), the weight rows' gradient (stop − start, d) and the biases'
#: (stop − start,), None for a cosine layer, whose bias takes no part.
RowsUpdate = Callable[[int, int, torch.Tensor, torch.Tensor | None], None]

#: A loss's terms over one chunk of labels: ``term(logits, targets, start, stop)`` gets the
#: chunk's logits (B, stop − start), its 0/1 targets (the rows' labels among those columns)
#: and the chunk's global label range, and returns each row's sum over the chunk (B,),
#: differentiable in the logits.
ChunkTerm = Callable[[torch.Tensor, torch.Tensor, int, int], torch.Tensor]


class ChunkedLogits:
    """The logits (B, L) of embeddings ``z`` against ``weight`` (L, d) and ``bias`` (L,), labels
    ``label_start`` … ``label_start + L − 1`` of ``num_classes``, scored ``width`` labels at
    a time and never held whole.

    ``cosine``: logits s·⟨ẑ, w_j/‖w_j‖⟩ of a normalised layer without bias, ``z`` then being
    s·ẑ already (the core normalises and scales the B rows, not the C). ``shape``, ``dtype``,
    ``device`` and ``ndim`` describe the logits as a tensor would, so a loss can build its
    per-class tables in their dtype.
    """

    def __init__(
        self,
        z: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        *,
        width: int,
        apply_rows: RowsUpdate,
        cosine: bool = False,
        label_start: int = 0,
        world: World = ONE_PROCESS,
        matmul: torch.dtype | None = None,
    ) -> None:
        if width < 1:
            raise ValueError(f"a label chunk needs at least one label, got {width}")
        self.z = z
        self.weight = weight
        self.bias = bias
        self.width = width
        self.apply_rows = apply_rows
        self.cosine = cosine
        self.label_start = label_start
        self.world = world
        #: the dtype the chunk's three GEMMs read their inputs in (bfloat16: half the bytes
        #: and a GPU's BF16 tensor cores; the products accumulate in float32, the row
        #: statistics and the gradients handed on stay in the logits' dtype)
        self.matmul = z.dtype if matmul is None else matmul
        self.reduced = False

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.z.shape[0], self.weight.shape[0]))

    @property
    def dtype(self) -> torch.dtype:
        return self.z.dtype

    @property
    def device(self) -> torch.device:
        return self.z.device

    @property
    def ndim(self) -> int:
        return 2

    def buffer(self) -> torch.Tensor:
        """Room for one chunk's products, (B · width) numbers reused chunk after chunk."""
        return self.z.new_empty(self.z.shape[0] * min(self.width, self.shape[1]))

    def bounds(self) -> list[tuple[int, int]]:
        """[start, stop) of each chunk, in this process's rows."""
        rows = self.weight.shape[0]
        return [(s, min(s + self.width, rows)) for s in range(0, rows, self.width)]

    def softmax_stats(
        self,
        labels: torch.Tensor,
        *,
        offsets: torch.Tensor | None = None,
        target_shift: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row, log Σ_j exp(a_ij) over every label (B,), and a at ``labels`` (global ids,
        (B,) or (B, k) padded with −1, which gives 0), where a = logits + ``offsets`` (the (C,)
        table of every label; constant) and, at each of the row's labels, + ``target_shift``
        (the labels' shape; constant). Differentiable with respect to the embeddings; the
        layer's gradient goes to ``apply_rows`` during the backward. Once per step."""
        self._reduce_once()
        if offsets is not None:
            offsets = offsets.detach()[self.label_start : self.label_start + self.shape[1]]
            offsets = offsets.to(self.dtype)
        if target_shift is not None:
            target_shift = target_shift.detach().to(self.dtype)
        z = self._input()
        lse, picked = _ChunkedSoftmaxStats.apply(z, labels.long(), offsets, target_shift, self)
        return lse, picked

    def _reduce_once(self) -> None:
        if self.reduced:
            raise RuntimeError(
                "chunked logits are reduced once per step (their backward updates the layer): "
                "ask for everything in one call"
            )
        self.reduced = True

    def _input(self) -> torch.Tensor:
        """The embeddings as the reduction's autograd input: one that requires a gradient
        even under an encoder without parameters, whose backward must still update the
        layer (it then skips the embeddings' product)."""
        return self.z if self.z.requires_grad else self.z.detach().requires_grad_()

    def label_sums(self, labels: torch.Tensor, term: ChunkTerm) -> torch.Tensor:
        """Per row, Σ over every label chunk of ``term`` (B,): the one-vs-all family's
        per-label sums (sigmoid, focal, hinge), each label's term a function of its own logit
        and target. ``labels`` are the rows' global label ids ((B,) or (B, k) padded with −1),
        which give the targets. Differentiable with respect to the embeddings; the backward
        recomputes each chunk and takes ``term``'s gradient there with autograd, and the
        layer's gradient goes to ``apply_rows``. Once per step, and not beside
        :meth:`softmax_stats`."""
        self._reduce_once()
        z = self._input()
        out: torch.Tensor = _ChunkedLabelSums.apply(z, labels.long(), term, self)
        return out


def _chunk_entries(
    flat: torch.Tensor, lo: int, hi: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The (row, slot) entries of ``flat`` (B, k) global ids that fall in [lo, hi), and their
    columns in the chunk."""
    rows, slots = ((flat >= lo) & (flat < hi)).nonzero(as_tuple=True)
    return rows, slots, flat[rows, slots] - lo


class _ChunkedSoftmaxStats(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any,
        z: torch.Tensor,
        labels: torch.Tensor,
        offsets: torch.Tensor | None,
        shift: torch.Tensor | None,
        chunks: ChunkedLogits,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch = z.shape[0]
        flat = labels.reshape(batch, -1)
        flat_shift = None if shift is None else shift.reshape(batch, -1)
        compiled = _compiled(z, chunks)
        top = z.new_full((batch,), float("-inf"))
        # the compiled fold sums in float64 (tailkit/distributed/chunk_kernels.py)
        total = z.new_zeros(batch, dtype=torch.float64 if compiled else z.dtype)
        picked = z.new_zeros(flat.shape)
        buffer = chunks.buffer()
        for start, stop in chunks.bounds():
            raw, addend, (rows, slots, cols) = _chunk(
                chunks, z, start, stop, offsets, flat, flat_shift, buffer
            )
            picked[rows, slots] = raw[rows, cols] + addend[cols]
            if compiled:
                fold_chunk(raw.numpy(), addend.numpy(), top.numpy(), total.numpy())
                continue
            # online log-sum-exp: Σ exp(a − m) kept against the running maximum m
            a = raw.add_(addend)
            grown = torch.maximum(top, a.amax(dim=1))
            pivot = finite_or_zero(grown)
            total.mul_(torch.exp(top - pivot)).add_(a.sub_(pivot.unsqueeze(1)).exp_().sum(dim=1))
            top = grown
        if chunks.world.sharded:
            top, total, picked = _combined(top, total, picked, chunks.world)
        pivot = finite_or_zero(top)
        lse = total.log().add_(pivot)
        ctx.save_for_backward(z, flat, offsets, flat_shift, lse)
        ctx.chunks = chunks
        return lse.to(z.dtype), picked.view(labels.shape)

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, grad_lse: torch.Tensor, grad_picked: torch.Tensor
    ) -> tuple[torch.Tensor | None, None, None, None, None]:
        z, flat, offsets, flat_shift, lse = ctx.saved_tensors
        chunks: ChunkedLogits = ctx.chunks
        batch = z.shape[0]
        compiled = _compiled(z, chunks)
        grad_flat = grad_picked.reshape(batch, -1)
        grad_rows = grad_lse.to(z.dtype).contiguous()
        grad_z = torch.zeros_like(z)
        buffer = chunks.buffer()
        for start, stop in chunks.bounds():
            raw, addend, (rows, slots, cols) = _chunk(
                chunks, z, start, stop, offsets, flat, flat_shift, buffer
            )
            # g_lse · softmax(a) + g_pick at the row's labels: the logits' gradient (∂a/∂f = 1)
            if compiled:
                chunk_gradient(raw.numpy(), addend.numpy(), lse.numpy(), grad_rows.numpy())
                g = raw
            else:
                g = raw.add_(addend).sub_(lse.unsqueeze(1)).exp_().mul_(grad_rows.unsqueeze(1))
            g.index_put_((rows, cols), grad_flat[rows, slots], accumulate=True)
            _apply_chunk(chunks, z, start, stop, g, grad_z)
        return grad_z, None, None, None, None


class _ChunkedLabelSums(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, z: torch.Tensor, labels: torch.Tensor, term: ChunkTerm, chunks: ChunkedLogits
    ) -> torch.Tensor:
        flat = labels.reshape(z.shape[0], -1)
        total = z.new_zeros(z.shape[0])
        buffer = chunks.buffer()
        for start, stop in chunks.bounds():
            logits, targets, lo, hi = _chunk_targets(chunks, z, start, stop, flat, buffer)
            total += term(logits, targets, lo, hi)
        if chunks.world.sharded:  # every rank's labels' sums; the backward stays local
            total = _all_reduce(total, chunks.world)
        ctx.save_for_backward(z, flat)
        ctx.term, ctx.chunks = term, chunks
        return total

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        z, flat = ctx.saved_tensors
        chunks: ChunkedLogits = ctx.chunks
        grad_z = torch.zeros_like(z)
        buffer = chunks.buffer()
        for start, stop in chunks.bounds():
            logits, targets, lo, hi = _chunk_targets(chunks, z, start, stop, flat, buffer)
            with torch.enable_grad():
                logits.requires_grad_()
                (g,) = torch.autograd.grad(ctx.term(logits, targets, lo, hi), logits, grad)
            _apply_chunk(chunks, z, start, stop, g, grad_z)
        return grad_z, None, None, None


def _chunk_targets(
    chunks: ChunkedLogits,
    z: torch.Tensor,
    start: int,
    stop: int,
    flat: torch.Tensor,
    buffer: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """A chunk's logits (bias added), its 0/1 targets and its global label range."""
    raw, addend, (rows, _, cols) = _chunk(chunks, z, start, stop, None, flat, None, buffer)
    logits = raw.add_(addend)
    targets = torch.zeros_like(logits)
    targets[rows, cols] = 1.0
    return logits, targets, chunks.label_start + start, chunks.label_start + stop


def _apply_chunk(
    chunks: ChunkedLogits,
    z: torch.Tensor,
    start: int,
    stop: int,
    g: torch.Tensor,
    grad_z: torch.Tensor,
) -> None:
    """A chunk's logits' gradient ``g`` used at once: into the embeddings' gradient, and as
    its rows' gradient handed to the optimiser."""
    w = _rows(chunks, start, stop)
    if chunks.z.requires_grad:  # not under an encoder without parameters
        if chunks.matmul == g.dtype:
            grad_z.addmm_(g, w[0])
        else:
            grad_z.add_(_product(g, w[0], chunks))
    grad_w = _product(g.t(), z, chunks)
    if chunks.cosine:
        chunks.apply_rows(
            start, stop, _project(grad_w, chunks.weight[start:stop], w[1], w[2]), None
        )
    else:
        chunks.apply_rows(start, stop, grad_w, g.sum(dim=0))


def _compiled(z: torch.Tensor, chunks: ChunkedLogits) -> bool:
    """Whether the chunks take the compiled kernels: float32 on the CPU."""
    return z.device.type == "cpu" and z.dtype == chunks.weight.dtype == torch.float32


def _rows(
    chunks: ChunkedLogits, start: int, stop: int
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """The rows the chunk's logits are products with: the weights, or for a cosine layer the
    unit rows w/max(‖w‖, ε) with the clamped norms and where the clamp binds."""
    w = chunks.weight[start:stop]
    if not chunks.cosine:
        return w, None, None
    norm = torch.linalg.vector_norm(w, dim=1, keepdim=True)
    clamped = norm < 1e-12
    norm = norm.clamp_min_(1e-12)
    return w / norm, norm, clamped


def _project(
    grad: torch.Tensor, w: torch.Tensor, norm: torch.Tensor | None, clamped: torch.Tensor | None
) -> torch.Tensor:
    """The gradient of w from that of ŵ = w/‖w‖: (G − w⟨w, G⟩/‖w‖²)/‖w‖ (G/ε where clamped)."""
    assert norm is not None and clamped is not None
    along = (w * grad).sum(dim=1, keepdim=True).div_(norm.square()).masked_fill_(clamped, 0.0)
    return grad.addcmul_(w, along, value=-1.0).div_(norm)


def _chunk(
    chunks: ChunkedLogits,
    z: torch.Tensor,
    start: int,
    stop: int,
    offsets: torch.Tensor | None,
    flat: torch.Tensor,
    flat_shift: torch.Tensor | None,
    buffer: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """The chunk's products (B, stop − start), contiguous in ``buffer``, with each row's shift
    added at its labels; what every row adds to column j (w,): the bias and the offset; and
    the rows' labels among the chunk's columns (:func:`_chunk_entries`)."""
    out = buffer[: z.shape[0] * (stop - start)].view(z.shape[0], stop - start)
    w = _rows(chunks, start, stop)[0]
    _product(z, w.t(), chunks, out)
    entries = _chunk_entries(flat, chunks.label_start + start, chunks.label_start + stop)
    if flat_shift is not None:
        rows, slots, cols = entries
        out.index_put_((rows, cols), flat_shift[rows, slots], accumulate=True)
    addend = torch.zeros_like(out[0]) if chunks.cosine else chunks.bias[start:stop]
    if offsets is not None:
        addend = addend + offsets[start:stop]
    return out, addend.contiguous(), entries


def _product(
    a: torch.Tensor, b: torch.Tensor, chunks: ChunkedLogits, out: torch.Tensor | None = None
) -> torch.Tensor:
    """a @ b in ``a``'s dtype, its inputs read in ``chunks.matmul`` (into ``out`` when given)."""
    if chunks.matmul == a.dtype:
        return torch.mm(a, b, out=out) if out is not None else a @ b
    low = torch.mm(a.to(chunks.matmul), b.to(chunks.matmul))
    if out is None:
        return low.to(a.dtype)
    return out.copy_(low)


def _combined(
    top: torch.Tensor, total: torch.Tensor, picked: torch.Tensor, world: World
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every rank's running statistics combined: the maximum over ranks, each rank's Σ exp
    rescaled to it and summed, and the picks summed (each label's from the rank that owns it)."""
    overall = _all_reduce(top, world, dist.ReduceOp.MAX)
    pivot = finite_or_zero(overall)
    rescaled = total * torch.exp(top - pivot)
    return overall, _all_reduce(rescaled, world), _all_reduce(picked, world)
