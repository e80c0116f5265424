"""Sparse inputs as given: the features of the Extreme Classification Repository's files.

The repository's bag-of-words files hold TF-IDF weights already (a term's count times its
feature's idf, rows not normalised; docs/xc-features.md), so weighting them again, as
``tfidf`` does to counts, would train on something else than the published features. The
peer tools read the values as given and scale each row to unit L2 norm (Parabel, PfastreXML
and Bonsai always, omikuji always, napkinXC by default), which ``normalize`` (on by default)
does here too; an all-zero row stays zero. Output: float32 CSR with sorted, summed ids.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from tailkit.plugins.featurizers._inputs import wrong_kind


class SparseIdentity:
    """The sparse inputs as float32 CSR, each row scaled to unit L2 norm when ``normalize``."""

    accepts: ClassVar[tuple[str, ...]] = ("sparse",)
    output: ClassVar[str] = "sparse"

    def __init__(self, normalize: bool = True) -> None:
        self.normalize = normalize
        self.in_dim: int | None = None

    def fit(self, inputs: Any) -> SparseIdentity:
        self.in_dim = _sparse(inputs).shape[1]
        return self

    def transform(self, inputs: Any) -> sp.csr_matrix:
        if self.in_dim is None:
            raise RuntimeError("SparseIdentity.transform called before fit")
        x = _sparse(inputs)
        if x.shape[1] != self.in_dim:
            raise ValueError(
                f"featurizer 'sparse-identity' was fitted on {self.in_dim} columns; "
                f"got {x.shape[1]}"
            )
        if self.normalize:  # norms in float64, whatever the input's precision
            wide = x.astype(np.float64)
            norms = np.sqrt(np.asarray(wide.multiply(wide).sum(axis=1)).ravel())
            norms[norms == 0] = 1.0  # an all-zero row stays zero
            x.data = (wide.data / np.repeat(norms, np.diff(x.indptr))).astype(np.float32)
        return x


def _sparse(inputs: Any) -> sp.csr_matrix:
    if not (sp.issparse(inputs) and inputs.ndim == 2):
        raise wrong_kind("sparse-identity", "a sparse (N, D) matrix", inputs)
    x = sp.csr_matrix(inputs, dtype=np.float32, copy=True)
    x.sum_duplicates()  # sorts the ids too
    return x
