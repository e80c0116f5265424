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
from typing import TYPE_CHECKING, Any

import numpy as np
import polars as pl
import pyarrow as pa

from tailkit.csr import is_label_sets
from tailkit.paths import require
from tailkit.storage import parquet
from tailkit.storage.label_table import read_label_table, write_label_table

if TYPE_CHECKING:  # labels.py imports torch, which the report (reading only counts) never needs
    from tailkit.labels import LabelSets

SPLITS = ("train", "val", "test")


def write_split(path: Path, rows: np.ndarray, labels: np.ndarray | LabelSets) -> None:
    """Row ids (int64) and labels: int64, or ``list<int32>`` for multi-label rows."""
    column = labels.to_arrow() if is_label_sets(labels) else pa.array(labels, pa.int64())
    table = pa.table({"row_id": pa.array(rows, pa.int64()), "label": column})
    parquet.write_table(table, path, compression="zstd")  # with page checksums


def read_split(split_dir: Path, name: str) -> tuple[np.ndarray, np.ndarray | LabelSets]:
    """Row ids and labels of a split: (N,) int64 ids, or :class:`LabelSets` for multi-label.
    A corrupt file (a page failing its checksum, say) is one line naming it and its stage."""
    path = split_dir / f"{name}.parquet"
    table = parquet.read_table(path, str(path), _producer(split_dir))
    column = table["label"].combine_chunks()
    if pa.types.is_list(column.type):
        from tailkit.labels import LabelSets

        labels = LabelSets.from_arrow(column, read_meta(split_dir)["num_classes"])
        return table["row_id"].to_numpy(), labels
    return table["row_id"].to_numpy(), column.to_numpy()


LABELS = "labels.parquet"


def write_labels(directory: Path, names: list[str], counts: dict[str, np.ndarray]) -> None:
    """The per-label table: ids, names and ``counts[split]`` as ``<split>_count``."""
    frame = pl.DataFrame(
        {
            "label": np.arange(len(names), dtype=np.int64),
            "name": pl.Series([str(n) for n in names], dtype=pl.String),
            **{f"{split}_count": np.asarray(counts[split], np.int64) for split in SPLITS},
        }
    )
    write_label_table(directory / LABELS, frame)


def _producer(directory: Path) -> str:
    return f"featurize@{directory.name}" if directory.parent.name == "features" else "subsample"


def read_labels(
    directory: Path, columns: list[str] | None = None, num_labels: int | None = None
) -> pl.DataFrame:
    """The per-label table of a split or feature-set folder (all columns, or ``columns`` and
    ``label``); ``num_labels``: the C its ids must cover."""
    path = directory / LABELS
    return read_label_table(path, str(path), _producer(directory), columns, num_labels)


def read_meta(directory: Path) -> dict[str, Any]:
    """The scalars of meta.json, plus ``<split>_counts`` (C,) int64 arrays from the label table
    (label names: :func:`read_labels`)."""
    meta = json.loads(require(directory / "meta.json", _producer(directory)).read_text())
    counts = [f"{split}_count" for split in SPLITS]
    table = read_labels(directory, counts, num_labels=meta["num_classes"])
    for split in SPLITS:
        # a writable copy: a zero-copy view of Arrow memory is read-only, and torch warns on it
        meta[f"{split}_counts"] = table[f"{split}_count"].to_numpy().copy()
    return meta
