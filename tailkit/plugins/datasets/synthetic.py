"""A synthetic long-tail dataset with a known label hierarchy, for any number of classes.

Real data fixes C; this one lets an experiment sweep it (up to 10^6 and beyond) while keeping
what makes extreme classification hard: a Zipf-distributed label frequency and labels whose
similarity follows a tree, which is what tree-structured negative samplers exploit and what
tests of them need as ground truth.

Generative model (all draws from ``seed``):

* A complete ``branching``-ary tree of depth L = ceil(log_b C). The root's children (level 1)
  get centres ~ N(0, I); a node at level k ≥ 2 gets its parent's centre plus an offset
  ~ N(0, (level_scale^(k-1))² I), i.e. the offsets' standard deviation shrinks by
  ``level_scale`` per level. Labels are the first C leaves (level L, in breadth-first order).
* Label id = frequency rank r (id 0 is the most frequent), p_r ∝ (r+1)^(−zipf_exponent), and
  n_r = max(min_per_class, floor(num_examples · p_r)) rows; ``num_examples`` is therefore a
  nominal total, the real N is Σ n_r. Ranks are assigned to leaves by a random permutation, so
  head labels are spread over the tree rather than packed into one subtree.
* A row of label r is its leaf's centre + ``noise`` · N(0, I); rows are in random order.

The tree, the rank-to-leaf assignment and the rows use independent child streams of
``SeedSequence(seed)``, so changing ``num_examples`` or ``noise`` does not move the centres.
Centres are float32 and only the nodes that are ancestors of the C labelled leaves are built,
one level at a time, so memory peaks near (C + N) · dim · 4 bytes (≈ 0.3 GB at C = N = 10^6,
dim = 32), and rows are drawn in chunks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from tailkit.components import RawData
from tailkit.errors import DataValidationError
from tailkit.storage.atomic import atomic_path, write_json
from tailkit.validation import SEED, Interval

DATA = "synthetic.npz"
META = "meta.json"
# Rows drawn per chunk (bounds the temporary noise array). Part of the generated data's
# definition: changing it changes the rows a seed gives.
_ROW_CHUNK = 65_536


def tree_depth(num_classes: int, branching: int) -> int:
    """ceil(log_b C) in exact integer arithmetic (at least 1)."""
    depth, leaves = 1, branching
    while leaves < num_classes:
        depth, leaves = depth + 1, leaves * branching
    return depth


def class_counts(
    num_classes: int, num_examples: int, zipf_exponent: float, min_per_class: int
) -> np.ndarray:
    """Rows per label id (= rank): max(min_per_class, floor(num_examples · p_r))."""
    p = np.arange(1, num_classes + 1, dtype=np.float64) ** -zipf_exponent
    p /= p.sum()
    return np.maximum(min_per_class, np.floor(num_examples * p)).astype(np.int64)


@dataclass
class Hierarchy:
    """Where each label sits in the tree.

    ``leaf_of_label[r]`` is the breadth-first index of label r's leaf at level ``depth``; the
    ancestor of a leaf ``j`` at level k (1 = the root's children) is ``j // branching^(depth-k)``.
    """

    branching: int
    depth: int
    leaf_of_label: np.ndarray

    def paths(self) -> np.ndarray:
        """(C, depth) int64: node index of each label's ancestor at levels 1..depth (leaf last)."""
        powers = self.branching ** np.arange(self.depth - 1, -1, -1, dtype=np.int64)
        return self.leaf_of_label[:, None] // powers[None, :]


@dataclass
class SyntheticData:
    """Everything :func:`generate` draws; ``centres`` (C, dim) are the labels' leaf centres."""

    inputs: np.ndarray
    labels: np.ndarray
    centres: np.ndarray
    hierarchy: Hierarchy


def generate(
    num_classes: int,
    num_examples: int,
    dim: int,
    branching: int,
    zipf_exponent: float,
    level_scale: float,
    noise: float,
    min_per_class: int,
    seed: int,
) -> SyntheticData:
    """Draw the dataset described in the module docstring (pure function of its arguments)."""
    tree_rng, rank_rng, row_rng = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3)
    )
    depth = tree_depth(num_classes, branching)

    # Level by level, only the ancestors of leaves 0..C-1: level k needs ceil(C / b^(L-k)).
    centres = np.zeros((1, dim), dtype=np.float32)  # the root, at the origin
    for level in range(1, depth + 1):
        width = -(-num_classes // branching ** (depth - level))
        child = tree_rng.standard_normal((width, dim), dtype=np.float32)
        child *= np.float32(level_scale ** (level - 1))
        # Node j's parent is j // b: add parents by broadcasting over blocks of b siblings
        # (no (width, dim) gather temporary), then the last, partial block.
        full = width // branching
        child[: full * branching].reshape(full, branching, dim)[...] += centres[:full, None, :]
        if width > full * branching:
            child[full * branching :] += centres[full]
        centres = child

    leaf_of_label = rank_rng.permutation(num_classes).astype(np.int64)
    centres = centres[leaf_of_label]  # reorder to label-id order: row r = label r's centre

    counts = class_counts(num_classes, num_examples, zipf_exponent, min_per_class)
    labels = row_rng.permutation(np.repeat(np.arange(num_classes, dtype=np.int64), counts))
    inputs = np.empty((labels.size, dim), dtype=np.float32)
    for start in range(0, labels.size, _ROW_CHUNK):
        block = inputs[start : start + _ROW_CHUNK]
        row_rng.standard_normal(block.shape, dtype=np.float32, out=block)
        block *= np.float32(noise)
        block += centres[labels[start : start + _ROW_CHUNK]]
    return SyntheticData(
        inputs=inputs,
        labels=labels,
        centres=centres,
        hierarchy=Hierarchy(branching=branching, depth=depth, leaf_of_label=leaf_of_label),
    )


class HierarchicalGaussian:
    """Synthetic hierarchical Gaussian mixture: labels are the leaves of a tree of cluster centres, Zipf-distributed.

    See :mod:`tailkit.plugins.datasets.synthetic` for the generative model. ``fetch`` generates
    and writes ``synthetic.npz`` (inputs, labels, leaf_of_label; uncompressed, since Gaussian
    noise does not compress) and ``meta.json`` (the options, C, N, tree depth).
    """

    constraints: ClassVar[dict[str, Interval]] = {
        "num_classes": Interval(2, None),
        # rows are int64 ids in memory: past 2^31 no machine holds them, so say so here
        "num_examples": Interval(1, 2**31 - 1),
        "dim": Interval(1, None),
        "branching": Interval(2, None),
        "zipf_exponent": Interval(0, None),
        "level_scale": Interval(0, None, closed="neither"),
        "noise": Interval(0, None),
        "min_per_class": Interval(1, None),
        "seed": SEED,
    }

    def __init__(
        self,
        num_classes: int = 1000,
        num_examples: int = 100_000,
        dim: int = 32,
        branching: int = 8,
        zipf_exponent: float = 1.0,
        level_scale: float = 0.5,
        noise: float = 0.3,
        min_per_class: int = 1,
        seed: int = 0,
    ) -> None:
        self.options: dict[str, Any] = {
            "num_classes": num_classes,
            "num_examples": num_examples,
            "dim": dim,
            "branching": branching,
            "zipf_exponent": zipf_exponent,
            "level_scale": level_scale,
            "noise": noise,
            "min_per_class": min_per_class,
            "seed": seed,
        }

    def generate(self) -> SyntheticData:
        return generate(**self.options)

    def fetch(self, dest: Path) -> None:
        dest = Path(dest)
        data = self.generate()
        dest.mkdir(parents=True, exist_ok=True)
        with atomic_path(dest / DATA) as tmp, tmp.open("wb") as fh:
            # A file object, because np.savez appends ".npz" to a path that lacks it.
            np.savez(
                fh,
                inputs=data.inputs,
                labels=data.labels,
                leaf_of_label=data.hierarchy.leaf_of_label,
            )
        write_json(
            dest / META,
            {
                "options": self.options,
                "num_classes": int(data.centres.shape[0]),
                "num_rows": int(data.labels.size),
                "depth": data.hierarchy.depth,
                "branching": data.hierarchy.branching,
                "leaf_of_label": f"array 'leaf_of_label' in {DATA}",
            },
        )

    def load(self, raw_dir: Path) -> RawData:
        """Inputs (N, dim) float32, label ids = frequency ranks, names ``leaf-<leaf index>``."""
        inputs, labels, hierarchy = _read(Path(raw_dir))
        width = max(6, len(str(hierarchy.leaf_of_label.size - 1)))
        names = [f"leaf-{leaf:0{width}d}" for leaf in hierarchy.leaf_of_label.tolist()]
        return RawData(inputs=inputs, labels=labels, label_names=names)


def load_hierarchy(raw_dir: str | Path) -> Hierarchy:
    """The label tree of a fetched synthetic dataset (for samplers and tests that need it)."""
    return _read(Path(raw_dir))[2]


def _read(raw_dir: Path) -> tuple[np.ndarray, np.ndarray, Hierarchy]:
    meta_path, data_path = raw_dir / META, raw_dir / DATA
    try:
        meta = json.loads(meta_path.read_text())
        depth, branching, c, n = (
            int(meta[k]) for k in ("depth", "branching", "num_classes", "num_rows")
        )
    except FileNotFoundError as exc:
        raise DataValidationError(
            f"{meta_path}: not found; run `dvc repro download` first"
        ) from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise DataValidationError(f"{meta_path}: malformed ({exc!r})") from exc
    try:
        with np.load(data_path, allow_pickle=False) as npz:
            inputs, labels, leaf = npz["inputs"], npz["labels"], npz["leaf_of_label"]
    except FileNotFoundError as exc:
        raise DataValidationError(
            f"{data_path}: not found; run `dvc repro download` first"
        ) from exc
    except (OSError, ValueError, KeyError) as exc:
        raise DataValidationError(f"{data_path}: unreadable ({exc})") from exc
    if (
        inputs.dtype != np.float32
        or inputs.shape[:1] != (n,)
        or inputs.ndim != 2
        or labels.shape != (n,)
        or leaf.shape != (c,)
        or labels.dtype != np.int64
        or leaf.dtype != np.int64
    ):
        raise DataValidationError(f"{data_path}: arrays do not match {meta_path}")
    if n and (labels.min() < 0 or labels.max() >= c):
        raise DataValidationError(f"{data_path}: label ids outside [0, {c})")
    return inputs, labels, Hierarchy(branching=branching, depth=depth, leaf_of_label=leaf)
