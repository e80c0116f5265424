"""``table``: a user's own rows from a Parquet, CSV, TSV or JSON-lines file, with no plugin.

``input`` names the column of raw inputs, or a list of numeric columns:

* a string column is **text** (modality ``text``; ``text-tfidf`` featurizes it);
* a list (or fixed-size list) of numbers, a numeric column, or a list of numeric columns is a
  **vector** (modality ``dense``; ``identity``, ``pca``, ``rff`` … take it).

``label`` names the label column: one value per row (a string or an integer) for single-label
data, or a list of them for multi-label data (``label_separator`` splits a string column into
such lists, for CSV files that cannot hold lists). Label names are the values as written, in
sorted order (integers numerically), so every table and prediction shows them. ``split``
optionally names a column of ``train`` / ``val`` / ``test`` that fixes the partition (else
``subsample`` draws it); ``sha256`` optionally pins the file's bytes.

``fetch`` reads and checks the whole file: every problem is one line naming the file, the row
(0-based, as polars counts data rows; CSV also gives the line) and the column. It writes the
checked rows in tailkit's own form under ``dest`` (``rows.parquet``, ``label_names.parquet``,
then ``table.json``, whose presence marks a complete fetch), which ``load`` reads. The file
itself is a dependency of the download stage (:mod:`tailkit.storage.file_hash`), so editing it
re-runs what depends on it.

Rows whose label list holds a name twice keep it once; rows with an empty label list stay (a
row may have no label, as in the Extreme Classification Repository). Both are counted and said.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import scipy.sparse as sp

from tailkit.components import RawData
from tailkit.errors import DataValidationError, InvalidParameterError
from tailkit.storage.atomic import atomic_path, write_json
from tailkit.storage.parquet import read_table, write_table
from tailkit.storage.user_table import read_user_table, table_format

if TYPE_CHECKING:
    import polars as pl

ROWS, NAMES, META = "rows.parquet", "label_names.parquet", "table.json"
SPLIT_NAMES = ("train", "val", "test")
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


class Table:
    """Rows of text or vectors with one label or a list of labels, from a table file."""

    def __init__(
        self,
        path: str,
        input: str | list[str] = "text",
        label: str = "label",
        split: str | None = None,
        label_separator: str | None = None,
        sha256: str | None = None,
    ) -> None:
        if sha256 is not None and not _HEX64.fullmatch(sha256):
            raise InvalidParameterError(
                f"dataset.sha256: got {sha256!r}; expected 64 hexadecimal digits"
            )
        if isinstance(input, list) and not (input and all(isinstance(c, str) for c in input)):
            raise InvalidParameterError(
                f"dataset.input: got {input!r}; expected a column name or a non-empty list of "
                "numeric column names"
            )
        if label_separator == "":
            raise InvalidParameterError("dataset.label_separator: must not be empty")
        table_format(Path(path))  # an unknown suffix is a params error, said before any stage
        self.path = path
        self.input = input
        self.label = label
        self.split = split
        self.label_separator = label_separator
        self.sha256 = sha256

    # --- what is known before reading every row --------------------------------------------

    @property
    def multilabel(self) -> bool | None:
        """Whether the label column holds lists, from the file's schema (None when it cannot
        be read yet: the download stage then says why)."""
        if self.label_separator is not None:
            return True
        try:
            import polars as pl

            schema = _scan(Path(self.path)).collect_schema()
            return isinstance(schema.get(self.label), pl.List | pl.Array)
        except Exception:  # noqa: BLE001 -- unknown until fetch reads it and names the problem
            return None

    # --- fetch: read, check, write tailkit's form ------------------------------------------

    def fetch(self, dest: Path) -> None:
        source = Path(self.path)
        if self.sha256 is not None:
            from tailkit.storage.download import verify_file

            verify_file(source, f"sha256:{self.sha256.lower()}")
        frame = read_user_table(source)
        where = _Where(source, table_format(source))
        if frame.height == 0:
            raise DataValidationError(f"{source}: the table has no rows")
        columns = [self.label, *([self.split] if self.split else [])]
        columns += self.input if isinstance(self.input, list) else [self.input]
        where.columns_exist(frame, columns)

        inputs, modality = _inputs(frame, self.input, where)
        names, labels, notes = _labels(frame[self.label], self.label_separator, where)
        table: dict[str, Any] = {"input": inputs}
        if isinstance(labels, list):
            table["labels"] = pa.array(labels, pa.list_(pa.int64()))
        else:
            table["label"] = pa.array(labels, pa.int64())
        if self.split:
            table["split"] = pa.array(_splits(frame[self.split], where), pa.string())
        for note in notes:
            print(f"dataset 'table': {source}: {note}", file=sys.stderr)

        dest = Path(dest)
        with atomic_path(dest / ROWS) as tmp:
            write_table(pa.table(table), tmp, compression="zstd")
        with atomic_path(dest / NAMES) as tmp:
            write_table(pa.table({"name": pa.array(names, pa.string())}), tmp)
        write_json(
            dest / META,
            {
                "source": str(source),
                "modality": modality,
                "multilabel": isinstance(labels, list),
                "rows": frame.height,
                "labels": len(names),
                "input": self.input,
                "label": self.label,
                "split": self.split,
            },
        )

    # --- load: tailkit's form back into RawData --------------------------------------------

    def load(self, raw_dir: Path) -> RawData:
        raw_dir = Path(raw_dir)
        try:
            meta = json.loads((raw_dir / META).read_text())
            rows = read_table(raw_dir / ROWS, str(raw_dir / ROWS), "download")
            names = read_table(raw_dir / NAMES, str(raw_dir / NAMES), "download")
        except FileNotFoundError as exc:
            raise DataValidationError(
                f"{exc.filename or raw_dir / META}: not found; run the download stage first"
            ) from exc
        except (OSError, ValueError) as exc:
            raise DataValidationError(f"{raw_dir}: unreadable table data ({exc})") from exc
        label_names = [str(n) for n in names.column("name").to_pylist()]
        inputs = _decoded_inputs(rows.column("input"), meta["modality"])
        if meta["multilabel"]:
            labels = _indicator(rows.column("labels"), len(label_names))
        else:
            labels = rows.column("label").to_numpy().astype(np.int64)
        splits = None
        if "split" in rows.column_names:
            split = np.asarray(rows.column("split").to_pylist(), dtype=object)
            splits = {
                name: np.flatnonzero(split == name).astype(np.int64)
                for name in SPLIT_NAMES
                if (split == name).any()
            }
        return RawData(
            inputs=inputs,
            labels=labels,
            label_names=label_names,
            modality=meta["modality"],
            splits=splits,
        )

    def decode_rows(self, table: pa.Table) -> Any:
        """New rows' inputs for ``tailkit predict``, read from the same column(s) by the same
        rules as ``fetch``."""
        import polars as pl

        frame = pl.from_arrow(table)
        assert isinstance(frame, pl.DataFrame)
        where = _Where(Path("the table"), "parquet")
        needed = self.input if isinstance(self.input, list) else [self.input]
        where.columns_exist(frame, needed)
        inputs, modality = _inputs(frame, self.input, where)
        return _decoded_inputs(pa.chunked_array([inputs]), modality)


# --- helpers ------------------------------------------------------------------------------


def _scan(path: Path) -> pl.LazyFrame:
    import polars as pl

    kind = table_format(path)
    if kind == "parquet":
        return pl.scan_parquet(path)
    if kind in ("csv", "tsv"):
        return pl.scan_csv(path, separator="\t" if kind == "tsv" else ",")
    return pl.scan_ndjson(path)


class _Where:
    """Names a place in the user's file for a one-line error."""

    def __init__(self, source: Path, kind: str) -> None:
        self.source, self.kind = source, kind

    def row(self, i: int, column: str) -> str:
        line = f" (line {i + 2})" if self.kind in ("csv", "tsv") else ""
        line = f" (line {i + 1})" if self.kind == "jsonl" else line
        return f"{self.source}: row {i}{line}, column {column!r}"

    def columns_exist(self, frame: pl.DataFrame, columns: list[str]) -> None:
        missing = [c for c in columns if c not in frame.columns]
        if missing:
            raise DataValidationError(
                f"{self.source}: no column {missing[0]!r}; the table has "
                + ", ".join(repr(c) for c in frame.columns)
            )


