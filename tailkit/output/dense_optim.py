"""The encoder's dense optimisers: the step of ``torch.optim.SGD`` and ``torch.optim.Adagrad``,
op for op, without ``torch.optim``.

Why not torch's own: ``torch.optim.Optimizer``'s constructor calls a function wrapped in
``torch._disable_dynamo``, whose first call imports ``torch._dynamo`` — about a second of every
training process, longer than a small study's whole training loop. The update is small enough
to write out: these classes run torch's single-tensor path (what torch runs on CPU tensors)
with the same in-place operations in the same order, so a parameter ends bit for bit where
torch's optimiser leaves it (tests/output/test_dense_optim.py steps both side by side), and
their ``state_dict`` has torch's layout (``state`` by parameter index, ``param_groups``), so a
checkpoint written by either loads into the other.

Dense gradients only: a sparse input table's rows are stepped by :mod:`.sparse_rows`, or by
``torch.optim.SGD`` itself when momentum makes its buffer sparse (:mod:`.optim`).
"""

from __future__ import annotations

from typing import Any

import torch


class DenseOptimizer:
    """One parameter group stepped in place; what :class:`~tailkit.output.optim.Optimizer`
    uses of a torch optimiser: ``param_groups[...]["lr"]``, ``step``, ``zero_grad``,
    ``state_dict`` and ``load_state_dict``, and the ``defaults`` a reader may check."""

    def __init__(self, params: list[torch.nn.Parameter], **hyper: Any) -> None:
        self.params = list(params)
        self.defaults = dict(hyper)  # as torch's optimisers name their settings
        self.param_groups = [{**hyper, "params": self.params}]
        self.state: dict[int, dict[str, Any]] = {}

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    def step(self) -> None:
        group = self.param_groups[0]
        with torch.no_grad():
            for index, p in enumerate(self.params):
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise TypeError("a dense optimiser got a sparse gradient")
                self._update(index, p, p.grad, group)

    def _update(
        self, index: int, p: torch.Tensor, grad: torch.Tensor, group: dict[str, Any]
    ) -> None:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        hyper = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        return {
            "state": {i: dict(s) for i, s in sorted(self.state.items())},
            "param_groups": [{**hyper, "params": list(range(len(self.params)))}],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Each parameter's state, copied to it (floating tensors also to its dtype, as torch
        does; ``step`` stays as saved)."""
        loaded: dict[int, dict[str, Any]] = {}
        for key, entries in state["state"].items():
            p = self.params[int(key)]
            loaded[int(key)] = {
                name: _like(value, p, keep_dtype=name == "step") for name, value in entries.items()
            }
        self.state = loaded


def _like(value: Any, p: torch.Tensor, keep_dtype: bool) -> Any:
    """A copy of a saved state tensor on ``p``'s device (and dtype): never the saved tensor
    itself, which another optimiser may still be stepping."""
    if not isinstance(value, torch.Tensor):
        return value
    dtype = value.dtype if keep_dtype or not value.is_floating_point() else p.dtype
    return value.detach().to(device=p.device, dtype=dtype, copy=True)


class DenseSGD(DenseOptimizer):
    """``torch.optim.SGD``'s step: g ← ∇ + λ·w; with momentum μ, v ← g on the first step and
    v ← μ·v + (1 − dampening)·g after, g ← g + μ·v (Nesterov) or v; then w ← w − lr·g."""

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        lr: float,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        super().__init__(
            params,
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
        )

    def _update(
        self, index: int, p: torch.Tensor, grad: torch.Tensor, group: dict[str, Any]
    ) -> None:
        if group["weight_decay"] != 0:
            grad = grad.add(p, alpha=group["weight_decay"])
        momentum = group["momentum"]
        if momentum != 0:
            state = self.state.setdefault(index, {})
            buf = state.get("momentum_buffer")
            if buf is None:
                buf = state["momentum_buffer"] = grad.detach().clone()
            else:
                buf.mul_(momentum).add_(grad, alpha=1 - group["dampening"])
            grad = grad.add(buf, alpha=momentum) if group["nesterov"] else buf
        p.add_(grad, alpha=-group["lr"])


class DenseAdagrad(DenseOptimizer):
    """``torch.optim.Adagrad``'s step (no learning-rate decay or weight decay, as tailkit's
    Adagrad takes neither): s ← s + ∇²; w ← w − lr · ∇ / (√s + eps), s starting at
    ``initial_accumulator_value``."""

    def __init__(
        self,
        params: list[torch.nn.Parameter],
        lr: float,
        eps: float = 1e-10,
        initial_accumulator_value: float = 0.0,
    ) -> None:
        super().__init__(
            params,
            lr=lr,
            eps=eps,
            initial_accumulator_value=initial_accumulator_value,
            lr_decay=0.0,
            weight_decay=0.0,
        )
        for index, p in enumerate(self.params):  # torch fills the state when it is built
            self.state[index] = {
                "step": torch.tensor(0.0),
                "sum": torch.full_like(
                    p, initial_accumulator_value, memory_format=torch.preserve_format
                ),
            }

    def _update(
        self, index: int, p: torch.Tensor, grad: torch.Tensor, group: dict[str, Any]
    ) -> None:
        state = self.state[index]
        state["step"] += 1
        state["sum"].addcmul_(grad, grad, value=1)
        std = state["sum"].sqrt().add_(group["eps"])
        p.addcdiv_(grad, std, value=-group["lr"])
