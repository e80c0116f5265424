"""ELM's pull term (Jitkrittum et al. 2022): Ω_pull of each embedding against the others of
its class, in the batch or in a memory of recent embeddings, as autograd functions (a generic
torch form and, for float32 on the CPU, the compiled kernels of :mod:`pull_kernels`), with
the distance and buffer helpers DRO-LT's prototypes share.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
import torch
from torch.autograd.function import once_differentiable

from tailkit.plugins.losses.pull_kernels import (
    class_runs,
    memory_pull,
    pull_backward,
    pull_forward,
)


def grow_lazy_buffers(
    names: tuple[str, ...],
    module: torch.nn.Module,
    state_dict: dict[str, Any],
    prefix: str,
    *_: Any,
) -> None:
    """A ``load_state_dict`` pre-hook (bind ``names`` with functools.partial): give the buffers
    ``names`` the shape and dtype of their entries in the incoming state dict.

    A buffer whose trailing size (the embedding dimension d) is only known at the first forward
    is registered empty in ``setup``; a checkpoint written after training holds the full
    tensor, and ``load_state_dict`` refuses a shape mismatch, so the empty buffer must grow
    before the copy. The values are then copied by the ordinary loading code.
    """
    for name in names:
        incoming = state_dict.get(prefix + name)
        current = getattr(module, name, None)
        if (
            isinstance(incoming, torch.Tensor)
            and isinstance(current, torch.Tensor)
            and (incoming.shape != current.shape or incoming.dtype != current.dtype)
        ):
            fresh = torch.zeros(incoming.shape, dtype=incoming.dtype, device=current.device)
            setattr(module, name, fresh)


def squared_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """‖a_i − b_j‖² for a (..., n, d) and b (..., k, d), as (..., n, k), clamped at 0.

    Uses ‖a‖² + ‖b‖² − 2a·b (one matrix product, no (n, k, d) temporary). Callers centre the
    points first: distances do not depend on the origin, and ReLU embeddings share a large
    common offset that would otherwise cost digits to cancellation.
    """
    sq_a = a.square().sum(-1, keepdim=True)
    sq_b = b.square().sum(-1).unsqueeze(-2)
    return (sq_a + sq_b - 2.0 * (a @ b.transpose(-1, -2))).clamp_min(0.0)


def pull_terms(
    anchors: torch.Tensor,
    positives: torch.Tensor,
    valid: torch.Tensor,
    alpha: torch.Tensor,
) -> torch.Tensor:
    """Ω_pull per anchor: log[1 + Σ_{valid j} exp(‖anchor − positive_j‖² − α)], shape (B,).

    ``positives`` is (P, d) shared by all anchors or (B, P, d) per anchor; ``valid`` (B, P) bool
    says which pairs count; ``alpha`` (B,) is the anchor's margin α_y. log(1 + Σ e^v) is the
    log-sum-exp of [0, v], so masked pairs are −inf entries and an anchor without a partner gets
    exactly log 1 = 0, with finite gradients everywhere.
    """
    centre = anchors.detach().mean(dim=0)
    a = anchors - centre
    p = positives - centre
    # Per-anchor positives (B, P, d) are a batch of 1 × P distance matrices.
    d2 = squared_distances(a, p) if p.ndim == 2 else squared_distances(a.unsqueeze(1), p)[:, 0]
    v = (d2 - alpha.unsqueeze(1)).masked_fill(~valid, float("-inf"))
    return torch.logsumexp(torch.cat([v.new_zeros(v.shape[0], 1), v], dim=1), dim=1)


def same_class_pairs(labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every ordered pair (i, j), i ≠ j, of batch rows with the same label, without a B × B mask.

    Returns ``rows``, ``cols`` (P,) and ``swap`` (P,), the position of the pair (j, i) for each
    pair (i, j). Built on the label sort: a class of n rows occupies a run of the sorted order
    and gives each of its rows the n − 1 other rows of the run as partners, so the pairs come
    anchor by anchor (Σ n(n − 1) of them, about 10^4 for B = 512 on a Zipf label set, against
    the 2.6 · 10^5 entries of the mask that had to be built, combined and scanned before).
    """
    order = torch.sort(labels, stable=True).indices
    _, run_sizes = torch.unique_consecutive(labels[order], return_counts=True)
    size = run_sizes.repeat_interleave(run_sizes)  # n of each sorted position's class
    start = (run_sizes.cumsum(0) - run_sizes).repeat_interleave(run_sizes)  # where its run starts
    partners = size - 1
    first = partners.cumsum(0) - partners  # where each anchor's partners start among the pairs
    anchor = torch.arange(labels.numel(), device=labels.device).repeat_interleave(partners)
    # The j-th partner of an anchor at rank r in its run is rank j, or j + 1 from j = r on.
    slot = torch.arange(anchor.numel(), device=labels.device) - first[anchor]
    rank = anchor - start[anchor]
    partner = start[anchor] + slot + (slot >= rank).long()
    # (partner, anchor) is the partner's (rank of anchor, less one if it comes after)-th pair.
    swap = first[partner] + rank - (anchor > partner).long()
    return order[anchor], order[partner], swap


