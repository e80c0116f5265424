"""Principal component analysis: dense inputs to their top ``dim`` principal coordinates.

scikit-learn's ``PCA`` fitted on the training rows: features are (x − μ) V_k, with V_k the top
k right singular vectors of the centred training matrix (sign fixed by scikit-learn's
``svd_flip``), divided by the singular values' sqrt(variance) when ``whiten`` is true. The
Bamler–Mandt tree is fitted on such features; a whitened PCA also makes an RBF bandwidth
meaningful for ``rff`` on anisotropic data. Computed in float64, returned as float32.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from tailkit.plugins.featurizers._inputs import is_dense_2d, row_chunks, wrong_kind
from tailkit.validation import SEED, Interval


class PCA:
    """Principal components of dense inputs (scikit-learn PCA), ``dim`` float32 features.

    ``dim`` is capped at min(N, D) of the training rows. ``seed`` seeds the randomised solver
    that scikit-learn picks for large inputs (``svd_solver="auto"``).
    """

    accepts: ClassVar[tuple[str, ...]] = ("dense",)
    output: ClassVar[str] = "dense"
    constraints: ClassVar[dict[str, Interval]] = {
        "dim": Interval(1, None),
        "seed": SEED,
    }

    def __init__(self, dim: int = 64, whiten: bool = False, seed: int = 0) -> None:
        self.dim = dim
        self.whiten = whiten
        self.seed = seed
        self.pca: Any = None  # sklearn PCA, imported when fitted (its import costs ~2 s)

    def fit(self, inputs: Any) -> PCA:
        x = _dense(inputs)
        dim = min(self.dim, *x.shape)
        from sklearn.decomposition import PCA as SklearnPCA

        self.pca = SklearnPCA(dim, whiten=self.whiten, random_state=self.seed).fit(x)
        return self

    def transform(self, inputs: Any) -> np.ndarray:
        if self.pca is None:
            raise RuntimeError("PCA.transform called before fit")
        if not is_dense_2d(inputs):
            raise _wrong(inputs)
        width = self.pca.components_.shape[1]
        if inputs.shape[1] != width:
            raise ValueError(
                f"featurizer 'pca' was fitted on {width} columns; got {inputs.shape[1]}"
            )
        out = np.empty((inputs.shape[0], self.pca.n_components_), dtype=np.float32)
        for rows in row_chunks(inputs.shape[0], width):
            out[rows] = self.pca.transform(np.asarray(inputs[rows], dtype=np.float64))
        return out


def _wrong(inputs: Any) -> ValueError:
    return wrong_kind("pca", "dense (N, D) real-valued inputs", inputs)


def _dense(inputs: Any) -> np.ndarray:
    if not is_dense_2d(inputs):
        raise _wrong(inputs)
    return np.asarray(inputs, dtype=np.float64)
