"""TF-IDF then truncated SVD (latent semantic analysis): bag-of-words counts to dense features.

``weighting: none`` skips the TF-IDF for values already weighted (the Extreme Classification
Repository's files: docs/xc-features.md) and only scales each row to unit L2 norm before the
SVD; under ``tfidf`` (the default) ``counts`` refuses values that are not integer counts, as
the ``tfidf`` featurizer does (``counts: false`` weights them anyway).

The XC datasets' inputs are sparse counts over 10^4–10^6 words; a linear model or an MLP on
them needs a dense, low-dimensional view. TF-IDF (scikit-learn's ``TfidfTransformer``,
defaults): tf-idf(t, d) = count(t, d) · idf(t), idf(t) = ln((1 + n) / (1 + df(t))) + 1 over
the n training rows, each row then scaled to unit L2 norm (an all-zero row stays zero). The
truncated SVD (randomised, ``random_state=seed``) keeps the top ``dim`` right singular vectors
V of the training TF-IDF matrix, without centring (which would densify it); features are
tf-idf(x) · V.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from tailkit.plugins.featurizers._inputs import (
    check_counts,
    csr_rows,
    is_dense_2d,
    row_chunks,
    wrong_kind,
)
from tailkit.validation import SEED, Interval, Options


class TfidfSVD:
    """TF-IDF weighting of bag-of-words counts, then truncated SVD to ``dim`` float32 features.

    Accepts a sparse (N, D) matrix of counts (CSR, as datasets give) or dense counts.
    ``dim`` is capped at min(N, D) of the training rows.
    """

    accepts: ClassVar[tuple[str, ...]] = ("sparse", "dense")
    output: ClassVar[str] = "dense"
    constraints: ClassVar[dict[str, Interval | Options]] = {
        "dim": Interval(1, None),
        "seed": SEED,
        "weighting": Options("tfidf", "none"),
    }

    def __init__(
        self, dim: int = 256, seed: int = 0, weighting: str = "tfidf", counts: bool = True
    ) -> None:
        self.dim = dim
        self.seed = seed
        self.weighting = weighting
        self.counts = counts
        # scikit-learn, imported when fitted: its import costs ~2 s of every command
        self.tfidf: Any = None
        self.svd: Any = None

    @property
    def takes_counts(self) -> bool:
        """Whether it refuses values that are not integer counts."""
        return self.weighting == "tfidf" and self.counts

    def fit(self, inputs: Any) -> TfidfSVD:
        counts = _counts(inputs, self.takes_counts)
        from sklearn.decomposition import TruncatedSVD
        from sklearn.feature_extraction.text import TfidfTransformer
        from sklearn.preprocessing import Normalizer

        if self.weighting == "tfidf":
            self.tfidf = TfidfTransformer(norm="l2", use_idf=True, smooth_idf=True).fit(counts)
        else:  # the values as given, each row at unit L2 norm (stateless)
            self.tfidf = Normalizer(norm="l2").fit(counts)
        dim = min(self.dim, *counts.shape)
        self.svd = TruncatedSVD(dim, algorithm="randomized", random_state=self.seed)
        self.svd.fit(self.tfidf.transform(counts))
        return self

    def transform(self, inputs: Any) -> np.ndarray:
        if self.tfidf is None or self.svd is None:
            raise RuntimeError("TfidfSVD.transform called before fit")
        counts = _counts(inputs, self.takes_counts)
        width = self.svd.components_.shape[1]
        if counts.shape[1] != width:
            raise ValueError(
                f"featurizer 'tfidf-svd' was fitted on {width} columns; got {counts.shape[1]}"
            )
        out = np.empty((counts.shape[0], self.svd.components_.shape[0]), dtype=np.float32)
        for rows in row_chunks(counts.shape[0], width):
            out[rows] = self.svd.transform(self.tfidf.transform(counts[rows]))
        return out


def _counts(inputs: Any, integers: bool) -> sp.csr_matrix:
    """Counts (integers when ``integers``) as float64 CSR (TF-IDF's idf and norms in double
    precision)."""
    if sp.issparse(inputs) and inputs.ndim == 2:
        counts = sp.csr_matrix(inputs, dtype=np.float64)
    elif is_dense_2d(inputs):
        counts = sp.csr_matrix(np.asarray(inputs, dtype=np.float64))
    else:
        raise wrong_kind("tfidf-svd", "sparse or dense (N, D) bag-of-words counts", inputs)
    if integers:
        check_counts(counts.data, csr_rows(counts), "tfidf-svd")
    return counts
