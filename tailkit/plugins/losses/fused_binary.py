"""Row sums of one-vs-all sigmoid (focal) losses over (B, C) logits, with the gradient written out.

The class-balanced sigmoid and focal losses score every label of every row as its own binary
problem, so autograd's version of them is a chain of (B, C) elementwise steps, each one saved
for the backward and each one with a (B, C) gradient: the focal loss kept three (B, C) tensors
and made five more in its backward. :func:`binary_row_losses` computes the same row sums in the
passes the value itself needs and forms the gradient in one fused pass from what it kept.

Notation: σ = sigmoid(z), sp(z) = softplus(z) = log(1 + e^z), t = 1 at the row's label and 0
elsewhere, M = (1 − p_t)^γ the focal modulator (p_t = σ for t = 1, 1 − σ for t = 0). Per entry

    t = 0:  f(z) = σ^γ · sp(z),             f'(z) = γ (1 − σ) f(z) + σ^{γ+1}
    t = 1:  h(z) = e^{−γ sp(z)} · sp(−z),   h'(z) = −e^{−γ sp(z)} (γ σ sp(−z) + σ(−z))

(γ = 0 is the plain sigmoid BCE: f' = σ, h' = σ − 1). M for t = 0 is σ(z) itself when γ = 1 and
exp(γ log σ(z)) otherwise, as the class-balanced loss has always computed it.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from tailkit.plugins.losses.binary_kernels import (
    binary_backward,
    binary_forward_with_slopes,
    kernel_mode,
)
from tailkit.plugins.losses.fused_softmax import check_label_range, compiled_path


def _positive_terms(z_y: torch.Tensor, gamma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """h(z) and h'(z) of the label entries (B, 1): the t = 1 loss and its derivative."""
    keep = torch.exp(-gamma * F.softplus(z_y))  # (1 − σ)^γ, stable for any z
    loss_if_wrong = F.softplus(-z_y)
    value = keep * loss_if_wrong
    slope = -keep * (gamma * torch.sigmoid(z_y) * loss_if_wrong + torch.sigmoid(-z_y))
    return value, slope


def _sigmoid_power(z: torch.Tensor, gamma: float) -> torch.Tensor:
    """σ(z)^γ as exp(γ log σ(z)), one fresh tensor worked in place."""
    return F.logsigmoid(z).mul_(gamma).exp_()


class _BinaryRowLosses(torch.autograd.Function):
    """Σ_c of f(z_ic) over the t = 0 entries and h(z_iy) at the label, per row (B,).

    The dense work assumes t = 0 everywhere and overwrites the B label entries with their t = 1
    terms before the row sum: no one-hot, and no t = 0 term subtracted back (which would cancel
    when it is large). Kept for the backward: the logits (already alive) and, for γ > 0, σ and
    the products f, so that f' = γ(1 − σ)f + σ^{γ+1} is one pass (a lerp when γ = 1).
    """

    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, labels: torch.Tensor, gamma: float) -> torch.Tensor:
        column = labels.unsqueeze(1)
        z_y = z.gather(1, column)
        positive, positive_slope = _positive_terms(z_y, gamma)
        terms = F.softplus(z)
        if gamma == 0:
            sig = None
        else:
            sig = torch.sigmoid(z)
            terms.mul_(sig if gamma == 1 else _sigmoid_power(z, gamma))
        # The dense terms f without the label entries are what the backward needs; the row sum
        # needs them with h in place, so the label entries are swapped in and back out.
        negative_at_label = terms.gather(1, column)
        row_sums = terms.scatter_(1, column, positive).sum(dim=1)
        terms.scatter_(1, column, negative_at_label)
        ctx.gamma = gamma
        if sig is None:
            ctx.save_for_backward(z, column, positive_slope)
        else:
            ctx.save_for_backward(z, column, positive_slope, sig, terms)
        return row_sums

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        z, column, positive_slope, *kept = ctx.saved_tensors
        gamma: float = ctx.gamma
        if not kept:  # sigmoid BCE: f' = σ
            slope = torch.sigmoid(z)
        else:
            sig, terms = kept
            if gamma == 1:
                # f' = (1 − σ)f + σ² = f + σ(σ − f): lerp from f towards σ by σ, one pass.
                slope = torch.lerp(terms, sig, sig)
            else:
                # f' = γ(1 − σ)f + σ^γ·σ, with σ^γ = f / sp recomputed as exp(γ log σ).
                slope = _sigmoid_power(z, gamma).mul_(sig)
                slope.addcmul_(terms, 1.0 - sig, value=gamma)
        slope.scatter_(1, column, positive_slope)
        return slope.mul_(grad.unsqueeze(1)), None, None


