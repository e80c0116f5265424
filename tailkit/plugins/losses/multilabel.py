"""Su Jianlin's multilabel categorical cross-entropy (ZLPR) and his n-way m-class loss l₁."""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from tailkit.components import FullBatch, Loss
from tailkit.plugins.losses.fused_softmax import compiled_path
from tailkit.plugins.losses.multilabel_kernels import masked_lse_backward, masked_lse_forward

_NEG_INF = float("-inf")


# ------------------------------------------------------------------ numerically careful helpers


def _lse(x: torch.Tensor, dim: int) -> torch.Tensor:
    """log Σ exp(x) along ``dim``; −inf for an all −inf slice, with a zero (not NaN) gradient.

    torch.logsumexp's backward is exp(x − out), which is NaN when every entry is −inf, and such
    slices are routine here (a row without positives, a class absent from a column).
    """
    out = torch.logsumexp(x, dim=dim)
    # logsumexp shifts by the max, so only an all −∞ slice gives −∞: when there is none (the
    # usual case), the plain result and gradient are exact and the masking passes are skipped.
    if not bool(torch.isneginf(out).any()):
        return out
    empty = torch.isneginf(x).all(dim=dim, keepdim=True)
    out = torch.logsumexp(x.masked_fill(empty, 0.0), dim=dim)
    return out.masked_fill(empty.squeeze(dim), _NEG_INF)


def _log1p_exp(x: torch.Tensor) -> torch.Tensor:
    """log(1 + eˣ), exact for large x (F.softplus switches to x above a threshold) and with a
    zero gradient at x = −inf."""
    return torch.logaddexp(x, x.new_zeros(()))


def _safe_log(t: torch.Tensor) -> torch.Tensor:
    """log t with log 0 = −inf exactly, and a finite gradient should t require one."""
    positive = t > 0
    return torch.where(positive, torch.log(torch.where(positive, t, 1.0)), _NEG_INF)


def _safe_log1m(t: torch.Tensor) -> torch.Tensor:
    """log(1 − t) with log 0 = −inf exactly at t = 1 (log1p keeps small t accurate)."""
    below = t < 1
    return torch.where(below, torch.log1p(-torch.where(below, t, 0.0)), _NEG_INF)


def _lse_excluding_each(s: torch.Tensor) -> torch.Tensor:
    """(B, C) with entry (i, j) = log Σ_{k≠j} exp(s_ik), from prefix and suffix log-cum-sums.

    Subtracting e^{s_ij} from the row total would cancel catastrophically exactly when row i is
    confidently right about j, the regime a trained model lives in.
    """
    b, c = s.shape
    if c == 1:
        return s.new_full((b, 1), _NEG_INF)
    pad = s.new_full((b, 1), _NEG_INF)
    before = torch.cat([pad, torch.logcumsumexp(s, dim=1)[:, :-1]], dim=1)
    after = torch.cat([torch.logcumsumexp(s.flip(1), dim=1).flip(1)[:, 1:], pad], dim=1)
    return torch.logaddexp(before, after)


# ------------------------------------------------------------------ compiled log-sum-exps


