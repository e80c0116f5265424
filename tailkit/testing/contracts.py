"""Contract checks a plugin author can run on their own components, on tiny CPU inputs.

Each ``check_*`` builds the component from ``factory(**options)`` (options validated first, as
``params.yaml`` values are) and raises :class:`ContractError` (an ``AssertionError``) naming the
component and the broken promise. In a plugin's own test suite::

    from tailkit.testing import check_loss, check_options, check_sampler
    from my_plugin import FocalLoss, TreeSampler

    def test_focal_loss_contract():
        check_options(FocalLoss)
        check_loss(FocalLoss, gamma=2.0)
        check_sampler(TreeSampler, shared=False)

Every check also accepts a registered :class:`tailkit.registry.Component` in place of the
factory (messages then use its registered name); :func:`parametrize_components` turns a
registry's components of one kind into pytest parameters.
"""

from __future__ import annotations

import inspect
import math
import os
import tempfile
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from tailkit import tensorfile
from tailkit.components import (
    MODALITIES,
    Batch,
    Dataset,
    Encoder,
    Featurizer,
    FullBatch,
    Loss,
    PredictionContext,
    RawData,
    SampledBatch,
    Sampler,
    batch_modes,
    featurizer_accepts,
    featurizer_output,
    is_learner,
    model_input_kind,
)
from tailkit.errors import InvalidParameterError, TailkitError
from tailkit.registry import KINDS, SINGULAR, Component, Registry, make_registry
from tailkit.sparse import SparseRows
from tailkit.validation import Interval, Options, check_value, option_signature, validate_options

__all__ = [
    "ContractError",
    "check_dataset",
    "check_description",
    "check_featurizer",
    "check_loss",
    "check_model",
    "check_options",
    "check_sampler",
    "components",
    "parametrize_components",
]

# Tiny problem sizes: labels, batch rows, negatives per draw, embedding and input dimensions.
C, B, M, EMBED_DIM, IN_DIM = 13, 6, 5, 4, 7
IMAGE_SHAPE = (8, 8, 3)  # (H, W, 3) pixels for models with input_kind = "image"
SEED = 1234


class ContractError(AssertionError):
    """A component breaks the plugin contract; the message names the component and the rule."""


def _expect(condition: object, label: str, message: str) -> None:
    if not condition:
        raise ContractError(f"{label}: {message}")


def _resolve(factory: Callable[..., Any] | Component, kind: str) -> tuple[Callable[..., Any], str]:
    """The callable to build with and the label used in every message."""
    if isinstance(factory, Component):
        return factory.factory, f"{SINGULAR[factory.kind]} {factory.name!r}"
    name = getattr(factory, "__qualname__", None) or repr(factory)
    return factory, f"{kind} {name}"


def _build(
    factory: Callable[..., Any], label: str, options: Mapping[str, Any], *runtime: Any
) -> Any:
    try:
        valid = validate_options(label, factory, options)
    except InvalidParameterError as exc:
        raise ContractError(f"{label}: options {dict(options)!r} do not validate: {exc}") from exc
    return factory(*runtime, **valid)


def _finite(t: torch.Tensor) -> bool:
    return bool(torch.isfinite(t).all())


def _kind_name(kind: str) -> str:
    if kind in KINDS:
        return kind
    plural = {v: k for k, v in SINGULAR.items()}
    if kind in plural:
        return plural[kind]
    raise ValueError(f"unknown component kind {kind!r}; expected one of {', '.join(KINDS)}")


# --- registry helpers -------------------------------------------------------------------------


def components(kind: str, registry: Registry | None = None) -> list[Component]:
    """Every component of ``kind`` (``"losses"`` or ``"loss"``, ...) in ``registry``.

    The default registry is a fresh :func:`tailkit.registry.make_registry`: built-ins plus every
    installed plugin.
    """
    registry = make_registry() if registry is None else registry
    return registry.components(_kind_name(kind))


