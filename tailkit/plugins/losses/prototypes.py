"""DRO-LT's embedding loss (Samuel & Chechik, ICCV 2021): the distributionally robust loss
of features against class prototypes, as a general function (:func:`dro_loss`) and as the
autograd functions DRO-LT trains with (one constant prototype per class of the batch; a
generic torch form and, for float32 on the CPU, the compiled kernels of :mod:`dro_kernels`).
"""

from __future__ import annotations

from typing import Any, Literal, overload

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from tailkit.plugins.losses.dro_kernels import dro_backward, dro_forward
from tailkit.plugins.losses.pull import squared_distances


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


class BatchPrototypeDRO(torch.autograd.Function):
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
        dist = distances_to_own(prototypes, z, owner, samples)
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


def dro_value(
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


def dro_gradients(
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


class CompiledBatchPrototypeDRO(torch.autograd.Function):
    """:class:`BatchPrototypeDRO`'s value and gradient for float32 on the CPU, from the compiled
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
        value, ctx.state = dro_value(prototypes, temperature)
        ctx.save_for_backward(z.detach(), labels, epsilon)
        return torch.tensor(value, dtype=z.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        z, labels, epsilon = ctx.saved_tensors
        grad_z, grad_epsilon = dro_gradients(z, labels, epsilon, ctx.state, float(grad))
        return grad_z, grad_epsilon if ctx.needs_input_grad[1] else None, None, None, None


_FLOOR_SQRT = {
    dtype: float(torch.tensor(torch.finfo(dtype).tiny, dtype=dtype).sqrt())
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
}


def distances_to_own(
    prototypes: torch.Tensor, z: torch.Tensor, owner: torch.Tensor, samples: torch.Tensor
) -> torch.Tensor:
    """:func:`_distances` (no autograd) where sample i is positive for prototype owner[i]."""
    centre = prototypes.mean(dim=0)
    a, b = prototypes - centre, z - centre
    dist = squared_distances(a, b).clamp_min_(torch.finfo(z.dtype).tiny).sqrt_()
    exact = torch.linalg.vector_norm(z - prototypes[owner], dim=1)
    return dist.index_put_((owner, samples), exact)
