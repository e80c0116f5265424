"""Which experiment, feature set or sampler a DVC stage runs, read from DVC, not from its command.

dvc.yaml's commands hold no value from params.yaml (``cmd: python -m tailkit train``): DVC
pastes interpolated values into a shell line unquoted, so a name such as ``"x; touch PWNED"``
in params.yaml would run as code under ``dvc repro -s <stage>`` before tailkit could refuse it.
Instead every stage command learns its key from ``DVC_STAGE``, which DVC sets to the stage's
address (``train@softmax``, ``train-seed@softmax-1``, ``sub/dvc.yaml:featurize@rff``) under
every way of running a stage (``dvc repro``, ``dvc repro -s``, ``dvc exp run``, ``tailkit
repro``). The address is only looked up among the names of the already validated params, so
nothing from it is trusted: a key that is not one of them is an error.

A ``foreach`` stage's key is the name itself. A ``matrix`` stage's key is DVC's join of its
values, ``<name>-<seed>``; since names may hold ``-``, it is resolved by matching every
(name, seed) pair of the params, and must match exactly one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

from tailkit.errors import InvalidParameterError

#: The environment variable DVC sets for every stage command (dvc/env.py).
DVC_STAGE = "DVC_STAGE"


def stage_address() -> tuple[str, str] | None:
    """(stage group, key) of the DVC stage this process runs as, or None outside DVC."""
    address = os.environ.get(DVC_STAGE)
    if not address or "@" not in address:
        return None
    group, _, key = address.partition("@")
    return group.rpartition(":")[2], key  # without the dvc.yaml path DVC puts before ':'


def keyed_name(flag: str, groups: Mapping[str, Iterable[str]]) -> str:
    """The key of the ``foreach`` stage running this command (``flag`` names the option that
    gives it by hand). ``groups`` maps each stage group that runs this command to the names it
    may run."""
    found = stage_address()
    if found is None or found[0] not in groups:
        raise InvalidParameterError(f"{flag} is required outside a DVC stage of {_of(groups)}")
    group, key = found
    if key not in set(groups[group]):
        raise InvalidParameterError(
            f"DVC stage {group}@{key[:100]!r}: no such name in params.yaml; "
            f"run `dvc repro` again after editing params.yaml"
        )
    return key


def seeded_name(
    flag: str,
    single: Mapping[str, Iterable[str]],
    matrix: Mapping[str, tuple[Iterable[str], Iterable[int]]],
) -> tuple[str, int | None]:
    """(name, seed) of the DVC stage running this command: a ``single`` group's key is a name
    (seed None); a ``matrix`` group's is ``<name>-<seed>`` over its (names, seeds)."""
    found = stage_address()
    if found is not None and found[0] in matrix:
        group, key = found
        names, seeds = matrix[group]
        pairs = [(n, s) for n in names for s in seeds if f"{n}-{s}" == key]
        if len(pairs) != 1:
            raise InvalidParameterError(
                f"DVC stage {group}@{key[:100]!r}: "
                + ("no" if not pairs else "more than one")
                + " (name, seed) pair of params.yaml gives this key; "
                "run `dvc repro` again after editing params.yaml"
            )
        return pairs[0]
    return keyed_name(flag, single), None


def _of(groups: Mapping) -> str:
    return " or ".join(sorted(groups))
