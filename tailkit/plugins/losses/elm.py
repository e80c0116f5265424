"""ELM: embedding and logit margins (Jitkrittum, Menon, Rawat & Kumar 2022)."""

from __future__ import annotations

from functools import partial
from typing import Any, ClassVar, Literal

import torch
from torch.autograd.function import once_differentiable

from tailkit.components import FullBatch, Loss
from tailkit.plugins.losses.cast_tables import table_like
from tailkit.plugins.losses.fused_softmax import (
    batch_cross_entropy,
    check_label_range,
    compiled_ce_gradient,
    compiled_ce_rows,
    compiled_path,
    replicated_embeddings,
)
from tailkit.plugins.losses.logit_adjusted import prior_offsets
from tailkit.plugins.losses.pull import (
    CompiledMemoryPull,
    MemoryPull,
    batch_pull,
    batch_pull_backward,
    batch_pull_forward,
    compiled_pull_runs,
    grow_lazy_buffers,
    memory_pull_forward,
    ring_slots,
)
from tailkit.plugins.losses.pull_kernels import memory_write
from tailkit.validation import Constraint, Interval, Options


class _CompiledELM(torch.autograd.Function):
    """The whole ELM loss, mean CE on logits + offsets + λ·mean Ω_pull, as one autograd node for
    a whole-label float32 CPU batch: the compiled CE kernels
    (:mod:`~tailkit.plugins.losses.softmax_kernels`) and pull kernels, in-batch
    (:class:`CompiledBatchPull`'s, ``positives = ("batch", runs)``) or against the memory
    (:class:`CompiledMemoryPull`'s, ``("memory", memory, filled)``). The same values and
    gradients, bit for bit, as that composition (CE node, mean, the pull node, mean, ×λ, +),
    whose five small nodes cost a step more autograd than the pull's kernels take; the pull
    runs first in both passes, while the embeddings are in cache."""

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        z: torch.Tensor,
        labels: torch.Tensor,
        offsets: torch.Tensor,
        alpha: torch.Tensor,
        positives: tuple[Any, ...],
        lam: float,
    ) -> torch.Tensor:
        a = z.contiguous()
        if positives[0] == "batch":
            omega, weights = batch_pull_forward(a, positives[1], alpha)
            ctx.pull = (positives[1], weights)
        else:
            _, memory, filled = positives
            omega, ctx.pull = memory_pull_forward(a, labels, memory, filled, alpha)
        rows = logits.shape[0]
        shift = logits.new_zeros(rows)
        per_example, lse = compiled_ce_rows(logits, labels, offsets, shift)
        ctx.lam = lam
        ctx.save_for_backward(logits, a, labels, offsets, shift, lse)
        return per_example.mean() + lam * omega.to(z.dtype).mean()

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        logits, a, labels, offsets, shift, lse = ctx.saved_tensors
        rows = a.shape[0]
        pull_grad = (grad * ctx.lam).expand(rows) / rows
        if isinstance(ctx.pull, torch.Tensor):  # the memory's Jacobian rows
            grad_z = ctx.pull * pull_grad.unsqueeze(1)
        else:
            runs, weights = ctx.pull
            grad_z = batch_pull_backward(a, runs, weights, pull_grad)
        grad_logits = compiled_ce_gradient(
            logits, labels, offsets, shift, lse, grad.expand(rows) / rows
        )
        return grad_logits, grad_z, None, None, None, None, None


