"""Optimisers for the row-sparse output layer: they update only the rows a step touched.

Plain SGD and Adagrad are exact under lazy (row-sparse) updates: an untouched row has zero
gradient, so SGD leaves it unchanged and Adagrad's accumulator does not move. Momentum, weight
decay and Adam are not: an untouched row still has a velocity (and a decay) that a dense
optimiser would apply every step, and a lazy one would skip. Adagrad is what Bamler & Mandt
train with; its learning-rate decay ρ_t = ρ₀·(a/(t+a))^b is available through ``decay_steps``
(a) and ``decay_power`` (b).

SGD takes ``momentum`` (optionally ``nesterov``) and ``weight_decay``, the recipe of the CIFAR
long-tail papers (LDAM-DRW: momentum 0.9, weight decay 2e-4). A *full*-mode loss touches every
row at every step, so the output layer then gets the dense update, exactly what
``torch.optim.SGD`` does to a parameter; a *sampled* loss with momentum or weight decay is
refused before the first step (a lazy update would be an approximation, not that optimiser).

Every optimiser takes a ``schedule`` (:mod:`tailkit.output.schedules`: linear warmup, then
step decays or cosine) that multiplies ``lr`` as a function of the step, so a resumed run
continues on the same curve. Encoder parameters, when a model has any, get the step of the
torch optimiser of the same name with the same lr, momentum and weight decay
(:mod:`tailkit.output.dense_optim`, which leaves the parameters where torch's would).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from tailkit.errors import InvalidParameterError
from tailkit.output.dense_optim import DenseAdagrad, DenseOptimizer, DenseSGD
from tailkit.output.output_layer import OutputLayer, Rows
from tailkit.output.schedules import Schedule, ScheduleSpec
from tailkit.output.sparse_rows import apply_dense_adagrad, apply_row_adagrad, apply_sparse_step
from tailkit.validation import Interval


def filled(like: torch.Tensor, value: float) -> torch.Tensor:
    """A contiguous tensor of ``like``'s shape, dtype and device, every entry ``value``.
    ``torch.full`` and not ``full_like``: on the meta device, where training's memory plan
    (:mod:`tailkit.training.plan`) attaches an optimizer to a layer, every ``*_like`` runs
    through ``torch._refs``, which imports sympy (0.3 s of every train process)."""
    return torch.full(like.shape, value, dtype=like.dtype, device=like.device)


class RowSparseOptimizer:
    """Base: learning-rate schedule and the torch optimiser for dense encoder parameters."""

    constraints: ClassVar = {
        "lr": Interval(0, None, closed="neither"),
        "decay_steps": Interval(0, None, closed="neither"),
        "decay_power": Interval(0, None),
        "schedule": ScheduleSpec(),
    }

    def __init__(
        self,
        *,
        lr: float = 0.1,
        decay_steps: float | None = None,
        decay_power: float = 0.5,
        schedule: dict[str, Any] | None = None,
    ) -> None:
        if decay_steps is not None and schedule is not None:
            raise InvalidParameterError(
                "optimizer: set either decay_steps (Adagrad-style decay) or schedule, not both"
            )
        self.lr = lr
        self.decay_steps = decay_steps
        self.decay_power = decay_power
        self.schedule = Schedule.from_spec(schedule, "optimizer.schedule")
        self.steps_per_epoch = 1
        self.total_steps: int | None = None
        self.dense: DenseOptimizer | torch.optim.Optimizer | None = None
        self.sparse_tables: list[torch.Tensor] = []

    def learning_rate(self, step: int) -> float:
        lr = self.lr * self.schedule.factor(step, self.steps_per_epoch, self.total_steps)
        if self.decay_steps is None:
            return lr
        a = self.decay_steps
        return lr * (a / (step + a)) ** self.decay_power

    def attach(
        self,
        layer: OutputLayer,
        encoder_params: list[torch.nn.Parameter],
        *,
        steps_per_epoch: int = 1,
        total_steps: int | None = None,
        sparse: bool = False,
        sparse_tables: Sequence[torch.Tensor] = (),
        owner: str = "optimizer",
    ) -> None:
        """Allocate state for ``layer``; build the dense optimiser for the encoder.

        ``steps_per_epoch`` and ``total_steps`` place the schedule's epochs and its end;
        ``sparse`` says the loss is sampled (row-sparse steps); ``sparse_tables`` are the
        encoder parameters (among ``encoder_params``) that get sparse gradients, the tables of
        ``EmbeddingBag(sparse=True)`` input layers, which this optimiser updates row by row
        (:mod:`tailkit.output.sparse_rows`) where it can; ``owner`` is the params key of
        this optimiser for error messages.
        """
        if sparse:
            self._check_sparse(owner)
        if sparse_tables and getattr(self, "weight_decay", 0) > 0:
            raise InvalidParameterError(
                f"{owner}.weight_decay: the model's sparse input layer gets sparse gradients, "
                "which torch's weight decay does not take; set weight_decay: 0 or the model's "
                "sparse_grad: false"
            )
        self.layer = layer
        self.steps_per_epoch = max(int(steps_per_epoch), 1)
        self.total_steps = total_steps
        own = {id(p) for p in sparse_tables} if self._rows_exact() else set()
        self.sparse_tables = [p for p in encoder_params if id(p) in own]
        dense = [p for p in encoder_params if id(p) not in own]
        tables = {id(p) for p in sparse_tables}
        sparse_left = any(id(p) in tables for p in dense)
        self.dense = self._dense_optimizer(dense, sparse_left) if dense else None

    def _rows_exact(self) -> bool:
        """Whether a sparse table's row-by-row update is this optimiser's exact update."""
        return True

    def _check_sparse(self, owner: str) -> None:
        """Raise when this optimiser is not exact under row-sparse (lazy) updates."""

    def _dense_optimizer(
        self, params: list[torch.nn.Parameter], sparse: bool
    ) -> DenseOptimizer | torch.optim.Optimizer:
        """The optimiser of the encoder's ``params`` (``sparse``: some get sparse gradients
        this optimiser does not step row by row)."""
        raise NotImplementedError

    def step(self, rows: Rows, step: int) -> None:
        self._update_rows(rows, self.learning_rate(step))
        self.step_dense(step)

    def step_dense(self, step: int) -> None:
        """Step the encoder's parameters alone: those of a run whose output rows are frozen
        (LWS's per-class scales, tailkit/training/decoupled.py)."""
        lr = self.learning_rate(step)
        if self.dense is not None:
            for group in self.dense.param_groups:
                group["lr"] = lr
            self.dense.step()
            self.dense.zero_grad(set_to_none=True)
        for i, table in enumerate(self.sparse_tables):
            if table.grad is not None:
                self._update_table(i, table, table.grad, lr)
                table.grad = None

    def _update_table(self, i: int, table: torch.Tensor, grad: torch.Tensor, lr: float) -> None:
        apply_sparse_step(table.data, grad, lr)

    def _update_rows(self, rows: Rows, lr: float) -> None:
        raise NotImplementedError

    def step_range(
        self, start: int, stop: int, grad_w: torch.Tensor, grad_b: torch.Tensor | None, step: int
    ) -> None:
        """Update layer rows ``start`` … ``stop`` − 1 from their full gradient (a chunk of a
        chunked full step, tailkit/distributed/chunked_logits.py): the dense update of those
        rows, element for element what :meth:`step` does to them with the whole gradient. The
        encoder's parameters are left to :meth:`step_dense`."""
        self._update_range(start, stop, grad_w, grad_b, self.learning_rate(step))

    def _update_range(
        self, start: int, stop: int, grad_w: torch.Tensor, grad_b: torch.Tensor | None, lr: float
    ) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict:
        """The state that is not per output row (:meth:`row_tables` holds that)."""
        return {"dense": self.dense.state_dict() if self.dense else None}

    def load_state_dict(self, state: dict) -> None:
        if self.dense is not None and state.get("dense") is not None:
            self.dense.load_state_dict(state["dense"])

    def row_tables(self) -> dict[str, torch.Tensor]:
        """The state kept per output row, by name, each with the layer's rows as its first
        dimension: a checkpoint stores them by label block, so that a run resumes with another
        number of processes (each loads the rows of its own labels)."""
        return {}

    def load_row_tables(self, tables: dict[str, torch.Tensor]) -> None:
        """Copy :meth:`row_tables` back in (this process's rows)."""
        for name, table in self.row_tables().items():
            table.copy_(tables[name])


class RowSparseSGD(RowSparseOptimizer):
    """SGD on the touched rows; with momentum/Nesterov and weight decay for full-mode losses.

    The update is ``torch.optim.SGD``'s (dampening 0): g ← ∇ + λ·w; v ← μ·v + g; then
    w ← w − lr·(g + μ·v) with Nesterov, else w ← w − lr·v.
    """

    constraints: ClassVar = {
        **RowSparseOptimizer.constraints,
        "momentum": Interval(0, 1, closed="left"),
        "weight_decay": Interval(0, None),
    }

    def __init__(
        self,
        *,
        lr: float = 0.1,
        momentum: float = 0.0,
        nesterov: bool = False,
        weight_decay: float = 0.0,
        decay_steps: float | None = None,
        decay_power: float = 0.5,
        schedule: dict[str, Any] | None = None,
    ) -> None:
        if nesterov and momentum <= 0:
            raise InvalidParameterError("optimizer.nesterov: needs momentum > 0")
        super().__init__(lr=lr, decay_steps=decay_steps, decay_power=decay_power, schedule=schedule)
        self.momentum = momentum
        self.nesterov = nesterov
        self.weight_decay = weight_decay
        self.velocity: dict[str, torch.Tensor] = {}

    def _rows_exact(self) -> bool:
        # torch's momentum buffer for a sparse gradient is itself sparse; leave that to torch
        return self.momentum == 0

    def _check_sparse(self, owner: str) -> None:
        if self.momentum > 0 or self.weight_decay > 0:
            raise InvalidParameterError(
                f"{owner}: momentum and weight_decay need a full-mode loss (a sampled step "
                "updates only the rows it touched); set them to 0 or use a full loss"
            )

    def attach(
        self, layer: OutputLayer, encoder_params: list[torch.nn.Parameter], **kw: Any
    ) -> None:
        super().attach(layer, encoder_params, **kw)
        # Zero velocity equals torch's first-step copy of the gradient (dampening 0).
        self.velocity = (
            {"weight": filled(layer.weight, 0.0), "bias": filled(layer.bias, 0.0)}
            if self.momentum > 0
            else {}
        )

    def _dense_optimizer(
        self, params: list[torch.nn.Parameter], sparse: bool
    ) -> DenseOptimizer | torch.optim.Optimizer:
        factory = torch.optim.SGD if sparse else DenseSGD
        # sparse: a sparse gradient's momentum buffer is sparse, which torch's own handles
        return factory(
            params,
            lr=self.lr,
            momentum=self.momentum,
            nesterov=self.nesterov,
            weight_decay=self.weight_decay,
        )

    def _update_rows(self, rows: Rows, lr: float) -> None:
        for name, table, grad in (
            ("weight", self.layer.weight, rows.weight.grad),
            ("bias", self.layer.bias, rows.bias.grad),
        ):
            if grad is None:  # the bias of a cosine layer takes no part
                continue
            if rows.ids is not None:
                if self.velocity or self.weight_decay > 0:
                    self._check_sparse("optimizer")
                table.index_add_(0, rows.ids, grad, alpha=-lr)
                continue
            if self.weight_decay > 0:
                grad = grad.add(table, alpha=self.weight_decay)
            if self.velocity:
                v = self.velocity[name].mul_(self.momentum).add_(grad)
                grad = grad.add(v, alpha=self.momentum) if self.nesterov else v
            table.add_(grad, alpha=-lr)

    def _update_range(
        self, start: int, stop: int, grad_w: torch.Tensor, grad_b: torch.Tensor | None, lr: float
    ) -> None:
        for name, table, grad in (
            ("weight", self.layer.weight, grad_w),
            ("bias", self.layer.bias, grad_b),
        ):
            if grad is None:
                continue
            rows = table[start:stop]
            if self.weight_decay > 0:
                grad = grad.add(rows, alpha=self.weight_decay)
            if self.velocity:
                v = self.velocity[name][start:stop].mul_(self.momentum).add_(grad)
                grad = grad.add(v, alpha=self.momentum) if self.nesterov else v
            rows.add_(grad, alpha=-lr)

    def row_tables(self) -> dict[str, torch.Tensor]:
        return {f"velocity.{name}": v for name, v in self.velocity.items()}


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
        schedule: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(lr=lr, decay_steps=decay_steps, decay_power=decay_power, schedule=schedule)
        self.eps = eps
        self.initial_accumulator = initial_accumulator

    def attach(
        self, layer: OutputLayer, encoder_params: list[torch.nn.Parameter], **kw: Any
    ) -> None:
        super().attach(layer, encoder_params, **kw)
        self.acc_w = filled(layer.weight, self.initial_accumulator)
        self.acc_b = filled(layer.bias, self.initial_accumulator)
        self.acc_tables = [filled(t, self.initial_accumulator) for t in self.sparse_tables]

    def _update_table(self, i: int, table: torch.Tensor, grad: torch.Tensor, lr: float) -> None:
        apply_sparse_step(table.data, grad, lr, acc=self.acc_tables[i], eps=self.eps)

    def _dense_optimizer(
        self, params: list[torch.nn.Parameter], sparse: bool
    ) -> DenseOptimizer | torch.optim.Optimizer:
        # never sparse: a sparse table's Adagrad rows are exact (_rows_exact), stepped apart
        return DenseAdagrad(
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
                apply_dense_adagrad(table, acc, grad, lr, self.eps)
            else:  # ids are unique: OutputLayer.sampled merged duplicates
                apply_row_adagrad(table, acc, rows.ids, grad, lr, self.eps)

    def _update_range(
        self, start: int, stop: int, grad_w: torch.Tensor, grad_b: torch.Tensor | None, lr: float
    ) -> None:
        for table, acc, grad in (
            (self.layer.weight, self.acc_w, grad_w),
            (self.layer.bias, self.acc_b, grad_b),
        ):
            if grad is not None:
                apply_dense_adagrad(table[start:stop], acc[start:stop], grad, lr, self.eps)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "acc_tables": self.acc_tables}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        for acc, saved in zip(self.acc_tables, state["acc_tables"], strict=True):
            acc.copy_(saved)

    def row_tables(self) -> dict[str, torch.Tensor]:
        return {"acc_w": self.acc_w, "acc_b": self.acc_b}


OPTIMIZERS = {"sgd": RowSparseSGD, "adagrad": RowSparseAdagrad}