def parametrize_components(
    kind: str,
    registry: Registry | None = None,
    *,
    marks: Mapping[str, Any] | None = None,
) -> list[Any]:
    """``pytest.param(component, id=name)`` for every component of ``kind`` in ``registry``.

    ``marks`` maps a component name to a pytest mark (or a list of marks), e.g. an
    ``xfail`` for a known failure. Use as ``@pytest.mark.parametrize("component",
    parametrize_components("losses"))``.
    """
    import pytest  # only the pytest helper needs pytest

    marks = marks or {}
    return [
        pytest.param(c, id=c.name, marks=marks.get(c.name, ())) for c in components(kind, registry)
    ]


def check_description(component: Component) -> None:
    """A registered component has a non-empty one-line description (``tailkit plugins``)."""
    label = f"{SINGULAR.get(component.kind, component.kind)} {component.name!r}"
    _expect(
        isinstance(component.description, str) and component.description.strip(),
        label,
        "has no description: give the factory a docstring or pass description= to register",
    )


# --- options ----------------------------------------------------------------------------------

_INVALID = "__tailkit_invalid__"
# Values of every kind validation distinguishes; a subset is wrong for any policed annotation.
_CANDIDATES: tuple[Any, ...] = (_INVALID, 1.5, 7, True, None, [1], {"a": 1})


def _accepts(annotation: Any, value: Any) -> bool | None:
    """Whether ``annotation`` admits ``value``; None when validation does not police it."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        verdicts = [_accepts(arm, value) for arm in typing.get_args(annotation)]
        return None if None in verdicts else any(verdicts)
    if origin is typing.Literal:
        return value in typing.get_args(annotation)
    if annotation is type(None):
        return value is None
    if annotation is bool:
        return isinstance(value, bool)
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if annotation is str:
        return isinstance(value, str)
    if origin in (list, tuple) or annotation in (list, tuple):
        return isinstance(value, list | tuple)
    if origin is dict or annotation is dict:
        return isinstance(value, Mapping)
    return None


def _outside_interval(annotation: Any, interval: Interval) -> list[Any]:
    """Values of the annotation's numeric type just outside ``interval`` (and NaN for floats)."""
    takes_float = bool(_accepts(annotation, 1.5))
    takes_int = bool(_accepts(annotation, 7))
    if not (takes_float or takes_int):
        return []
    low_closed = interval.closed in ("both", "left")
    high_closed = interval.closed in ("both", "right")
    out: list[Any] = []
    if interval.low is not None:
        if takes_float:
            out.append(math.nextafter(interval.low, -math.inf) if low_closed else interval.low)
        else:
            lo = interval.low
            out.append(
                math.ceil(lo) - 1 if low_closed and float(lo).is_integer() else math.floor(lo)
            )
    if interval.high is not None:
        if takes_float:
            out.append(math.nextafter(interval.high, math.inf) if high_closed else interval.high)
        else:
            hi = interval.high
            out.append(
                math.floor(hi) + 1 if high_closed and float(hi).is_integer() else math.ceil(hi)
            )
    if takes_float:
        out.append(math.nan)
    return out


def _outside_options(annotation: Any, allowed: Options) -> list[Any]:
    out: list[Any] = []
    if _accepts(annotation, _INVALID) and _INVALID not in allowed:
        out.append(_INVALID)
    numbers = [v for v in allowed.values if isinstance(v, int | float) and not isinstance(v, bool)]
    if numbers and _accepts(annotation, max(numbers) + 1):
        out.append(max(numbers) + 1)
    return out