class BatchPull(torch.autograd.Function):
    """Ω_pull of every anchor against the other rows of the same batch, with its gradient
    written out: the same value as :func:`pull_terms` (z, z, valid, alpha) on the same-class
    pairs of :func:`same_class_pairs`, in two GEMMs, where autograd's graph of the same
    expression took three GEMMs and about twice the passes (the pull was a third of an ELM
    step), and with every pass after the GEMMs over the pairs only.

    With a = z − mean(z), d²_ij = ‖a_i − a_j‖² and P_ij = exp(d²_ij − α_i − Ω_i) the softmax
    weight of pair (i, j) (0 for a masked pair), ∂Ω_i/∂d²_ij = P_ij, and since d² is symmetric
    in its two arguments, ∂L/∂z = 2[(r + c) ⊙ a − (W + Wᵀ) a] with W = diag(g) P and r, c its
    row and column sums. The pair set is symmetric, so (W + Wᵀ)_ij = W_ij + W_ji is the pair's
    weight plus its swapped pair's, and r + c the row sums of that. The clamp of d² at 0 is
    ignored in the gradient: where it binds, the points coincide and 2(a_i − a_j) is 0 anyway.
    """

    @staticmethod
    def forward(
        ctx: Any,
        z: torch.Tensor,
        pairs: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
        alpha: torch.Tensor,
    ) -> torch.Tensor:
        rows, cols, swap = pairs
        a = z - z.mean(dim=0)
        # ‖a_i‖² + ‖a_j‖² − 2 a_i·a_j (squared_distances' form and order), on the pairs only:
        # exp over the masked majority of a B × B matrix would cost more than the rest (exp(−inf)
        # takes the slow path, 5× a normal exp on this CPU).
        sq = a.square().sum(dim=1)
        gram = (a @ a.t()).view(-1)
        d2 = (sq[rows] + sq[cols]).sub_(gram[rows * a.shape[0] + cols].mul_(2.0)).clamp_min_(0.0)
        v = d2.sub_(alpha[rows])
        # log(1 + Σ_j e^{v_ij}) with the 1 as a v = 0 term, shifted by max(0, max_j v_ij).
        top = torch.zeros_like(alpha).scatter_reduce_(0, rows, v, "amax", include_self=True)
        weights = v.sub_(top[rows]).exp_()
        total = torch.exp(-top).index_add_(0, rows, weights)
        weights.div_(total[rows])  # P_ij = e^{v_ij − Ω_i}
        ctx.save_for_backward(a, weights, rows, cols, swap)
        return top.add_(total.log_())

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        a, weights, rows, cols, swap = ctx.saved_tensors
        b = a.shape[0]
        w = weights * grad[rows]
        both = w + w[swap]  # (W + Wᵀ) on the pairs, which are all its non-zeros
        degree = torch.zeros(b, dtype=a.dtype, device=a.device).index_add_(0, rows, both)
        dense = torch.zeros(b, b, dtype=a.dtype, device=a.device).index_put_((rows, cols), both)
        grad_z = torch.addmm(degree.unsqueeze(1) * a, dense, a, alpha=-1.0).mul_(2.0)
        return grad_z, None, None


def batch_pull_forward(
    a: torch.Tensor, runs: tuple[Any, ...], alpha: torch.Tensor
) -> tuple[torch.Tensor, np.ndarray]:
    """Ω (B,) float64 of the contiguous float32 embeddings ``a`` and the pair weights the
    backward reads, from :func:`~tailkit.plugins.losses.pull_kernels.pull_forward`."""
    order, run_start, run_size, block_start, total = runs
    weights = np.empty(int(total), dtype=np.float64)
    omega = torch.empty(a.shape[0], dtype=torch.float64)
    pull_forward(
        a.numpy(),
        order,
        run_start,
        run_size,
        block_start,
        alpha.to(torch.float64).contiguous().numpy(),
        weights,
        omega.numpy(),
        numba.get_num_threads(),
    )
    return omega, weights


