"""``text-tfidf`` against TF-IDF computed by hand in float64 (Python's Counter over the same
tokens), its deterministic vocabulary cut, and its fitted state restored as data."""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np
import pytest

from tailkit.plugins.featurizers.text_tfidf import TextTfidf
from tailkit.storage.featurizer_state import read_state, write_state

TRAIN = np.array(
    [
        "The tail label is rare",
        "head labels are common, the head is common",
        "a rare tail; a RARE word",
        "common words in the head",
        "",
    ],
    dtype=object,
)
NEW = np.array(["rare head words", "nothing known here", "tail tail tail"], dtype=object)


def _tokens(text: str) -> list[str]:
    return re.findall(r"(?u)\b\w\w+\b", text.lower())  # scikit-learn's default word pattern


def _by_hand(train, rows, sublinear: bool, min_df: int = 1):
    """Terms (sorted) and the (rows, terms) TF-IDF matrix, in float64, from the formula."""
    df = Counter(t for text in train for t in set(_tokens(text)))
    terms = sorted(t for t, d in df.items() if d >= min_df)
    n = len(train)
    idf = {t: math.log((1 + n) / (1 + df[t])) + 1 for t in terms}
    out = np.zeros((len(rows), len(terms)))
    for i, text in enumerate(rows):
        for t, c in Counter(_tokens(text)).items():
            if t in idf:
                tf = 1 + math.log(c) if sublinear else c
                out[i, terms.index(t)] = tf * idf[t]
        norm = math.sqrt((out[i] ** 2).sum())
        if norm:
            out[i] /= norm
    return terms, out


@pytest.mark.parametrize("sublinear", [True, False])
@pytest.mark.parametrize("min_df", [1, 2])
def test_word_tfidf_matches_the_formula(sublinear, min_df):
    featurizer = TextTfidf(sublinear_tf=sublinear, min_df=min_df).fit(TRAIN)
    terms, expected = _by_hand(TRAIN, np.concatenate([TRAIN, NEW]), sublinear, min_df)
    assert featurizer.terms["word"].tolist() == terms
    got = featurizer.transform(np.concatenate([TRAIN, NEW]))
    assert got.dtype == np.float32 and got.has_sorted_indices
    np.testing.assert_allclose(got.toarray(), expected, rtol=1e-6, atol=1e-7)
    assert got[len(TRAIN) + 1].nnz == 0  # no known term: an empty row
    assert got[len(TRAIN) - 1].nnz == 0  # the empty text


def test_max_features_keeps_the_most_frequent_terms_lower_first_on_ties():
    featurizer = TextTfidf(max_features=3).fit(TRAIN)
    # df: the 3, common 2, head 2, rare 2, tail 2, ...: the tie at 2 goes alphabetically
    assert featurizer.terms["word"].tolist() == ["common", "head", "the"]


def test_word_and_character_ngrams_sit_side_by_side():
    featurizer = TextTfidf(word_ngrams=[1, 2], char_ngrams=[3, 3]).fit(TRAIN)
    words, chars = featurizer.terms["word"], featurizer.terms["char"]
    assert "tail label" in words and " ta" in chars and "ail" in chars
    x = featurizer.transform(NEW)
    assert x.shape == (3, words.size + chars.size)
    np.testing.assert_allclose(np.sqrt(x.multiply(x).sum(axis=1)).A1, 1.0, rtol=1e-6)


def test_the_state_restores_the_same_bits(tmp_path):
    fitted = TextTfidf(word_ngrams=[1, 2], char_ngrams=[2, 4], max_features=40).fit(TRAIN)
    write_state(tmp_path / "state.parquet", fitted.fitted_state(), "text-tfidf")
    restored = TextTfidf(word_ngrams=[1, 2], char_ngrams=[2, 4], max_features=40)
    restored.restore_state(read_state(tmp_path / "state.parquet"))
    a, b = fitted.transform(NEW), restored.transform(NEW)
    assert (a.indptr == b.indptr).all() and (a.indices == b.indices).all()
    assert a.data.tobytes() == b.data.tobytes()
    with pytest.raises(ValueError, match="stored state"):
        TextTfidf().restore_state(read_state(tmp_path / "state.parquet"))  # no char terms


def test_refusals_are_one_line():
    with pytest.raises(ValueError, match=r"word_ngrams: got \[2, 1\]"):
        TextTfidf(word_ngrams=[2, 1])
    with pytest.raises(ValueError, match="accepts text"):
        TextTfidf().fit(np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match="no term is in at least min_df=9"):
        TextTfidf(min_df=9).fit(TRAIN)


ODD = [
    "Tuberculosis of spine; Pott's disease",
    "  tabs\tand\n\nnewlines   between  ",
    "Ünïcödé straße — ÉCOLE 3x 42 a",
    "x",
    "",
    "hyphen-ated words_with_underscores and digits 2024",
    "repeat repeat repeat repeat",
]


@pytest.mark.parametrize(
    ("analyzer", "ngrams"),
    [("word", (1, 1)), ("word", (1, 3)), ("word", (2, 3)), ("char_wb", (1, 1)),
     ("char_wb", (2, 5)), ("char_wb", (3, 3))],
)  # fmt: skip
def test_the_analyzers_are_scikit_learns_term_for_term(analyzer, ngrams):
    """The hand-written analyzers (written so that predict does not import scikit-learn)
    give scikit-learn's terms, in its order, on odd texts: whitespace runs, unicode, one-letter
    words, the empty text."""
    from sklearn.feature_extraction.text import CountVectorizer

    from tailkit.plugins.featurizers.text_tfidf import char_wb_ngrams, word_ngrams

    reference = CountVectorizer(analyzer=analyzer, ngram_range=ngrams).build_analyzer()
    ours = word_ngrams if analyzer == "word" else char_wb_ngrams
    for text in [*ODD, *TRAIN]:
        assert ours(text.lower(), *ngrams) == reference(text), text


def test_counts_match_scikit_learns_vectorizer():
    from sklearn.feature_extraction.text import CountVectorizer, TfidfTransformer

    texts = np.array([*ODD, *TRAIN], dtype=object)
    ours = TextTfidf(word_ngrams=[1, 2], min_df=1).fit(texts)
    counts = CountVectorizer(ngram_range=(1, 2)).fit(texts)
    assert ours.terms["word"].tolist() == counts.get_feature_names_out().tolist()
    reference = TfidfTransformer(sublinear_tf=True).fit_transform(counts.transform(texts))
    np.testing.assert_allclose(ours.transform(texts).toarray(), reference.toarray(), rtol=1e-6)