def check_options(factory: Callable[..., Any] | Component) -> None:
    """The factory's options are declared so that :func:`validate_options` can police them.

    Every option has a type annotation; every default passes its own annotation and
    constraint; every ``constraints`` key names an option and holds an ``Interval`` or
    ``Options``; and generated bad values (a wrong type; for an ``Interval`` a value just
    outside it and NaN; for ``Options`` a value not listed) raise ``InvalidParameterError``
    naming the option.
    """
    factory, label = _resolve(factory, "component")
    target = factory.__init__ if inspect.isclass(factory) else factory
    raw = inspect.signature(target).parameters
    signature = option_signature(factory)
    constraints = getattr(factory, "constraints", {}) or {}
    _expect(isinstance(constraints, Mapping), label, "constraints must be a mapping")
    for name, constraint in constraints.items():
        _expect(
            name in signature,
            label,
            f"constraints name {name!r}, which is not an option (options: "
            f"{', '.join(sorted(signature)) or 'none'})",
        )
        _expect(
            isinstance(constraint, Interval | Options),
            label,
            f"constraint of {name!r} is {constraint!r}; expected an Interval or Options",
        )
    for name, param in signature.items():
        key = f"{label}.{name}"
        _expect(
            raw[name].annotation is not inspect.Parameter.empty,
            label,
            f"option {name!r} has no type annotation, so its values are not checked",
        )
        annotation, constraint = param.annotation, constraints.get(name)
        if param.default is not inspect.Parameter.empty:
            try:
                check_value(key, param.default, annotation, constraint)
            except InvalidParameterError as exc:
                raise ContractError(f"{label}: the default of {name!r} is invalid: {exc}") from exc
        bad = [v for v in _CANDIDATES if _accepts(annotation, v) is False]
        if isinstance(constraint, Interval):
            bad += _outside_interval(annotation, constraint)
        elif isinstance(constraint, Options):
            bad += _outside_options(annotation, constraint)
        for value in bad:
            try:
                validate_options(label, factory, {name: value})
            except InvalidParameterError as exc:
                _expect(
                    name in str(exc),
                    label,
                    f"{name}={value!r} was rejected, but the message does not name the option: "
                    f"{exc}",
                )
            else:
                raise ContractError(
                    f"{label}: {name}={value!r} passed validation; expected InvalidParameterError "
                    f"(annotation {annotation!r}, constraint {constraint})"
                )


# --- losses -----------------------------------------------------------------------------------


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
    :func:`class_counts`, as the core calls it before training.

    It is run on each batch type its ``forward`` takes (:func:`tailkit.components.batch_modes`);
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
    # As the core does: setup with the training counts once, before any forward.
    loss.setup(class_counts())
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


# --- samplers ---------------------------------------------------------------------------------


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


# --- featurizers ------------------------------------------------------------------------------


def _featurizer_inputs(modality: str, workdir: Path) -> list[tuple[str, Any]]:
    """(what, inputs): 40 rows of ``modality``, as a dataset's ``load`` returns them."""
    rng = np.random.default_rng(SEED)
    if modality == "dense":
        return [("dense (40, 3) float32", rng.standard_normal((40, 3)).astype(np.float32))]
    if modality == "sparse":
        counts = rng.poisson(0.3, size=(40, 50)).astype(np.float32)
        counts[np.arange(40), rng.integers(50, size=40)] += 1  # no empty row
        return [("sparse (40, 50) CSR counts", sp.csr_matrix(counts))]
    from PIL import Image  # only image featurizers need Pillow

    pixels = rng.integers(0, 256, size=(40, 8, 8, 3), dtype=np.uint8)
    paths = np.empty(40, dtype=object)
    for i in range(40):  # files of varied sizes, so a resizing featurizer has work to do
        h, w = 6 + i % 5, 7 + i % 4
        path = workdir / f"image-{i:02d}.png"
        Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)).save(path)
        paths[i] = str(path)
    return [("uint8 (40, 8, 8, 3) images", pixels), ("(40,) image file paths", paths)]


def _equal(a: Any, b: Any) -> bool:
    if sp.issparse(a) or sp.issparse(b):
        if not (sp.issparse(a) and sp.issparse(b)) or a.shape != b.shape:
            return False
        a, b = a.toarray(), b.toarray()
    return a.shape == b.shape and bool(np.array_equal(a, b))


