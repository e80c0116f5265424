"""Encoders that read sparse rows (TF-IDF, grid cells): x·E through ``EmbeddingBag``.

The first layer of both encoders is a (D, h) table E read with ``embedding_bag(mode="sum",
per_sample_weights=values)``: a row's output is Σ_j x_j E_j over its non-zeros only, which is
x·E without densifying x. ``benchmarks/bench_sparse_input.py`` measures one step of it against
``torch.sparse.mm`` on a torch CSR batch, whose gradient to E is always dense: on a 2-core
AVX-512 machine, B = 512, h = 256, the bag with sparse gradients took 45 ms at 830k columns (18 per
row) where sparse.mm took 1.8 s (40×); at 30k columns (100 per row) the bag with a dense gradient
took 22 ms, sparse.mm 37 ms and the sparse-gradient bag 59 ms.

Hence ``sparse_grad``: with it the backward pass returns a sparse gradient touching only the
batch's columns, so a step costs O(nnz·h) instead of O(D·h); but a sparse update costs more
per element than a dense pass, so for a narrow vocabulary the dense gradient is faster. The
default (``None``) picks sparse from ``SPARSE_GRAD_COLUMNS`` columns on. tailkit's Adagrad and
plain SGD update such a table row by row in one compiled pass (tailkit/output/sparse_rows.py:
4 ms against torch's Adagrad's 13–17 ms a step on the default GeoNames run); SGD with momentum
leaves it to torch's sparse update. That row update moved the crossover below the bag-alone
measurement above: on the synthetic XC set (30,000 columns, B = 256, h = 256, Adagrad) a dense
gradient cost its zeroing and torch's dense Adagrad over the whole 30,000 × 256 table, ~30 ms
a step, and the sparse one ~4 ms (an epoch 26.9 → 22.5 s on the 2-core dev VM, the same
model, since Adagrad leaves an untouched row as it is). Hence 2·10^4 columns, not 10^5. Weight
decay takes no sparse gradient and is refused when the optimiser is attached.

E starts as N(0, 1/h): an L2-normalised row (``tfidf`` and ``geocells`` give them) then has an
embedding of expected squared norm 1, whatever D and the row's non-zero count.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch

from tailkit.components import Encoder
from tailkit.plugins.models.mlp import MLP, hidden_widths, relu_layers
from tailkit.sparse import SparseRows
from tailkit.validation import Constraint, Interval

# torch's sparse gradients (and its Adagrad's sparse update) build COO tensors whose invariants
# torch leaves unchecked unless told; it warns until told either way. They come from
# embedding_bag's own backward, so the checks would only cost a pass per step: opt out.
torch.sparse.check_sparse_tensor_invariants.disable()


#: From this many input columns on, ``sparse_grad=None`` means sparse gradients.
SPARSE_GRAD_COLUMNS = 20_000


def _bag(in_dim: int, width: int, sparse_grad: bool | None) -> torch.nn.EmbeddingBag:
    if sparse_grad is None:
        sparse_grad = in_dim >= SPARSE_GRAD_COLUMNS
    # the table handed in is drawn once: EmbeddingBag's own N(0, 1) draw, overwritten at
    # once, cost 1.1 s of every train stage on GeoNames' 830,909 x 128 table
    weight = torch.empty(in_dim, width)
    torch.nn.init.normal_(weight, std=1.0 / math.sqrt(width))
    return torch.nn.EmbeddingBag(in_dim, width, mode="sum", sparse=sparse_grad, _weight=weight)


def _rows(x: SparseRows, model: str) -> SparseRows:
    if not isinstance(x, SparseRows):
        raise TypeError(
            f"model {model!r} reads sparse rows; got {type(x).__name__} (choose a featurizer "
            "with sparse output: tfidf, geocells)"
        )
    return x


class SparseLinear(Encoder):
    """Φ(x) = x·E: a learned ``dim``-dimensional projection of sparse rows, no bias.

    With the core's output layer W (C × dim) the scores are x·E·Wᵀ + b, a linear classifier
    over all D columns whose C × D weight matrix is factored through rank ``dim`` (10^6 columns
    × 10^4 labels would not fit otherwise). A bias in Φ would only add W·c, a per-label constant
    the output layer's own bias already holds.
    """

    input_kind: ClassVar[str] = "sparse"
    constraints: ClassVar[dict[str, Constraint]] = {"dim": Interval(1, None)}

    def __init__(self, in_dim: int, /, *, dim: int = 256, sparse_grad: bool | None = None) -> None:
        super().__init__()
        self.embed = _bag(in_dim, dim, sparse_grad)
        self.out_dim = dim

    def forward(self, x: SparseRows) -> torch.Tensor:
        indices, offsets, values = _rows(x, "sparse-linear").bag()
        return self.embed(indices, offsets, per_sample_weights=values)


class SparseMLP(Encoder):
    """Φ(x) = ReLU(W_k … ReLU(x·E + b_1) …): an MLP whose first layer reads sparse rows.

    ``hidden`` lists the hidden widths (the first is E's width), ``dim`` the embedding
    dimension; ``final_relu`` and ``dropout`` as in the dense ``mlp``.
    """

    input_kind: ClassVar[str] = "sparse"
    constraints: ClassVar[dict[str, Constraint]] = MLP.constraints  # the same dim and dropout

    def __init__(
        self,
        in_dim: int,
        /,
        *,
        hidden: list[int] | None = None,
        dim: int = 256,
        final_relu: bool = True,
        dropout: float = 0.0,
        sparse_grad: bool | None = None,
    ) -> None:
        super().__init__()
        widths = hidden_widths(hidden, "sparse-mlp", non_empty=True)
        self.embed = _bag(in_dim, widths[0], sparse_grad)
        self.bias = torch.nn.Parameter(torch.zeros(widths[0]))
        # the bag and its bias are the first Linear; the rest is the dense mlp's stack after it
        first: list[torch.nn.Module] = [torch.nn.ReLU()]
        if dropout > 0:
            first.append(torch.nn.Dropout(dropout))
        rest = relu_layers(widths[0], widths[1:], dim, final_relu=final_relu, dropout=dropout)
        self.net = torch.nn.Sequential(*first, *rest)
        self.out_dim = dim

    def forward(self, x: SparseRows) -> torch.Tensor:
        indices, offsets, values = _rows(x, "sparse-mlp").bag()
        return self.net(self.embed(indices, offsets, per_sample_weights=values) + self.bias)