class _CompiledMaskedLSE(torch.autograd.Function):
    """(log Σ_{j ∉ P} e^(s_j), log Σ_{p ∈ P} e^(−s_p)) per row, from the compiled kernels of
    :mod:`tailkit.plugins.losses.multilabel_kernels`: what :meth:`MultilabelCE._sparse`'s
    torch path computes with a (B, C) mask and two logsumexps."""

    @staticmethod
    def forward(ctx: Any, scores: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        rows = scores.shape[0]
        log_neg, log_pos = np.empty(rows), np.empty(rows)
        masked_lse_forward(scores.numpy(), ids.numpy(), log_neg, log_pos)
        neg, pos = torch.from_numpy(log_neg), torch.from_numpy(log_pos)
        ctx.save_for_backward(scores, ids, neg, pos)
        return neg.to(scores.dtype), pos.to(scores.dtype)

    @staticmethod
    @once_differentiable
    def backward(
        ctx: Any, grad_neg: torch.Tensor, grad_pos: torch.Tensor
    ) -> tuple[torch.Tensor, None]:
        scores, ids, neg, pos = ctx.saved_tensors
        out = torch.empty_like(scores)
        masked_lse_backward(
            scores.numpy(), ids.numpy(), neg.numpy(), pos.numpy(),
            grad_neg.double().contiguous().numpy(), grad_pos.double().contiguous().numpy(),
            out.numpy(),
        )  # fmt: skip
        return out, None


def compiled_masked_lse(scores: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """:class:`_CompiledMaskedLSE` on float32 CPU scores (B, C) and positive ids (B, P), padding
    any negative id."""
    out: tuple[torch.Tensor, ...] = _CompiledMaskedLSE.apply(
        scores.contiguous(), ids.long().contiguous()
    )
    return out


# ------------------------------------------------------------------ input checks


def _scores(owner: str, s: torch.Tensor) -> torch.Tensor:
    if s.ndim != 2:
        raise ValueError(f"{owner} needs logits of shape (B, C); got {tuple(s.shape)}")
    return s


def _targets(owner: str, targets: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    if targets.shape != s.shape:
        raise ValueError(
            f"{owner}: targets have shape {tuple(targets.shape)}; expected the shape of "
            f"the logits {tuple(s.shape)}"
        )
    t = targets.to(s.dtype)
    outside = ~((t >= 0) & (t <= 1))  # NaN fails both comparisons, so it is caught too
    if bool(outside.any()):
        raise ValueError(f"{owner}: targets must lie in [0, 1]; got {t[outside][0].item()!r}")
    return t


def _label_ids(owner: str, labels: torch.Tensor, s: torch.Tensor, *, lists: bool) -> torch.Tensor:
    b, c = s.shape
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise ValueError(f"{owner}: batch.labels must hold integer label ids; got {labels.dtype}")
    shapes = "(B,) or (B, k)" if lists else "(B,)"
    if labels.ndim not in ((1, 2) if lists else (1,)) or labels.shape[0] != b:
        raise ValueError(
            f"{owner}: batch.labels has shape {tuple(labels.shape)}; expected {shapes} with B = {b}"
        )
    labels = labels.long()
    low = -1 if lists else 0
    if labels.numel() and bool(((labels < low) | (labels >= c)).any()):
        bad = labels[(labels < low) | (labels >= c)][0].item()
        allowed = f"[0, {c}) or -1 (padding)" if lists else f"[0, {c})"
        raise ValueError(f"{owner}: label ids must lie in {allowed}; got {bad}")
    if labels.ndim == 2 and labels.shape[1] > 1:
        ordered = labels.sort(dim=1).values
        # A repeated positive would be counted twice in the positive term, and the negative
        # mass (all minus positives) could go below zero.
        if bool(((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)).any()):
            raise ValueError(f"{owner}: a row of batch.labels repeats a label id")
    return labels


def _reduce(per_row: torch.Tensor, reduction: str) -> torch.Tensor:
    return per_row.sum() if reduction == "sum" else per_row.mean()


# ------------------------------------------------------------------ losses


class MultilabelCE(Loss):
    """Su Jianlin's multilabel categorical cross-entropy (ZLPR; kexue.fm/archives/7359, 9064).

    On unbounded scores s = ``batch.logits`` (B, C), never squashed by a sigmoid or softmax.
    With positives P and negatives N of a row, ``threshold=True`` (a threshold class s₀ = 0;
    predict {j : s_j > 0}) gives per row::

        log(1 + Σ_{i∈N} e^{s_i}) + log(1 + Σ_{j∈P} e^{−s_j})

    and ``threshold=False`` the pairwise form for a fixed number of labels (predict the top k)::

        log(1 + Σ_{i∈N, j∈P} e^{s_i − s_j}) = log(1 + Σ_{i∈N} e^{s_i} · Σ_{j∈P} e^{−s_j})

    which with one positive y is exactly the softmax cross-entropy log Σ_j e^{s_j} − s_y.

    Targets:

    - :meth:`soft` takes dense targets (B, C) in [0, 1], hard or soft. Soft labels t replace the sums by
      Σ_i t_i e^{−s_i} and Σ_i (1 − t_i) e^{s_i} (kexue.fm/archives/9064; the pairwise form
      takes the same two sums). The sums are taken in log space with log t and log(1 − t), and
      t = 0 or t = 1 masks the entry exactly (log 0 = −∞, no clipping), as bert4keras does.
      The soft loss is convex with optimum t = σ(2s), so :meth:`confidence` is σ(2s).
    - ``forward`` takes ``batch.labels``, (B,) int: one positive per row; or (B, k) int: lists of positive ids
      padded with −1. These never build a dense float target: the negatives' sum is a
      log-sum-exp over the scores with the positives masked to −∞ (a (B, C) boolean mask), so
      it is exact however much of the mass the positives hold. bert4keras's sparse variant
      instead takes the total minus the positives, LSE([s, 0]) + log(1 − e^{LSE(s_P) −
      LSE([s, 0])}), which cancels catastrophically exactly when the model is confidently right;
      its ε clamp (bert4keras issue #436) binds once a positive scores above −log ε ≈ 16 and
      then gives a loss of s_P + log ε (33.9 for a positive scored 50) with a gradient of +1
      on the positive, where the exact loss and gradient are ≈ 0. (B,) labels with ``threshold=False`` use the
      softmax form above, LSE(s) − s_y, which needs no mask.

    A score of −∞ marks an entry as absent: it is neither a positive nor a negative.

    ``reduction="mean"`` divides the sum of the per-row losses by B (Keras's average of
    bert4keras's per-example losses); ``"sum"`` does not. No prediction-time adjustment.
    """

    multilabel = True

    def __init__(
        self, *, threshold: bool = True, reduction: Literal["mean", "sum"] = "mean"
    ) -> None:
        super().__init__()
        self.threshold = threshold
        self.reduction = reduction

    def forward(self, batch: FullBatch) -> torch.Tensor:
        name = type(self).__name__
        s = _scores(name, batch.logits)
        per_row = self._sparse(s, _label_ids(name, batch.labels, s, lists=True))
        return _reduce(per_row, self.reduction)

    def soft(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The loss on dense targets (B, C) in [0, 1], hard or soft. The core hands a loss
        label ids (``forward``); this form is for a caller that holds soft targets
        (distillation, label smoothing) and is the reference the label-id path is checked
        against."""
        name = type(self).__name__
        s = _scores(name, logits)
        return _reduce(self._dense(s, _targets(name, targets, s)), self.reduction)

    def _dense(self, s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        absent = torch.isneginf(s)
        # Selecting −∞ instead of adding it keeps −s = +∞ of an absent entry out of the sums.
        log_neg = _lse(torch.where(absent, _NEG_INF, s) + _safe_log1m(t), dim=1)
        log_pos = _lse(torch.where(absent, _NEG_INF, -s) + _safe_log(t), dim=1)
        return self._combine(log_neg, log_pos)

    def _combine(self, log_neg: torch.Tensor, log_pos: torch.Tensor) -> torch.Tensor:
        """Per-row loss from log Σ_N e^{s} and log Σ_P e^{−s} (either may be −∞)."""
        if self.threshold:
            return _log1p_exp(log_neg) + _log1p_exp(log_pos)
        return _log1p_exp(log_neg + log_pos)

    def _sparse(self, s: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        single = labels.ndim == 1
        ids = labels.unsqueeze(1) if single else labels
        s_pos = s.gather(1, ids.clamp(min=0))
        present = (ids >= 0) & ~torch.isneginf(s_pos)
        if single and not self.threshold:
            # log(1 + Σ_{i≠y} e^{s_i − s_y}) = LSE(s) − s_y: no subtraction of masses needed.
            s_y = torch.where(present, s_pos, 0.0).squeeze(1)
            return torch.where(present.squeeze(1), _lse(s, dim=1) - s_y, 0.0)
        if compiled_path(s):  # the kernels trust the ids: _label_ids has checked them
            return self._combine(*compiled_masked_lse(s, ids))
        log_pos = _lse(torch.where(present, -s_pos, _NEG_INF), dim=1)
        # Every write stores True, so repeated padding slots cannot race (a scatter of the
        # mask values would let a padding slot's False overwrite a real positive at id 0).
        positive = torch.zeros(s.shape, dtype=torch.bool, device=s.device)
        rows = torch.arange(s.shape[0], device=s.device).unsqueeze(1).expand_as(ids)
        positive[rows[present], ids[present]] = True
        log_neg = _lse(s.masked_fill(positive, _NEG_INF), dim=1)
        return self._combine(log_neg, log_pos)

    def confidence(
        self, top_scores: torch.Tensor, log_partition: torch.Tensor
    ) -> torch.Tensor | None:
        """σ(2s) with the threshold class, the optimum t = σ(2s) of the soft loss; the softmax
        probability without it (the pairwise form with one positive is softmax CE)."""
        if self.threshold:
            return torch.sigmoid(2.0 * top_scores)
        return super().confidence(top_scores, log_partition)

    def extra_repr(self) -> str:
        return f"threshold={self.threshold}, reduction={self.reduction!r}"


class NWayMClass(Loss):
    """Su Jianlin's "n-way m-class" loss l₁ (kexue.fm/archives/9158) over the batch's rows.

    n is the B rows of the batch and m the C classes.

    On scores s = ``batch.logits`` (B, C) and targets t (B, C), rows summing to 1::

        l₁ = Σ_j log(1 + Σ_i Σ_{k≠j} t_ij e^{s_ik − s_ij})
           = Σ_j softplus(LSE_i (log t_ij + r_ij)),   r_ij = LSE_{k≠j} s_ik − s_ij

    the first-order truncation of Σ_i Σ_j t_ij · (−log softmax(s_i)_j), the batch's summed
    softmax cross-entropy. :meth:`soft` takes targets (B, C) in [0, 1] by the general formula
    (soft labels have no closed-form optimum; it is computed all the same); ``forward``'s (B,)
    ``batch.labels`` y give Σ over the classes j present in the batch of
    softplus(LSE_{i : y_i = j} r_i), r_i = LSE_{k≠y_i} s_ik − s_{i,y_i}, with the per-class
    log-sum-exp done by scatter ops in O(B·C).

    Built-in imbalance damping: moving the sum over rows inside the log makes a class's term
    grow like log(#rows of that class) rather than in proportion to it; k identical rows of a
    class give exactly softplus(r + log k), so doubling a class adds about log 2. Since rows of
    one class share a log, the loss does not decompose over rows: its value depends on how the
    batch is composed.

    For m = 2, with d_i = s_i1 − s_i0 and τ_i = t_i1, l₁ = log(1 + Σ_i τ_i e^{−d_i}) +
    log(1 + Σ_i (1 − τ_i) e^{d_i}): the multilabel CE (``multilabel-ce``, with threshold) of one
    example whose C' = B labels have scores d and targets τ.

    ``reduction="sum"`` returns l₁, the sum over classes; ``"mean"`` divides it by B, the number
    of rows. No prediction-time adjustment; :meth:`confidence` is the softmax default.
    """

    def __init__(self, *, reduction: Literal["sum", "mean"] = "mean") -> None:
        super().__init__()
        self.reduction = reduction

    def forward(self, batch: FullBatch) -> torch.Tensor:
        name = type(self).__name__
        s = _scores(name, batch.logits)
        return self._total(self._hard_terms(s, _label_ids(name, batch.labels, s, lists=False)), s)

    def soft(self, logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """l₁ on dense targets (B, C) in [0, 1] (rows summing to 1), by the general formula."""
        name = type(self).__name__
        s = _scores(name, logits)
        t = _targets(name, targets, s)
        r = _lse_excluding_each(s) - s
        return self._total(_log1p_exp(_lse(_safe_log(t) + r, dim=0)), s)

    def _total(self, terms: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        total = terms.sum()
        return total if self.reduction == "sum" else total / s.shape[0]

    @staticmethod
    def _hard_terms(s: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-class terms (C,) for single labels; 0 for a class absent from the batch."""
        c = s.shape[1]
        s_y = s.gather(1, y.unsqueeze(1)).squeeze(1)
        r = _lse(s.scatter(1, y.unsqueeze(1), _NEG_INF), dim=1) - s_y
        # Any per-class shift gives the same log-sum-exp, so the max needs no gradient.
        top = torch.full((c,), _NEG_INF, dtype=s.dtype, device=s.device)
        top = top.scatter_reduce(0, y, r.detach(), reduce="amax", include_self=True)
        top = torch.where(torch.isfinite(top), top, 0.0)
        mass = s.new_zeros(c).index_add(0, y, torch.exp(r - top[y]))
        present = mass > 0
        lse = torch.where(present, top + torch.log(torch.where(present, mass, 1.0)), _NEG_INF)
        return _log1p_exp(lse)

    def extra_repr(self) -> str:
        return f"reduction={self.reduction!r}"
