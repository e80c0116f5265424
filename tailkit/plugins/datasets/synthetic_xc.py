"""A seeded synthetic multi-label bag-of-words set shaped like an Extreme Classification
Repository dataset, generated in the download stage (``dataset: {name: synthetic-xc, ...}``).

The repository's data cannot be downloaded here (its hosts need a browser), and a study at its
scale must still run end to end: this generator gives any shape — Amazon-670K's 670,091 labels,
135,909 features and 490,449 / 153,025 rows included — with what makes those sets hard. The
generative model is the one their bag-of-words sets resemble:

* ``num_labels`` labels with power-law frequencies, p(l) ∝ (l + 1)^−1 (label id = frequency
  rank: at 10,000 labels the head label is in 20 % of the rows and 7 labels in 8 have fewer
  than 15 training rows), grouped into clusters of 20 related labels;
* about ``labels_per_row`` labels a row: the first drawn from p, each further one
  (Poisson(labels_per_row − 1) of them) from the first one's cluster with probability 0.5
  (labels co-occur, as a label tree assumes), else from p again; duplicates collapse;
* ``num_features`` word features: each label owns 10 words of its own and shares a pool of 40
  with its cluster; a row draws 6 words from each of its labels' own words and 6 from their
  cluster's pool, plus Poisson(25) background words from a Zipf(1.1) vocabulary, and stores
  the counts.

Everything is a function of ``seed`` and the sizes; the same call gives the same bytes. The
vocabulary and the label → word tables use a fixed seed of their own (they are the dataset's,
not the rows'). ``fetch`` writes the decoded copy the ``xc`` datasets write (training rows
first, then test rows), so loading, splits and metrics are theirs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import scipy.sparse as sp

from tailkit.errors import InvalidParameterError
from tailkit.plugins.datasets.xc import XC, write_decoded
from tailkit.plugins.datasets.xc_decode import split_stats
from tailkit.validation import SEED, Interval

CLUSTER = 20  # labels per cluster
OWN_WORDS = 10
POOL_WORDS = 40
WORDS_PER_LABEL = 6  # own words and pool words, each, per (row, label)
BACKGROUND_WORDS = 25.0
_VOCABULARY_SEED = 12345


def generate(
    rows: int,
    seed: int,
    num_labels: int = 10_000,
    num_features: int = 30_000,
    labels_per_row: float = 3.0,
) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """(rows, num_features) word counts and (rows, num_labels) 0/1 labels, both CSR float32
    with sorted ids (the model in the module docstring)."""
    rng = np.random.default_rng(seed)
    vocab = np.random.default_rng(_VOCABULARY_SEED)
    own = vocab.integers(0, num_features, size=(num_labels, OWN_WORDS))
    clusters = -(-num_labels // CLUSTER)
    pools = vocab.integers(0, num_features, size=(clusters, POOL_WORDS))
    prior = 1.0 / np.arange(1, num_labels + 1)
    prior /= prior.sum()
    background = 1.0 / np.arange(1, num_features + 1) ** 1.1
    background /= background.sum()

    first = rng.choice(num_labels, size=rows, p=prior)
    extra = rng.poisson(labels_per_row - 1.0, size=rows)
    owner = np.repeat(np.arange(rows), extra)
    same_cluster = rng.random(owner.size) < 0.5
    start = (first[owner] // CLUSTER) * CLUSTER
    if num_labels % CLUSTER == 0:
        in_cluster = start + rng.integers(0, CLUSTER, owner.size)
    else:  # the last cluster is partial: draw within it, never past num_labels
        in_cluster = start + rng.integers(0, np.minimum(CLUSTER, num_labels - start))
    anywhere = rng.choice(num_labels, size=owner.size, p=prior)
    label_rows = np.concatenate([np.arange(rows), owner])
    label_ids = np.concatenate([first, np.where(same_cluster, in_cluster, anywhere)])
    y = sp.csr_matrix(
        (np.ones(label_ids.size, np.float32), (label_rows, label_ids)), shape=(rows, num_labels)
    )
    y.sum_duplicates()
    y.data[:] = 1.0

    pair_rows = np.repeat(np.arange(rows), np.diff(y.indptr))
    pair_labels = y.indices
    picks = (pair_labels.size, WORDS_PER_LABEL)
    own_words = own[pair_labels[:, None], rng.integers(0, OWN_WORDS, picks)]
    pool_words = pools[(pair_labels // CLUSTER)[:, None], rng.integers(0, POOL_WORDS, picks)]
    n_background = rng.poisson(BACKGROUND_WORDS, size=rows)
    word_rows = np.concatenate(
        [
            np.repeat(pair_rows, WORDS_PER_LABEL),
            np.repeat(pair_rows, WORDS_PER_LABEL),
            np.repeat(np.arange(rows), n_background),
        ]
    )
    words = np.concatenate(
        [
            own_words.ravel(),
            pool_words.ravel(),
            rng.choice(num_features, size=int(n_background.sum()), p=background),
        ]
    )
    x = sp.csr_matrix(
        (np.ones(words.size, np.float32), (word_rows, words)), shape=(rows, num_features)
    )
    x.sum_duplicates()  # counts; also sorts each row's ids
    return x, y


class SyntheticXC(XC):
    """A synthetic XC-shaped multi-label bag-of-words set of any size, generated in ``fetch``.

    See :mod:`tailkit.plugins.datasets.synthetic_xc` for the model. The training rows come
    first, then the test rows, as the repository's trn/tst files give them; ``single_label``
    and ``propensity`` work as for the ``xc`` datasets.
    """

    constraints: ClassVar[dict[str, Interval]] = {
        "num_labels": Interval(2, None),
        "num_features": Interval(1, None),
        "num_train": Interval(1, None),
        "num_test": Interval(1, None),
        "labels_per_row": Interval(1, None),
        "seed": SEED,
    }

    def __init__(
        self,
        num_labels: int = 10_000,
        num_features: int = 30_000,
        num_train: int = 60_000,
        num_test: int = 15_000,
        labels_per_row: float = 3.0,
        propensity: tuple[float, float] | None = None,
        single_label: bool = False,
        seed: int = 0,
    ) -> None:
        super().__init__(single_label=single_label)
        self.options: dict[str, Any] = {
            "num_labels": num_labels,
            "num_features": num_features,
            "num_train": num_train,
            "num_test": num_test,
            "labels_per_row": labels_per_row,
            "seed": seed,
        }
        self._propensity: tuple[float, float] | None = None
        if propensity is not None:
            if len(propensity) != 2 or not all(v > 0 for v in propensity):
                raise InvalidParameterError(
                    f"dataset.propensity: got {propensity!r}; expected [A, B], both positive "
                    "(Jain et al.'s propensity model)"
                )
            self._propensity = (float(propensity[0]), float(propensity[1]))

    @property
    def name(self) -> str:
        return "synthetic-xc"

    @property
    def propensity(self) -> tuple[float, float]:
        return self._propensity if self._propensity is not None else super().propensity

    def fetch(self, dest: Path) -> None:
        o = self.options
        num_train = o["num_train"]
        x, y = generate(
            num_train + o["num_test"],
            o["seed"],
            num_labels=o["num_labels"],
            num_features=o["num_features"],
            labels_per_row=o["labels_per_row"],
        )
        meta = {
            "format": "synthetic",
            "num_features": o["num_features"],
            "num_labels": o["num_labels"],
            "splits": {
                "train": split_stats(x[:num_train], y[:num_train]),
                "test": split_stats(x[num_train:], y[num_train:]),
            },
            "options": o,
            "dataset": self.name,
            "propensity": {"a": self.propensity[0], "b": self.propensity[1]},
        }
        write_decoded(Path(dest), x, y, meta)
