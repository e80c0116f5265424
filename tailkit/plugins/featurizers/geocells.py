"""Multi-resolution grid cells of a position on the sphere: sparse features for geolocation.

The standard trick of geolocation classifiers (PlaNet's and the geo-cell literature's "which
cell is it in", and tile coding's overlapping grids): a position activates one cell of a
latitude/longitude grid at each of several resolutions, so a linear model over the cells learns
a piecewise-constant map at every scale at once. The coarse cells give every place a prior from
its region; the fine ones let a border region's places be told apart without a kernel. Each
level is laid ``tilings`` times, shifted by 1/tilings of a cell in both coordinates, so a place
near a cell edge still shares a cell with its neighbours across that edge.

Levels: cell sizes ``finest``·2^l degrees for l = 0 … ``levels``−1 (defaults: 0.02° ≈ 2 km up
to 10.24° ≈ 1,100 km). On GeoNames' split that is 1.19M columns (20 per row); starting at 0.04°
with 9 levels gives 831k (18 per row); ``benchmarks/bench_peers.py`` measures models on them.

The columns are the cells that hold at least ``min_count`` training rows, numbered by (level, tiling, latitude band, longitude band); a cell never seen in training is
no column, so a test place there simply activates fewer cells. Every active cell has the value
1/sqrt(levels · tilings), so a row with all its cells known has unit L2 norm.

Inputs: GeoNames' (N, 3) unit vectors (x, y, z), or (N, 2) (latitude, longitude) in degrees.
Longitude cells are equal in degrees, so they narrow towards the poles (a plain grid; few places
lie there).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from tailkit.plugins.featurizers._inputs import is_dense_2d, wrong_kind
from tailkit.validation import Interval

# Cell keys pack (level·tilings + tiling, latitude band, longitude band) into one int64:
# 2^21 bands hold 360° / 2^21 ≈ 0.00017°, far below any useful cell.
_BAND_BITS = 21


class GeoCells:
    """One active cell per level and tiling of a multi-resolution lat/lon grid (sparse)."""

    accepts: ClassVar[tuple[str, ...]] = ("dense",)
    output: ClassVar[str] = "sparse"
    constraints: ClassVar[dict[str, Interval]] = {
        "finest": Interval(0.0002, 360, closed="both"),  # band ids must fit _BAND_BITS
        "levels": Interval(1, 24),
        "tilings": Interval(1, 16),
        "min_count": Interval(1, None),
    }

    def __init__(
        self, finest: float = 0.02, levels: int = 10, tilings: int = 2, min_count: int = 1
    ) -> None:
        self.finest = finest
        self.levels = levels
        self.tilings = tilings
        self.min_count = min_count
        self.vocabulary: np.ndarray | None = None  # sorted cell keys, one per column

    def _keys(self, inputs: Any) -> np.ndarray:
        """(N, levels · tilings) int64 cell keys."""
        lat, lon = _lat_lon(inputs)
        keys = np.empty((lat.shape[0], self.levels * self.tilings), dtype=np.int64)
        for level in range(self.levels):
            size = self.finest * 2.0**level
            for t in range(self.tilings):
                shift = size * t / self.tilings
                band = np.floor((lat + 90.0 + shift) / size).astype(np.int64)
                # longitude wraps: the band index is taken modulo the bands around the globe
                around = int(np.ceil(360.0 / size))
                sector = np.floor((lon + 180.0 + shift) / size).astype(np.int64) % around
                plane = level * self.tilings + t
                keys[:, plane] = (plane << 2 * _BAND_BITS) | (band << _BAND_BITS) | sector
        return keys

    def fit(self, inputs: Any) -> GeoCells:
        cells, counts = np.unique(self._keys(inputs), return_counts=True)
        self.vocabulary = cells[counts >= self.min_count]
        if self.vocabulary.size == 0:
            raise ValueError(
                f"featurizer 'geocells': no cell holds min_count={self.min_count} training rows"
            )
        return self

    def transform(self, inputs: Any) -> sp.csr_matrix:
        if self.vocabulary is None:
            raise RuntimeError("GeoCells.transform called before fit")
        keys = self._keys(inputs)
        n, active = keys.shape
        column = np.searchsorted(self.vocabulary, keys).clip(max=self.vocabulary.size - 1)
        known = self.vocabulary[column] == keys
        # Planes are numbered in key order, so each row's known columns are already sorted.
        indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(known.sum(axis=1), out=indptr[1:])
        values = np.full(int(indptr[-1]), 1.0 / np.sqrt(active), dtype=np.float32)
        return sp.csr_matrix(
            (values, column[known].astype(np.int32), indptr), shape=(n, self.vocabulary.size)
        )


def _lat_lon(inputs: Any) -> tuple[np.ndarray, np.ndarray]:
    """Latitude and longitude in degrees, float64."""
    if is_dense_2d(inputs) and inputs.shape[1] == 3:
        xyz = np.asarray(inputs, dtype=np.float64)
        norm = np.linalg.norm(xyz, axis=1)
        if not np.all(np.isfinite(norm)) or np.any(norm == 0):
            row = int(np.flatnonzero(~np.isfinite(norm) | (norm == 0))[0])
            raise ValueError(f"featurizer 'geocells': row {row} is not a position (norm 0 or NaN)")
        lat = np.degrees(np.arcsin(np.clip(xyz[:, 2] / norm, -1.0, 1.0)))
        return lat, np.degrees(np.arctan2(xyz[:, 1], xyz[:, 0]))
    if is_dense_2d(inputs) and inputs.shape[1] == 2:
        lat_lon = np.asarray(inputs, dtype=np.float64)
        lat, lon = lat_lon[:, 0], lat_lon[:, 1]
        bad = np.flatnonzero(~(np.abs(lat) <= 90) | ~np.isfinite(lon))
        if bad.size:
            raise ValueError(
                f"featurizer 'geocells': row {int(bad[0])} has latitude {lat[bad[0]]}, "
                f"longitude {lon[bad[0]]}; expected degrees with |latitude| <= 90"
            )
        return lat, (lon + 180.0) % 360.0 - 180.0
    raise wrong_kind(
        "geocells", "(N, 3) unit vectors or (N, 2) latitude/longitude in degrees", inputs
    )