class _CompiledBinaryRowLosses(torch.autograd.Function):
    """The same row sums and gradient as :class:`_BinaryRowLosses` for float32 logits on the
    CPU, from the compiled kernels of :mod:`~tailkit.plugins.losses.binary_kernels`. The forward
    computes each entry's transcendentals once and writes its slope f' beside the row sum,
    already multiplied by the gradient the caller expects each row to receive (``expected``,
    (B,) float32; ones when it does not say). The backward hands that table on as the logits'
    gradient when the expected gradient came, scales it in place when ``expected`` was ones,
    and otherwise (or in a second backward through the same graph: gradcheck, retain_graph,
    which finds the table spent) recomputes it from the logits: every path gives the bits of
    f' · grad rounded once. So a step makes one (B, C) tensor, and a loss that knows its row
    weights (the class-balanced α_i / B) pays no pass to apply them. The B label entries are
    computed in the kernels in float64, as :func:`_positive_terms` computes them."""

    @staticmethod
    def forward(
        ctx: Any, z: torch.Tensor, labels: torch.Tensor, gamma: float, expected: torch.Tensor
    ) -> torch.Tensor:
        rows = torch.empty(z.shape[0], dtype=torch.float32)
        slopes = torch.empty_like(z)
        binary_forward_with_slopes(
            z.numpy(),
            labels.numpy(),
            gamma,
            kernel_mode(gamma),
            expected.numpy(),
            rows.numpy(),
            slopes.numpy(),
        )
        ctx.gamma = gamma
        ctx.slopes = slopes  # an intermediate, consumed by the first backward
        ctx.save_for_backward(z, labels, expected)
        return rows

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        scale = grad.to(torch.float32)
        z, labels, expected = ctx.saved_tensors
        slopes, ctx.slopes = ctx.slopes, None
        if slopes is not None:
            if torch.equal(scale, expected):
                return slopes, None, None, None
            if bool((expected == 1).all()):
                return slopes.mul_(scale.unsqueeze(1)), None, None, None
        gamma: float = ctx.gamma
        again = torch.empty_like(z)
        binary_backward(
            z.numpy(),
            labels.numpy(),
            gamma,
            kernel_mode(gamma),
            scale.contiguous().numpy(),
            again.numpy(),
        )
        return again, None, None, None


def binary_row_losses(
    logits: torch.Tensor,
    labels: torch.Tensor,
    gamma: float,
    *,
    expected_grad: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per row (B,): Σ_c M_ic BCE(z_ic, t_ic) with one-hot targets t at ``labels`` (B,) and the
    focal modulator M = (1 − p_t)^γ (γ = 0: the sigmoid loss, M ≡ 1). Same values and gradient
    as the elementwise autograd formula; see the module docstring for the terms.

    ``expected_grad`` (B,): the gradient the caller's reduction will send each row, bit for
    bit, when it is known in the forward (a weighted mean's w_i / B); the compiled path then
    writes the logits' gradient in its forward pass. Any other gradient is still handled
    exactly, by a pass more."""
    if compiled_path(logits):
        check_label_range(labels, logits.shape[1], "one-vs-all loss")
        expected = (
            torch.ones(logits.shape[0], dtype=torch.float32)
            if expected_grad is None
            else expected_grad.detach().to(torch.float32).contiguous()
        )
        compiled: torch.Tensor = _CompiledBinaryRowLosses.apply(
            logits.contiguous(), labels.long().contiguous(), float(gamma), expected
        )
        return compiled
    rows: torch.Tensor = _BinaryRowLosses.apply(logits, labels, float(gamma))
    return rows
