"""DRO-LT (Samuel & Chechik, ICCV 2021), one-stage: cross-entropy plus the DRO embedding loss."""

from __future__ import annotations

from functools import partial
from typing import Any, ClassVar, Literal, overload

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from tailkit.components import FullBatch, Loss
from tailkit.plugins.losses.dro_kernels import batch_prototypes, dro_backward, dro_forward
from tailkit.plugins.losses.elm import (
    grow_lazy_buffers,
    squared_distances,
)
from tailkit.plugins.losses.fused_softmax import (
    batch_cross_entropy,
    check_label_range,
    compiled_ce_gradient,
    compiled_ce_rows,
    compiled_path,
    replicated_embeddings,
)
from tailkit.validation import Constraint, Interval, Options


@overload
def dro_loss(
    z: torch.Tensor,
    labels: torch.Tensor,
    prototypes: torch.Tensor,
    proto_labels: torch.Tensor,
    epsilon: torch.Tensor | float,
    temperature: float,
    *,
    per_class: Literal[False] = ...,
) -> torch.Tensor: ...


@overload
def dro_loss(
    z: torch.Tensor,
    labels: torch.Tensor,
    prototypes: torch.Tensor,
    proto_labels: torch.Tensor,
    epsilon: torch.Tensor | float,
    temperature: float,
    *,
    per_class: Literal[True],
) -> tuple[torch.Tensor, torch.Tensor]: ...