def _close(a: Any, b: Any) -> bool:
    if sp.issparse(a) or sp.issparse(b):
        if not (sp.issparse(a) and sp.issparse(b)):
            return False
        a, b = a.toarray(), b.toarray()
    if a.shape != b.shape:
        return False
    if a.dtype == np.uint8:
        return bool(np.array_equal(a, b))
    return bool(np.allclose(a, b, rtol=1e-5, atol=1e-6))


def _check_features(where: str, out: Any, output: str, inputs: Any) -> None:
    """``out`` is what ``output`` promises, for the rows of ``inputs``."""
    n = inputs.shape[0]
    if output == "image":
        _expect(isinstance(out, np.ndarray), where, f"transform returned a {type(out).__name__}")
        _expect(
            out.dtype == np.uint8,
            where,
            f"transform returned dtype {out.dtype}, not uint8 (image output keeps the pixels' "
            "dtype)",
        )
        _expect(
            out.ndim == 4 and out.shape[0] == n and out.shape[3] == 3 and min(out.shape) >= 1,
            where,
            f"transform of shape {inputs.shape} returned shape {out.shape}; expected "
            f"({n}, H, W, 3)",
        )
        return
    if output == "sparse":
        _expect(
            sp.issparse(out) and out.format == "csr",
            where,
            f"transform returned a {type(out).__name__}, not a CSR matrix",
        )
        data = out.data
    else:
        _expect(isinstance(out, np.ndarray), where, f"transform returned a {type(out).__name__}")
        data = out
    _expect(out.dtype == np.float32, where, f"transform returned dtype {out.dtype}, not float32")
    _expect(
        out.ndim == 2 and out.shape[0] == n and out.shape[1] >= 1,
        where,
        f"transform of shape {inputs.shape} returned shape {out.shape}; expected ({n}, D')",
    )
    _expect(np.isfinite(data).all(), where, "transform returned non-finite features")


def check_featurizer(factory: Callable[..., Any] | Component, /, **options: Any) -> None:
    """A featurizer declares what it takes and gives: ``accepts``, a tuple of modalities
    (``"dense"``, ``"sparse"``, ``"image"``; ``("dense",)`` when absent), and ``output``
    (``"dense"``, ``"sparse"`` or ``"image"``; ``"dense"`` when absent).

    For every accepted modality (dense: (40, 3) float32; sparse: (40, 50) float32 CSR counts;
    image: (40, 8, 8, 3) uint8 and an (40,) object array of PNG paths) a fresh instance fits on
    the first 30 rows and transforms all 40 to the declared output (dense: finite float32
    (N, D'); sparse: a finite float32 CSR matrix (N, D'); image: uint8 (N, H, W, 3)), row by
    row, the same way for two fresh instances, without touching its input.
    """
    factory, label = _resolve(factory, "featurizer")
    probe = _build(factory, label, options)
    _expect(isinstance(probe, Featurizer), label, "built an object without fit and transform")
    accepts = featurizer_accepts(probe)
    output = featurizer_output(probe)
    _expect(
        isinstance(accepts, tuple) and accepts and set(accepts) <= set(MODALITIES),
        label,
        f"accepts is {accepts!r}; expected a non-empty tuple of {', '.join(map(repr, MODALITIES))}",
    )
    _expect(
        output in MODALITIES,
        label,
        f"output is {output!r}; expected one of {', '.join(map(repr, MODALITIES))}",
    )
    with tempfile.TemporaryDirectory(prefix="tailkit-featurizer-") as workdir:
        for modality in accepts:
            for what, inputs in _featurizer_inputs(modality, Path(workdir)):
                where = f"{label} on {what}"
                original = inputs.copy()
                featurizer = _build(factory, label, options)
                try:
                    featurizer.fit(inputs[:30])
                    out = featurizer.transform(inputs)
                except Exception as exc:  # the point is which input kind it fails on
                    raise ContractError(
                        f"{where}: fit/transform raised {type(exc).__name__}: {exc}; yet it "
                        f"declares accepts = {accepts!r}"
                    ) from exc
                _check_features(where, out, output, inputs)
                _expect(_equal(inputs, original), where, "fit or transform modified its input")
                part = featurizer.transform(inputs[:5])
                _expect(
                    _close(part, out[:5]),
                    where,
                    "transform of the first 5 rows differs from the first 5 rows of the full "
                    "transform",
                )
                twin = _build(factory, label, options)
                twin.fit(inputs[:30])
                _expect(
                    _equal(twin.transform(inputs), out),
                    where,
                    "two fresh instances with the same options give different features",
                )


