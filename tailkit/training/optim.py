"""Optimisers for the row-sparse output layer: they update only the rows a step touched.

Plain SGD and Adagrad are exact under lazy (row-sparse) updates: an untouched row has zero
gradient, so SGD leaves it unchanged and Adagrad's accumulator does not move. (Momentum and
Adam are not, which is why they are not offered here.) Adagrad is what Bamler & Mandt train
with; its learning-rate decay ρ_t = ρ₀·(a/(t+a))^b is available through ``decay_steps`` (a)
and ``decay_power`` (b).

Encoder parameters, when a model has any, get the torch optimiser of the same name and lr.
"""

from __future__ import annotations

from typing import ClassVar

import torch

from tailkit.training.output_layer import OutputLayer, Rows
from tailkit.validation import Interval


class RowSparseOptimizer:
    """Base: learning-rate schedule and the torch optimiser for dense encoder parameters."""

    constraints: ClassVar = {
        "lr": Interval(0, None, closed="neither"),
        "decay_steps": Interval(0, None, closed="neither"),
        "decay_power": Interval(0, None),
    }

    def __init__(
        self, *, lr: float = 0.1, decay_steps: float | None = None, decay_power: float = 0.5
    ) -> None:
        self.lr = lr
        self.decay_steps = decay_steps
        self.decay_power = decay_power
        self.dense: torch.optim.Optimizer | None = None

    def learning_rate(self, step: int) -> float:
        if self.decay_steps is None:
            return self.lr
        a = self.decay_steps
        return self.lr * (a / (step + a)) ** self.decay_power

    def attach(self, layer: OutputLayer, encoder_params: list[torch.nn.Parameter]) -> None:
        """Allocate state for ``layer``; build the dense optimiser for the encoder."""
        self.layer = layer
        if encoder_params:
            self.dense = self._dense_optimizer(encoder_params)

    def _dense_optimizer(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        raise NotImplementedError

    def step(self, rows: Rows, step: int) -> None:
        lr = self.learning_rate(step)
        self._update_rows(rows, lr)
        if self.dense is not None:
            for group in self.dense.param_groups:
                group["lr"] = lr
            self.dense.step()
            self.dense.zero_grad(set_to_none=True)

    def _update_rows(self, rows: Rows, lr: float) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict:
        return {"dense": self.dense.state_dict() if self.dense else None}

    def load_state_dict(self, state: dict) -> None:
        if self.dense is not None and state.get("dense") is not None:
            self.dense.load_state_dict(state["dense"])


class RowSparseSGD(RowSparseOptimizer):
    """Plain SGD on the touched rows."""

    def _dense_optimizer(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=self.lr)

    def _update_rows(self, rows: Rows, lr: float) -> None:
        for table, grad in (
            (self.layer.weight, rows.weight.grad),
            (self.layer.bias, rows.bias.grad),
        ):
            if grad is None:  # the bias of a cosine layer takes no part
                continue
            if rows.ids is None:
                table.add_(grad, alpha=-lr)
            else:
                table.index_add_(0, rows.ids, grad, alpha=-lr)


class RowSparseAdagrad(RowSparseOptimizer):
    """Adagrad (per-element accumulators) on the touched rows; exact under lazy updates."""

    constraints: ClassVar = {
        **RowSparseOptimizer.constraints,
        "eps": Interval(0, None),
        "initial_accumulator": Interval(0, None),
    }

    def __init__(
        self,
        *,
        lr: float = 0.1,
        eps: float = 1e-10,
        initial_accumulator: float = 1e-8,
        decay_steps: float | None = None,
        decay_power: float = 0.5,
    ) -> None:
        super().__init__(lr=lr, decay_steps=decay_steps, decay_power=decay_power)
        self.eps = eps
        self.initial_accumulator = initial_accumulator

    def attach(self, layer: OutputLayer, encoder_params: list[torch.nn.Parameter]) -> None:
        super().attach(layer, encoder_params)
        self.acc_w = torch.full_like(layer.weight, self.initial_accumulator)
        self.acc_b = torch.full_like(layer.bias, self.initial_accumulator)

    def _dense_optimizer(self, params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.Adagrad(
            params, lr=self.lr, eps=self.eps, initial_accumulator_value=self.initial_accumulator
        )

    def _update_rows(self, rows: Rows, lr: float) -> None:
        for table, acc, grad in (
            (self.layer.weight, self.acc_w, rows.weight.grad),
            (self.layer.bias, self.acc_b, rows.bias.grad),
        ):
            if grad is None:  # the bias of a cosine layer takes no part
                continue
            if rows.ids is None:
                acc.addcmul_(grad, grad)
                table.addcdiv_(grad, acc.sqrt().add_(self.eps), value=-lr)
            else:
                # ids are unique (OutputLayer.sampled merged duplicates), so select/copy is exact.
                a = acc.index_select(0, rows.ids).addcmul_(grad, grad)
                acc.index_copy_(0, rows.ids, a)
                table.index_add_(0, rows.ids, grad / a.sqrt_().add_(self.eps), alpha=-lr)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "acc_w": self.acc_w, "acc_b": self.acc_b}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.acc_w.copy_(state["acc_w"])
        self.acc_b.copy_(state["acc_b"])


OPTIMIZERS = {"sgd": RowSparseSGD, "adagrad": RowSparseAdagrad}
