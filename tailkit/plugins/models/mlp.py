"""A multilayer perceptron encoder Φ: the embedding that ELM pulls together and DRO-LT centres."""

from __future__ import annotations

from typing import ClassVar

import torch

from tailkit.components import Encoder
from tailkit.validation import Constraint, Interval


def relu_layers(
    in_dim: int, widths: list[int], dim: int, *, final_relu: bool, dropout: float
) -> list[torch.nn.Module]:
    """Linear(in_dim, w_1), ReLU[, Dropout], …, Linear(w_k, dim)[, ReLU]."""
    layers: list[torch.nn.Module] = []
    width = in_dim
    for h in widths:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU()]
        if dropout > 0:
            layers.append(torch.nn.Dropout(dropout))
        width = h
    layers.append(torch.nn.Linear(width, dim))
    if final_relu:
        layers.append(torch.nn.ReLU())
    return layers


def hidden_widths(hidden: list[int] | None, model: str, non_empty: bool = False) -> list[int]:
    """The hidden widths an MLP's ``hidden`` option gives (512 when unset), each a positive
    int; ``non_empty`` for a model whose first layer needs one."""
    widths = [512] if hidden is None else list(hidden)
    if (non_empty and not widths) or any(
        not isinstance(w, int) or isinstance(w, bool) or w < 1 for w in widths
    ):
        kind = "non-empty list" if non_empty else "list"
        raise ValueError(f"{model}: hidden must be a {kind} of positive widths, got {hidden!r}")
    return widths


class MLP(Encoder):
    """Φ(x) = ReLU(W_k … ReLU(W_1 x + b_1) … + b_k): fully connected layers with ReLU.

    ``hidden`` lists the widths of the hidden layers and ``dim`` is the embedding dimension d
    that the core's output layer (C × d) reads. The embedding ends with a ReLU by default, as
    the pooled features of a ResNet do (``final_relu: false`` keeps it linear). ``dropout`` is
    applied after every hidden ReLU during training. Weights use torch's default (Kaiming-
    uniform) initialisation, drawn from the global seed the core sets before building.
    """

    constraints: ClassVar[dict[str, Constraint]] = {
        "dim": Interval(1, None),
        "dropout": Interval(0, 1, closed="left"),
    }

    def __init__(
        self,
        in_dim: int,
        /,
        *,
        hidden: list[int] | None = None,
        dim: int = 128,
        final_relu: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        widths = hidden_widths(hidden, "mlp")
        self.net = torch.nn.Sequential(
            *relu_layers(in_dim, widths, dim, final_relu=final_relu, dropout=dropout)
        )
        self.out_dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
