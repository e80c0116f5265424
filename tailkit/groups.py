"""The many/medium/few groups of the long-tail literature, by a class's training rows.

Kept apart from :mod:`tailkit.evaluation.metrics` (numpy) so that ``params.py`` can validate
``evaluate.groups`` without importing array libraries.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import ClassVar

from tailkit.validation import Interval

#: The groups, from the most to the least frequent.
GROUPS = ("many", "medium", "few")


@dataclass(frozen=True)
class GroupThresholds:
    """Where the many/medium/few groups split, by a class's training rows: many above
    ``many_above``, few below ``few_below``, medium from ``few_below`` to ``many_above``, both
    included. The defaults are the OLTR paper's (Liu et al., 2019: > 100, 20–100, < 20); the
    reference codebases disagree on exactly 100 and 20, so a study that follows one of them
    sets these (``evaluate.groups``) and every metrics file records them."""

    many_above: int = 100
    few_below: int = 20

    constraints: ClassVar = {"many_above": Interval(0, None), "few_below": Interval(0, None)}

    def __post_init__(self) -> None:
        if self.few_below > self.many_above + 1:
            raise ValueError(
                f"few_below ({self.few_below}) is more than many_above + 1 "
                f"({self.many_above + 1}): a class could be both many and few"
            )

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def ranges(self) -> dict[str, str]:
        """Each group's range of training rows, as tables and figures write it."""
        return {
            "many": f"> {self.many_above}",
            "medium": f"{self.few_below}–{self.many_above}",
            "few": f"< {self.few_below}",
        }


#: The OLTR paper's thresholds: many > 100, medium 20–100, few < 20.
DEFAULT_GROUPS = GroupThresholds()
