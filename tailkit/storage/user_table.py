"""Reading a user's own table: Parquet, CSV, TSV or JSON lines, by the file's suffix, with
every failure one line naming the file.

polars reads all four (its readers are the fastest at hand and infer a column's type from its
values). CSV and TSV columns are inferred from the whole file, not the first rows, so a label
column that turns from integers to strings late in the file is read as strings rather than
failing half-way; the same holds for JSON lines.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tailkit.errors import DataValidationError

if TYPE_CHECKING:
    import polars as pl

#: Suffix → polars reader name.
FORMATS = {
    ".parquet": "parquet",
    ".csv": "csv",
    ".tsv": "tsv",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
}


def table_format(path: Path) -> str:
    """The reader for ``path``'s suffix, or a one-line error listing those taken."""
    kind = FORMATS.get(path.suffix.lower())
    if kind is None:
        raise DataValidationError(
            f"{path}: expected a table file ending in {', '.join(FORMATS)}; got "
            f"{path.suffix or 'no suffix'!r}"
        )
    return kind


def read_user_table(path: str | Path) -> pl.DataFrame:
    """The whole table at ``path`` as a polars DataFrame."""
    import polars as pl

    path = Path(path)
    kind = table_format(path)
    if not path.is_file():
        raise DataValidationError(f"{path}: no such file")
    try:
        if kind == "parquet":
            return pl.read_parquet(path)
        if kind in ("csv", "tsv"):
            return pl.read_csv(
                path, separator="\t" if kind == "tsv" else ",", infer_schema_length=None
            )
        return pl.read_ndjson(path, infer_schema_length=None)
    except (pl.exceptions.PolarsError, OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DataValidationError(f"{path}: not a readable {kind} table ({first})") from exc
