"""A fitted featurizer's state as data: named 1-D arrays (numbers or strings) in one Parquet
file beside the feature cache, so that ``tailkit predict`` restores the featurizer instead of
fitting it again, and nothing read back can run code (no pickle).

A featurizer opts in with two methods: ``fitted_state() -> dict[str, np.ndarray]`` and
``restore_state(state) -> self``. Each array is one list cell of a one-row table, so arrays of
different lengths and kinds sit side by side.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tailkit.errors import PluginError
from tailkit.storage.atomic import atomic_path
from tailkit.storage.parquet import read_table, write_table

FILE = "featurizer.parquet"


def keeps_state(featurizer: Any) -> bool:
    """Whether the featurizer can hand over its fitted state and take it back."""
    return callable(getattr(featurizer, "fitted_state", None)) and callable(
        getattr(featurizer, "restore_state", None)
    )


def write_state(path: Path, state: dict[str, np.ndarray], name: str) -> None:
    """``state`` into ``path`` (atomically); a value that is not a 1-D array of numbers or
    strings is a one-line error naming the featurizer."""
    columns = {}
    for key, value in state.items():
        array = np.asarray(value)
        if array.ndim != 1 or array.dtype.kind not in "biufUO":
            raise PluginError(
                f"featurizer {name!r}: fitted_state()[{key!r}] is {array.dtype} of shape "
                f"{array.shape}; expected a 1-D array of numbers or strings"
            )
        if array.dtype.kind in "UO":
            cell = pa.array(array.astype(str).tolist(), pa.large_string())
        else:
            cell = pa.array(array)
        columns[key] = pa.LargeListArray.from_arrays(pa.array([0, len(cell)], pa.int64()), cell)
    with atomic_path(path) as tmp:
        write_table(pa.table(columns), tmp, compression="zstd")


def read_state(path: Path) -> dict[str, np.ndarray]:
    """The arrays :func:`write_state` stored."""
    table = read_table(path, str(path), "featurize")
    state = {}
    for key in table.column_names:
        cell = table.column(key).combine_chunks().values
        if pa.types.is_string(cell.type) or pa.types.is_large_string(cell.type):
            state[key] = np.asarray(cell.to_pylist(), dtype=object)
        else:
            state[key] = cell.to_numpy(zero_copy_only=False)
    return state
