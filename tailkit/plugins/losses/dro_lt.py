"""DRO-LT (Samuel & Chechik, ICCV 2021), one-stage: cross-entropy plus the DRO embedding loss."""

from __future__ import annotations

from functools import partial
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from tailkit.components import FullBatch, Loss
from tailkit.plugins.losses.dro_kernels import batch_prototypes
from tailkit.plugins.losses.fused_softmax import (
    batch_cross_entropy,
    check_label_range,
    compiled_ce_gradient,
    compiled_ce_rows,
    compiled_path,
    replicated_embeddings,
)
from tailkit.plugins.losses.prototypes import (
    BatchPrototypeDRO,
    CompiledBatchPrototypeDRO,
    dro_gradients,
    dro_value,
)
from tailkit.plugins.losses.pull import grow_lazy_buffers
from tailkit.validation import Constraint, Interval, Options


class _CompiledDROLT(torch.autograd.Function):
    """The whole loss, Σ_i r_i CE_i + λ·DRO, as one autograd node for a whole-label float32 CPU
    batch: CE from the compiled kernels of :mod:`~tailkit.plugins.losses.softmax_kernels` with
    the row weights r (1/B for the mean, w_i/Σw for ``head-up``), DRO as
    :class:`CompiledBatchPrototypeDRO`. The same values and gradients as that composition
    (``r``-weighted CE, ×λ, +), whose mean, multiply and add nodes and second Function cost a
    DRO-LT step ~0.1 ms of autograd on a 2-core CPU beside a DRO term of ~0.5 ms."""

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        z: torch.Tensor,
        epsilon: torch.Tensor,
        labels: torch.Tensor,
        row_weights: torch.Tensor | None,
        prototypes: tuple[np.ndarray, ...],
        temperature: float,
        lam: float,
    ) -> torch.Tensor:
        # the DRO term first, while the batch's prototypes are in cache: CE then streams (B, C)
        value, ctx.state = dro_value(prototypes, temperature)
        rows, width = logits.shape
        offsets, shift = logits.new_zeros(width), logits.new_zeros(rows)
        per_example, lse = compiled_ce_rows(logits, labels, offsets, shift)
        if row_weights is None:
            ce = per_example.mean()
        else:  # PyTorch's weighted mean, as F.cross_entropy's
            ce = (row_weights * per_example).sum() / row_weights.sum()
        ctx.lam = lam
        ctx.save_for_backward(logits, z.detach(), epsilon, labels, row_weights, offsets, shift, lse)
        return ce + lam * torch.tensor(value, dtype=z.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        logits, z, epsilon, labels, row_weights, offsets, shift, lse = ctx.saved_tensors
        rows = logits.shape[0]
        if row_weights is None:
            per_row = grad.expand(rows) / rows
        else:
            per_row = grad / row_weights.sum() * row_weights
        # the DRO term first, while its (K, B) tables may still be in cache
        grad_z, grad_epsilon = dro_gradients(z, labels, epsilon, ctx.state, float(ctx.lam * grad))
        grad_logits = compiled_ce_gradient(logits, labels, offsets, shift, lse, per_row)
        return (
            grad_logits,
            grad_z,
            grad_epsilon if ctx.needs_input_grad[2] else None,
            None,
            None,
            None,
            None,
            None,
        )


#: sqrt of the floor of the squared distances: a distance at or below it has no gradient.
class DROLT(Loss):
    """CE + DRO-LT, the one-stage version the ELM paper compares with ("CE + DRO-LT").

    ::

        loss = CE(f, y) + λ · DRO(Φ(x), y; μ, ε, T)

    CE is the batch mean of the softmax cross-entropy on the raw logits
    (``ce_weighting="none"``), or with ``"head-up"`` the reference's CE_lt: class weights
    w_c = n_c / max n and PyTorch's weighted mean Σ_i w_{y_i} ℓ_i / Σ_i w_{y_i}. DRO is
    :func:`dro_loss` (the reference's per-prototype normalisation over the batch samples, with
    non-squared distances; its reduction is the mean over the classes present in the batch),
    computed with the prototypes of the classes present in the batch only.

    ε (``epsilon``, shape (C,), initialised to ``epsilon_init``) is a parameter created in
    ``setup`` and trained by the core's optimiser with the encoder when ``learn_epsilon``; it
    has no positivity constraint, as in the reference.

    Prototypes. The two-stage reference recomputes the class means over the training set every
    epoch; in one stage we keep a running mean of the detached embeddings per class, updated
    after each training-mode forward with the batch's class means: μ_c ← m·μ_c + (1 − m)·mean_c
    (m = ``prototype_momentum``), and a class seen for the first time takes its batch mean. A
    class in the batch that has never been seen before this step uses the current batch's
    (detached) class mean as its prototype for this step. The prototypes (C, d) and the seen
    mask (C,) are persistent buffers, so a resumed run continues exactly.

    Temperature: the README's value 1 is the default (the reference code's default is 0.07).
    At prediction the raw logits are used; the confidence is the softmax probability.
    """

    # CE through batch_cross_entropy, the embedding term on replicated_embeddings
    shardable = True
    chunkable = True

    constraints: ClassVar[dict[str, Constraint]] = {
        "lam": Interval(0, None),
        "temperature": Interval(0, None, closed="neither"),
        "epsilon_init": Interval(None, None),
        "prototype_momentum": Interval(0, 1),
        "ce_weighting": Options("none", "head-up"),
    }
    # Buffers registered by setup.
    ce_weights: torch.Tensor
    prototypes: torch.Tensor
    seen: torch.Tensor

    def __init__(
        self,
        *,
        lam: float = 1.0,
        temperature: float = 1.0,
        epsilon_init: float = 1.0,
        learn_epsilon: bool = True,
        prototype_momentum: float = 0.9,
        ce_weighting: Literal["none", "head-up"] = "none",
    ) -> None:
        super().__init__()
        self.lam = lam
        self.temperature = temperature
        self.epsilon_init = epsilon_init
        self.learn_epsilon = learn_epsilon
        self.prototype_momentum = prototype_momentum
        self.ce_weighting = ce_weighting
        self.ready = False
        self.register_load_state_dict_pre_hook(partial(grow_lazy_buffers, ("prototypes",)))

    def setup(self, class_counts: torch.Tensor) -> None:
        counts = class_counts.to(torch.float64)
        c, device = counts.numel(), counts.device
        self.epsilon = torch.nn.Parameter(
            torch.full((c,), float(self.epsilon_init), device=device),
            requires_grad=self.learn_epsilon,
        )
        self.register_buffer("ce_weights", counts / counts.max(), persistent=False)
        # d is unknown until the first forward: an empty trailing dimension, grown there or by
        # load_state_dict (grow_lazy_buffers).
        self.register_buffer("prototypes", torch.zeros(c, 0, device=device))
        self.register_buffer("seen", torch.zeros(c, dtype=torch.bool, device=device))
        self.ready = True

    def forward(self, batch: FullBatch) -> torch.Tensor:
        if not self.ready:
            raise RuntimeError("DROLT.setup(class_counts) must be called before the loss is used")
        logits, z = batch.logits, replicated_embeddings(batch)
        labels = batch.labels.long()
        if self.prototypes.shape[-1] != z.shape[-1]:
            if self.seen.any():
                raise ValueError(
                    f"dro-lt prototypes have dimension {self.prototypes.shape[-1]}, "
                    f"got embeddings of dimension {z.shape[-1]}"
                )
            self.prototypes = z.new_zeros(self.prototypes.shape[0], z.shape[-1])
        # PyTorch's weighted mean, as F.cross_entropy's, with "head-up"
        weights = (
            self.ce_weights.to(logits.dtype)[labels] if self.ce_weighting == "head-up" else None
        )
        compiled = z.dtype == self.prototypes.dtype == self.epsilon.dtype == torch.float32
        if compiled and z.device.type == "cpu" and batch.whole and compiled_path(logits):
            check_label_range(labels, logits.shape[1], "dro-lt")
            labels = labels.contiguous()
            loss: torch.Tensor = _CompiledDROLT.apply(
                logits.contiguous(),
                z,
                self.epsilon,
                labels,
                weights,
                self._batch_prototypes(z, labels),
                self.temperature,
                self.lam,
            )
            return loss
        # F.cross_entropy's value and gradient without its (B, C) one-hot gradient pass
        per_example = batch_cross_entropy(batch)
        ce = (
            per_example.mean() if weights is None else (weights * per_example).sum() / weights.sum()
        )
        if compiled and z.device.type == "cpu":
            return ce + self.lam * self._compiled_dro(z, labels)
        classes, inverse = torch.unique(labels, return_inverse=True)
        feats = z.detach()
        sums = feats.new_zeros(classes.numel(), feats.shape[1]).index_add_(0, inverse, feats)
        means = sums / torch.bincount(inverse, minlength=classes.numel()).unsqueeze(1)
        seen = self.seen[classes].unsqueeze(1)
        current = torch.where(seen, self.prototypes[classes].to(z.dtype), means)
        # dro_loss(z, labels, current, classes, ε, T), with the class of each sample known.
        dro = BatchPrototypeDRO.apply(z, labels, current, inverse, self.epsilon, self.temperature)
        if self.training:
            with torch.no_grad():
                m = self.prototype_momentum
                updated = torch.where(seen, m * current + (1.0 - m) * means, means)
                self.prototypes[classes] = updated.to(self.prototypes.dtype)
                self.seen[classes] = True
        return ce + self.lam * dro

    def _batch_prototypes(self, z: torch.Tensor, labels: torch.Tensor) -> tuple[np.ndarray, ...]:
        """The batch's prototypes from the compiled kernel and, in training, their update."""
        return batch_prototypes(
            z.detach().contiguous().numpy(),
            labels.numpy(),
            self.prototypes.numpy(),
            self.seen.numpy(),
            self.epsilon.detach().numpy(),
            self.prototype_momentum,
            self.training,
        )

    def _compiled_dro(self, z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The DRO term alone from the compiled kernels (float32 embeddings beside logits that
        the one-node path does not take: a label shard's, or float64), and in training the
        prototype update."""
        labels = labels.contiguous()
        dro: torch.Tensor = CompiledBatchPrototypeDRO.apply(
            z, self.epsilon, labels, self._batch_prototypes(z, labels), self.temperature
        )
        return dro

    def extra_repr(self) -> str:
        return (
            f"lam={self.lam:g}, temperature={self.temperature:g}, "
            f"epsilon_init={self.epsilon_init:g}, learn_epsilon={self.learn_epsilon}, "
            f"prototype_momentum={self.prototype_momentum:g}, ce_weighting={self.ce_weighting!r}"
        )
