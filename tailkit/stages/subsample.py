"""Stage ``subsample``: stratified validation/test splits, then a long-tail training profile.

Held-out rows are split off first, per class (or a fixed number per class with
``balanced_test``), so that a long-tail profile changes only the training pool, as the
CIFAR-LT recipe leaves the test set alone. The profile then keeps, for the class of rank r
(classes ranked by training-pool size, ties by id):

* ``natural``: every row;
* ``exp``: ``floor(n_max · ratio^(-r/(C-1)))`` rows (LDAM-DRW's ``imb_type='exp'``);
* ``step``: ``n_max`` for the first half of the ranks and ``floor(n_max / ratio)`` for the rest,

capped by what the class has. Rows within a class are taken in a seeded random order. A class
left with fewer than ``min_class_count`` training rows is an error, before anything is written.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tailkit.atomic import atomic_dir, write_json
from tailkit.errors import DataValidationError
from tailkit.params import Params, SubsampleParams
from tailkit.paths import Layout, require
from tailkit.registry import Registry
from tailkit.stages.download import raw_dir

SPLITS = ("train", "val", "test")


def _round_half_up(x: np.ndarray) -> np.ndarray:
    return np.floor(x + 0.5).astype(np.int64)


def profile_quota(pool: np.ndarray, p: SubsampleParams) -> np.ndarray:
    """Training rows to keep per class, given each class's training-pool size."""
    if p.profile == "natural":
        return pool.copy()
    num_classes = pool.shape[0]
    rank_order = np.lexsort((np.arange(num_classes), -pool))  # largest pool first, ties by id
    n_max = int(pool.max())
    ranks = np.arange(num_classes)
    if p.profile == "exp":
        target = np.floor(n_max * p.imbalance_ratio ** (-ranks / max(num_classes - 1, 1)))
    else:  # step
        target = np.where(ranks < num_classes // 2, n_max, np.floor(n_max / p.imbalance_ratio))
    quota = np.empty(num_classes, dtype=np.int64)
    quota[rank_order] = target.astype(np.int64)
    return np.minimum(quota, pool)


def split_rows(labels: np.ndarray, num_classes: int, p: SubsampleParams) -> dict[str, np.ndarray]:
    """Row indices of each split (sorted), per the module docstring."""
    counts = np.bincount(labels, minlength=num_classes)
    if p.balanced_test:
        n_test = np.minimum(p.test_per_class, np.maximum(counts - 1, 0))
    else:
        n_test = np.minimum(_round_half_up(counts * p.test_fraction), np.maximum(counts - 1, 0))
    n_val = np.minimum(_round_half_up(counts * p.val_fraction), np.maximum(counts - 1 - n_test, 0))
    quota = profile_quota(counts - n_test - n_val, p)

    short = np.flatnonzero(quota < p.min_class_count)
    if short.size:
        c = int(short[0])
        raise DataValidationError(
            f"subsample: {short.size} of {num_classes} classes keep fewer than "
            f"min_class_count={p.min_class_count} training rows (e.g. class id {c} keeps "
            f"{int(quota[c])} of {int(counts[c])}) with profile={p.profile!r}, "
            f"imbalance_ratio={p.imbalance_ratio:g}; lower subsample.imbalance_ratio or "
            "subsample.val_fraction/test_fraction"
        )

    rng = np.random.default_rng(p.seed)
    order = np.lexsort((rng.random(labels.shape[0]), labels))  # by class, random within
    start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    sorted_labels = labels[order]
    rank = np.arange(labels.shape[0]) - start[sorted_labels]
    test_end = n_test[sorted_labels]
    val_end = test_end + n_val[sorted_labels]
    train_end = val_end + quota[sorted_labels]
    masks = {
        "test": rank < test_end,
        "val": (rank >= test_end) & (rank < val_end),
        "train": (rank >= val_end) & (rank < train_end),
    }
    return {name: np.sort(order[mask]) for name, mask in masks.items()}


def _write_split(path: Path, rows: np.ndarray, labels: np.ndarray) -> None:
    table = pa.table({"row_id": pa.array(rows, pa.int64()), "label": pa.array(labels, pa.int64())})
    pq.write_table(table, path, compression="zstd")


def read_split(split_dir: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    table = pq.read_table(split_dir / f"{name}.parquet")
    return table["row_id"].to_numpy(), table["label"].to_numpy()


def read_meta(directory: Path) -> dict[str, Any]:
    """The meta.json that subsample writes and featurize extends."""
    producer = "featurize" if directory.name == "features" else "subsample"
    return json.loads(require(directory / "meta.json", producer).read_text())


def run(params: Params, layout: Layout, registry: Registry) -> dict[str, Any]:
    dataset = registry.build("datasets", params.dataset, "dataset")
    raw = dataset.load(raw_dir(layout, params))
    labels = np.asarray(raw.labels, dtype=np.int64)
    rows = split_rows(labels, raw.num_classes, params.subsample)
    meta: dict[str, Any] = {
        "dataset": params.dataset,
        "subsample": {**params.subsample.__dict__},
        "num_classes": raw.num_classes,
        "label_names": list(raw.label_names),
    }
    with atomic_dir(layout.split) as tmp:
        for name in SPLITS:
            _write_split(tmp / f"{name}.parquet", rows[name], labels[rows[name]])
            meta[f"{name}_counts"] = np.bincount(
                labels[rows[name]], minlength=raw.num_classes
            ).tolist()
        write_json(tmp / "meta.json", meta)
    return meta
