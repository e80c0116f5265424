"""Declarative checks for params values, with scikit-learn-style one-line messages.

A component declares its options as keyword arguments with type annotations and defaults, plus
optional ``constraints = {"name": Interval(...) | Options(...)}``. :func:`validate_options`
checks a params mapping against that declaration before the component is built, so a typo or a
bad value is reported with the params key that holds it, the value, and what is allowed.
"""

from __future__ import annotations

import inspect
import json
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tailkit.errors import InvalidParameterError, did_you_mean


@dataclass(frozen=True)
class Interval:
    """A numeric range; ``None`` is an open end."""

    low: float | None = None
    high: float | None = None
    closed: str = "both"  # "both", "left", "right" or "neither"

    def __contains__(self, value: float) -> bool:
        if isinstance(value, float) and math.isnan(value):
            return False
        lo_ok = self.low is None or (
            value >= self.low if self.closed in ("both", "left") else value > self.low
        )
        hi_ok = self.high is None or (
            value <= self.high if self.closed in ("both", "right") else value < self.high
        )
        return lo_ok and hi_ok

    def __str__(self) -> str:
        left = "[" if self.closed in ("both", "left") and self.low is not None else "("
        right = "]" if self.closed in ("both", "right") and self.high is not None else ")"
        lo = "-inf" if self.low is None else _bound(self.low)
        hi = "inf" if self.high is None else _bound(self.high)
        return f"in the range {left}{lo}, {hi}{right}"


def _bound(value: float) -> str:
    """An integer bound in full (2**32 - 1 is 4294967295, not 4.29497e+09), else %g."""
    return str(value) if isinstance(value, int) else f"{value:g}"


#: Every seed setting: the widest range that numpy's legacy RandomState (which scikit-learn's
#: random_state uses), numpy's Generator and torch all accept, so no seed fails deep in a stage.
SEED = Interval(0, 2**32 - 1)


@dataclass(frozen=True)
class Options:
    """A closed set of allowed values."""

    values: tuple[Any, ...]

    def __init__(self, *values: Any) -> None:
        object.__setattr__(self, "values", values)

    def __contains__(self, value: Any) -> bool:
        return value in self.values

    def __str__(self) -> str:
        return "one of " + ", ".join(repr(v) for v in self.values)


Constraint = Interval | Options


def _type_name(tp: Any) -> str:
    if tp is float:
        return "a number"
    if tp is int:
        return "an integer"
    if tp is bool:
        return "true or false"
    if tp is str:
        return "a string"
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, annotation: Any) -> tuple[bool, Any]:
    """Return (ok, value) after the few lossless coercions YAML users expect (1 -> 1.0)."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        for arm in typing.get_args(annotation):
            ok, out = _coerce(value, arm)
            if ok:
                return True, out
        return False, value
    if origin is typing.Literal:
        return value in typing.get_args(annotation), value
    if annotation is type(None):
        return value is None, value
    if annotation is bool:
        return isinstance(value, bool), value
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool), value
    if annotation is float:
        if isinstance(value, bool):
            return False, value
        if isinstance(value, int | float):
            return True, float(value)
        return False, value
    if annotation is str:
        return isinstance(value, str), value
    if origin in (list, tuple):
        return isinstance(value, list | tuple), list(value) if isinstance(
            value, list | tuple
        ) else value
    if origin is dict or annotation is dict:
        return isinstance(value, Mapping), value
    return True, value  # Any or an annotation we do not police


def _describe(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(v) for v in typing.get_args(annotation))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(
            "null" if a is type(None) else _describe(a) for a in typing.get_args(annotation)
        )
    return _type_name(annotation)


def check_value(key: str, value: Any, annotation: Any, constraint: Constraint | None) -> Any:
    """Check one value; return it coerced. ``key`` is the full params path used in the message."""
    ok, value = _coerce(value, annotation)
    if not ok:
        raise InvalidParameterError(
            f"{key}: got {value!r} ({type(value).__name__}); expected {_describe(annotation)}"
        )
    # an Interval bounds the numeric arm of a union such as ``int | Literal["auto"]``
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    if numeric and not math.isfinite(value):  # YAML's .inf and .nan: no setting means them
        raise InvalidParameterError(f"{key}: got {value!r}; expected a finite number")
    if (
        constraint is not None
        and value is not None
        and (numeric or not isinstance(constraint, Interval))
        and value not in constraint
    ):
        raise InvalidParameterError(
            f"{key}: got {value!r}; expected a value {constraint}"
            if isinstance(constraint, Interval)
            else f"{key}: got {value!r}; expected {constraint}"
        )
    return value


def option_signature(factory: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    """The options a component factory accepts: its parameters that are not positional-only."""
    target = factory.__init__ if inspect.isclass(factory) else factory
    hints = typing.get_type_hints(target)
    params = {}
    for name, p in inspect.signature(target).parameters.items():
        # Positional-only parameters are runtime inputs the core passes (e.g. a model's input
        # dimension), not options a user sets in params.yaml.
        if name == "self" or p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        params[name] = p.replace(annotation=hints.get(name, Any))
    return params


def describe_options(factory: Callable[..., Any]) -> list[dict[str, str]]:
    """Per option of ``factory``, in signature order: its ``name``, the ``type`` a value must
    have (as the errors word it), its ``default`` as YAML would write it ("required" when it
    has none) and the ``allowed`` range or set from ``constraints`` ("" when none)."""
    constraints: Mapping[str, Constraint] = getattr(factory, "constraints", {})
    rows = []
    for name, p in option_signature(factory).items():
        if p.default is inspect.Parameter.empty:
            default = "required"
        elif isinstance(p.default, str):
            default = p.default  # as YAML writes a plain string
        else:
            try:  # null, true/false, numbers and lists as YAML writes them
                default = json.dumps(p.default, allow_nan=False)
            except (TypeError, ValueError):  # a default YAML cannot spell (an object, a NaN)
                default = repr(p.default)
        constraint = constraints.get(name)
        rows.append(
            {
                "name": name,
                "type": "any" if p.annotation is Any else _describe(p.annotation),
                "default": default,
                "allowed": "" if constraint is None else str(constraint),
            }
        )
    return rows


def validate_options(
    owner: str, factory: Callable[..., Any], options: Mapping[str, Any]
) -> dict[str, Any]:
    """Validate ``options`` against ``factory``'s keyword signature and ``constraints``.

    ``owner`` is the params path of the mapping (e.g. ``experiments.ss.loss``); messages name
    ``owner.key``. Unknown keys are rejected with the list of accepted ones.
    """
    if not isinstance(options, Mapping):
        raise InvalidParameterError(f"{owner}: got {options!r}; expected a mapping of options")
    signature = option_signature(factory)
    constraints: Mapping[str, Constraint] = getattr(factory, "constraints", {})
    unknown = sorted(set(options) - set(signature))
    if unknown:
        allowed = ", ".join(sorted(signature)) or "(none)"
        raise InvalidParameterError(
            f"{owner}: unknown key {unknown[0]!r}{did_you_mean(unknown[0], signature)}; "
            f"allowed keys are {allowed}"
        )
    out = {}
    for name, value in options.items():
        out[name] = check_value(
            f"{owner}.{name}", value, signature[name].annotation, constraints.get(name)
        )
    missing = [
        n for n, p in signature.items() if p.default is inspect.Parameter.empty and n not in out
    ]
    if missing:
        raise InvalidParameterError(f"{owner}: missing required key {missing[0]!r}")
    return out