# --- models -----------------------------------------------------------------------------------


def check_model(factory: Callable[..., Any] | Component, /, **options: Any) -> None:
    """``factory(in_dim, **options)`` is an Encoder mapping (B, in_dim) to finite (B, out_dim),
    differentiable, whose state_dict restores the same function in a fresh instance; or a model
    that trains itself (:func:`_check_learner`).

    A model whose class declares ``input_kind = "image"`` is built with ``in_dim`` = (H, W, 3)
    and fed uint8 pixels (B, H, W, 3) instead of float rows; one with ``input_kind =
    "sparse"`` is fed :class:`~tailkit.sparse.SparseRows` (with an empty row among them), and
    its output must equal the same model on the rows one at a time (a batch must not mix rows).
    """
    factory, label = _resolve(factory, "model")
    if is_learner(factory):
        return _check_learner(factory, label, options)
    kind = model_input_kind(factory)
    image = kind == "image"
    in_dim = IMAGE_SHAPE if image else IN_DIM
    model = _build(factory, label, options, in_dim)
    _expect(isinstance(model, Encoder), label, f"built a {type(model).__name__}, not an Encoder")
    out_dim = getattr(model, "out_dim", None)
    _expect(
        isinstance(out_dim, int) and not isinstance(out_dim, bool) and out_dim >= 1,
        label,
        f"out_dim is {out_dim!r}; expected a positive int",
    )
    gen = torch.Generator().manual_seed(SEED)
    x: torch.Tensor | SparseRows
    if image:
        x = torch.randint(0, 256, (B, *IMAGE_SHAPE), generator=gen, dtype=torch.uint8)
    elif kind == "sparse":
        x = _sparse_rows(gen)
    else:
        x = torch.randn(B, IN_DIM, generator=gen, requires_grad=True)
    z = model(x)
    _expect(
        isinstance(z, torch.Tensor) and z.shape == (B, out_dim),
        label,
        f"forward of {tuple(x.shape)} gave shape {tuple(getattr(z, 'shape', ()))}; expected "
        f"({B}, {out_dim})",
    )
    _expect(z.is_floating_point() and _finite(z), label, "forward gave non-finite embeddings")
    _expect(z.requires_grad, label, "the embeddings are not differentiable")
    z.sum().backward()
    for name, grad in [("input", getattr(x, "grad", None))] + [
        (n, p.grad) for n, p in model.named_parameters() if p.requires_grad
    ]:
        if grad is not None and grad.is_sparse:
            grad = grad.coalesce().values()
        _expect(grad is None or _finite(grad), label, f"the gradient on {name} is not finite")
    if kind == "sparse":
        model.eval()
        with torch.no_grad():
            one_by_one = torch.cat([model(x[i : i + 1]) for i in range(B)])
            _expect(
                torch.allclose(model(x), one_by_one, rtol=1e-5, atol=1e-6),
                label,
                "a batch of sparse rows gives other embeddings than its rows one at a time",
            )
        model.train()
    fresh = _build(factory, label, options, in_dim)
    fresh.load_state_dict(model.state_dict())
    model.eval()
    fresh.eval()
    with torch.no_grad():
        _expect(
            torch.equal(fresh(x), model(x)),
            label,
            "a fresh instance loaded from state_dict() computes different embeddings",
        )


