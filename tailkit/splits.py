"""The split files, ``labels.parquet`` and ``meta.json`` of ``data/split/`` (written by
subsample, read downstream).

One place for their format, so that the stages that read them depend on this module and not
on the subsample stage's code (editing how subsample draws rows must not re-run a reader).
``meta.json`` holds scalars only (its size does not grow with C); everything per label lives
in ``labels.parquet``, one row per label id: ``label``, ``name`` and the ``train_count``,
``val_count``, ``test_count`` of the split (rows carrying the label). featurize@<set> carries
both into ``data/features/<set>/``: the same reader serves both folders.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tailkit.labels import LabelSets
from tailkit.paths import require

SPLITS = ("train", "val", "test")


def write_split(path: Path, rows: np.ndarray, labels: np.ndarray | LabelSets) -> None:
    """Row ids (int64) and labels: int64, or ``list<int32>`` for multi-label rows."""
    multi = isinstance(labels, LabelSets)
    column = labels.to_arrow() if multi else pa.array(labels, pa.int64())
    table = pa.table({"row_id": pa.array(rows, pa.int64()), "label": column})
    pq.write_table(table, path, compression="zstd")


def read_split(split_dir: Path, name: str) -> tuple[np.ndarray, np.ndarray | LabelSets]:
    """Row ids and labels of a split: (N,) int64 ids, or :class:`LabelSets` for multi-label."""
    table = pq.read_table(split_dir / f"{name}.parquet")
    column = table["label"].combine_chunks()
    if pa.types.is_list(column.type):
        labels = LabelSets.from_arrow(column, read_meta(split_dir)["num_classes"])
        return table["row_id"].to_numpy(), labels
    return table["row_id"].to_numpy(), column.to_numpy()


LABELS = "labels.parquet"


def write_labels(directory: Path, names: list[str], counts: dict[str, np.ndarray]) -> None:
    """The per-label table: ids, names and ``counts[split]`` as ``<split>_count``."""
    columns = {
        "label": pa.array(np.arange(len(names)), pa.int64()),
        "name": pa.array([str(n) for n in names], pa.string()),
        **{f"{split}_count": pa.array(counts[split], pa.int64()) for split in SPLITS},
    }
    pq.write_table(pa.table(columns), directory / LABELS, compression="zstd")


def _producer(directory: Path) -> str:
    return f"featurize@{directory.name}" if directory.parent.name == "features" else "subsample"


def read_labels(directory: Path, columns: list[str] | None = None) -> pa.Table:
    """The per-label table of a split or feature-set folder (all columns, or ``columns``)."""
    return pq.read_table(require(directory / LABELS, _producer(directory)), columns=columns)


def read_meta(directory: Path) -> dict[str, Any]:
    """The scalars of meta.json, plus ``<split>_counts`` (C,) int64 arrays from the label table
    (label names: :func:`read_labels`)."""
    meta = json.loads(require(directory / "meta.json", _producer(directory)).read_text())
    table = read_labels(directory, [f"{split}_count" for split in SPLITS])
    for split in SPLITS:
        # a writable copy: Arrow's zero-copy view is read-only, and torch warns on those
        meta[f"{split}_counts"] = table[f"{split}_count"].to_numpy().copy()
    return meta