def batch_pull_backward(
    a: torch.Tensor, runs: tuple[Any, ...], weights: np.ndarray, grad: torch.Tensor
) -> torch.Tensor:
    """∂(Σ_i grad_i Ω_i)/∂a (B, d) float32 for per-row gradients ``grad`` (B,)."""
    order, run_start, run_size, block_start, _ = runs
    out = torch.empty_like(a)
    pull_backward(
        a.numpy(),
        order,
        run_start,
        run_size,
        block_start,
        weights,
        grad.to(torch.float64).contiguous().numpy(),
        out.numpy(),
        numba.get_num_threads(),
    )
    return out


class CompiledBatchPull(torch.autograd.Function):
    """:class:`BatchPull`'s value and gradient for float32 embeddings on the CPU, from the
    compiled kernels of :mod:`~tailkit.plugins.losses.pull_kernels`: the pairs are visited run
    by run of the label-sorted batch, with no B × B matrix and no pair lists."""

    @staticmethod
    def forward(
        ctx: Any, z: torch.Tensor, runs: tuple[np.ndarray, ...], alpha: torch.Tensor
    ) -> torch.Tensor:
        a = z.contiguous()  # differences need no centre (pull_kernels)
        omega, ctx.weights = batch_pull_forward(a, runs, alpha)
        ctx.runs = runs
        ctx.save_for_backward(a)
        return omega.to(z.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (a,) = ctx.saved_tensors
        return batch_pull_backward(a, ctx.runs, ctx.weights, grad), None, None


def compiled_pull_runs(z: torch.Tensor, labels: torch.Tensor) -> tuple[Any, ...] | None:
    """The label-sorted runs that the compiled pull kernels walk (order, run_start, run_size,
    block_start, total), or None where the torch path is to be taken: not float32 on the CPU,
    or same-class pairs over a quarter of the B × B matrix (past that, the two GEMMs of
    :class:`BatchPull` do the same work faster)."""
    if z.device.type != "cpu" or z.dtype != torch.float32:
        return None
    flat = labels.numpy()
    order = np.argsort(flat, kind="stable")
    run_start, run_size, block_start, total = class_runs(flat[order])
    if total > flat.size * flat.size // 4:
        return None
    return order, run_start, run_size, block_start, total


def batch_pull(z: torch.Tensor, labels: torch.Tensor, alpha: torch.Tensor) -> torch.Tensor:
    """Ω_pull (B,) of every row against the other rows of its class in the batch: the compiled
    kernels where :func:`compiled_pull_runs` gives runs, :class:`BatchPull` otherwise."""
    runs = compiled_pull_runs(z, labels)
    if runs is not None:
        compiled: torch.Tensor = CompiledBatchPull.apply(z, runs, alpha)
        return compiled
    pull: torch.Tensor = BatchPull.apply(z, same_class_pairs(labels), alpha)
    return pull


class MemoryPull(torch.autograd.Function):
    """Ω_pull of each anchor against the stored embeddings of its class, with the gradient
    formed in the forward: the same value as :func:`pull_terms` (z, memory[labels], valid,
    alpha), keeping (B, d) for the backward where autograd kept the (B, memory_size, d) gather
    and its centred copy (a fifth of the step's peak at C = 3,875).

    Ω_i depends on z_i alone (the centre is detached, the stored positives are constants), so
    its gradient is a (B, d) Jacobian row per anchor: with a = z − c, p_im the centred
    positives and P_im = exp(d²_im − α_i − Ω_i) (0 for a masked slot), ∂Ω_i/∂z_i =
    2 Σ_m P_im (a_i − p_im) = 2 (r_i a_i − Σ_m P_im p_im), r_i = Σ_m P_im. The backward
    scales it by the incoming gradient, so it needs nothing the training step may since have
    overwritten (the memory is written right after the forward). As in :class:`BatchPull`,
    the clamp of d² at 0 is ignored in the gradient: where it binds, a_i = p_im and the term
    is 0 anyway.
    """

    @staticmethod
    def forward(
        ctx: Any, z: torch.Tensor, positives: torch.Tensor, valid: torch.Tensor, alpha: torch.Tensor
    ) -> torch.Tensor:
        centre = z.mean(dim=0)
        a = z - centre
        p = positives.sub_(centre)  # a fresh gather: centred in place
        sq_p = torch.linalg.vector_norm(p, dim=2).square_()
        cross = torch.bmm(p, a.unsqueeze(2)).squeeze(2)
        d2 = sq_p.add_(a.square().sum(dim=1, keepdim=True)).sub_(cross.mul_(2.0)).clamp_min_(0.0)
        v = d2.sub_(alpha.unsqueeze(1)).masked_fill_(~valid, float("-inf"))
        # log(1 + Σ_m e^{v_im}): the 1 is a v = 0 term, so shift by max(0, max_m v_im).
        top = v.amax(dim=1).clamp_min(0.0)
        weights = v.sub_(top.unsqueeze(1)).exp_()
        total = torch.exp(-top).add_(weights.sum(dim=1))
        weights.div_(total.unsqueeze(1))  # P_im
        pulled = torch.bmm(weights.unsqueeze(1), p).squeeze(1)  # Σ_m P_im p_im
        jacobian = a.mul_(weights.sum(dim=1, keepdim=True)).sub_(pulled).mul_(2.0)
        ctx.save_for_backward(jacobian)
        return top.add_(total.log_())

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        (jacobian,) = ctx.saved_tensors
        return jacobian * grad.unsqueeze(1), None, None, None


def memory_pull_forward(
    a: torch.Tensor,
    labels: torch.Tensor,
    memory: np.ndarray,
    filled: np.ndarray,
    alpha: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Ω (B,) float64 against the memory and each row's Jacobian (B, d), from
    :func:`~tailkit.plugins.losses.pull_kernels.memory_pull` on contiguous float32 ``a``."""
    omega = torch.empty(a.shape[0], dtype=torch.float64)
    jacobian = torch.empty_like(a)
    memory_pull(
        a.numpy(),
        labels.numpy(),
        memory,
        filled,
        alpha.to(torch.float64).contiguous().numpy(),
        omega.numpy(),
        jacobian.numpy(),
    )
    return omega, jacobian


class CompiledMemoryPull(torch.autograd.Function):
    """:class:`MemoryPull`'s value and gradient for float32 embeddings and memory on the CPU,
    from :func:`~tailkit.plugins.losses.pull_kernels.memory_pull`: each row reads its class's
    memory slots in place (no (B, memory_size, d) gather) and its Jacobian row is formed in
    the same pass; the backward scales it."""

    @staticmethod
    def forward(
        ctx: Any,
        z: torch.Tensor,
        labels: torch.Tensor,
        memory: torch.Tensor,
        filled: torch.Tensor,
        alpha: torch.Tensor,
    ) -> torch.Tensor:
        omega, jacobian = memory_pull_forward(
            z.contiguous(), labels, memory.numpy(), filled.numpy(), alpha
        )
        ctx.save_for_backward(jacobian)
        return omega.to(z.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None, None]:
        (jacobian,) = ctx.saved_tensors
        return jacobian * grad.unsqueeze(1), None, None, None, None


def ring_slots(labels: torch.Tensor, written: torch.Tensor, size: int) -> tuple[torch.Tensor, ...]:
    """Where each row of a batch goes in a per-class ring buffer of ``size`` slots.

    ``written`` (C,) counts every embedding ever written per class. Row i of class c is the
    r-th row of class c in the batch (row order), so it lands in slot (written[c] + r) mod size.
    Only the last ``size`` rows of a class in the batch are kept (earlier ones would be
    overwritten within the same write, and a scatter with repeated indices keeps an arbitrary
    one). Returns (kept row indices, their classes, their slots, batch count per class id).
    """
    order = torch.sort(labels, stable=True).indices
    sorted_labels = labels[order]
    _, counts = torch.unique_consecutive(sorted_labels, return_counts=True)
    starts = torch.repeat_interleave(counts.cumsum(0) - counts, counts)
    rank_sorted = torch.arange(labels.numel(), device=labels.device) - starts
    per_row_count = torch.repeat_interleave(counts, counts)
    keep = rank_sorted >= per_row_count - size
    rows = order[keep]
    classes = sorted_labels[keep]
    slots = (written[classes] + rank_sorted[keep]) % size
    added = torch.zeros_like(written).index_add_(0, labels, torch.ones_like(labels))
    return rows, classes, slots, added
