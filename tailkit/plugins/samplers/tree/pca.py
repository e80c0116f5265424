"""Whitened correlation-matrix PCA, the feature map of the Bamler–Mandt tree (algorithms.md §1.2).

The reference notebook standardises each feature, eigendecomposes the correlation matrix and
keeps the k largest components, scaled to unit variance: x̃ = Λ^(−1/2) Vᵀ diag(1/σ) (x − μ), so
that Cov(x̃) = I. scikit-learn computes exactly that (``StandardScaler`` then ``PCA(whiten=True)``
with the covariance eigensolver, float64 accumulation); we fold both into one affine map
x̃ = (x − μ') Tᵀ, which is all the sampler needs at draw time (no scikit-learn in the loop).

Sparse features (TF-IDF, grid cells; a scipy CSR matrix) take the covariance PCA instead:
standardising a column that is non-zero in three rows of 10^5 would multiply it by ~200 and
let the rarest columns span the tree's space, and it would densify the matrix. scikit-learn's
PCA centres sparse input implicitly (ARPACK on the centred operator), so x̃ = Λ^(−1/2) Vᵀ (x − μ)
is computed without a dense N × D copy.

BLAS runs on one thread here, whatever the process was given: a multi-threaded BLAS splits its
dot products and matrix-vector products between threads, so their sums, and with them the
components, the tree fitted on them and every model trained with its negatives, would change
in the 11th digit with the thread count (``tailkit repro`` runs a sampler's fit on one thread
or on all, depending on what runs beside it). The fit is dominated by sparse products, which
scipy runs on one thread anyway.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from threadpoolctl import threadpool_limits

# scikit-learn is imported in the fits, not here: its import (~2 s, mostly scipy.stats) would
# otherwise be paid by every command that loads the sampler registry, train and evaluate too.


class WhitenedPCA:
    """Fit on the training features; ``transform`` applies the folded map."""

    def __init__(self, dim: int) -> None:
        self.requested = dim
        self.mean: np.ndarray | None = None  # (D,) float64
        self.transform_matrix: np.ndarray | None = None  # (k, D) float64

    @property
    def dim(self) -> int:
        return 0 if self.transform_matrix is None else self.transform_matrix.shape[0]

    def fit(self, features: np.ndarray | sp.csr_matrix) -> WhitenedPCA:
        # threadpoolctl limits the BLAS libraries loaded when it starts: scikit-learn's import
        # loads scipy's own OpenBLAS (ARPACK's), so it comes first
        import sklearn.decomposition  # noqa: F401

        with threadpool_limits(limits=1, user_api="blas"):  # module docstring
            return self._fit(features)

    def _fit(self, features: np.ndarray | sp.csr_matrix) -> WhitenedPCA:
        if sp.issparse(features):
            return self._fit_sparse(sp.csr_matrix(features, dtype=np.float64))
        x = np.asarray(features)
        if x.ndim != 2 or x.shape[0] < 2:
            raise ValueError(f"PCA needs at least two feature rows, got shape {x.shape}")
        from sklearn.decomposition import PCA
        from sklearn.preprocessing import StandardScaler

        scaler = StandardScaler().fit(x)
        # A constant feature has no correlation to speak of; StandardScaler leaves it at 0.
        dim = min(self.requested, x.shape[1], x.shape[0] - 1)
        pca = PCA(n_components=dim, whiten=True, svd_solver="covariance_eigh")
        pca.fit(scaler.transform(x).astype(np.float64, copy=False))
        variance = pca.explained_variance_
        keep = variance > variance[0] * 1e-10  # drop directions with no variance: 1/√0
        components = pca.components_[keep] / np.sqrt(variance[keep])[:, None]
        self.transform_matrix = components / scaler.scale_[None, :]
        self.mean = scaler.mean_ + scaler.scale_ * pca.mean_
        return self

    def _fit_sparse(self, x: sp.csr_matrix) -> WhitenedPCA:
        if x.shape[0] < 2:
            raise ValueError(f"PCA needs at least two feature rows, got shape {x.shape}")
        # ARPACK needs k < min(N, D); its start vector is fixed so the fit is reproducible.
        dim = min(self.requested, x.shape[1] - 1, x.shape[0] - 1)
        if dim < 1:
            raise ValueError(f"sparse PCA needs at least two columns and rows, got {x.shape}")
        from sklearn.decomposition import PCA

        pca = PCA(n_components=dim, svd_solver="arpack", random_state=0).fit(x)
        variance = pca.explained_variance_
        keep = variance > variance[0] * 1e-10
        self.transform_matrix = pca.components_[keep] / np.sqrt(variance[keep])[:, None]
        self.mean = np.asarray(pca.mean_, dtype=np.float64)
        return self

    def transform(self, features: np.ndarray | sp.csr_matrix) -> np.ndarray:
        """(N, k) float32 whitened features."""
        if self.mean is None or self.transform_matrix is None:
            raise RuntimeError("WhitenedPCA: call fit first")
        with threadpool_limits(limits=1, user_api="blas"):  # module docstring
            if sp.issparse(features):  # x·Tᵀ − μ·Tᵀ: centring a sparse matrix would densify it
                t = self.transform_matrix.T
                out = sp.csr_matrix(features, dtype=np.float64) @ t - self.mean @ t
                return np.asarray(out, dtype=np.float32)
            out = (np.asarray(features, dtype=np.float64) - self.mean) @ self.transform_matrix.T
        return out.astype(np.float32)
