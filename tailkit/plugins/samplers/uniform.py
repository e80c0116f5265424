"""The uniform proposal: the baseline every other sampler is compared against."""

from __future__ import annotations

import math
from typing import Any

import torch

from tailkit.components import Sampler


class UniformSampler(Sampler):
    """Uniform proposal q(y) = 1/C.

    It needs nothing from the data but C, so it is the cheapest possible draw (one
    ``torch.randint``) and the reference point for what a smarter proposal buys. Under it the
    head labels dominate the negatives only as often as the tail ones, so on a long-tailed
    dataset most draws are easy negatives; that is the weakness the unigram and adversarial
    proposals address.

    ``shared`` (default true) draws one set of ``m`` ids for the whole batch, so the sampled
    logits are one GEMM; ``shared: false`` draws ``m`` ids per example.
    """

    def __init__(self, shared: bool = True) -> None:
        # An instance attribute overrides the class-level default the core reads.
        self.shared = shared
        self.num_classes = 0
        self._log_q = 0.0

    def fit(self, features: torch.Tensor | None, labels: torch.Tensor, num_classes: int) -> None:
        """Only C matters; the labels are ignored on purpose (that is what uniform means)."""
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        self.num_classes = int(num_classes)
        self._log_q = -math.log(self.num_classes)

    def _check_fitted(self) -> None:
        if self.num_classes < 1:
            raise RuntimeError("UniformSampler: call fit (or load_state_dict) before sampling")

    def sample(
        self, x: torch.Tensor, y: torch.Tensor, m: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``m`` i.i.d. ids, shared ``(m,)`` or per example ``(B, m)``, on ``y``'s device.

        ``generator`` must live on that device too (torch draws on the generator's device).
        """
        self._check_fitted()
        shape = (m,) if self.shared else (y.shape[0], m)
        ids = torch.randint(
            self.num_classes, shape, generator=generator, device=y.device, dtype=torch.int64
        )
        log_q = torch.full(shape, self._log_q, dtype=torch.float32, device=y.device)
        return ids, log_q

    def log_prob(self, x: torch.Tensor | None, labels: torch.Tensor) -> torch.Tensor:
        self._check_fitted()
        return torch.full(labels.shape, self._log_q, dtype=torch.float32, device=labels.device)

    def state_dict(self) -> dict[str, Any]:
        return {"num_classes": self.num_classes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.fit(None, torch.empty(0, dtype=torch.int64), int(state["num_classes"]))