class ELM(Loss):
    """ELM (Jitkrittum et al. 2022): logit-adjusted cross-entropy plus an embedding pull term.

    Per example (paper eq. 4), with logits f (B, C), embeddings Φ(x) (B, d) and priors π_y =
    n_y / Σ n from the training counts::

        ℓ_mar(y, f) + λ · Ω_pull(x, y)
        ℓ_mar = cross-entropy of f + log(π^τ + 1e-12)     (the logit-adjusted loss, τ = ``tau``,
                                                            ε added after the power as in the
                                                            Google logit-adjustment code)
        Ω_pull(x, y) = log[1 + Σ_{x⁺ ∈ S_y \\ {x}} exp(‖Φ(x) − Φ(x⁺)‖²₂ − α_y)]

    computed stably as the log-sum-exp of [0, ‖Φ(x) − Φ(x⁺)‖² − α_y, ...] (= softplus of the
    LSE) with self and other-class pairs masked out as −inf, so an anchor with no positive gets
    exactly 0. Squared Euclidean distances on the raw embedding, no temperature.
    The margin is α_y = c · P(y)^a (``alpha="prior"``) or c · n_y^a (``"count"``), with a =
    ``alpha_power`` and c = ``alpha_scale``: the paper's CIFAR10-LT α = P(y) is prior with the
    defaults a = c = 1, ImageNet-LT 10·√P(y) is prior with a = 0.5, c = 10, CIFAR100-LT α =
    √n_y is count with a = 0.5, and the defaults (α_y = n_y, λ = 0.01) are the paper's
    "good across many datasets" choice.

    Reduction: the batch mean over all B rows of the per-example sum, i.e. mean CE + λ · mean
    pull, where rows without a positive count as 0 in the pull mean.

    ``positives="batch"``: S_y is the set of the other in-batch rows of class y. ``"memory"``:
    S_y is a per-class ring buffer of the last ``memory_size`` embeddings of class y written by
    earlier steps (detached, so they carry no gradient, and the current batch is written only
    after its loss is computed, so there is no self pair). It holds C · memory_size · d numbers.
    The memory (``memory`` (C, memory_size, d) and ``memory_written`` (C,), the number of
    embeddings ever written per class) is part of the state dict, so a resumed run continues
    exactly; it is filled only in training mode. A class with at most ``memory_size`` training
    rows eventually holds a stale copy of the anchor itself (an earlier epoch's Φ(x)), which the
    loss cannot tell apart without example ids.

    At prediction the raw logits are used (the adjustment is a training device), so the
    confidence is the plain softmax probability.
    """

    # CE through batch_cross_entropy, the embedding term on replicated_embeddings
    shardable = True
    chunkable = True

    constraints: ClassVar[dict[str, Constraint]] = {
        "lam": Interval(0, None),
        "tau": Interval(0, None),
        "alpha": Options("prior", "count"),
        "alpha_power": Interval(0, None),
        "alpha_scale": Interval(0, None),
        "positives": Options("batch", "memory"),
        "memory_size": Interval(1, None),
    }
    # Buffers registered by setup (memory and memory_written with positives="memory" only).
    log_adjustment: torch.Tensor
    margins: torch.Tensor
    memory: torch.Tensor
    memory_written: torch.Tensor

    def __init__(
        self,
        *,
        lam: float = 0.01,
        tau: float = 1.0,
        alpha: Literal["prior", "count"] = "count",
        alpha_power: float = 1.0,
        alpha_scale: float = 1.0,
        positives: Literal["batch", "memory"] = "batch",
        memory_size: int = 16,
    ) -> None:
        super().__init__()
        self.lam = lam
        self.tau = tau
        self.alpha = alpha
        self.alpha_power = alpha_power
        self.alpha_scale = alpha_scale
        self.positives = positives
        self.memory_size = memory_size
        self.ready = False
        self.register_load_state_dict_pre_hook(partial(grow_lazy_buffers, ("memory",)))

    def setup(self, class_counts: torch.Tensor) -> None:
        counts = class_counts.to(torch.float64)
        prior = counts / counts.sum()
        base = prior if self.alpha == "prior" else counts
        # Derived from the counts, which setup receives again before any load: not checkpointed.
        # Kept in float64, so float64 inputs see the exact tables, and cast once (table_like).
        self.register_buffer("log_adjustment", prior_offsets(counts, self.tau), persistent=False)
        self.register_buffer("margins", self.alpha_scale * base**self.alpha_power, persistent=False)
        if self.positives == "memory":
            c = counts.numel()
            # d is unknown until the first forward: an empty trailing dimension, grown there or
            # by load_state_dict (grow_lazy_buffers).
            self.register_buffer(
                "memory", torch.zeros(c, self.memory_size, 0, device=counts.device)
            )
            self.register_buffer(
                "memory_written", torch.zeros(c, dtype=torch.int64, device=counts.device)
            )
        self.ready = True

    def forward(self, batch: FullBatch) -> torch.Tensor:
        if not self.ready:
            raise RuntimeError("ELM.setup(class_counts) must be called before the loss is used")
        labels = batch.labels.long()
        offsets = table_like(self, "log_adjustment", batch.logits)
        z = replicated_embeddings(batch)
        alpha = table_like(self, "margins", z)[labels]
        positives = self._compiled_positives(batch, z, labels)
        if positives is not None:
            check_label_range(labels, batch.logits.shape[1], "elm")
            loss: torch.Tensor = _CompiledELM.apply(
                batch.logits.contiguous(),
                z,
                labels.contiguous(),
                offsets.detach().contiguous(),
                alpha.detach(),
                positives,
                self.lam,
            )
            if self.positives == "memory" and self.training:
                self._write_compiled(z, labels)
            return loss
        ce = batch_cross_entropy(batch, offsets=offsets).mean()
        if self.positives == "batch":
            pull = batch_pull(z, labels, alpha.detach())
        else:
            pull = self._memory_pull(z, labels, alpha)
        return ce + self.lam * pull.mean()

    def _memory_pull(
        self, z: torch.Tensor, labels: torch.Tensor, alpha: torch.Tensor
    ) -> torch.Tensor:
        self._fit_memory(z)
        filled = self.memory_written.clamp(max=self.memory_size)[labels]
        if z.device.type == "cpu" and z.dtype == torch.float32 == self.memory.dtype:
            pull: torch.Tensor = CompiledMemoryPull.apply(
                z, labels.contiguous(), self.memory, filled, alpha.detach()
            )
            if self.training:
                self._write_compiled(z, labels)
            return pull
        slots = torch.arange(self.memory_size, device=z.device)
        valid = slots.unsqueeze(0) < filled.unsqueeze(1)
        positives = self.memory[labels].to(z.dtype)  # a fresh (B, memory_size, d) gather
        pull = MemoryPull.apply(z, positives, valid, alpha.detach())
        if self.training:
            self._write(z.detach(), labels)
        return pull

    def _fit_memory(self, z: torch.Tensor) -> None:
        """Grow the memory to the embeddings' dimension at the first forward."""
        if self.memory.shape[-1] != z.shape[-1]:
            if self.memory_written.any():
                raise ValueError(
                    f"elm memory holds embeddings of dimension {self.memory.shape[-1]}, "
                    f"got {z.shape[-1]}"
                )
            self.memory = z.new_zeros(self.memory.shape[0], self.memory_size, z.shape[-1])

    def _compiled_positives(
        self, batch: FullBatch, z: torch.Tensor, labels: torch.Tensor
    ) -> tuple[Any, ...] | None:
        """What :class:`_CompiledELM` needs to pull with, or None where the loss is composed
        (a label shard, float64, CUDA, or an in-batch pull dense enough for the GEMM path)."""
        if not (batch.whole and compiled_path(batch.logits)):
            return None
        if self.positives == "batch":
            runs = compiled_pull_runs(z, labels)
            return None if runs is None else ("batch", runs)
        self._fit_memory(z)
        on_cpu = z.device.type == self.memory.device.type == "cpu"
        if not on_cpu or z.dtype != torch.float32 or self.memory.dtype != torch.float32:
            return None
        filled = self.memory_written.clamp(max=self.memory_size)[labels]
        return "memory", self.memory.numpy(), filled.numpy()

    def _write_compiled(self, z: torch.Tensor, labels: torch.Tensor) -> None:
        memory_write(
            z.detach().contiguous().numpy(),
            labels.contiguous().numpy(),
            self.memory.numpy(),
            self.memory_written.numpy(),
        )

    @torch.no_grad()
    def _write(self, z: torch.Tensor, labels: torch.Tensor) -> None:
        rows, classes, slots, added = ring_slots(labels, self.memory_written, self.memory_size)
        self.memory[classes, slots] = z[rows].to(self.memory.dtype)
        self.memory_written += added

    def extra_repr(self) -> str:
        memory = f", memory_size={self.memory_size}" if self.positives == "memory" else ""
        return (
            f"lam={self.lam:g}, tau={self.tau:g}, alpha={self.alpha!r}, "
            f"alpha_power={self.alpha_power:g}, alpha_scale={self.alpha_scale:g}, "
            f"positives={self.positives!r}{memory}"
        )
