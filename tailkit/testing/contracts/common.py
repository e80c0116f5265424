"""What every contract check shares: :class:`ContractError`, building a component from
validated options, the tiny problem sizes, the registry helpers and ``check_description``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

from tailkit.errors import InvalidParameterError
from tailkit.registry import KINDS, SINGULAR, Component, Registry, make_registry
from tailkit.validation import validate_options

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
