"""Progress bars for long stage work: shown on an interactive terminal, silent otherwise.

The command line decides once per process (``--quiet``, or stderr not a TTY as under ``dvc
repro`` logs and CI) with :func:`configure`; stage and plugin code asks :func:`enabled` or wraps
its loop in :func:`bar`, and never decides on its own. Bars go to stderr, so piped stdout (e.g.
``tailkit plugins | jq``) stays clean.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")
_enabled = False


def configure(quiet: bool) -> bool:
    """Turn bars on when not ``quiet`` and stderr is a terminal; returns whether they are."""
    global _enabled
    _enabled = not quiet and sys.stderr.isatty()
    return _enabled


def enabled() -> bool:
    return _enabled


_noticed: set[str] = set()


def notice(message: str) -> None:
    """One line on stderr, ``tailkit: <message>``, at most once per process and message: for a
    setting tailkit had to adjust (a k larger than the data allows), which must not pass
    silently but is no error. Shown with or without ``--quiet``, as DVC logs keep stderr."""
    if message not in _noticed:
        _noticed.add(message)
        print(f"tailkit: {message}", file=sys.stderr)


def bar(
    iterable: Iterable[T] | None = None,
    *,
    desc: str,
    total: int | None = None,
    unit: str = "it",
) -> tqdm:
    """A tqdm bar over ``iterable`` (or a manual one, with ``total``), disabled unless
    :func:`configure` enabled bars; it leaves no line behind when done."""
    return tqdm(
        iterable,
        desc=desc,
        total=total,
        unit=unit,
        file=sys.stderr,
        disable=not _enabled,
        leave=False,
        dynamic_ncols=True,
    )


def each(iterable: Iterable[T], desc: str, unit: str = "it") -> Iterator[T]:
    """``for x in each(items, "featurize"):`` — iterate with a bar when bars are on."""
    yield from bar(iterable, desc=desc, unit=unit)
