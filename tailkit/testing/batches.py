"""Loss batches for tests: the fields a check cares about, the rest filled as the core would.

A loss's own tests usually pin a few fields (the logits and labels of a worked vector) and do
not care about the others the core always fills (the class prior, the embeddings, log q of a
uniform proposal). ``full_batch`` and ``sampled_batch`` take any field of
:class:`~tailkit.components.FullBatch` / :class:`~tailkit.components.SampledBatch` by keyword
and fill the missing ones with neutral values, so a test states only what it checks.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from tailkit.components import FullBatch, SampledBatch


def _uniform_prior(num_classes: int, like: torch.Tensor) -> torch.Tensor:
    return torch.full((num_classes,), -math.log(num_classes), dtype=like.dtype, device=like.device)


def _no_embeddings(rows: int, like: torch.Tensor) -> torch.Tensor:
    return torch.zeros(rows, 1, dtype=like.dtype, device=like.device)


def full_batch(*, logits: torch.Tensor, labels: torch.Tensor, **fields: Any) -> FullBatch:
    """A :class:`FullBatch` of ``logits`` (B, C) and ``labels``; by default ``num_classes`` is
    C, ``log_prior`` uniform and ``embeddings`` zeros (B, 1)."""
    fields.setdefault("num_classes", logits.shape[-1])
    fields.setdefault("log_prior", _uniform_prior(fields["num_classes"], logits.detach()))
    fields.setdefault("embeddings", _no_embeddings(logits.shape[0], logits.detach()))
    return FullBatch(logits=logits, labels=labels, **fields)


def sampled_batch(
    *,
    pos_logits: torch.Tensor,
    neg_logits: torch.Tensor,
    labels: torch.Tensor | None = None,
    num_classes: int | None = None,
    **fields: Any,
) -> SampledBatch:
    """A :class:`SampledBatch` of ``pos_logits`` (B,) and ``neg_logits`` (B, m). Missing fields:
    ``labels`` 0, ``neg_ids`` 0 … m − 1 for every row, ``hits`` where ``neg_ids`` equals the
    label, log q of a uniform proposal over ``num_classes`` labels (default: one more than the
    largest id) for ``pos_log_q`` and ``neg_log_q``, a uniform ``log_prior`` and zero
    ``embeddings``."""
    like = neg_logits.detach()
    rows, m = neg_logits.shape
    if labels is None:
        labels = torch.zeros(rows, dtype=torch.int64, device=like.device)
    neg_ids = fields.setdefault(
        "neg_ids", torch.arange(m, device=like.device).expand(rows, m).clone()
    )
    if num_classes is None:
        num_classes = 1 + int(max(labels.max(), neg_ids.max()))
    fields.setdefault("hits", neg_ids.reshape(-1, m) == labels.reshape(-1, 1))
    fields.setdefault("pos_log_q", torch.full_like(pos_logits.detach(), -math.log(num_classes)))
    fields.setdefault("neg_log_q", torch.full_like(like, -math.log(num_classes)))
    fields.setdefault("log_prior", _uniform_prior(num_classes, like))
    fields.setdefault("embeddings", _no_embeddings(rows, like))
    return SampledBatch(pos_logits=pos_logits, neg_logits=neg_logits, labels=labels, **fields)
