"""An example tailkit plugin: one loss and one sampler, registered through the entry point."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from tailkit import FullBatch, Interval, Loss, Sampler, hookimpl


class LabelSmoothing(Loss):
    """Softmax cross-entropy against a target smoothed by epsilon (batch mean)."""

    constraints: ClassVar = {"epsilon": Interval(0, 1, closed="left")}

    def __init__(self, *, epsilon: float = 0.1) -> None:
        super().__init__()
        self.epsilon = epsilon

    def forward(self, batch: FullBatch) -> torch.Tensor:
        return F.cross_entropy(batch.logits, batch.labels, label_smoothing=self.epsilon)


class Mixture(Sampler):
    """Mixture of uniform and unigram proposals: q = (1 - beta)/C + beta * pi_y."""

    constraints: ClassVar = {"beta": Interval(0, 1)}

    def __init__(self, *, beta: float = 0.5, shared: bool = True) -> None:
        self.beta = beta
        self.shared = shared

    def fit(self, features: torch.Tensor | None, labels: torch.Tensor, num_classes: int) -> None:
        counts = torch.bincount(labels.reshape(-1).cpu(), minlength=num_classes).double()
        self.load_state_dict({"pi": (counts / counts.sum()).float()})

    def sample(
        self, x: torch.Tensor, y: torch.Tensor, m: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (m,) if self.shared else (y.shape[0], m)
        device = self.pi.device
        uniform = torch.randint(self.pi.numel(), shape, generator=generator, device=device)
        unigram = torch.multinomial(
            self.pi, math.prod(shape), replacement=True, generator=generator
        ).view(shape)
        pick = torch.rand(shape, generator=generator, device=device) < self.beta
        ids = torch.where(pick, unigram, uniform)
        return ids, self.log_q[ids]

    def log_prob(self, x: torch.Tensor | None, labels: torch.Tensor) -> torch.Tensor:
        return self.log_q[labels]

    def to(self, device: torch.device) -> Mixture:
        self.pi, self.log_q = self.pi.to(device), self.log_q.to(device)
        return self

    def state_dict(self) -> dict[str, Any]:
        return {"pi": self.pi}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.pi = state["pi"]
        self.log_q = torch.log((1 - self.beta) / self.pi.numel() + self.beta * self.pi)


@hookimpl
def register_losses(register):
    register("label-smoothing", LabelSmoothing)


@hookimpl
def register_samplers(register):
    register("mixture", Mixture)
