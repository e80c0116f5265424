"""The identity featurizer: the dataset's inputs are already the features."""

from __future__ import annotations

from typing import ClassVar

import numpy as np


class Identity:
    """Use the inputs as features (float32, C-contiguous).

    The featurize stage still runs so every experiment goes through the same feature cache;
    this only normalises dtype and layout (no copy when the inputs already are float32 and
    C-contiguous), because the cache's zero-copy read and torch expect exactly that.
    """

    accepts: ClassVar[tuple[str, ...]] = ("dense",)
    output: ClassVar[str] = "dense"

    def fit(self, inputs: np.ndarray) -> Identity:
        """Nothing to learn; checks the shape so a bad dataset fails here, not in training."""
        _check_2d(inputs)
        return self

    def transform(self, inputs: np.ndarray) -> np.ndarray:
        _check_2d(inputs)
        return np.ascontiguousarray(inputs, dtype=np.float32)


def _check_2d(inputs: np.ndarray) -> None:
    if np.ndim(inputs) != 2:
        raise ValueError(f"inputs must be a 2-D (N, D) array; got shape {np.shape(inputs)}")
