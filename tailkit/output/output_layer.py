"""The core's row-sparse output layer: C × d weights and C biases that a step touches by row.

A sampled step gathers only the rows it scores (the positives and the negatives), as fresh
leaf tensors, so autograd produces a gradient of shape (rows, d) instead of a dense C × d one:
the step time does not grow with C. Duplicate ids are merged (``torch.unique``; a radix sort on
the CPU) before the gather, so each touched row appears once and its gradient arrives already
summed, which is what an exact Adagrad update needs. The full-softmax path views the whole table
the same way.

With ``cosine_scale = s`` (LDAM's normalised layer) a logit is s·⟨z/‖z‖, w_j/‖w_j‖⟩ and the
bias is unused: the normalisation runs inside autograd on the gathered rows, so the stored rows
keep their raw scale and the row-sparse update stays exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from tailkit.distributed.chunked_logits import ChunkedLogits, RowsUpdate
from tailkit.distributed.world import ONE_PROCESS, World
from tailkit.output.cosine_kernels import project_rows


def _norms(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """max(‖x‖, ε) row-wise (n, 1), and where the clamp binds."""
    norm = torch.linalg.vector_norm(x, dim=1, keepdim=True)
    clamped = norm < eps
    return norm.clamp_min_(eps), clamped


def _unit(x: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x/max(‖x‖, ε) row-wise, 1/max(‖x‖, ε) and where the clamp binds: what the backward of
    the row normalisation needs."""
    norm, clamped = _norms(x, eps)
    unit = x / norm  # divided, not multiplied by 1/‖x‖: bit for bit F.normalize's value
    return unit, norm.reciprocal_(), clamped


def _project_(
    grad: torch.Tensor, unit: torch.Tensor, inv: torch.Tensor, clamped: torch.Tensor
) -> torch.Tensor:
    """(g − x̂ ⟨x̂, g⟩) / ‖x‖ in place on ``grad`` (g/ε where the clamp binds)."""
    # ⟨x̂_j, g_j⟩ per row as a batch of 1 × d by d × 1 products: no C × d temporary
    along = torch.bmm(unit.unsqueeze(1), grad.unsqueeze(2)).squeeze(2)
    along.masked_fill_(clamped, 0.0)
    return grad.addcmul_(unit, along, value=-1.0).mul_(inv)


