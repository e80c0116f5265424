"""Random Fourier features (Rahimi & Recht, 2007) for the RBF kernel.

z(x) = sqrt(2/dim) · cos(x W / bandwidth + b) with W ~ N(0, 1)^(D × dim), b ~ U(0, 2π)^dim
satisfies E[z(x)·z(x')] = exp(−‖x − x'‖² / (2 · bandwidth²)): a linear model on z behaves like
a kernel machine on x, which lets the linear/sampled-softmax pipeline handle non-linear data
(e.g. GeoNames' 3-D coordinates) at the cost of ``dim`` features. The error of one inner
product is O(1/sqrt(dim)).
"""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from tailkit.validation import SEED, Interval

# Rows per transform chunk are chosen so one chunk's output is about this many floats
# (16 MiB): the only temporary is the chunk's cast input, whatever N is.
_CHUNK_FLOATS = 4 * 1024 * 1024


class RandomFourierFeatures:
    """Random Fourier features approximating an RBF kernel of the given bandwidth.

    ``W`` and ``b`` are drawn in :meth:`fit` from ``seed`` (fit only needs the input
    dimension, never the data), so the same options give the same features on every split and
    every machine. The output is float32; the projection is computed in float32 too, whose
    rounding (~1e-7 relative) is far below the Monte-Carlo error 1/sqrt(dim).
    """

    accepts: ClassVar[tuple[str, ...]] = ("dense",)
    output: ClassVar[str] = "dense"
    constraints: ClassVar[dict[str, Interval]] = {
        "dim": Interval(1, None),
        "bandwidth": Interval(0, None, closed="neither"),
        "seed": SEED,
    }

    def __init__(self, dim: int = 512, bandwidth: float = 1.0, seed: int = 0) -> None:
        self.dim = dim
        self.bandwidth = bandwidth
        self.seed = seed
        self.weights: np.ndarray | None = None  # (D, dim) float32, already divided by bandwidth
        self.offsets: np.ndarray | None = None  # (dim,) float32 in [0, 2π)

    def fit(self, inputs: np.ndarray) -> RandomFourierFeatures:
        if np.ndim(inputs) != 2:
            raise ValueError(f"inputs must be a 2-D (N, D) array; got shape {np.shape(inputs)}")
        in_dim = int(np.shape(inputs)[1])
        rng = np.random.default_rng(self.seed)
        # Drawn in float64 and rounded, so the draw does not depend on a dtype-specific stream.
        w = rng.standard_normal((in_dim, self.dim)) / self.bandwidth
        b = rng.uniform(0.0, 2.0 * math.pi, size=self.dim)
        self.weights = w.astype(np.float32)
        self.offsets = b.astype(np.float32)
        return self

    def transform(self, inputs: np.ndarray) -> np.ndarray:
        if self.weights is None or self.offsets is None:
            raise RuntimeError("RandomFourierFeatures.transform called before fit")
        if np.ndim(inputs) != 2 or np.shape(inputs)[1] != self.weights.shape[0]:
            raise ValueError(
                f"inputs must have shape (N, {self.weights.shape[0]}) as seen by fit; "
                f"got {np.shape(inputs)}"
            )
        n = int(np.shape(inputs)[0])
        out = np.empty((n, self.dim), dtype=np.float32)
        scale = np.float32(math.sqrt(2.0 / self.dim))
        step = max(1, _CHUNK_FLOATS // max(self.dim, self.weights.shape[0]))
        for start in range(0, n, step):
            block = out[start : start + step]  # a contiguous view: written in place
            chunk = np.asarray(inputs[start : start + step], dtype=np.float32)
            np.matmul(chunk, self.weights, out=block)
            block += self.offsets
            np.cos(block, out=block)
            block *= scale
        return out
