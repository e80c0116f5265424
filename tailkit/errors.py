"""User-facing errors: each renders as one line naming the file, param or plugin at fault.

The CLI catches :class:`TailkitError` and prints ``Error: <message>`` with exit code 2, no
traceback. Anything else escaping a stage is a bug in tailkit and keeps its traceback.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class TailkitError(Exception):
    """Base class of the errors a user can fix by changing input, params or installed plugins."""

    exit_code = 2


class InvalidParameterError(TailkitError, ValueError, TypeError):
    """A params value of the wrong type, out of range, or an unknown key."""


class UnknownComponentError(TailkitError, KeyError):
    """A name in params that no installed plugin registered."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class PluginError(TailkitError):
    """A plugin failed to load, or two plugins registered the same name."""


class ComponentFault(PluginError):
    """A component misbehaved while it ran: a sampler's ids out of range, a model's forward
    raising. Raised where the fault is seen (the training loop), which does not know the
    component's plugin; the stage names it (:meth:`named`)."""

    def __init__(self, kind: str, what: str) -> None:
        super().__init__(what)
        self.kind, self.what = kind, what

    def named(self, component: str, experiment: str) -> PluginError:
        """The one line a user sees: the experiment, the component with its distribution."""
        return PluginError(f"experiments.{experiment}: {self.kind} {component}: {self.what}")


class DataValidationError(TailkitError, ValueError):
    """Input data that is malformed, or that a stage cannot use (e.g. a class vanished)."""


class MismatchedArtifactError(TailkitError, ValueError):
    """A saved model or state was made for another experiment or other settings."""


class TrainingDivergedError(TailkitError, FloatingPointError):
    """The training loss became NaN or infinite."""


def did_you_mean(word: object, choices: Iterable[str]) -> str:
    """``" (did you mean 'x'?)"`` for the closest of ``choices`` to a misspelt ``word`` (difflib's
    ratio ≥ 0.6), else ``""``: appended to an unknown-name error."""
    if not isinstance(word, str):
        return ""
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""