def _first_null(series: pl.Series) -> int | None:
    nulls = series.is_null()
    return int(nulls.arg_max()) if nulls.any() else None  # type: ignore[arg-type]


def _inputs(frame: pl.DataFrame, input: str | list[str], where: _Where) -> tuple[Any, str]:
    """(an Arrow array of the inputs: strings or fixed-size lists of float32, modality)."""
    import polars as pl

    if isinstance(input, list):
        for column in input:
            if not frame[column].dtype.is_numeric():
                raise DataValidationError(
                    f"{where.source}: column {column!r} is {frame[column].dtype}; a list of "
                    "input columns must all be numeric"
                )
            null = _first_null(frame[column])
            if null is not None:
                raise DataValidationError(f"{where.row(null, column)}: empty (null) input")
        values = frame.select(pl.col(c).cast(pl.Float64) for c in input).to_numpy()
        return _vectors(values, input, where), "dense"
    series = frame[input]
    null = _first_null(series)
    if null is not None:
        raise DataValidationError(f"{where.row(null, input)}: empty (null) input")
    if series.dtype == pl.String:
        return series.to_arrow().cast(pa.string()), "text"
    if series.dtype.is_numeric():
        return _vectors(series.cast(pl.Float64).to_numpy()[:, None], [input], where), "dense"
    if isinstance(series.dtype, pl.List | pl.Array) and series.dtype.inner.is_numeric():
        lists = _arrow(series)
        widths = np.diff(_offsets(lists))
        if widths.size and (widths != widths[0]).any():
            other = int(np.argmax(widths != widths[0]))
            raise DataValidationError(
                f"{where.row(other, input)}: a vector of {int(widths[other])} values; row 0 "
                f"has {int(widths[0])} (every row needs the same width)"
            )
        width = int(widths[0]) if widths.size else 0
        if width == 0:
            raise DataValidationError(f"{where.row(0, input)}: an empty vector")
        flat = pl.Series(input, lists.flatten())
        null = _first_null(flat)
        if null is not None:
            raise DataValidationError(f"{where.row(null // width, input)}: a null value")
        values = flat.cast(pl.Float64).to_numpy().reshape(len(series), width)
        return _vectors(values, [input], where), "dense"
    raise DataValidationError(
        f"{where.source}: column {input!r} is {series.dtype}; expected text (strings), vectors "
        "(lists of numbers) or numbers (`input: [col, ...]` for several numeric columns)"
    )


