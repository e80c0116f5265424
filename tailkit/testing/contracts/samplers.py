"""``check_sampler``: a sampler draws in-range ids with the log q its ``log_prob`` reports,
normalises, is deterministic per seed and survives a ``state_dict`` round trip."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from tailkit.components import Sampler
from tailkit.registry import Component
from tailkit.storage import tensorfile
from tailkit.testing.contracts.common import (
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


def _sampler_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Training features and labels (every class present, skewed counts) and one batch."""
    g = torch.Generator().manual_seed(SEED + 2)
    labels = torch.cat([torch.arange(C), torch.randint(C // 2, (2 * C,), generator=g)])
    labels = labels[torch.randperm(labels.numel(), generator=g)]
    features = torch.randn(labels.numel(), IN_DIM, generator=g)
    return features, labels, features[:B].clone(), labels[:B].clone()


def _draw(sampler: Sampler, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return sampler.sample(x, y, M, torch.Generator().manual_seed(SEED + 3))


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and bool(torch.equal(a, b))


def check_sampler(factory: Callable[..., Any] | Component, /, **options: Any) -> None:
    """A sampler fits, draws ids of the promised shape and dtype in [0, C) with the log q that
    ``log_prob`` reports, normalises, is deterministic per seed, and survives a
    ``state_dict`` round trip (through safetensors, as fit-sampler stores it) and ``to(cpu)``.
    """
    factory, label = _resolve(factory, "sampler")
    sampler = _build(factory, label, options)
    _expect(isinstance(sampler, Sampler), label, f"built a {type(sampler).__name__}, not a Sampler")
    features, labels, x, y = _sampler_data()
    sampler.fit(features, labels, C)
    if sampler.conditions_on == "scores":
        # A model-based sampler is handed the model's scores of all C labels, not the input.
        x = torch.randn(B, C, generator=torch.Generator().manual_seed(SEED + 4))
    shared, conditional = sampler.shared, sampler.conditional
    _expect(isinstance(shared, bool), label, f"shared is {shared!r}, not a bool")
    _expect(isinstance(conditional, bool), label, f"conditional is {conditional!r}, not a bool")

    ids, log_q = _draw(sampler, x, y)
    if shared:
        _expect(
            ids.ndim == 1 and (ids.shape[-1] == M or ids.shape == y.shape),
            label,
            f"a shared sampler drew ids of shape {tuple(ids.shape)}; expected ({M},) "
            f"(or the batch's ({B},))",
        )
    else:
        _expect(
            ids.shape == (B, M),
            label,
            f"a per-example sampler drew ids of shape {tuple(ids.shape)}; expected {(B, M)}",
        )
    _expect(
        log_q.shape == ids.shape,
        label,
        f"log_q has shape {tuple(log_q.shape)}, ids {tuple(ids.shape)}",
    )
    _expect(ids.dtype == torch.int64, label, f"ids have dtype {ids.dtype}; expected int64")
    _expect(log_q.is_floating_point(), label, f"log_q has dtype {log_q.dtype}; expected float32")
    _expect(
        bool(((ids >= 0) & (ids < C)).all()),
        label,
        f"drew ids outside [0, {C}): {ids.tolist()}",
    )
    _expect(_finite(log_q), label, f"a drawn id has log q = {log_q.tolist()}; it must be finite")

    reported = sampler.log_prob(x, ids)
    try:
        a, b = torch.broadcast_tensors(reported.to(log_q.dtype), log_q)
    except RuntimeError:
        a, b = reported, None
    _expect(
        b is not None and torch.allclose(a, b, rtol=1e-5, atol=1e-6),
        label,
        f"log_q from sample() {log_q.tolist()} differs from log_prob(x, ids) {reported.tolist()}",
    )

    pos = sampler.log_prob(x, y.unsqueeze(1))
    _expect(
        pos.shape == (B, 1),
        label,
        f"log_prob(x, labels (B, 1)) has shape {tuple(pos.shape)}; expected {(B, 1)}",
    )
    _expect(_finite(pos), label, "log_prob of a training label is not finite")

    everything = sampler.log_prob(x, torch.arange(C))
    expected = (B, C) if conditional and everything.ndim == 2 else (C,)
    _expect(
        everything.shape == expected,
        label,
        f"log_prob(x, labels ({C},)) has shape {tuple(everything.shape)}; expected {expected}",
    )
    totals = everything.double().exp().sum(-1)
    _expect(
        torch.allclose(totals, torch.ones_like(totals), atol=1e-4),
        label,
        f"exp(log_prob) over all {C} labels sums to {totals.tolist()}, not 1",
    )
    if not conditional:
        alone = sampler.log_prob(None, torch.arange(C))
        _expect(
            _same(alone, everything),
            label,
            "an unconditional sampler's log_prob(None, labels) differs from log_prob(x, labels)",
        )

    again = _draw(sampler, x, y)
    _expect(
        _same(again[0], ids) and _same(again[1], log_q),
        label,
        "two draws with generators of the same seed differ",
    )

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "state.safetensors"
        try:
            tensorfile.save(path, sampler.state_dict())
        except TypeError as exc:
            _expect(False, label, f"state_dict() must hold only tensors and JSON values: {exc}")
        fresh = _build(factory, label, options)
        fresh.load_state_dict(tensorfile.load(path))
    restored = _draw(fresh, x, y)
    _expect(
        _same(restored[0], ids) and _same(restored[1], log_q),
        label,
        "a fresh instance loaded from state_dict() (through safetensors, as fit-sampler stores "
        "it) draws differently",
    )
    _expect(
        _same(fresh.log_prob(x, torch.arange(C)), everything),
        label,
        "a fresh instance loaded from state_dict() reports a different log_prob",
    )
    _expect(sampler.to(torch.device("cpu")) is sampler, label, "to(device) must return the sampler")
