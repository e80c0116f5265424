"""Learning-rate schedules: a factor of the base lr as a pure function of the step.

The recipes of the long-tail papers (algorithms.md §§4–6) are a linear warmup followed by either
step decays or a cosine decay:

* ``step`` (LDAM-DRW): ×``gamma`` at each of the ``milestones`` (in epochs), e.g. gamma 0.01 at
  160 and 180 of 200 epochs gives lr, lr·10⁻², lr·10⁻⁴;
* ``cosine``: ½(1 + cos(π·p)) where p runs from 0 after the warmup to 1 at the end of the run,
  so the lr reaches 0 after the last step;
* ``constant``: the warmup only.

The warmup multiplies by (t + 1)/W for t < W, W = ``warmup_epochs`` in the chosen unit, so the
first step already moves and the factor reaches 1 on the last warmup step. ``interval: epoch``
holds the factor for a whole epoch, t being the epoch index (LDAM-DRW's ``adjust_learning_rate``,
which sets lr·(e+1)/5 for epochs e < 5 and decays from epoch e ≥ 160); ``interval: step`` (the
default) moves every step, t being the step.

A schedule keeps no state: the factor is a function of (step, steps per epoch, total steps), so
a run resumed from a checkpoint (which stores the step) continues on exactly the same curve.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from tailkit.errors import InvalidParameterError
from tailkit.validation import Interval, validate_options

SCHEDULES = ("step", "cosine", "constant")


class Schedule:
    """lr factor per step; built from the ``optimizer.schedule`` mapping of an experiment."""

    constraints: ClassVar = {
        "warmup_epochs": Interval(0, None),
        "gamma": Interval(0, None, closed="neither"),
    }

    def __init__(
        self,
        *,
        name: Literal["step", "cosine", "constant"] = "constant",
        warmup_epochs: float = 0.0,
        milestones: list[float] | None = None,
        gamma: float = 0.1,
        interval: Literal["step", "epoch"] = "step",
    ) -> None:
        milestones = [] if milestones is None else list(milestones)
        if any(
            isinstance(m, bool) or not isinstance(m, int | float) or not m >= 0 for m in milestones
        ):
            raise InvalidParameterError(
                f"milestones: got {milestones!r}; expected a list of epochs >= 0"
            )
        if sorted(milestones) != milestones:
            raise InvalidParameterError(f"milestones: got {milestones!r}; expected increasing")
        if milestones and name != "step":
            raise InvalidParameterError(
                f"milestones: schedule {name!r} has no milestones; use name: step"
            )
        self.name = name
        self.warmup_epochs = float(warmup_epochs)
        self.milestones = [float(m) for m in milestones]
        self.gamma = gamma
        self.interval = interval

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None, key: str = "schedule") -> Schedule:
        """Validate a params mapping (``{name, warmup_epochs, milestones, gamma, interval}``);
        errors name ``key.<option>``."""
        if spec is None:
            return cls()
        if not isinstance(spec, Mapping):
            raise InvalidParameterError(f"{key}: got {spec!r}; expected a mapping")
        options = validate_options(key, cls, spec)
        try:
            return cls(**options)
        except InvalidParameterError as exc:
            raise InvalidParameterError(f"{key}.{exc}") from exc

    def factor(self, step: int, steps_per_epoch: int, total_steps: int | None = None) -> float:
        """Multiplier of the base lr for the update made at ``step`` (0-based)."""
        per_epoch = 1 if self.interval == "epoch" else steps_per_epoch
        t = step // steps_per_epoch if self.interval == "epoch" else step
        warmup = self.warmup_epochs * per_epoch
        if t < warmup:
            return (t + 1) / warmup
        if self.name == "step":
            passed = sum(1 for m in self.milestones if t >= m * per_epoch)
            return self.gamma**passed
        if self.name == "cosine":
            if total_steps is None:
                raise ValueError("a cosine schedule needs the total number of steps")
            end = total_steps if self.interval == "step" else math.ceil(total_steps / per_epoch)
            span = end - warmup
            progress = min(max((t - warmup) / span, 0.0), 1.0) if span > 0 else 1.0
            return 0.5 * (1.0 + math.cos(math.pi * progress))
        return 1.0


class ScheduleSpec:
    """A constraint for ``validate_options``: the value is a valid schedule mapping.

    It lets the optimiser's ``schedule`` option be checked where every other optimiser option
    is, with the full params key in the message.
    """

    def __contains__(self, value: Any) -> bool:
        try:
            Schedule.from_spec(value)
        except InvalidParameterError:
            return False
        return True

    def __str__(self) -> str:
        return (
            "a mapping {name: step|cosine|constant, warmup_epochs >= 0, milestones: [epochs, "
            "increasing] (step only), gamma > 0, interval: step|epoch}"
        )
