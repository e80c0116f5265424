"""The core's row-sparse output layer: C × d weights and C biases that a step touches by row.

A sampled step gathers only the rows it scores (the positives and the negatives), as fresh
leaf tensors, so autograd produces a gradient of shape (rows, d) instead of a dense C × d one:
the step time does not grow with C. Duplicate ids are merged with ``torch.unique`` before the
gather, so each touched row appears once and its gradient arrives already summed, which is what
an exact Adagrad update needs. The full-softmax path views the whole table the same way.

With ``cosine_scale = s`` (LDAM's normalised layer) a logit is s·⟨z/‖z‖, w_j/‖w_j‖⟩ and the
bias is unused: the normalisation runs inside autograd on the gathered rows, so the stored rows
keep their raw scale and the row-sparse update stays exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


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
    ) -> None:
        # Xavier-uniform for weights, as the Bamler–Mandt reference does; biases from the loss
        # (0 except for sigmoid losses).
        bound = math.sqrt(6.0 / (num_classes + dim))
        weight = torch.empty(num_classes, dim)
        weight.uniform_(-bound, bound, generator=generator)
        self.weight = weight.to(device)
        self.bias = torch.full((num_classes,), float(initial_bias), device=device)
        self.cosine_scale = cosine_scale

    @classmethod
    def for_loss(
        cls,
        loss,
        num_classes: int,
        dim: int,
        *,
        device: torch.device | str = "cpu",
        generator: torch.Generator | None = None,
    ) -> OutputLayer:
        """The layer a loss asks for: cosine logits (``loss.cosine_scale``) and its initial bias."""
        return cls(
            num_classes,
            dim,
            device=device,
            generator=generator,
            cosine_scale=loss.cosine_scale,
            initial_bias=loss.initial_bias(num_classes),
        )

    @property
    def num_classes(self) -> int:
        return self.weight.shape[0]

    @property
    def dim(self) -> int:
        return self.weight.shape[1]

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
        return z, F.normalize(weight, dim=-1)

    def full(self, z: torch.Tensor) -> tuple[torch.Tensor, Rows]:
        """All logits (B, C) and the rows that receive their gradient."""
        rows = self.all_rows()
        if self.cosine_scale is not None:
            zs, w = self._cosine(z, rows.weight)
            return zs @ w.t(), rows
        return torch.addmm(rows.bias, z, rows.weight.t()), rows

    def sampled(self, z: torch.Tensor, labels: torch.Tensor, neg: torch.Tensor) -> SampledLogits:
        """Positive logits (B,) and negative logits (B, m) touching only those rows.

        ``neg`` is (m,) for negatives shared by the batch (one GEMM) or (B, m) per example.
        """
        batch = labels.shape[0]
        ids, inverse = torch.unique(torch.cat([labels, neg.reshape(-1)]), return_inverse=True)
        rows = self.gather(ids)
        pos_idx, neg_idx = inverse[:batch], inverse[batch:].view(neg.shape)
        weight, bias = rows.weight, rows.bias
        if self.cosine_scale is not None:
            z, weight = self._cosine(z, weight)
            bias = torch.zeros_like(bias)
        # index_select, not weight[idx]: the backward of advanced indexing (index_put_ with
        # accumulate) sums a repeated row's gradients in an order that depends on thread
        # scheduling on CPU, so two runs differ in the last bits; index_select's (index_add_)
        # does not.
        pos = (z * weight.index_select(0, pos_idx)).sum(-1) + bias.index_select(0, pos_idx)
        flat = neg_idx.reshape(-1)
        w, b = weight.index_select(0, flat), bias.index_select(0, flat).view(neg_idx.shape)
        if neg.dim() == 1:
            negative = torch.addmm(b, z, w.t())
            hits = neg.unsqueeze(0) == labels.unsqueeze(1)
        else:
            w = w.view(*neg_idx.shape, -1)  # (B, m, d)
            negative = torch.bmm(w, z.unsqueeze(-1)).squeeze(-1) + b
            hits = neg == labels.unsqueeze(1)
        return SampledLogits(pos, negative, hits, rows)

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
        return layer

    def with_weight(self, weight: torch.Tensor) -> OutputLayer:
        """A copy with ``weight`` (C × d) in place of the rows and the same bias (a second
        stage's rescaled classifier, tailkit/training/decoupled.py)."""
        layer = object.__new__(OutputLayer)
        layer.weight = weight.clone()
        layer.bias = self.bias.clone()
        layer.cosine_scale = self.cosine_scale
        return layer

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {"weight": self.weight, "bias": self.bias}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.weight = state["weight"].to(self.weight.device)
        self.bias = state["bias"].to(self.bias.device)
