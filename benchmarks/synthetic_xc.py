"""A seeded synthetic multi-label set in the Extreme Classification Repository's legacy format.

    python benchmarks/synthetic_xc.py OUT_DIR [--train 60000] [--test 15000] [--seed 0]

Writes ``OUT_DIR/train.txt`` and ``OUT_DIR/test.txt`` (header ``N D L``, then per row
``l1,l2,... f:v f:v ...``, zero-based ids), which the ``xc`` dataset reads with ``path:
OUT_DIR``. The generative model is the one the XC benchmarks' bag-of-words sets resemble:

* 10,000 labels with power-law frequencies, p(l) ∝ (l + 1)^−1 (the head label in 20 % of the
  rows, the median label in 5 of 75,000, 7 labels in 8 in fewer than 15 training rows),
  grouped into clusters of 20 related labels;
* about 3 labels a row: the first drawn from p, each further one (Poisson(2) of them) from the
  first one's cluster with probability 0.5 (labels co-occur, as a label tree assumes), else from
  p again;
* 30,000 word features: each label owns 10 words of its own and shares a pool of 40 with its
  cluster; a row draws 6 words from each of its labels' own words and 6 from their cluster's
  pool, plus Poisson(25) background words from a Zipf-distributed vocabulary, and stores the
  counts.

Everything is a function of ``seed`` and the sizes; the same call writes the same bytes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from tailkit.plugins.datasets.xc_decode import write_legacy

LABELS = 10_000
FEATURES = 30_000
CLUSTER = 20  # labels per cluster
OWN_WORDS = 10
POOL_WORDS = 40


def generate(rows: int, seed: int) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    """(rows, FEATURES) word counts and (rows, LABELS) 0/1 labels, both CSR with sorted ids."""
    rng = np.random.default_rng(seed)
    # the vocabulary and the label → word tables are the dataset's, not the rows': fixed seed
    vocab = np.random.default_rng(12345)
    own = vocab.integers(0, FEATURES, size=(LABELS, OWN_WORDS))
    pools = vocab.integers(0, FEATURES, size=(LABELS // CLUSTER, POOL_WORDS))
    prior = 1.0 / np.arange(1, LABELS + 1)
    prior /= prior.sum()
    background = 1.0 / np.arange(1, FEATURES + 1) ** 1.1
    background /= background.sum()

    first = rng.choice(LABELS, size=rows, p=prior)
    extra = rng.poisson(2.0, size=rows)
    owner = np.repeat(np.arange(rows), extra)
    same_cluster = rng.random(owner.size) < 0.5
    in_cluster = (first[owner] // CLUSTER) * CLUSTER + rng.integers(0, CLUSTER, owner.size)
    anywhere = rng.choice(LABELS, size=owner.size, p=prior)
    label_rows = np.concatenate([np.arange(rows), owner])
    label_ids = np.concatenate([first, np.where(same_cluster, in_cluster, anywhere)])
    y = sp.csr_matrix(
        (np.ones(label_ids.size, np.float32), (label_rows, label_ids)), shape=(rows, LABELS)
    )
    y.sum_duplicates()
    y.data[:] = 1.0

    # words: 6 own and 6 cluster words per (row, label), then the background
    pair_rows = np.repeat(np.arange(rows), np.diff(y.indptr))
    pair_labels = y.indices
    own_words = own[pair_labels[:, None], rng.integers(0, OWN_WORDS, (pair_labels.size, 6))]
    pool_words = pools[
        (pair_labels // CLUSTER)[:, None], rng.integers(0, POOL_WORDS, (pair_labels.size, 6))
    ]
    n_background = rng.poisson(25.0, size=rows)
    word_rows = np.concatenate(
        [np.repeat(pair_rows, 6), np.repeat(pair_rows, 6), np.repeat(np.arange(rows), n_background)]
    )
    words = np.concatenate(
        [
            own_words.ravel(),
            pool_words.ravel(),
            rng.choice(FEATURES, size=int(n_background.sum()), p=background),
        ]
    )
    x = sp.csr_matrix((np.ones(words.size, np.float32), (word_rows, words)), shape=(rows, FEATURES))
    x.sum_duplicates()  # counts; also sorts each row's ids
    return x, y


def write(out: Path, train: int = 60_000, test: int = 15_000, seed: int = 0) -> Path:
    """Generate ``train + test`` rows and write the two files under ``out``; returns ``out``."""
    x, y = generate(train + test, seed)
    out.mkdir(parents=True, exist_ok=True)
    write_legacy(out / "train.txt", x[:train], y[:train])
    write_legacy(out / "test.txt", x[train:], y[train:])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--train", type=int, default=60_000)
    parser.add_argument("--test", type=int, default=15_000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    write(args.out, args.train, args.test, args.seed)


if __name__ == "__main__":
    main()