def _vectors(values: np.ndarray, columns: list[str], where: _Where) -> pa.Array:
    """(N, D) float64 values as an Arrow fixed-size list of float32, refusing non-finite or
    out-of-float32-range values with their row and column."""
    bad = np.argwhere(~np.isfinite(values) | (np.abs(values) > np.finfo(np.float32).max))
    if bad.size:
        i, j = (int(v) for v in bad[0])
        column = columns[j] if len(columns) > 1 else columns[0]
        item = f" (value {j})" if len(columns) == 1 and values.shape[1] > 1 else ""
        raise DataValidationError(
            f"{where.row(i, column)}{item}: {float(values[i, j])!r} is not a finite float32; drop or "
            "impute such rows"
        )
    flat = pa.array(values.astype(np.float32).ravel(), pa.float32())
    return pa.FixedSizeListArray.from_arrays(flat, values.shape[1])


def _labels(
    series: pl.Series, separator: str | None, where: _Where
) -> tuple[list[str], np.ndarray | list[list[int]], list[str]]:
    """(label names in sorted order, int64 ids or per-row id lists, notes to print)."""
    import polars as pl

    column = series.name
    null = _first_null(series)
    if null is not None:
        raise DataValidationError(f"{where.row(null, column)}: no label (null)")
    if separator is not None:
        if series.dtype != pl.String:
            raise DataValidationError(
                f"{where.source}: column {column!r} is {series.dtype}; label_separator splits "
                "a string column"
            )
        series = series.str.split(separator).list.eval(pl.element().str.strip_chars())
        series = series.list.eval(pl.element().filter(pl.element() != ""))
    listed = isinstance(series.dtype, pl.List | pl.Array)
    if listed:
        # Arrow's flatten keeps an empty list empty (polars' explode would give it a null).
        lists = _arrow(series)
        row_of = np.diff(np.asarray(_offsets(lists)))
        present = pl.Series(column, lists.flatten())
        owner = np.repeat(np.arange(len(series)), row_of)
        null = _first_null(present)
        if null is not None:
            raise DataValidationError(f"{where.row(int(owner[null]), column)}: a null label")
    else:
        present = series
    kind = present.dtype
    if len(present) == 0:
        raise DataValidationError(f"{where.source}: column {column!r}: no row has a label")
    if not (kind == pl.String or kind.is_integer()):
        raise DataValidationError(
            f"{where.source}: column {column!r} holds {kind} labels; labels are strings or "
            "integers (or lists of them)"
        )
    notes: list[str] = []
    if kind == pl.String:
        empty = (present == "").to_numpy()
        if empty.any():
            i = int(np.argmax(empty))
            row = int(owner[i]) if listed else i
            raise DataValidationError(f"{where.row(row, column)}: an empty label")
    unique = present.unique().sort()
    names = [str(v) for v in unique.to_list()]
    ids = unique.search_sorted(present).to_numpy().astype(np.int64)
    if not listed:
        return names, ids, notes
    out, twice = [], 0
    for row in np.split(ids, np.cumsum(row_of)[:-1]):
        kept = sorted(set(row.tolist()))
        twice += len(kept) < len(row)
        out.append(kept)
    if twice:
        notes.append(f"{twice:,} rows list a label more than once; each counts once")
    empty_rows = int(np.count_nonzero(row_of == 0))
    if empty_rows:
        notes.append(f"{empty_rows:,} rows have an empty label list; they stay, with no label")
    return names, out, notes