def _check_learner(factory: Callable[..., Any], label: str, options: dict[str, Any]) -> None:
    """A model that trains itself (:class:`~tailkit.components.Learner`): on rows whose class
    owns two feature columns, ``fit`` leaves its files (no pickle) in the directory it is given
    and learns the classes; ``predict_topk`` gives (N, k) int64 ids in [−1, C) without repeats
    and float32 scores in descending order; a fresh instance ``load``-ed from the directory
    predicts the same."""
    classes, per_class, k = 6, 12, 3
    rows = classes * per_class
    y = torch.arange(rows) % classes
    gen = torch.Generator().manual_seed(SEED)
    noise = torch.randint(0, 2 * classes, (rows,), generator=gen)
    ids = torch.stack([2 * y, 2 * y + 1, 2 * classes + noise], dim=1).sort(dim=1).values
    x: SparseRows | torch.Tensor = SparseRows(
        torch.arange(0, 3 * rows + 1, 3), ids.reshape(-1), torch.ones(3 * rows), 4 * classes
    )
    if model_input_kind(factory) != "sparse":
        x = x.to_dense()
    with tempfile.TemporaryDirectory(prefix="tailkit-contract-") as tmp:
        directory = Path(tmp) / "model"
        model = _build(factory, label, options, 4 * classes)
        model.fit(x, y, classes, directory, SEED)
        files = [f for f in directory.rglob("*") if f.is_file()] if directory.is_dir() else []
        _expect(bool(files), label, f"fit left no files in the directory it was given ({tmp})")
        pickled = [f.name for f in files if f.read_bytes()[:1] == b"\x80"]
        _expect(not pickled, label, f"fit wrote pickled files: {', '.join(pickled)}")
        top, scores = model.predict_topk(x, k)
        _expect(
            isinstance(top, np.ndarray) and top.dtype == np.int64 and top.shape == (rows, k),
            label,
            f"predict_topk gave ids {getattr(top, 'dtype', type(top))} "
            f"{getattr(top, 'shape', '')}; expected int64 ({rows}, {k})",
        )
        _expect(
            isinstance(scores, np.ndarray)
            and scores.dtype == np.float32
            and scores.shape == (rows, k),
            label,
            f"predict_topk gave scores {getattr(scores, 'dtype', type(scores))} "
            f"{getattr(scores, 'shape', '')}; expected float32 ({rows}, {k})",
        )
        _expect(bool(((top >= -1) & (top < classes)).all()), label, "predict_topk ids out of range")
        valid = top >= 0
        repeats = any(
            len(set(r[v].tolist())) < int(v.sum()) for r, v in zip(top, valid, strict=True)
        )
        _expect(not repeats, label, "predict_topk repeats a label within a row")
        ordered = np.where(valid[:, 1:], scores[:, :-1] >= scores[:, 1:], True).all()
        _expect(bool(ordered), label, "predict_topk scores are not in descending order")
        accuracy = float((top[:, 0] == y.numpy()).mean())
        _expect(
            accuracy >= 0.9,
            label,
            f"training accuracy {accuracy:.2f} on rows whose class owns two columns",
        )
        fresh = _build(factory, label, options, 4 * classes)
        fresh.load(directory)
        again, _ = fresh.predict_topk(x, k)
        _expect(
            np.array_equal(again, top), label, "a fresh instance load()-ed predicts differently"
        )


def _sparse_rows(gen: torch.Generator) -> SparseRows:
    """B rows over IN_DIM columns, 1–4 sorted ids each, row 1 empty."""
    lengths = torch.randint(1, 5, (B,), generator=gen)
    lengths[1] = 0
    indices = torch.cat(
        [torch.randperm(IN_DIM, generator=gen)[: int(n)].sort().values for n in lengths]
    )
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    return SparseRows(indptr, indices, torch.rand(len(indices), generator=gen) + 0.1, IN_DIM)


