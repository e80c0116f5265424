"""Generated tables of the kind a user brings: short texts or vectors with a Zipf-distributed
label among ``labels`` (or a list of 1–3 of them), for tests, studies and benchmarks of the
``table`` dataset.

Each label owns a few words (or a direction, for vectors) that its rows carry among noise, so
a linear model has something to learn and the tail labels are rare but not hopeless.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import polars as pl


def _label_sets(rows: int, labels: int, multilabel: bool, rng: np.random.Generator) -> list:
    prior = 1.0 / np.arange(1, labels + 1) ** 1.1
    prior /= prior.sum()
    sizes = rng.integers(1, 4, size=rows) if multilabel else np.ones(rows, dtype=np.int64)
    return [sorted(set(rng.choice(labels, size=k, p=prior).tolist())) for k in sizes]


def zipf_text_table(
    rows: int, labels: int = 50, *, multilabel: bool = False, seed: int = 0
) -> pl.DataFrame:
    """Columns ``text`` (a few words) and ``label`` (``topic-007``, or a list of such)."""
    import polars as pl

    rng = np.random.default_rng(seed)
    vocabulary = np.array([f"w{i}" for i in range(max(400, 8 * labels))])
    texts, names = [], []
    for ys in _label_sets(rows, labels, multilabel, rng):
        words = [
            vocabulary[(y * 7 + j) % vocabulary.size] for y in ys for j in rng.integers(5, size=3)
        ]
        words += rng.choice(vocabulary, size=3).tolist()
        rng.shuffle(words)
        texts.append(" ".join(words))
        tags = [f"topic-{y:03d}" for y in ys]
        names.append(tags if multilabel else tags[0])
    return pl.DataFrame({"text": texts, "label": names})


def zipf_vector_table(
    rows: int, labels: int = 50, dim: int = 16, *, multilabel: bool = False, seed: int = 0
) -> pl.DataFrame:
    """Columns ``embedding`` (``dim`` float32 values) and ``label`` (an integer, or a list)."""
    import polars as pl

    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((labels, dim)).astype(np.float32)
    vectors, names = [], []
    for ys in _label_sets(rows, labels, multilabel, rng):
        x = centres[ys].sum(axis=0) + 0.5 * rng.standard_normal(dim).astype(np.float32)
        vectors.append(x.tolist())
        names.append(ys if multilabel else ys[0])
    return pl.DataFrame(
        {"embedding": vectors, "label": names},
        schema_overrides={"embedding": pl.List(pl.Float32)},
    )
