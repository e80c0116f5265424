"""``text-tfidf``: raw text into sparse TF-IDF rows of word and, optionally, character n-grams.

Terms are those of scikit-learn's ``CountVectorizer``: its default word pattern of two or more
word characters and their n-grams, and ``char_wb`` n-grams inside word boundaries for
``char_ngrams``, fitted on the training rows only. The analyzers are written here, term for
term the same (tests/plugins/test_text_tfidf.py checks them against scikit-learn), because
``tailkit predict`` would otherwise import scikit-learn and scipy.stats, about two seconds, to
featurize a handful of rows. A term is kept when at least ``min_df`` training rows hold it, and
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

import re
from collections import Counter
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from tailkit.plugins.featurizers._inputs import frequent_columns, wrong_kind
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

    def _terms(self, kind: str, text: str) -> list[str]:
        lo, hi = self.ranges[kind]
        if self.lowercase:
            text = text.lower()
        if kind == "word":
            return word_ngrams(text, lo, hi)
        return char_wb_ngrams(text, lo, hi)

    def fit(self, inputs: Any) -> TextTfidf:
        texts = _texts(inputs)
        vocabularies, dfs = [], []
        for kind in self.ranges:
            df: Counter[str] = Counter()
            for text in texts:
                df.update(set(self._terms(kind, text)))
            vocabulary = np.array(sorted(df), dtype=object)  # alphabetical, as scikit-learn
            vocabularies.append(vocabulary)
            dfs.append(np.array([df[t] for t in vocabulary], dtype=np.int64))
        df_all = np.concatenate(dfs)
        keep = frequent_columns(df_all, self.min_df, self.max_features)
        if keep.size == 0:
            raise ValueError(
                f"featurizer 'text-tfidf': no term is in at least min_df={self.min_df} of the "
                f"{len(texts):,} training rows"
            )
        bounds = np.cumsum([0, *(v.size for v in vocabularies)])
        self.terms = {
            kind: vocabularies[i][keep[(keep >= bounds[i]) & (keep < bounds[i + 1])] - bounds[i]]
            for i, kind in enumerate(self.ranges)
        }
        self.idf = np.log((1.0 + len(texts)) / (1.0 + df_all[keep])) + 1.0
        return self

    def transform(self, inputs: Any) -> sp.csr_matrix:
        if self.idf is None:
            raise RuntimeError("TextTfidf.transform called before fit")
        texts = _texts(inputs)
        columns: dict[str, int] = {}
        for kind in self.ranges:  # one column space: word terms first, then character terms
            prefix = "w" if kind == "word" else "c"
            for t in self.terms[kind]:
                columns[prefix + str(t)] = len(columns)
        indptr, indices, values = [0], [], []
        for text in texts:
            found: Counter[int] = Counter()
            for kind in self.ranges:
                prefix = "w" if kind == "word" else "c"
                for t in self._terms(kind, text):
                    j = columns.get(prefix + t)
                    if j is not None:
                        found[j] += 1
            present = sorted(found)
            indices += present
            values += [found[j] for j in present]
            indptr.append(len(indices))
        counts = np.asarray(values, dtype=np.float64)
        ids = np.asarray(indices, dtype=np.int64)
        tf = 1.0 + np.log(counts) if self.sublinear_tf else counts
        weights = tf * self.idf[ids]
        rows = np.repeat(np.arange(len(texts)), np.diff(indptr))
        norms = np.sqrt(np.bincount(rows, weights=weights * weights, minlength=len(texts)))
        return sp.csr_matrix(
            ((weights / norms[rows]).astype(np.float32), ids, np.asarray(indptr, np.int64)),
            shape=(len(texts), int(self.idf.size)),
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


# scikit-learn's default token: two or more word characters.
_TOKEN = re.compile(r"(?u)\b\w\w+\b")
_SPACES = re.compile(r"\s\s+")


def word_ngrams(text: str, low: int, high: int) -> list[str]:
    """scikit-learn's word analyzer (``CountVectorizer(analyzer="word")``) on a preprocessed
    text: its default tokens, then their n-grams for n in [low, high] joined by a space, the
    unigrams first."""
    tokens = _TOKEN.findall(text)
    if high == 1:
        return tokens
    out = list(tokens) if low == 1 else []
    for n in range(max(low, 2), min(high, len(tokens)) + 1):
        out += [" ".join(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return out


def char_wb_ngrams(text: str, low: int, high: int) -> list[str]:
    """scikit-learn's ``char_wb`` analyzer on a preprocessed text: each whitespace-separated
    word padded with one space either side, its character n-grams for n in [low, high]; a word
    shorter than n gives itself once and no longer n-grams."""
    out = []
    for word in _SPACES.sub(" ", text).split():
        padded = f" {word} "
        for n in range(low, high + 1):
            last = max(len(padded) - n, 0)
            out += [padded[i : i + n] for i in range(last + 1)]
            if last == 0:
                break
    return out


def _texts(inputs: Any) -> list[str]:
    if not (
        isinstance(inputs, np.ndarray)
        and inputs.ndim == 1
        and all(isinstance(t, str) for t in inputs)
    ):
        raise wrong_kind("text-tfidf", "text: an (N,) array of strings", inputs)
    return list(inputs)