# --- datasets ---------------------------------------------------------------------------------


def check_dataset(
    factory: Callable[..., Any] | Component, tmp_path: Path | None, /, **options: Any
) -> None:
    """The options validate and build a Dataset; ``load`` of an empty directory raises a
    :class:`TailkitError`; and, unless ``tmp_path`` is None (for data too large for a unit
    test), ``fetch`` writes only under its ``dest`` and ``load`` returns consistent RawData:

    * inputs as ``modality`` says: dense (N, D) float32, finite; sparse (N, D) float32 CSR with
      sorted, unique indices, finite; image (N, H, W, 3) uint8 or an (N,) object array of paths
      to existing files;
    * labels: (N,) int64 in [0, C), or an (N, C) CSR 0/1 indicator with sorted indices;
    * ``splits``, when given: names among train/val/test including train, each a sorted,
      unique, in-range int64 array of row ids, no row in two splits.
    """
    factory, label = _resolve(factory, "dataset")
    dataset = _build(factory, label, options)
    _expect(isinstance(dataset, Dataset), label, "built an object without fetch and load")
    _expect(
        callable(dataset.fetch) and callable(dataset.load), label, "fetch/load are not callable"
    )
    if tmp_path is None:
        return
    tmp_path = Path(tmp_path)
    empty = tmp_path / "never-fetched"
    empty.mkdir(parents=True)
    try:
        dataset.load(empty)
    except TailkitError:
        pass
    except Exception as exc:  # the point is which exception escapes
        raise ContractError(
            f"{label}: load of an empty directory raised {type(exc).__name__}: {exc}; expected "
            "a TailkitError (e.g. DataValidationError) telling the user to fetch first"
        ) from exc
    else:
        raise ContractError(f"{label}: load of an empty directory returned instead of raising")

    dest = tmp_path / "raw"
    dest.mkdir()
    before = set(tmp_path.iterdir())
    dataset.fetch(dest)
    _expect(set(tmp_path.iterdir()) == before, label, "fetch wrote files outside dest")
    _expect(any(dest.iterdir()), label, "fetch left dest empty")
    raw = dataset.load(dest)
    _expect(isinstance(raw, RawData), label, f"load returned a {type(raw).__name__}, not RawData")
    n = _check_raw_inputs(label, raw)
    _expect(
        isinstance(raw.label_names, list) and all(isinstance(n, str) for n in raw.label_names),
        label,
        "label_names must be a list of strings",
    )
    _check_raw_labels(label, raw, n)
    _check_raw_splits(label, raw.splits, n)


def _kind_of(value: Any) -> str:
    kind = getattr(value, "dtype", type(value).__name__)
    return f"{kind} of shape {getattr(value, 'shape', None)}"


def _check_raw_inputs(label: str, raw: RawData) -> int:
    """The inputs match ``raw.modality`` (see :class:`RawData`); returns the number of rows."""
    inputs, modality = raw.inputs, raw.modality
    _expect(
        modality in MODALITIES,
        label,
        f"modality {modality!r} is not one of {', '.join(map(repr, MODALITIES))}",
    )
    if modality == "dense":
        _expect(
            isinstance(inputs, np.ndarray) and inputs.dtype == np.float32 and inputs.ndim == 2,
            label,
            f"inputs must be a 2-D float32 array; got {_kind_of(inputs)}",
        )
        _expect(np.isfinite(inputs).all(), label, "inputs hold non-finite values")
    elif modality == "sparse":
        _expect(
            sp.issparse(inputs)
            and inputs.format == "csr"
            and inputs.dtype == np.float32
            and inputs.ndim == 2,
            label,
            f"sparse inputs must be a float32 CSR matrix; got {type(inputs).__name__} "
            f"{_kind_of(inputs)}",
        )
        _expect(
            inputs.has_canonical_format,
            label,
            "sparse inputs must have sorted, unique column indices in every row",
        )
        _expect(np.isfinite(inputs.data).all(), label, "inputs hold non-finite values")
    elif isinstance(inputs, np.ndarray) and inputs.dtype == object:
        _expect(
            inputs.ndim == 1 and all(isinstance(p, str | os.PathLike) and p for p in inputs),
            label,
            f"image paths must be an (N,) object array of file paths; got shape {inputs.shape}",
        )
        missing = [p for p in inputs if not os.path.isfile(p)]
        _expect(
            not missing,
            label,
            f"{len(missing)} of {inputs.size} image paths are not files, e.g. {missing[:1]}",
        )
    else:
        _expect(
            isinstance(inputs, np.ndarray)
            and inputs.dtype == np.uint8
            and inputs.ndim == 4
            and inputs.shape[-1] == 3,
            label,
            "image inputs must be a (N, H, W, 3) uint8 array or an (N,) object array of paths; "
            f"got {_kind_of(inputs)}",
        )
    n = int(inputs.shape[0])
    _expect(n > 0, label, "load returned no rows")
    return n


