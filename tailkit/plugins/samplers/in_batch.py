"""In-batch negatives: the other rows' labels serve as the negatives, at no sampling cost."""

from __future__ import annotations

from typing import Any, ClassVar

import torch

from tailkit.components import Sampler


class InBatchSampler(Sampler):
    """In-batch negatives: the labels of the other examples in the batch.

    The batch already holds B labels drawn from the training distribution, and their output
    rows are gathered for the positives anyway, so these negatives cost no draw and no extra
    rows. The price is a popularity-biased proposal: a label turns up in proportion to its
    training frequency π, which the loss has to correct for (logQ correction).

    ``sample`` ignores ``m`` and returns the batch's own labels, shape (B,), always shared. Each
    row's own label (and any duplicate of it elsewhere in the batch) is an accidental hit that
    the core masks. ``log_q`` here is *not* the probability of one proposal draw in the usual
    sense but the probability that one batch row carries the label, log π_y: a batch of B rows
    holds label y B·π_y times on average, so it plays the role of ``m`` i.i.d. draws with
    m = B, and the importance weight 1 / (m q) with m = B is the right one. This assumes batch
    rows are (close to) i.i.d. draws of training rows, as a shuffled epoch gives.
    """

    shared: bool = True
    uses_negatives: ClassVar[bool] = False

    def __init__(self) -> None:
        self.num_classes = 0
        self._log_pi: torch.Tensor | None = None  # (C,) float32, −inf for unseen labels

    def fit(self, features: torch.Tensor | None, labels: torch.Tensor, num_classes: int) -> None:
        """Record log π from the training label counts; unseen labels get −inf."""
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        labels = labels.detach().reshape(-1).to("cpu", torch.int64)
        if labels.numel() == 0:
            raise ValueError("in-batch sampler: no training labels to estimate π from")
        if int(labels.min()) < 0 or int(labels.max()) >= num_classes:
            raise ValueError(f"labels must lie in [0, {num_classes}); got values outside it")
        counts = torch.bincount(labels, minlength=num_classes).to(torch.float64)
        self.num_classes = int(num_classes)
        self._log_pi = (counts.log() - counts.sum().log()).to(torch.float32)

    def _table(self) -> torch.Tensor:
        if self._log_pi is None:
            raise RuntimeError("InBatchSampler: call fit (or load_state_dict) before sampling")
        return self._log_pi

    def sample(
        self, x: torch.Tensor, y: torch.Tensor, m: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch's labels ``y`` (B,), not copied, and log π[y]; ``m``, ``generator`` unused."""
        ids = y.to(torch.int64)
        return ids, self._table().index_select(0, ids)

    def log_prob(self, x: torch.Tensor | None, labels: torch.Tensor) -> torch.Tensor:
        return self._table().index_select(0, labels.reshape(-1)).view(labels.shape)

    def to(self, device: torch.device) -> InBatchSampler:
        if self._log_pi is not None:
            self._log_pi = self._log_pi.to(device)
        return self

    def state_dict(self) -> dict[str, Any]:
        return {"num_classes": self.num_classes, "log_pi": self._table()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        c = int(state["num_classes"])
        log_pi = state["log_pi"]
        if log_pi.shape != (c,):
            raise ValueError(f"in-batch sampler state: log_pi must have shape ({c},)")
        self.num_classes = c
        self._log_pi = log_pi.to(torch.float32)