class _UnitRows(torch.autograd.Function):
    """x/max(‖x‖, ε) row-wise (``F.normalize(x, dim=1)`` in value and gradient) with the
    backward written out: (g − x̂ ⟨x̂, g⟩) / ‖x‖, the projection of the incoming gradient off
    each row's direction, in three passes over the C × d table. Autograd's normalize takes a
    dozen (a division's two gradients, the norm's backward, the clamp's mask), which at C = 10^5
    cost LDAM's cosine layer a quarter of a step. Where the clamp at ε binds the map is x/ε
    and its gradient g/ε, without the projection, as autograd has it."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, eps: float) -> torch.Tensor:
        unit, inv, clamped = _unit(x, eps)
        ctx.save_for_backward(unit, inv, clamped)
        return unit

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        unit, inv, clamped = ctx.saved_tensors
        # a copy: the incoming gradient may be another node's too
        return _project_(grad.clone(), unit, inv, clamped), None


class _CosineLogits(torch.autograd.Function):
    """zs @ (w/max(‖w‖, ε))ᵀ for all C rows at once: the full-softmax step of a cosine layer.

    One function instead of :func:`unit_rows` followed by a matrix product, so that the
    backward owns the C × d gradient the second GEMM writes and projects it in place
    ((G − ŵ⟨ŵ, G⟩)/‖w‖) instead of writing a second C × d tensor: on this CPU a fresh tensor
    of that size costs ten times an in-place pass over it (its pages are faulted in anew).
    Values and gradients are those of ``zs @ F.normalize(w, dim=1).t()``.

    Memory: the unit table ŵ = w/‖w‖ is as large as the weight gradient, and the step's peak
    is the logits, their gradient and one C × d table. So the backward forms ŵ again (the
    same division, so the same bits) for grad_zs and lets it go before the weight gradient
    exists, and projects that gradient with (C,) coefficients, G − w⟨w, G⟩/‖w‖², without
    ŵ (one compiled pass per row for float32 on the CPU: :mod:`~tailkit.training.
    cosine_kernels`): the cosine layer's peak is then CE's (a unit table beside the weight
    gradient put LDAM's step at 1.11× CE's peak, 2 MB at C = 3,875 and 51 MB at 10^5).
    """

    @staticmethod
    def forward(ctx: Any, zs: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        norm, clamped = _norms(w, eps)
        ctx.save_for_backward(zs, w, norm, clamped)
        return zs @ (w / norm).t()

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor, None]:
        zs, w, norm, clamped = ctx.saved_tensors
        grad_zs = grad @ (w / norm) if ctx.needs_input_grad[0] else None
        grad_w = grad.t() @ zs  # ∂/∂ŵ, fresh: projected in place
        if grad_w.device.type == "cpu" and grad_w.dtype == w.dtype == torch.float32:
            project_rows(
                grad_w.numpy(),
                w.contiguous().numpy(),
                norm.view(-1).numpy(),
                clamped.view(-1).numpy(),
            )
            return grad_zs, grad_w, None
        along = torch.bmm(w.unsqueeze(1), grad_w.unsqueeze(2)).squeeze(2)  # ⟨w_j, G_j⟩, (C, 1)
        along.div_(norm.square()).masked_fill_(clamped, 0.0)
        grad_w.addcmul_(w, along, value=-1.0).div_(norm)
        return grad_zs, grad_w, None


class _FullLogits(torch.autograd.Function):
    """z @ wᵀ + b for all C rows, with the backward written out: grad @ w, gradᵀ @ z and the
    column sums of grad, the products autograd's ``addmm`` backward takes, bit for bit.

    Through autograd the step also copied the (B, C) logit gradient once more (its
    transpose's layout for the weight's product): 0.9 ms of a 13.6-ms full-softmax step at
    B = 512, C = 3,875 on a 2-core AVX-512 machine (``benchmarks/bench_losses.py``'s CE), and the
    whole product chain ran 2-3 ms faster written out here.
    """

    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(z, w)
        return torch.addmm(b, z, w.t())

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        z, w = ctx.saved_tensors
        grad_z = grad @ w if ctx.needs_input_grad[0] else None
        grad_w = grad.t() @ z if ctx.needs_input_grad[1] else None
        grad_b = grad.sum(0) if ctx.needs_input_grad[2] else None
        return grad_z, grad_w, grad_b


def unit_rows(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Each row of ``x`` (n, d) scaled to unit length, as ``F.normalize(x, dim=1, eps=eps)``."""
    out: torch.Tensor = _UnitRows.apply(x, eps)
    return out


def _per_example_logits(
    z: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor,
    pos_idx: torch.Tensor,
    neg_idx: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Positive logits (B,) and per-example negative logits (B, m) of the gathered rows
    ``weight``/``bias`` at ``pos_idx`` (B,) and ``neg_idx`` (B, m), and the positives' and the
    negatives' rows (B, d) and (B, m, d). index_select, not weight[idx]: the backward of
    advanced indexing (index_put_ with accumulate) sums a repeated row's gradients in an order
    that depends on thread scheduling on CPU, so two runs would differ in the last bits;
    index_select's (index_add_) does not."""
    w_pos = weight.index_select(0, pos_idx)
    pos = (z * w_pos).sum(-1) + bias.index_select(0, pos_idx)
    flat = neg_idx.reshape(-1)
    w = weight.index_select(0, flat).view(*neg_idx.shape, weight.shape[1])
    neg = torch.bmm(w, z.unsqueeze(-1)).squeeze(-1) + bias.index_select(0, flat).view(neg_idx.shape)
    return pos, neg, w_pos, w


class _PerExampleScores(torch.autograd.Function):
    """The positive logits (B,) and per-example negative logits (B, m) of the gathered rows
    ``weight`` (rows, d) and ``bias`` (rows,), as the torch ops of :meth:`OutputLayer.sampled`
    compute them (the same values), with the rows' gradient from one compiled pass
    (tailkit/output/row_gradient_kernels.py: autograd's sums bit for bit, without its three
    dense temporary tables). The embeddings' gradient is the torch ops' own two parts, added
    here; where the loss also takes a gradient of the embeddings elsewhere, autograd adds that
    to this sum instead of to each part in turn, which can move z's gradient in its last bits
    (no built-in sampled loss does). As the module's other Functions, it has no double
    backward; an output the loss leaves unused sends a zero gradient."""

    @staticmethod
    def forward(
        ctx: Any,
        z: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor,
        pos_idx: torch.Tensor,
        neg_idx: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        pos, neg, w_pos, w = _per_example_logits(z, weight, bias, pos_idx, neg_idx)
        ctx.rows = weight.shape[0]
        ctx.save_for_backward(z, w_pos, w, pos_idx, neg_idx)
        return pos, neg

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, grad_pos: torch.Tensor, grad_neg: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor, None, None]:
        from tailkit.output.row_gradient_kernels import per_example_rows_gradient

        z, w_pos, w, pos_idx, neg_idx = ctx.saved_tensors
        z = z.detach()
        grad_pos, grad_neg = grad_pos.contiguous(), grad_neg.contiguous()
        grad_z = None
        if ctx.needs_input_grad[0]:
            # as autograd forms them: the positive's product and the batched product's backward
            grad_z = grad_pos.unsqueeze(1) * w_pos
            grad_z += w.transpose(1, 2).bmm(grad_neg.unsqueeze(-1)).squeeze(-1)
        grad_weight = z.new_empty(ctx.rows, z.shape[1])
        grad_bias = z.new_empty(ctx.rows)
        per_example_rows_gradient(
            z.numpy(),
            grad_pos.numpy(),
            grad_neg.numpy(),
            pos_idx.numpy(),
            neg_idx.numpy(),
            grad_weight.numpy(),
            grad_bias.numpy(),
        )
        return grad_z, grad_weight, grad_bias, None, None


def shared_hits(neg: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(B, m) bool: True where the shared draw ``neg[j]`` (m,) equals the label ``labels[i]``.

    Found through the sorted draws, not a (B, m) broadcast compare: hits are rare, and torch
    runs the compare of a row against a column element by element (0.4 ms of a 5.7 ms step at
    B = m = 1,024, bench_step.py); here the cost is the sort and a (B, m) fill. On the CPU one
    compiled pass (tailkit/output/hit_kernels.py); elsewhere torch ops.
    """
    batch, m = labels.shape[0], neg.shape[0]
    if _compiled_hits(neg, labels):
        from tailkit.output.hit_kernels import shared_hit_mask

        out = torch.empty(batch, m, dtype=torch.bool)
        shared_hit_mask(neg.contiguous().numpy(), labels.contiguous().numpy(), out.numpy())
        return out
    hits = torch.zeros(batch, m, dtype=torch.bool, device=neg.device)
    drawn, order = torch.sort(neg)
    first = torch.searchsorted(drawn, labels, side="left")
    count = torch.searchsorted(drawn, labels, side="right") - first
    total = int(count.sum())
    if total:
        rows = torch.repeat_interleave(torch.arange(batch, device=neg.device), count)
        starts = torch.cumsum(count, 0) - count  # each row's first pair among the pairs
        within = torch.arange(total, device=neg.device) - starts.repeat_interleave(count)
        hits[rows, order[first.repeat_interleave(count) + within]] = True
    return hits


def per_row_hits(neg: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """(B, m) bool: True where the row's own draw ``neg[i, j]`` equals ``labels[i]``; compiled
    on the CPU, where torch's broadcast compare runs element by element."""
    if _compiled_hits(neg, labels):
        from tailkit.output.hit_kernels import per_row_hit_mask

        out = torch.empty(neg.shape, dtype=torch.bool)
        per_row_hit_mask(neg.contiguous().numpy(), labels.contiguous().numpy(), out.numpy())
        return out
    return neg == labels.unsqueeze(1)


def _compiled_hits(neg: torch.Tensor, labels: torch.Tensor) -> bool:
    return (
        neg.device.type == "cpu"
        and labels.device.type == "cpu"
        and neg.dtype == labels.dtype == torch.int64
    )


def unique_ids(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.unique(values, return_inverse=True)`` for (n,) label ids: on the CPU, for int64,
    by a compiled radix sort (tailkit/output/unique_kernels.py), the same result."""
    if values.device.type == "cpu" and values.dtype == torch.int64 and values.dim() == 1:
        from tailkit.output.unique_kernels import unique_inverse

        ids, inverse = unique_inverse(values.contiguous().numpy())
        return torch.from_numpy(ids), torch.from_numpy(inverse)
    return torch.unique(values, return_inverse=True)


def _compiled_rows_gradient(z: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> bool:
    """Whether :class:`_PerExampleScores` takes the step: CPU float tensors of one dtype, the
    gathered rows taking a gradient (a training step) and the embeddings contiguous."""
    return (
        torch.is_grad_enabled()
        and weight.requires_grad
        and bias.requires_grad
        and all(t.device.type == "cpu" for t in (z, weight, bias))
        and z.dtype == weight.dtype == bias.dtype
        and z.dtype in (torch.float32, torch.float64)
        and z.dim() == 2
        and z.is_contiguous()
    )


def _skip_uniform(count: int, generator: torch.Generator | None) -> None:
    """Advance ``generator`` past ``count`` uniform float32 draws, a bounded block at a time.

    The CPU generator's uniform draws are one per element in order, however a tensor is cut
    (tests/output/test_output_layer_shard.py), so a shard that draws the rows before its own and
    throws them away gets the whole layer's bits for its rows; this costs the time of drawing
    them, not their memory."""
    scratch = torch.empty(min(count, 1 << 22))
    while count > 0:
        part = scratch[: min(count, scratch.numel())]
        part.uniform_(generator=generator)
        count -= part.numel()


@dataclass
class Rows:
    """The rows a step touches: ``ids`` (None = all rows) and leaf views that collect grads."""

    ids: torch.Tensor | None
    weight: torch.Tensor
    bias: torch.Tensor


@dataclass
class SampledLogits:
    pos: torch.Tensor  # (B,)
    neg: torch.Tensor  # (B, m)
    hits: torch.Tensor  # (B, m) bool: the negative is the row's own label
    rows: Rows


class OutputLayer:
    """Weights (C, d) and biases (C,) kept outside autograd and updated row by row."""

    def __init__(
        self,
        num_classes: int,
        dim: int,
        *,
        device: torch.device | str = "cpu",
        generator: torch.Generator | None = None,
        cosine_scale: float | None = None,
        initial_bias: float = 0.0,
        rows: tuple[int, int] | None = None,
    ) -> None:
        # Xavier-uniform for weights, as the Bamler–Mandt reference does; biases from the loss
        # (0 except for sigmoid losses).
        bound = math.sqrt(6.0 / (num_classes + dim))
        start, stop = (0, num_classes) if rows is None else rows
        # drawn on the CPU so that every device starts from the same bits; a meta layer
        # (tailkit plan: shapes and bytes only) draws nothing
        meta = torch.device(device).type == "meta"
        weight = torch.empty(stop - start, dim, device="meta" if meta else "cpu")
        if not meta:
            _skip_uniform(start * dim, generator)
            weight.uniform_(-bound, bound, generator=generator)
        self.weight = weight.to(device)
        self.bias = torch.full((stop - start,), float(initial_bias), device=device)
        self.cosine_scale = cosine_scale
        # A label shard of a sharded run (``rows``: its [start, stop)) holds rows label_start …
        # of total_classes labels (tailkit/output/shards.py); a whole layer holds them all.
        self.label_start = start
        self.total_classes = num_classes

    @classmethod
    def for_loss(
        cls,
        loss,
        num_classes: int,
        dim: int,
        *,
        device: torch.device | str = "cpu",
        generator: torch.Generator | None = None,
        rows: tuple[int, int] | None = None,
    ) -> OutputLayer:
        """The layer a loss asks for: cosine logits (``loss.cosine_scale``) and its initial bias;
        with ``rows`` (start, stop) only those labels' rows, the bits the whole layer has there
        (a label shard, drawn without the whole layer in memory)."""
        return cls(
            num_classes,
            dim,
            device=device,
            generator=generator,
            cosine_scale=loss.cosine_scale,
            initial_bias=loss.initial_bias(num_classes),
            rows=rows,
        )

    @property
    def num_classes(self) -> int:
        """The rows this layer holds: every label's, except in a label shard (total_classes)."""
        return self.weight.shape[0]

    @property
    def dim(self) -> int:
        return self.weight.shape[1]

    @property
    def is_shard(self) -> bool:
        """Whether this layer holds only some labels' rows (a rank's shard)."""
        return self.label_start != 0 or self.num_classes != self.total_classes

    def all_rows(self) -> Rows:
        """Every row, as leaves sharing storage with the table (for full-softmax steps)."""
        return Rows(
            None,
            self.weight.detach().requires_grad_(),
            self.bias.detach().requires_grad_(),
        )

    def gather(self, ids: torch.Tensor) -> Rows:
        """Rows ``ids`` (unique), copied out as leaves that collect this step's gradient."""
        return Rows(
            ids,
            self.weight.index_select(0, ids).requires_grad_(),
            self.bias.index_select(0, ids).requires_grad_(),
        )

    def _cosine(self, z: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """s·z/‖z‖ and w/‖w‖ row-wise (the scale folded into the B rows of z, not the C of w)."""
        scale = self.cosine_scale
        assert scale is not None  # called for cosine layers only
        z = F.normalize(z, dim=-1) * scale
        return z, unit_rows(weight)

    def full(self, z: torch.Tensor) -> tuple[torch.Tensor, Rows]:
        """All logits (B, C) and the rows that receive their gradient."""
        rows = self.all_rows()
        logits: torch.Tensor
        if self.cosine_scale is not None:
            # unit_rows: F.normalize's value with one backward node instead of a dozen
            zs = unit_rows(z) * self.cosine_scale
            logits = _CosineLogits.apply(zs, rows.weight, 1e-12)
        else:
            logits = _FullLogits.apply(z, rows.weight, rows.bias)
        return logits, rows

    def chunked(
        self,
        z: torch.Tensor,
        width: int,
        apply_rows: RowsUpdate,
        world: World = ONE_PROCESS,
        matmul: torch.dtype | None = None,
    ) -> ChunkedLogits:
        """The logits of every row of this layer, scored ``width`` labels at a time and never
        held whole (:mod:`tailkit.distributed.chunked_logits`); each chunk's gradient goes to
        ``apply_rows`` in the backward. ``matmul``: the dtype the chunks' GEMMs read their
        inputs in (None: the embeddings')."""
        cosine = self.cosine_scale is not None
        if self.cosine_scale is not None:
            z = unit_rows(z) * self.cosine_scale
        return ChunkedLogits(
            z,
            self.weight,
            self.bias,
            width=width,
            apply_rows=apply_rows,
            cosine=cosine,
            label_start=self.label_start,
            world=world,
            matmul=matmul,
        )

    def sampled(self, z: torch.Tensor, labels: torch.Tensor, neg: torch.Tensor) -> SampledLogits:
        """Positive logits (B,) and negative logits (B, m) touching only those rows.

        ``neg`` is (m,) for negatives shared by the batch (one GEMM) or (B, m) per example.
        Label ids are global; a label shard (:attr:`is_shard`) scores the labels it owns and
        gives 0 for the others, and ``rows`` holds its own rows only, under local ids.
        """
        batch = labels.shape[0]
        ids, inverse = unique_ids(torch.cat([labels, neg.reshape(-1)]))
        pos_idx, neg_idx = inverse[:batch], inverse[batch:].view(neg.shape)
        if self.is_shard:
            # A label shard scores the ids it owns and gives 0 for the rest: zero rows in
            # place of the others' (index_copy passes the gradient to the owned rows only).
            # Summed over the ranks (tailkit.distributed.ops.sum_over_ranks), every logit is
            # its owner's, exactly: x + 0 = x.
            local = ids - self.label_start
            owned = ((local >= 0) & (local < self.num_classes)).nonzero().squeeze(1)
            rows = self.gather(local.index_select(0, owned))
            weight = rows.weight.new_zeros(ids.shape[0], self.dim).index_copy(0, owned, rows.weight)
            bias = rows.bias.new_zeros(ids.shape[0]).index_copy(0, owned, rows.bias)
        else:
            rows = self.gather(ids)
            weight, bias = rows.weight, rows.bias
        if self.cosine_scale is not None:
            z, weight = self._cosine(z, weight)
            bias = torch.zeros_like(bias)
        if neg.dim() == 2:
            if _compiled_rows_gradient(z, weight, bias):
                pos_idx, neg_idx = pos_idx.contiguous(), neg_idx.contiguous()
                pos, negative = _PerExampleScores.apply(z, weight, bias, pos_idx, neg_idx)
            else:
                pos, negative, _, _ = _per_example_logits(z, weight, bias, pos_idx, neg_idx)
            return SampledLogits(pos, negative, per_row_hits(neg, labels), rows)
        # index_select, not weight[idx]: as in _per_example_logits
        pos = (z * weight.index_select(0, pos_idx)).sum(-1) + bias.index_select(0, pos_idx)
        w, b = weight.index_select(0, neg_idx), bias.index_select(0, neg_idx)
        negative = torch.addmm(b, z, w.t())
        return SampledLogits(pos, negative, shared_hits(neg, labels), rows)

    def scores(self, z: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        """Scores of labels [start, stop) for embeddings z, as training sees them, no autograd."""
        if self.cosine_scale is not None:
            zs, w = self._cosine(z, self.weight[start:stop])
            return zs @ w.t()
        return torch.addmm(self.bias[start:stop], z, self.weight[start:stop].t())

    def reordered(self, order: torch.Tensor) -> OutputLayer:
        """A copy whose row j is label ``order[j]``: prediction scores in a sampler's table
        order so the correction is a contiguous slice (one C × d copy per prediction call)."""
        layer = object.__new__(OutputLayer)
        order = order.to(self.weight.device)
        layer.weight = self.weight.index_select(0, order)
        layer.bias = self.bias.index_select(0, order)
        layer.cosine_scale = self.cosine_scale
        layer.label_start, layer.total_classes = self.label_start, self.total_classes
        return layer

    def with_weight(self, weight: torch.Tensor) -> OutputLayer:
        """A copy with ``weight`` (C × d) in place of the rows and the same bias (a second
        stage's rescaled classifier, tailkit/training/decoupled.py)."""
        layer = object.__new__(OutputLayer)
        layer.weight = weight.clone()
        layer.bias = self.bias.clone()
        layer.cosine_scale = self.cosine_scale
        layer.label_start, layer.total_classes = self.label_start, self.total_classes
        return layer

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"weight": self.weight, "bias": self.bias}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.weight = state["weight"].to(self.weight.device)
        self.bias = state["bias"].to(self.bias.device)
