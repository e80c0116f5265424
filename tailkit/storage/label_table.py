"""One Parquet form for every per-label table: the data stages' names and counts
(``labels.parquet``) and evaluation's per-class results (``per_class.parquet``).

A label table is a polars frame with one row per label, sorted by the ``label`` column (int64
ids 0..C−1, each exactly once), written with zstd, page checksums (:mod:`tailkit.storage.parquet`)
and optional string key-value metadata (e.g. the key of the data an evaluation ran on). One
reader checks what every consumer relies on — the file is Parquet, its pages match their
checksums, it has the columns asked for, and its ids cover 0..C−1 once each — and turns each
failure into one line naming the file and the ``dvc repro`` target that rebuilds it.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path
from typing import IO, cast

import numpy as np
import polars as pl
import pyarrow as pa

from tailkit.errors import DataValidationError
from tailkit.storage import parquet
from tailkit.storage.atomic import atomic_path

ID = "label"


def write_label_table(path: Path, frame: pl.DataFrame, metadata: dict[str, str] | None = None):
    """Write ``frame`` (its ``label`` column must be 0..C−1 in order) atomically."""
    ids = frame[ID].to_numpy()
    if not np.array_equal(ids, np.arange(len(ids))):
        raise ValueError(f"{path}: a label table's ids must be 0..{len(ids) - 1} in order")
    table = frame.to_arrow()
    if metadata:  # Parquet key-value metadata, as polars' write_parquet(metadata=...) wrote it
        table = table.replace_schema_metadata({**(table.schema.metadata or {}), **metadata})
    with atomic_path(path) as tmp:
        # pyarrow, not polars' write_parquet: polars cannot write page checksums. No
        # statistics: min/max of every column would only grow the file, nobody filters on
        # them, and the bytes stay identical across library versions more often
        parquet.write_table(table, tmp, compression="zstd", write_statistics=False)


def read_label_table(
    source: Path | bytes,
    name: str,
    producer: str,
    columns: Sequence[str] | None = None,
    num_labels: int | None = None,
) -> pl.DataFrame:
    """The table at ``source`` (a path, or the bytes of a file read from another revision),
    checked; ``name`` and ``producer`` say in errors which file it is and which stage rebuilds
    it. ``num_labels`` (default: the row count) is the C the ids must cover."""
    rebuild = f"rebuild it with `dvc repro {producer}`"
    if isinstance(source, Path) and not source.exists():
        raise DataValidationError(f"{name}: missing; run `dvc repro {producer}` first")
    wanted = None if columns is None else list(dict.fromkeys([ID, *columns]))
    # pyarrow, which verifies the page checksums (tailkit/storage/parquet.py); polars cannot
    with parquet.open_file(_readable(source), name, producer) as file:
        # ParquetFile.read silently skips a column the file lacks: check the names first
        if wanted is not None and not set(wanted) <= set(file.schema_arrow.names):
            raise DataValidationError(f"{name}: lacks a column of {wanted} ({rebuild})")
        try:
            frame = cast(pl.DataFrame, pl.from_arrow(file.read(columns=wanted)))  # a Table's
        except (OSError, pa.ArrowException, pl.exceptions.PolarsError) as exc:
            raise parquet.unreadable(name, producer, exc) from exc
    try:
        check_ids(frame, name, num_labels)
    except DataValidationError as exc:
        raise DataValidationError(f"{exc}; {rebuild}") from None
    return frame if _sorted(frame) else frame.sort(ID)


def read_table_metadata(source: Path | bytes, name: str, producer: str) -> dict[str, str]:
    """The key-value metadata written beside a label table."""
    try:
        return pl.read_parquet_metadata(_readable(source))
    except (OSError, pl.exceptions.PolarsError) as exc:
        raise DataValidationError(
            f"{name}: not a readable Parquet file; rebuild it with `dvc repro {producer}`"
        ) from exc


def check_ids(frame: pl.DataFrame, name: str, num_labels: int | None = None) -> None:
    """One line naming ``name`` unless ``frame``'s ids are 0..C−1, each exactly once."""
    if ID not in frame.columns or not frame.schema[ID].is_integer():
        raise DataValidationError(f"{name}: no integer {ID!r} column")
    total = len(frame) if num_labels is None else num_labels
    ids = frame[ID].to_numpy()
    if frame[ID].null_count():
        raise DataValidationError(f"{name}: a {ID!r} id is missing (null)")
    bad = np.flatnonzero((ids < 0) | (ids >= total))
    if bad.size:
        raise DataValidationError(
            f"{name}: label id {ids[bad[0]]} (row {bad[0]}) is out of range 0..{total - 1}"
        )
    seen = np.bincount(ids, minlength=total)
    if (seen > 1).any():
        raise DataValidationError(f"{name}: label id {int(np.argmax(seen > 1))} appears twice")
    if len(ids) != total:
        raise DataValidationError(f"{name}: holds {len(ids)} labels, expected {total}")


def _sorted(frame: pl.DataFrame) -> bool:
    ids = frame[ID].to_numpy()
    return bool((ids[1:] > ids[:-1]).all())


def _readable(source: Path | bytes) -> Path | IO[bytes]:
    return io.BytesIO(source) if isinstance(source, bytes) else source
