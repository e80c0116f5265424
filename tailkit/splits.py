"""The split files and meta.json of ``data/split/`` (written by subsample, read downstream).

One place for their format, so that the stages that read them depend on this module and not
on the subsample stage's code (editing how subsample draws rows must not re-run a reader).
``meta.json`` is extended by featurize@<set> into ``data/features/<set>/meta.json``: the same
reader serves both.
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


def read_meta(directory: Path) -> dict[str, Any]:
    """The meta.json that subsample writes and featurize extends."""
    producer = f"featurize@{directory.name}" if directory.parent.name == "features" else "subsample"
    return json.loads(require(directory / "meta.json", producer).read_text())