def _check_raw_labels(label: str, raw: RawData, n: int) -> None:
    """One int64 label per row in [0, C), or an (N, C) CSR 0/1 indicator (multi-label)."""
    labels = raw.labels
    if sp.issparse(labels):
        _expect(
            labels.format == "csr" and labels.shape == (n, raw.num_classes),
            label,
            f"a multi-label indicator must be an (N, C) = ({n}, {raw.num_classes}) CSR matrix; "
            f"got {labels.format} of shape {labels.shape}",
        )
        _expect(
            labels.has_canonical_format,
            label,
            "the label indicator must have sorted, unique label ids in every row",
        )
        _expect(
            bool(np.all(labels.data == 1)),
            label,
            "the label indicator holds values other than 1",
        )
        return
    _expect(
        isinstance(labels, np.ndarray) and labels.dtype == np.int64 and labels.ndim == 1,
        label,
        f"labels must be a 1-D int64 array or a CSR indicator; got "
        f"{getattr(labels, 'dtype', type(labels).__name__)}",
    )
    _expect(labels.shape[0] == n, label, f"{labels.shape[0]} labels for {n} input rows")
    _expect(
        labels.min() >= 0 and labels.max() < raw.num_classes,
        label,
        f"label ids span [{labels.min()}, {labels.max()}], outside [0, {raw.num_classes})",
    )


def _check_raw_splits(label: str, splits: Any, n: int) -> None:
    """When a dataset fixes its own splits: known names, a train split, and sorted, unique,
    in-range row ids that no two splits share."""
    if splits is None:
        return
    _expect(
        isinstance(splits, Mapping) and "train" in splits,
        label,
        f"splits must map 'train' (and optionally 'val', 'test') to row ids; got "
        f"{sorted(splits) if isinstance(splits, Mapping) else type(splits).__name__}",
    )
    taken = np.zeros(n, dtype=bool)
    for name, rows in splits.items():
        _expect(
            name in ("train", "val", "test"),
            label,
            f"split {name!r} is not one of 'train', 'val', 'test'",
        )
        _expect(
            isinstance(rows, np.ndarray) and rows.dtype == np.int64 and rows.ndim == 1,
            label,
            f"split {name!r} must be a 1-D int64 array of row ids; got {_kind_of(rows)}",
        )
        _expect(rows.size > 0, label, f"split {name!r} is empty")
        _expect(
            bool(np.all(np.diff(rows) > 0)),
            label,
            f"split {name!r} row ids are not sorted and unique",
        )
        _expect(
            rows[0] >= 0 and rows[-1] < n,
            label,
            f"split {name!r} row ids span [{rows[0]}, {rows[-1]}], outside [0, {n})",
        )
        _expect(not taken[rows].any(), label, f"split {name!r} shares rows with another split")
        taken[rows] = True
