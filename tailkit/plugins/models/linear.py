"""The linear model: Φ is the identity, so logits are x·Wᵀ + b on the core's output layer."""

from __future__ import annotations

import torch

from tailkit.components import Encoder


class Linear(Encoder):
    """Linear classifier on the input features (Φ = identity; the output layer is the model)."""

    def __init__(self, in_dim: int, /) -> None:
        super().__init__()
        self.out_dim = in_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x
