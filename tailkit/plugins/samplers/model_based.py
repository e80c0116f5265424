"""The model-based proposal q(y|x) ∝ exp(f_y(x)) of Rawat et al.: the model's own softmax."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tailkit.components import Sampler
from tailkit.validation import Constraint, Interval


class ModelBasedSampler(Sampler):
    """Negatives drawn from the model's current softmax, q(y|x) = softmax(f(x)/T)_y.

    The hardest proposal there is: it puts the negatives where the model is most confused,
    and with importance weights 1/(m q) its sampled softmax estimates the full one with the
    least variance. It is exact, not approximated: the core hands it the current scores of all
    C labels (``conditions_on = "scores"``, computed without gradient), so a step costs a full
    B × C GEMM and an O(B·C) multinomial draw — practical up to C ≈ 10^5, and the reference
    point the cheaper proposals (uniform, in-batch, the Bamler–Mandt tree) approximate.

    Draws are per example, with replacement (the row's own label may be drawn; the core masks
    it as an accidental hit). ``temperature`` T flattens (T > 1) or sharpens the proposal.
    Nothing is fitted: ``fit`` only records C.
    """

    shared: bool = False
    conditional: ClassVar[bool] = True
    conditions_on = "scores"
    constraints: ClassVar[dict[str, Constraint]] = {
        "temperature": Interval(0, None, closed="neither")
    }

    def __init__(self, temperature: float = 1.0) -> None:
        self.temperature = temperature
        self.num_classes = 0

    def fit(self, features: torch.Tensor | None, labels: torch.Tensor, num_classes: int) -> None:
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        self.num_classes = int(num_classes)

    def _log_q(self, scores: torch.Tensor | None) -> torch.Tensor:
        if self.num_classes < 1:
            raise RuntimeError("ModelBasedSampler: call fit (or load_state_dict) before sampling")
        if scores is None or scores.dim() != 2 or scores.shape[1] != self.num_classes:
            shape = None if scores is None else tuple(scores.shape)
            raise ValueError(
                f"model-based sampler: expected the model's scores (B, {self.num_classes}), "
                f"got {shape}"
            )
        return torch.log_softmax(scores.detach().float() / self.temperature, dim=1)

    def sample(
        self, x: torch.Tensor, y: torch.Tensor, m: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``m`` ids per row (B, m) from softmax(x / T), ``x`` being the scores (B, C)."""
        log_q = self._log_q(x)
        ids = torch.multinomial(log_q.exp(), m, replacement=True, generator=generator)
        return ids, log_q.gather(1, ids)

    def log_prob(self, x: torch.Tensor | None, labels: torch.Tensor) -> torch.Tensor:
        log_q = self._log_q(x)
        if labels.dim() == 1:
            return log_q.index_select(1, labels)
        return log_q.gather(1, labels)

    def state_dict(self) -> dict[str, Any]:
        return {"num_classes": self.num_classes}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.fit(None, torch.empty(0, dtype=torch.int64), int(state["num_classes"]))