@overload
def dro_loss(
    z: torch.Tensor,
    labels: torch.Tensor,
    prototypes: torch.Tensor,
    proto_labels: torch.Tensor,
    epsilon: torch.Tensor | float,
    temperature: float,
    *,
    per_class: bool = ...,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...


def dro_loss(
    z: torch.Tensor,
    labels: torch.Tensor,
    prototypes: torch.Tensor,
    proto_labels: torch.Tensor,
    epsilon: torch.Tensor | float,
    temperature: float,
    *,
    per_class: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """The DRO loss as dvirsamuel/DRO-LT computes it (``DROLoss.forward``), given prototypes.

    ``z`` (B, d) features with ``labels`` (B,); ``prototypes`` (K, d) with distinct class ids
    ``proto_labels`` (K,); ``epsilon`` the per-class radius, indexed by class id (a tensor
    (C,)) or one number for all classes. With P[k, i] = −‖μ_k − z_i‖₂ (not squared), minus
    ε_{y_i} where proto_labels[k] = y_i (the worst case inside the ε-ball), the log-probabilities
    are normalised over the batch samples for each prototype::

        log p[k, i] = P[k, i]/T − log Σ_j exp(P[k, j]/T)
        loss_k = −mean_{i: y_i = proto_labels[k]} log p[k, i]

    and the loss is Σ_k loss_k / #(prototypes whose class is in the batch); a prototype whose
    class is absent does not change the others (each row is normalised on its own) and is not
    counted. Unlike the reference, the log-normaliser subtracts the row maximum first, so it
    does not overflow for small T; the value is the same wherever the reference's is finite.

    ``per_class=True`` also returns loss_k (K,) (0 for an absent class).
    """
    labels = labels.long()
    positive = proto_labels.long().unsqueeze(1) == labels.unsqueeze(0)
    dist = _distances(prototypes.to(z.dtype), z, positive)
    if isinstance(epsilon, torch.Tensor):
        radius = epsilon.to(z.dtype)[labels].unsqueeze(0)
    else:
        radius = torch.full_like(dist[:1], float(epsilon))
    scores = -(dist + torch.where(positive, radius, 0.0)) / temperature
    log_p = torch.log_softmax(scores, dim=1)
    n = positive.sum(dim=1)
    losses = -torch.where(positive, log_p, 0.0).sum(dim=1) / n.clamp_min(1)
    total = losses.sum() / (n > 0).sum().clamp_min(1)
    return (total, losses) if per_class else total


def _distances(prototypes: torch.Tensor, z: torch.Tensor, positive: torch.Tensor) -> torch.Tensor:
    """‖μ_k − z_i‖₂ (K, B): one GEMM for all pairs, then the positive pairs again exactly.

    The GEMM form ‖a‖² + ‖b‖² − 2a·b is 5× faster than direct differences (cdist's exact mode
    was a third of the step), but the square root turns its rounding error near 0 into
    √eps·‖z‖ (3e-4·‖z‖ in float32), and a prototype often sits on a feature of its own class (a
    class seen once). Those are positive pairs, one per sample, so they are recomputed from
    direct differences (B × d), whose norm has the subgradient 0 at 0. Negative pairs are
    other classes' prototypes, away from the feature; their squared distance is floored at a
    tiny value so the square root's gradient stays finite. Centring both sets on the
    prototypes' mean first keeps the GEMM form's cancellation small.
    """
    centre = prototypes.detach().mean(dim=0)
    a, b = prototypes - centre, z - centre
    d2 = squared_distances(a, b)
    dist = d2.clamp_min(torch.finfo(d2.dtype).tiny).sqrt()
    k, i = positive.nonzero(as_tuple=True)
    exact = torch.linalg.vector_norm(z[i] - prototypes[k], dim=1)
    return dist.index_put((k, i), exact)


class _BatchPrototypeDRO(torch.autograd.Function):
    """:func:`dro_loss` for the case :class:`DROLT` trains: one constant prototype per class of
    the batch (no gradient), each sample positive for exactly the prototype of its class, with
    the gradient for the features and ε written out.

    The same value as :func:`dro_loss` (same distances, the same exact recomputation of the
    positive pairs, the same normalisation), in a dozen (K, B) passes where autograd's graph
    of the general function took about sixty (DRO-LT cost 1.34x CE per step in issue 17). With
    s = −D/T the scores (D the distances, plus ε at the positive pairs), G = ∂L/∂s is
    (g/K)(softmax(s_k) − [pair (k, i) positive]/n_k); ∂L/∂ε_{y_i} = −G_{k(i) i}/T, and with
    H = −G/(T·D) (D without ε) ∂L/∂z_i = Σ_k H_ki (z_i − μ_k) = (Σ_k H_ki) z_i − (Hᵀμ)_i, one
    GEMM. H is 0 where D is floored or exactly 0 (a feature on its prototype), where the
    general function's clamp and norm give a zero (sub)gradient.
    """

    @staticmethod
    def forward(
        ctx: Any,
        z: torch.Tensor,
        labels: torch.Tensor,
        prototypes: torch.Tensor,
        owner: torch.Tensor,
        epsilon: torch.Tensor,
        temperature: float,
    ) -> torch.Tensor:
        samples = torch.arange(z.shape[0], device=z.device)
        dist = _distances_to_own(prototypes, z, owner, samples)
        scores = dist.clone()
        scores.index_put_((owner, samples), epsilon.to(z.dtype)[labels], accumulate=True)
        log_p = torch.log_softmax(scores.div_(-temperature), dim=1)
        sizes = torch.bincount(owner, minlength=prototypes.shape[0]).to(z.dtype)
        picked = log_p[owner, samples] / sizes[owner]
        classes = int((sizes > 0).sum().clamp_min(1))
        ctx.temperature, ctx.classes = temperature, classes
        ctx.save_for_backward(z, labels, prototypes, owner, epsilon, dist, log_p, sizes)
        return -picked.sum() / classes

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        z, labels, prototypes, owner, epsilon, dist, log_p, sizes = ctx.saved_tensors
        temperature: float = ctx.temperature
        samples = torch.arange(z.shape[0], device=z.device)
        scale = grad / ctx.classes
        g = log_p.exp().mul_(scale)  # fresh: a retained graph runs this backward again
        g.index_put_((owner, samples), -scale / sizes[owner], accumulate=True)
        grad_epsilon = None
        if ctx.needs_input_grad[4]:
            at_positive = g[owner, samples] / -temperature
            grad_epsilon = torch.zeros_like(epsilon).index_add_(
                0, labels, at_positive.to(epsilon.dtype)
            )
        h = g.div_(dist).div_(-temperature).masked_fill_(dist <= _FLOOR_SQRT[dist.dtype], 0.0)
        grad_z = torch.addmm(h.sum(dim=0).unsqueeze(1) * z, h.t(), prototypes, alpha=-1.0)
        return grad_z, None, None, None, grad_epsilon, None


def _dro_value(
    prototypes: tuple[np.ndarray, ...], temperature: float
) -> tuple[float, tuple[Any, ...]]:
    """The DRO term's value from :func:`~tailkit.plugins.losses.dro_kernels.batch_prototypes`'s
    output (the cross-term GEMM, then the forward sweep), and what its gradient needs."""
    inverse, members, starts, sizes, points, norms, own, current, shift = prototypes
    count = sizes.shape[0]
    centred = torch.from_numpy(points)
    dist = torch.mm(centred[:count], centred[count:].t()).numpy()  # the cross term, then D
    inv_t = np.float32(1.0 / temperature)
    lse = np.empty(count, dtype=np.float64)
    value = dro_forward(dist, norms, own, inverse, members, starts, shift, inv_t, lse)
    return value, (dist, inverse, members, starts, shift, inv_t, lse, current)


def _dro_gradients(
    z: torch.Tensor,
    labels: torch.Tensor,
    epsilon: torch.Tensor,
    state: tuple[Any, ...],
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``scale`` times the DRO term's gradients with respect to the embeddings and ε: the
    backward sweep, then −Hᵀμ added by a GEMM."""
    dist, inverse, members, starts, shift, inv_t, lse, current = state
    weights = np.empty_like(dist)
    grad_z = torch.empty_like(z)
    grad_epsilon = torch.zeros_like(epsilon)
    dro_backward(
        dist,
        z.numpy(),
        labels.numpy(),
        inverse,
        members,
        starts,
        shift,
        inv_t,
        lse,
        scale,
        weights,
        grad_z.numpy(),
        grad_epsilon.numpy(),
    )
    grad_z.addmm_(torch.from_numpy(weights).t(), torch.from_numpy(current), alpha=-1.0)
    return grad_z, grad_epsilon


class _CompiledBatchPrototypeDRO(torch.autograd.Function):
    """:class:`_BatchPrototypeDRO`'s value and gradient for float32 on the CPU, from the compiled
    kernels of :mod:`~tailkit.plugins.losses.dro_kernels`, given the batch's prototypes as
    :func:`~tailkit.plugins.losses.dro_kernels.batch_prototypes` returns them: two GEMMs and
    two parallel (K, B) sweeps where the torch version takes some forty small ops."""

    @staticmethod
    def forward(
        ctx: Any,
        z: torch.Tensor,
        epsilon: torch.Tensor,
        labels: torch.Tensor,
        prototypes: tuple[np.ndarray, ...],
        temperature: float,
    ) -> torch.Tensor:
        value, ctx.state = _dro_value(prototypes, temperature)
        ctx.save_for_backward(z.detach(), labels, epsilon)
        return torch.tensor(value, dtype=z.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        z, labels, epsilon = ctx.saved_tensors
        grad_z, grad_epsilon = _dro_gradients(z, labels, epsilon, ctx.state, float(grad))
        return grad_z, grad_epsilon if ctx.needs_input_grad[1] else None, None, None, None


class _CompiledDROLT(torch.autograd.Function):
    """The whole loss, Σ_i r_i CE_i + λ·DRO, as one autograd node for a whole-label float32 CPU
    batch: CE from the compiled kernels of :mod:`~tailkit.plugins.losses.softmax_kernels` with
    the row weights r (1/B for the mean, w_i/Σw for ``head-up``), DRO as
    :class:`_CompiledBatchPrototypeDRO`. The same values and gradients as that composition
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
        value, ctx.state = _dro_value(prototypes, temperature)
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
        grad_z, grad_epsilon = _dro_gradients(z, labels, epsilon, ctx.state, float(ctx.lam * grad))
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
_FLOOR_SQRT = {
    dtype: float(torch.tensor(torch.finfo(dtype).tiny, dtype=dtype).sqrt())
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
}


def _distances_to_own(
    prototypes: torch.Tensor, z: torch.Tensor, owner: torch.Tensor, samples: torch.Tensor
) -> torch.Tensor:
    """:func:`_distances` (no autograd) where sample i is positive for prototype owner[i]."""
    centre = prototypes.mean(dim=0)
    a, b = prototypes - centre, z - centre
    dist = squared_distances(a, b).clamp_min_(torch.finfo(z.dtype).tiny).sqrt_()
    exact = torch.linalg.vector_norm(z - prototypes[owner], dim=1)
    return dist.index_put_((owner, samples), exact)


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
        dro = _BatchPrototypeDRO.apply(z, labels, current, inverse, self.epsilon, self.temperature)
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
        dro: torch.Tensor = _CompiledBatchPrototypeDRO.apply(
            z, self.epsilon, labels, self._batch_prototypes(z, labels), self.temperature
        )
        return dro

    def extra_repr(self) -> str:
        return (
            f"lam={self.lam:g}, temperature={self.temperature:g}, "
            f"epsilon_init={self.epsilon_init:g}, learn_epsilon={self.learn_epsilon}, "
            f"prototype_momentum={self.prototype_momentum:g}, ce_weighting={self.ce_weighting!r}"
        )
