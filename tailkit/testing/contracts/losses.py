"""``check_loss``: a loss gives a finite scalar with finite gradients on every batch type it
takes, masks accidental hits, and its ``adjust_scores`` keeps the scores' shape."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from tailkit.components import Batch, FullBatch, Loss, SampledBatch, Sampler
from tailkit.evaluation.correction import PredictionContext
from tailkit.registry import Component, batch_modes
from tailkit.testing.contracts.common import (
    EMBED_DIM,
    IN_DIM,
    SEED,
    B,
    C,
    M,
    _build,
    _expect,
    _finite,
    _resolve,
)


def _log_softmax(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    return torch.log_softmax(torch.randn(shape, generator=g), dim=-1)


def class_counts() -> torch.Tensor:
    """The training counts n_y (C,) float64 that ``check_loss`` hands ``Loss.setup``: skewed,
    every class present (a long tail from 200 down to 1)."""
    return torch.round(200.0 * torch.arange(1, C + 1, dtype=torch.float64) ** -2.1)


def _loss_inputs(mode: str, dtype: torch.dtype) -> list[tuple[str, Batch, dict[str, Any]]]:
    """(description, batch, leaves) as the training loop builds them; leaves require grad."""
    g = torch.Generator().manual_seed(SEED)
    labels = torch.randint(C, (B,), generator=g)
    z = torch.randn(B, EMBED_DIM, generator=g, dtype=torch.float64)
    weight = torch.randn(C, EMBED_DIM, generator=g, dtype=torch.float64)
    full = z @ weight.T
    log_prior = class_counts().log().sub(class_counts().sum().log()).to(dtype)
    embeddings = z.to(dtype)
    if mode == "full":
        logits = full.to(dtype).requires_grad_(True)
        batch: Batch = FullBatch(
            labels=labels, logits=logits, num_classes=C, log_prior=log_prior, embeddings=embeddings
        )
        return [("full logits", batch, {"logits": logits})]

    out: list[tuple[str, Batch, dict[str, Any]]] = []
    for variant in ("shared", "per-example", "conditional"):
        y = labels.clone()
        if variant == "shared":
            neg_ids = torch.randint(C, (M,), generator=g)
            y[0], y[3] = neg_ids[1], neg_ids[4]  # accidental hits
            hits = neg_ids.unsqueeze(0) == y.unsqueeze(1)
            neg = full[:, neg_ids]
        else:
            neg_ids = torch.randint(C, (B, M), generator=g)
            neg_ids[0, 1], neg_ids[3, 4] = y[0], y[3]
            hits = neg_ids == y.unsqueeze(1)
            neg = full.gather(1, neg_ids)
        if variant == "conditional":
            table = _log_softmax((B, C), g)
            neg_log_q, pos_log_q = table.gather(1, neg_ids), table.gather(1, y.unsqueeze(1))[:, 0]
        else:
            table = _log_softmax((C,), g)
            neg_log_q, pos_log_q = table[neg_ids], table[y]
        pos_logits = full.gather(1, y.unsqueeze(1))[:, 0].to(dtype).requires_grad_(True)
        neg_logits = neg.to(dtype).requires_grad_(True)
        batch = SampledBatch(
            labels=y,
            pos_logits=pos_logits,
            neg_logits=neg_logits,
            pos_log_q=pos_log_q.to(dtype),
            neg_log_q=neg_log_q.to(dtype),
            hits=hits,
            neg_ids=neg_ids,
            sampler_conditional=variant == "conditional",
            log_prior=log_prior,
            embeddings=embeddings,
        )
        out.append(
            (f"{variant} negatives", batch, {"pos_logits": pos_logits, "neg_logits": neg_logits})
        )
    return out


def check_loss(factory: Callable[..., Any] | Component, /, **options: Any) -> None:
    """A loss gives a finite scalar and finite gradients, masks accidental hits, takes float64,
    and its ``adjust_scores`` keeps the (B, k) shape. ``setup`` is called first with
    :func:`class_counts` (``train_rows`` set to their sum), as the core calls it before
    training.

    It is run on each batch type its ``forward`` takes (:func:`tailkit.registry.batch_modes`);
    a sampled batch comes with shared ``(m,)`` and per-example ``(B, m)`` negatives, with an
    unconditional and a conditional ``log q``.
    """
    factory, label = _resolve(factory, "loss")
    loss = _build(factory, label, options)
    _expect(isinstance(loss, Loss), label, f"built a {type(loss).__name__}, not a tailkit Loss")
    modes = batch_modes(loss)
    _expect(
        modes,
        label,
        "forward(batch) names no batch type; annotate it FullBatch, SampledBatch or both",
    )
    # As the core does: N, then setup with the training counts once, before any forward.
    counts = class_counts()
    loss.train_rows = int(counts.sum())
    loss.setup(counts)
    for mode, dtype in [(m, d) for m in modes for d in (torch.float32, torch.float64)]:
        for what, batch, leaves in _loss_inputs(mode, dtype):
            where = f"{label} on {what} ({dtype})"
            value = loss(batch)
            _expect(
                isinstance(value, torch.Tensor) and value.ndim == 0,
                where,
                f"returned {value!r}; expected a scalar tensor",
            )
            _expect(_finite(value), where, f"loss is {value.detach().item()}, not finite")
            _expect(value.requires_grad, where, "the loss does not depend on the logits")
            value.backward()
            for name, leaf in leaves.items():
                _expect(leaf.grad is not None, where, f"no gradient reaches batch.{name}")
                _expect(_finite(leaf.grad), where, f"the gradient on batch.{name} is not finite")
            if isinstance(batch, SampledBatch):
                grad = leaves["neg_logits"].grad
                _expect(
                    bool((grad[batch.hits] == 0).all()),
                    where,
                    "an accidental hit (batch.hits) gets a non-zero gradient "
                    f"{grad[batch.hits].tolist()}; hits must be masked",
                )
    _check_adjust_scores(loss, label)


class _TableProposal(Sampler):
    """An unconditional proposal given by its log q table: the kit's own, so checking a loss
    needs no sampler plugin installed."""

    def __init__(self, log_q: torch.Tensor) -> None:
        self.log_q = log_q

    def log_prob(self, x: torch.Tensor | None, labels: torch.Tensor) -> torch.Tensor:
        return self.log_q[labels]


def _check_adjust_scores(loss: Loss, label: str) -> None:
    g = torch.Generator().manual_seed(SEED + 1)
    k = 4
    x = torch.randn(B, IN_DIM, generator=g)
    scores = torch.randn(B, k, generator=g)
    label_ids = torch.arange(3, 3 + k)
    proposal = _TableProposal(_log_softmax((C,), g))
    log_prior = _log_softmax((C,), g)
    adjusts = loss.adjusts_scores
    _expect(isinstance(adjusts, bool), label, f"adjusts_scores is {adjusts!r}, not a bool")
    for ctx in (
        PredictionContext(log_prior=log_prior, sampler=proposal),
        PredictionContext(log_prior=log_prior, sampler=None),
    ):
        where = f"{label}.adjust_scores (sampler {'a fitted proposal' if ctx.sampler else 'None'})"
        before = scores.clone()
        with torch.no_grad():
            out = loss.adjust_scores(scores, x, label_ids, ctx)
        _expect(torch.equal(scores, before), where, "modified the scores in place")
        _expect(
            isinstance(out, torch.Tensor) and out.shape == (B, k),
            where,
            f"returned shape {tuple(getattr(out, 'shape', ()))}; expected {(B, k)}",
        )
        _expect(_finite(out), where, "returned non-finite scores")
        if not adjusts:
            _expect(
                torch.equal(out, scores),
                where,
                "changes the scores although adjusts_scores is False, so evaluation would "
                "never apply the change",
            )
