"""``check_options``: a factory declares its options so that
:func:`~tailkit.validation.validate_options` can police them."""

from __future__ import annotations

import inspect
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from tailkit.errors import InvalidParameterError
from tailkit.registry import Component
from tailkit.testing.contracts.common import ContractError, _expect, _resolve
from tailkit.validation import Interval, Options, check_value, option_signature, validate_options

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
