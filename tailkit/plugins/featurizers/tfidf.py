"""TF-IDF over bag-of-words counts, kept sparse: the input of the XC repository's baselines.

tf-idf(t, d) = tf(t, d) · idf(t) with idf(t) = ln((1 + n) / (1 + df(t))) + 1 over the n
training rows (scikit-learn's ``TfidfTransformer``, smoothed), and tf = 1 + ln(count) when
``sublinear_tf`` (the default, as Parabel, PfastreXML and napkinXC's XC setups use) or the raw
count otherwise; each row is then scaled to unit L2 norm (an all-zero row stays zero).

``counts`` (true by default) refuses values that are not non-negative integers, naming the
first such row: the Extreme Classification Repository's files hold TF-IDF weights already
(docs/xc-features.md), and weighting them again (1 + ln v is negative below 1/e) would train
on a distortion of the published features; ``sparse-identity`` takes them as given, and
``counts: false`` weights them anyway.

``max_features`` keeps the columns present in the most training rows (ties: the lower column
id), the usual vocabulary cut; ``min_df`` drops columns seen in fewer training rows. Kept
columns are renumbered 0..D'−1 in their original order, so the output is a float32 CSR matrix
with sorted ids that the cache stores as is.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from tailkit.plugins.featurizers._inputs import (
    check_counts,
    csr_rows,
    frequent_columns,
    wrong_kind,
)
from tailkit.validation import Interval


class Tfidf:
    """TF-IDF weights of bag-of-words counts as sparse float32 rows with unit L2 norm."""

    # Dense inputs are no bag of words (tfidf-svd takes them); counts come as sparse matrices.
    accepts: ClassVar[tuple[str, ...]] = ("sparse",)
    output: ClassVar[str] = "sparse"
    constraints: ClassVar[dict[str, Interval]] = {
        "max_features": Interval(1, None),
        "min_df": Interval(1, None),
    }

    def __init__(
        self,
        sublinear_tf: bool = True,
        max_features: int | None = None,
        min_df: int = 1,
        counts: bool = True,
    ) -> None:
        self.sublinear_tf = sublinear_tf
        self.counts = counts
        self.max_features = max_features
        self.min_df = min_df
        self.columns: np.ndarray | None = None  # kept input columns, sorted
        self.in_dim: int | None = None
        self.tfidf: Any = None  # sklearn TfidfTransformer, imported when fitted (~2 s)

    @property
    def takes_counts(self) -> bool:
        """Whether it refuses values that are not integer counts (the stage checks a dataset
        that says its values are weights against it before any work)."""
        return self.counts

    def fit(self, inputs: Any) -> Tfidf:
        counts = _counts(inputs, self.counts)
        self.in_dim = counts.shape[1]
        df = np.bincount(counts.indices, minlength=counts.shape[1])
        keep = frequent_columns(df, self.min_df, self.max_features)
        if keep.size == 0:
            raise ValueError(
                f"featurizer 'tfidf': no column is in at least min_df={self.min_df} training rows"
            )
        self.columns = keep
        from sklearn.feature_extraction.text import TfidfTransformer

        self.tfidf = TfidfTransformer(
            norm="l2", use_idf=True, smooth_idf=True, sublinear_tf=self.sublinear_tf
        ).fit(counts[:, keep])
        return self

    def transform(self, inputs: Any) -> sp.csr_matrix:
        if self.tfidf is None or self.columns is None:
            raise RuntimeError("Tfidf.transform called before fit")
        counts = _counts(inputs, self.counts)
        if counts.shape[1] != self.in_dim:
            raise ValueError(
                f"featurizer 'tfidf' was fitted on {self.in_dim} columns; got {counts.shape[1]}"
            )
        out = self.tfidf.transform(counts[:, self.columns])
        out = sp.csr_matrix(out, dtype=np.float32)
        out.sort_indices()
        return out


def _counts(inputs: Any, integers: bool) -> sp.csr_matrix:
    """Non-negative counts (integers when ``integers``) as float64 CSR with sorted, summed
    ids."""
    if not (sp.issparse(inputs) and inputs.ndim == 2):
        raise wrong_kind("tfidf", "sparse (N, D) bag-of-words counts", inputs)
    counts = sp.csr_matrix(inputs, dtype=np.float64)
    counts.sum_duplicates()
    if integers:
        check_counts(counts.data, csr_rows(counts), "tfidf")
    elif counts.nnz and counts.data.min() < 0:
        raise ValueError("featurizer 'tfidf' takes counts; got negative values")
    counts.eliminate_zeros()  # an explicit zero is no occurrence (df must not count it)
    return counts
