"""``text-tfidf``: raw text into sparse TF-IDF rows of word and, optionally, character n-grams.

Tokens come from scikit-learn's ``CountVectorizer`` (its default word pattern of two or more
word characters; ``char_wb`` n-grams inside word boundaries for ``char_ngrams``), fitted on
the training rows only. A term is kept when at least ``min_df`` training rows hold it, and
``max_features`` keeps the terms held by the most rows (ties: word terms before character
terms, then alphabetical order, so the cut is the same on every machine; scikit-learn's own cut
sorts with an unstable sort). The weights are :mod:`tfidf`'s: tf = 1 + ln(count) when
``sublinear_tf`` (else the count), idf(t) = ln((1 + n) / (1 + df(t))) + 1 over the n training
rows, each row then at unit L2 norm (a row without a known term stays empty).

The fitted state is data: the kept terms and their idf (:meth:`fitted_state`), which
``featurize`` stores beside the feature cache and ``tailkit predict`` restores instead of
fitting again on the training rows.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from tailkit.plugins.featurizers._inputs import wrong_kind
from tailkit.validation import Interval

#: The two term kinds, in column order.
KINDS = ("word", "char")


def _ngram_range(option: str, value: list[int] | None) -> tuple[int, int] | None:
    if value is None:
        return None
    if not (
        len(value) == 2
        and all(isinstance(v, int) and not isinstance(v, bool) for v in value)
        and 1 <= value[0] <= value[1] <= 10
    ):
        raise ValueError(
            f"{option}: got {value!r}; expected [low, high] with 1 <= low <= high <= 10"
        )
    return int(value[0]), int(value[1])


class TextTfidf:
    """TF-IDF of word (and character) n-grams of raw text, as sparse float32 rows."""

    accepts: ClassVar[tuple[str, ...]] = ("text",)
    output: ClassVar[str] = "sparse"
    constraints: ClassVar[dict[str, Interval]] = {
        "max_features": Interval(1, None),
        "min_df": Interval(1, None),
    }

    def __init__(
        self,
        word_ngrams: list[int] | None = None,
        char_ngrams: list[int] | None = None,
        lowercase: bool = True,
        min_df: int = 1,
        max_features: int | None = None,
        sublinear_tf: bool = True,
    ) -> None:
        ranges = {
            "word": _ngram_range("word_ngrams", [1, 1] if word_ngrams is None else word_ngrams),
            "char": _ngram_range("char_ngrams", char_ngrams),
        }
        self.ranges = {kind: r for kind, r in ranges.items() if r is not None}
        self.lowercase = lowercase
        self.min_df = min_df
        self.max_features = max_features
        self.sublinear_tf = sublinear_tf
        self.terms: dict[str, np.ndarray] = {}  # kind -> kept terms, in column order
        self.idf: np.ndarray | None = None

    def _vectorizer(self, kind: str, vocabulary: Any = None, min_df: int = 1) -> Any:
        from sklearn.feature_extraction.text import CountVectorizer

        return CountVectorizer(
            analyzer="word" if kind == "word" else "char_wb",
            ngram_range=self.ranges[kind],
            lowercase=self.lowercase,
            min_df=min_df,
            vocabulary=vocabulary,
            dtype=np.float64,
        )

    def fit(self, inputs: Any) -> TextTfidf:
        texts = _texts(inputs)
        blocks, terms = [], []
        for kind in self.ranges:
            vectorizer = self._vectorizer(kind, min_df=min(self.min_df, max(len(texts), 1)))
            try:
                blocks.append(sp.csr_matrix(vectorizer.fit_transform(texts)))
            except ValueError:  # scikit-learn's "empty vocabulary" / "no terms remain"
                blocks.append(sp.csr_matrix((len(texts), 0)))
                terms.append(np.zeros(0, dtype=object))
                continue
            terms.append(vectorizer.get_feature_names_out().astype(object))
        counts = sp.hstack(blocks, format="csr")
        df = np.bincount(counts.indices, minlength=counts.shape[1])
        keep = np.flatnonzero(df >= self.min_df)
        if self.max_features is not None and keep.size > self.max_features:
            order = np.argsort(-df[keep], kind="stable")[: self.max_features]
            keep = np.sort(keep[order])
        if keep.size == 0:
            raise ValueError(
                f"featurizer 'text-tfidf': no term is in at least min_df={self.min_df} of the "
                f"{len(texts):,} training rows"
            )
        bounds = np.cumsum([0, *(t.size for t in terms)])
        self.terms = {
            kind: terms[i][keep[(keep >= bounds[i]) & (keep < bounds[i + 1])] - bounds[i]]
            for i, kind in enumerate(self.ranges)
        }
        self.idf = np.log((1.0 + len(texts)) / (1.0 + df[keep])) + 1.0
        return self

    def transform(self, inputs: Any) -> sp.csr_matrix:
        if self.idf is None:
            raise RuntimeError("TextTfidf.transform called before fit")
        texts = _texts(inputs)
        blocks = []
        for kind in self.ranges:
            vocabulary = {str(t): i for i, t in enumerate(self.terms[kind])}
            if vocabulary:
                blocks.append(self._vectorizer(kind, vocabulary).transform(texts))
        counts = sp.csr_matrix(sp.hstack(blocks, format="csr"), dtype=np.float64)
        counts.sort_indices()
        values = counts.data
        if self.sublinear_tf:
            values = 1.0 + np.log(values)
        values = values * self.idf[counts.indices]
        rows = np.repeat(np.arange(counts.shape[0]), np.diff(counts.indptr))
        norms = np.sqrt(np.bincount(rows, weights=values * values, minlength=counts.shape[0]))
        values = values / norms[rows]
        return sp.csr_matrix(
            (values.astype(np.float32), counts.indices.copy(), counts.indptr.copy()),
            shape=counts.shape,
        )

    # --- the fitted state, as data ----------------------------------------------------------

    def fitted_state(self) -> dict[str, np.ndarray]:
        """The kept terms of each kind and their idf, in column order."""
        if self.idf is None:
            raise RuntimeError("TextTfidf.fitted_state called before fit")
        state = {f"{kind}_terms": self.terms[kind].astype(str) for kind in self.ranges}
        return {**state, "idf": self.idf}

    def restore_state(self, state: dict[str, np.ndarray]) -> TextTfidf:
        """The featurizer as :meth:`fit` left it, from :meth:`fitted_state`'s arrays."""
        expected = {f"{kind}_terms" for kind in self.ranges} | {"idf"}
        if set(state) != expected:
            raise ValueError(
                f"featurizer 'text-tfidf': a stored state with {sorted(state)}; these options "
                f"need {sorted(expected)}"
            )
        self.terms = {
            kind: np.asarray(state[f"{kind}_terms"], dtype=object) for kind in self.ranges
        }
        idf = np.asarray(state["idf"], dtype=np.float64)
        if idf.size != sum(t.size for t in self.terms.values()):
            raise ValueError("featurizer 'text-tfidf': stored idf and terms differ in length")
        self.idf = idf
        return self


def _texts(inputs: Any) -> list[str]:
    if not (
        isinstance(inputs, np.ndarray)
        and inputs.ndim == 1
        and all(isinstance(t, str) for t in inputs)
    ):
        raise wrong_kind("text-tfidf", "text: an (N,) array of strings", inputs)
    return list(inputs)