def _splits(series: pl.Series, where: _Where) -> list[str]:
    import polars as pl

    column = series.name
    null = _first_null(series)
    if null is not None:
        raise DataValidationError(f"{where.row(null, column)}: no split (null)")
    values = series.cast(pl.String)
    bad = ~values.is_in(SPLIT_NAMES)
    if bad.any():
        i = int(bad.arg_max())  # type: ignore[arg-type]
        raise DataValidationError(
            f"{where.row(i, column)}: split {values[i]!r}; expected one of "
            + ", ".join(SPLIT_NAMES)
        )
    if not (values == "train").any() or not (values == "test").any():
        raise DataValidationError(
            f"{where.source}: column {column!r} needs train and test rows (val is optional)"
        )
    return values.to_list()


def _arrow(series: pl.Series) -> Any:
    """A polars Series as one Arrow array (not chunked)."""
    array = series.to_arrow()
    return array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array


def _offsets(lists: Any) -> np.ndarray:
    """A (large or fixed-size) Arrow list array's offsets, from 0."""
    if isinstance(lists, pa.FixedSizeListArray):
        return np.arange(len(lists) + 1, dtype=np.int64) * lists.type.list_size
    offsets = lists.offsets.to_numpy().astype(np.int64)
    return offsets - offsets[0]


def _decoded_inputs(column: Any, modality: str) -> Any:
    """The stored inputs as RawData holds them: an (N,) object array of str, or (N, D)
    float32."""
    if modality == "text":
        return np.asarray(column.to_pylist(), dtype=object)
    flat = pa.concat_arrays([c.flatten() for c in column.chunks]) if column.num_chunks else None
    width = column.type.list_size
    values = flat.to_numpy(zero_copy_only=False) if flat is not None else np.zeros(0, np.float32)
    return np.ascontiguousarray(values.reshape(len(column), width), dtype=np.float32)


def _indicator(column: Any, num_labels: int) -> sp.csr_matrix:
    """Per-row label id lists as an (N, C) float32 CSR 0/1 indicator with sorted indices."""
    lists = column.combine_chunks()
    indptr = lists.offsets.to_numpy().astype(np.int64)
    indptr = indptr - indptr[0]
    indices = lists.values.to_numpy().astype(np.int64)
    matrix = sp.csr_matrix(
        (np.ones(indices.size, np.float32), indices, indptr), shape=(len(lists), num_labels)
    )
    matrix.sort_indices()
    return matrix
