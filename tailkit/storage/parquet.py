"""Parquet with page checksums: tailkit writes a CRC-32 into every page header and verifies it
on every read, so that a flipped bit in a file under ``data/`` is an error and not wrong numbers.

Without the CRC a damaged page is caught only by luck. zstd notices a damaged compressed block,
but an incompressible page (random ids, float mantissas, pixels) is stored as a raw block inside
the zstd frame, and a flipped bit there decodes to a wrong value with no error at all. The CRC
covers the page as stored and is checked before decompressing, so any flip in a page's data is
reported as a checksum failure, compressed or not. (The page *header* is not covered; a flip
there mostly makes the header unparseable, which is an error too.)

Files written without checksums (by polars, by older tailkit) carry no CRC; pyarrow skips the
check for such pages, so they still read.

Every read failure becomes one line naming the file and the ``dvc repro`` stage that rebuilds
it (:func:`unreadable`), in the words of :mod:`tailkit.storage.label_table`'s errors.
"""

from __future__ import annotations

from pathlib import Path
from typing import IO, Any, TypeAlias

import pyarrow as pa
import pyarrow.parquet as pq

from tailkit.errors import DataValidationError

Source: TypeAlias = str | Path | IO[bytes] | pa.NativeFile


def write_table(table: pa.Table, where: str | Path | IO[bytes], **options: Any) -> None:
    """:func:`pyarrow.parquet.write_table` with page checksums (``options`` as there)."""
    pq.write_table(table, where, write_page_checksum=True, **options)


def read_table(source: Source, name: str, stage: str, **options: Any) -> pa.Table:
    """:func:`pyarrow.parquet.read_table` verifying page checksums (``options`` as there, e.g.
    ``columns``, ``memory_map``). A missing file is left to the caller (``FileNotFoundError``:
    each says "missing" its own way); any other failure is :func:`unreadable`."""
    try:
        return pq.read_table(source, page_checksum_verification=True, **options)
    except FileNotFoundError:
        raise
    except (pa.ArrowException, OSError) as exc:
        raise unreadable(name, stage, exc) from exc


def open_file(source: Source, name: str, stage: str, **options: Any) -> pq.ParquetFile:
    """A :class:`pyarrow.parquet.ParquetFile` whose reads verify page checksums; a footer that
    does not parse is :func:`unreadable` (its reads then raise what pyarrow raises: wrap them
    in ``except (pa.ArrowException, OSError)`` and :func:`unreadable`)."""
    try:
        return pq.ParquetFile(source, page_checksum_verification=True, **options)
    except FileNotFoundError:
        raise
    except (pa.ArrowException, OSError) as exc:
        raise unreadable(name, stage, exc) from exc


def rebuild(stage: str) -> str:
    return f"rebuild it with `dvc repro {stage}`"


def unreadable(name: str, stage: str, exc: BaseException) -> DataValidationError:
    """``<name>: not a readable Parquet file (<reason>); rebuild it with `dvc repro <stage>```,
    on one line: pyarrow's messages may run over several (a schema dump, say)."""
    return DataValidationError(
        f"{name}: not a readable Parquet file ({reason(exc)}); {rebuild(stage)}"
    )


def reason(exc: BaseException) -> str:
    """The first line of ``exc``'s message, or its type's name when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
