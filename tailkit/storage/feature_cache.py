"""The Parquet feature cache: one file per split, read back into torch without copying ``x``.

Layout of a feature file (one Parquet file, written atomically):

* ``row_id`` int64: the row's index in the dataset's :class:`~tailkit.components.RawData`, so a
  split can always be traced back to its raw rows;
* ``label`` int64: the label id; for multi-label data ``list<int32>``, the row's sorted label
  ids (possibly none), read back as a :class:`~tailkit.labels.LabelSets`; the metadata then holds
  ``multilabel`` = true and ``num_classes``;
* the features, in one of three kinds (``FeatureTable.kind``):

  - ``dense``: ``x`` ``fixed_size_list<float32, D>``, the feature vector. One list column, not
    D float columns: D columns are 3-5× slower to write and read (reference measurements,
    ecosystem §5.2), and the list's child values are one contiguous float buffer, which is what
    makes the zero-copy read below possible;
  - ``image``: ``x`` ``fixed_size_list<uint8, H·W·3>``, an image's pixels, channels last, as the
    ``pixels`` featurizer gives them (never converted to float: a quarter of float32's size; the
    encoder converts and normalises on its device). The metadata holds ``shape`` = [H, W, 3];
  - ``sparse``: ``idx`` ``list<int32>`` (sorted column ids) and ``val`` ``list<float32>`` (their
    values), one list per row: a CSR matrix whose row pointer is the lists' offsets.

Encoding: zstd; the values of ``x`` are written with BYTE_STREAM_SPLIT and without dictionary
encoding, which is what makes floats compress at all (0.84× raw for i.i.d. Gaussians, 0.44× for
real-looking embeddings, against 0.92× / 0.63× without it); Parquet stores uint8 as INT32, and
the split turns the three zero bytes of each value into streams zstd removes (so an image file is
about its raw pixel size, against 1.36× with PLAIN). Sparse ``idx`` is DELTA_BINARY_PACKED (sorted
ids), ``val`` BYTE_STREAM_SPLIT. Statistics only for the integer columns (min/max of a list
column is useless). Row groups hold 65,536 rows. Every page carries a CRC-32, verified on read
(:mod:`tailkit.storage.parquet`): a flipped bit is a one-line error naming the file and ``dvc repro
featurize@<set>``, not wrong features. The Parquet key-value metadata key ``b"tailkit"``
holds a JSON object: the caller's ``metadata`` plus ``dim`` (D; H·W·3 for images) and
``num_rows`` (N), and for the image and sparse kinds ``kind`` (and ``shape``, ``nnz``),
readable without touching the data (:func:`read_metadata`). A dense file carries no ``kind``
key, so its metadata is what it was before the other kinds existed; no ``kind`` reads as dense.

Note that pyarrow's ``use_byte_stream_split`` takes *leaf* column paths: ``["x"]`` is silently
ignored for a list column, the leaf is ``"x.list.element"``.

Zero-copy route (pyarrow 26): ``pq.read_table`` decodes each row group into its own Arrow
buffers; the column is then one ``FixedSizeListArray`` (one chunk as is, several chunks
concatenated once by ``combine_chunks`` — a single chunk is *not* passed through
``combine_chunks``, which copies even then). Its ``flatten()`` (which, unlike ``.values``,
respects a slice offset) is a float32 (uint8) array over the same buffer; ``to_numpy(zero_copy_
only=True)`` views it, ``reshape(N, D)`` (``(N, H, W, 3)``) keeps the view, and
``torch.from_numpy`` shares it. torch warns that the array is not writable; we silence that one
warning, because the buffers are private decoded memory (never the mmapped file), and document
that the tensor must not be written in place. ``FixedSizeListArray.to_numpy`` itself would copy
(apache/arrow #35622). Sparse features come back as :class:`~tailkit.sparse.SparseRows` over the
lists' int32 offsets and values, also without a copy, after :func:`~tailkit.csr.check_rows`.
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import scipy.sparse as sp

from tailkit.csr import canonical, check_rows, is_label_sets
from tailkit.errors import DataValidationError
from tailkit.storage import parquet
from tailkit.storage.atomic import atomic_path

if TYPE_CHECKING:  # imported where features are read: the featurize stage only writes them
    import torch

    from tailkit.labels import LabelSets
    from tailkit.sparse import SparseRows

METADATA_KEY = b"tailkit"
ROW_GROUP_SIZE = 65_536
#: What ``columns`` of :func:`read_features` may name; ``x`` is the features of any kind.
COLUMNS = ("row_id", "label", "x")
FeatureKind = Literal["dense", "image", "sparse"]
KINDS: tuple[FeatureKind, ...] = ("dense", "image", "sparse")
# The leaf path of x's values; pyarrow's per-column encoding options need it.
X_LEAF = "x.list.element"
IDX_LEAF, VAL_LEAF = "idx.list.element", "val.list.element"
_INT32_MAX = np.iinfo(np.int32).max


@dataclass
class FeatureTable:
    """One split read back from the cache.

    ``x`` by :attr:`kind`: (N, D) float32 (``dense``), (N, H, W, 3) uint8 (``image``), both
    sharing memory with the Arrow buffers in ``arrow`` (read-only in spirit: clone before
    modifying in place), or an (N, D) :class:`~tailkit.sparse.SparseRows` of float32 values with
    int32 ids (``sparse``). ``labels`` are (N,) int64, or :class:`LabelSets` for multi-label
    data; ``row_ids`` are (N,) int64. Columns not requested are ``None``. ``metadata`` is the
    JSON stored at write time, with ``dim`` and ``num_rows``.
    """

    x: torch.Tensor | None
    labels: torch.Tensor | LabelSets | None
    row_ids: torch.Tensor | None
    metadata: dict[str, Any]
    # The Arrow table the tensors view; kept so the buffers' owner is explicit and so tabular
    # work (polars: ``pl.from_arrow(table.arrow)``) needs no second read.
    arrow: pa.Table | None = field(default=None, repr=False)

    @property
    def num_rows(self) -> int:
        return int(self.metadata["num_rows"])

    @property
    def dim(self) -> int:
        """Values per row: D, or H·W·3 for images."""
        return int(self.metadata["dim"])

    @property
    def kind(self) -> FeatureKind:
        return self.metadata.get("kind", "dense")

    @property
    def shape(self) -> tuple[int, ...]:
        """The shape of ``x``: (N, D), or (N, H, W, 3) for images."""
        if self.kind == "image":
            return (self.num_rows, *self.metadata["shape"])
        return (self.num_rows, self.dim)


def _list_type(value_type: pa.DataType, size: int = -1) -> pa.DataType:
    return pa.list_(pa.field("element", value_type, nullable=False), size)


def _x_type(dim: int) -> pa.DataType:
    return _list_type(pa.float32(), dim)


def _kind_of(path: Path, x: Any) -> FeatureKind:
    if sp.issparse(x):
        if x.format != "csr" or x.ndim != 2 or x.dtype != np.float32:
            raise ValueError(
                f"{path}: sparse x must be a 2-D float32 CSR matrix; got {x.format} of "
                f"{x.dtype} with shape {x.shape}"
            )
        return "sparse"
    if isinstance(x, np.ndarray) and x.ndim == 2 and x.dtype == np.float32:
        return "dense"
    if isinstance(x, np.ndarray) and x.ndim == 4 and x.shape[-1] == 3 and x.dtype == np.uint8:
        return "image"
    raise ValueError(
        f"{path}: x must be a 2-D float32 array, an (N, H, W, 3) uint8 array or a float32 CSR "
        f"matrix; got {getattr(x, 'dtype', type(x).__name__)} of shape {getattr(x, 'shape', None)}"
    )


def _feature_columns(path: Path, x: Any, kind: FeatureKind) -> tuple[dict[str, pa.Array], dict]:
    """The feature columns of ``x`` and the metadata facts they imply."""
    if kind == "sparse":
        x = canonical(x)
        if x.nnz > _INT32_MAX or x.shape[1] > _INT32_MAX:
            raise ValueError(
                f"{path}: sparse x of shape {x.shape} with {x.nnz} values exceeds int32"
            )
        offsets = pa.array(x.indptr.astype(np.int32, copy=False))
        idx = pa.array(x.indices.astype(np.int32, copy=False))
        val = pa.array(np.ascontiguousarray(x.data))
        columns = {
            "idx": pa.ListArray.from_arrays(offsets, idx, type=_list_type(pa.int32())),
            "val": pa.ListArray.from_arrays(offsets, val, type=_list_type(pa.float32())),
        }
        return columns, {"dim": int(x.shape[1]), "kind": kind, "nnz": int(x.nnz)}
    # pa.array over a contiguous 1-D view wraps the NumPy buffer without copying.
    flat = pa.array(np.ascontiguousarray(x).reshape(-1))
    dim = int(np.prod(x.shape[1:]))
    column = pa.FixedSizeListArray.from_arrays(flat, type=_list_type(flat.type, dim))
    facts: dict[str, Any] = {"dim": dim}
    if kind == "image":
        facts.update(kind=kind, shape=list(x.shape[1:]))
    return {"x": column}, facts


def write_features(
    path: str | Path,
    x: np.ndarray | sp.csr_matrix,
    labels: np.ndarray | LabelSets,
    row_ids: np.ndarray,
    metadata: Mapping[str, Any],
) -> None:
    """Write one feature file atomically (see the module docstring for the layout).

    ``x`` is (N, D) float32 (dense), (N, H, W, 3) uint8 (image) or an (N, D) float32 CSR
    matrix (sparse); any other dtype, a float64 array say, is refused rather than silently
    converted. ``labels`` is an (N,) integer array (stored as int64) or :class:`LabelSets`
    (stored as ``list<int32>``); ``row_ids`` an (N,) integer array, stored as int64.
    ``metadata`` must be JSON-serialisable; the keys ``dim``, ``num_rows`` (and ``kind``,
    ``shape``, ``nnz`` where they apply) are set here and must agree if given.
    """
    path = Path(path)
    kind = _kind_of(path, x)
    n = x.shape[0]
    if min(x.shape[1:]) < 1:
        raise ValueError(f"{path}: x must have at least one feature column; got shape {x.shape}")
    columns, facts = {}, {}
    if is_label_sets(labels):
        if len(labels) != n:
            raise ValueError(f"{path}: label has {len(labels)} rows; x has {n}")
        columns["label"] = labels.to_arrow()
        facts = {"multilabel": True, "num_classes": labels.num_classes}
    for name, values in (("label", labels), ("row_id", row_ids)):
        if name in columns:
            continue
        values = np.asarray(values)
        if values.shape != (n,) or not np.issubdtype(values.dtype, np.integer):
            raise ValueError(
                f"{path}: {name} must be a ({n},) integer array; got {values.dtype} "
                f"of shape {values.shape}"
            )
        columns[name] = pa.array(values.astype(np.int64, copy=False))
    features, feature_facts = _feature_columns(path, x, kind)
    facts.update(feature_facts)
    meta = dict(metadata)
    for key, value in (*facts.items(), ("num_rows", n)):
        if key in meta and meta[key] != value:
            raise ValueError(f"{path}: metadata[{key!r}] = {meta[key]!r} but the data has {value}")
        meta[key] = value
    if kind == "dense" and meta.get("kind", "dense") != "dense":
        raise ValueError(f"{path}: metadata['kind'] = {meta['kind']!r} but the data is dense")
    encoded = json.dumps(meta, sort_keys=True, allow_nan=False).encode()

    table = pa.table({"row_id": columns["row_id"], "label": columns["label"], **features})
    table = table.replace_schema_metadata({METADATA_KEY: encoded})
    if kind == "sparse":
        encoding: dict[str, Any] = {
            "column_encoding": {IDX_LEAF: "DELTA_BINARY_PACKED", VAL_LEAF: "BYTE_STREAM_SPLIT"}
        }
    else:
        encoding = {"use_byte_stream_split": [X_LEAF]}
    with atomic_path(path) as tmp:
        parquet.write_table(  # with page checksums, verified by read_features
            table,
            tmp,
            compression="zstd",
            use_dictionary=["label"] if "multilabel" not in facts else False,
            write_statistics=["row_id"] if "multilabel" in facts else ["row_id", "label"],
            row_group_size=ROW_GROUP_SIZE,
            **encoding,
        )


def _stage(path: Path) -> str:
    """The stage that rebuilds a feature file: featurize writes ``data/features/<set>/``."""
    return f"featurize@{path.parent.name}"


def _schema(path: Path) -> pa.Schema:
    """The file's Arrow schema (reads only the footer); bad files become DataValidationError."""
    if not path.is_file():
        raise DataValidationError(f"{path}: feature file not found")
    try:
        return pq.read_schema(path)
    except (pa.ArrowException, OSError) as exc:
        raise parquet.unreadable(str(path), _stage(path), exc) from exc


def _decode_metadata(path: Path, schema: pa.Schema) -> dict[str, Any]:
    raw = (schema.metadata or {}).get(METADATA_KEY)
    if raw is None:
        raise DataValidationError(
            f"{path}: no {METADATA_KEY.decode()!r} metadata; not a feature file"
        )
    try:
        meta = json.loads(raw)
    except ValueError as exc:
        raise DataValidationError(f"{path}: unreadable tailkit metadata ({exc})") from exc
    if not isinstance(meta, dict) or not {"dim", "num_rows"} <= meta.keys():
        raise DataValidationError(f"{path}: tailkit metadata lacks 'dim' or 'num_rows'")
    kind = meta.get("kind", "dense")
    if kind not in KINDS:
        raise DataValidationError(
            f"{path}: unknown feature kind {kind!r} in the metadata; expected one of {KINDS}"
        )
    if kind == "image":
        shape = meta.get("shape")
        if (
            not isinstance(shape, list)
            or len(shape) != 3
            or shape[2] != 3
            or not all(isinstance(s, int) and s > 0 for s in shape)
            or shape[0] * shape[1] * 3 != meta["dim"]
        ):
            raise DataValidationError(
                f"{path}: image metadata 'shape' = {shape!r} is not [H, W, 3] with H·W·3 = dim"
            )
    return meta


def read_metadata(path: str | Path) -> dict[str, Any]:
    """The metadata stored with a feature file (``dim``, ``num_rows``, …), without its data."""
    path = Path(path)
    return _decode_metadata(path, _schema(path))


def _as_tensor(array: np.ndarray) -> torch.Tensor:
    import torch

    with warnings.catch_warnings():
        # Arrow buffers are immutable to NumPy; torch warns once per call. We share on purpose.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return torch.from_numpy(array)


def _single_array(column: pa.ChunkedArray) -> pa.Array:
    # combine_chunks copies even a single chunk, so only concatenate when there are several.
    if column.num_chunks == 1:
        return column.chunk(0)
    return column.combine_chunks()


def _expected_types(kind: FeatureKind, dim: int, multilabel: bool) -> dict[str, pa.DataType]:
    label = _list_type(pa.int32()) if multilabel else pa.int64()
    types = {"row_id": pa.int64(), "label": label}
    if kind == "sparse":
        return {**types, "idx": _list_type(pa.int32()), "val": _list_type(pa.float32())}
    value = pa.uint8() if kind == "image" else pa.float32()
    return {**types, "x": _list_type(value, dim)}


def _type_ok(actual: pa.DataType, expected: pa.DataType) -> bool:
    # Nullability of the list's element field is not part of the check: a file rewritten by
    # another tool may lose it, and nulls are rejected when the data is read.
    if pa.types.is_fixed_size_list(expected):
        return (
            pa.types.is_fixed_size_list(actual)
            and actual.list_size == expected.list_size
            and actual.value_type == expected.value_type
        )
    if pa.types.is_list(expected):
        return pa.types.is_list(actual) and actual.value_type == expected.value_type
    return actual == expected


def _values(path: Path, name: str, array: pa.Array) -> np.ndarray:
    """The child values of a list array, as a zero-copy NumPy view."""
    flat = array.flatten()
    if flat.null_count:
        raise DataValidationError(f"{path}: column {name!r} has {flat.null_count} null values")
    return flat.to_numpy(zero_copy_only=True)


def _sparse(path: Path, idx: pa.ListArray, val: pa.ListArray, dim: int) -> SparseRows:
    from tailkit.sparse import SparseRows

    indptr = idx.offsets.to_numpy(zero_copy_only=True)
    if not np.array_equal(indptr, val.offsets.to_numpy(zero_copy_only=True)):
        raise DataValidationError(f"{path}: columns 'idx' and 'val' have different row lengths")
    if indptr.size == 0:  # an empty list array may have no offsets at all
        indptr = np.zeros(1, dtype=np.int32)
    elif indptr[0] != 0:  # a sliced array's offsets start where the slice does
        indptr = indptr - indptr[0]
    indices, values = _values(path, "idx", idx), _values(path, "val", val)
    try:  # a file written by another tool may break CSR's rules; name the row
        check_rows(indptr, indices, values, dim, str(path))
    except ValueError as exc:
        raise DataValidationError(str(exc)) from exc
    return SparseRows(_as_tensor(indptr), _as_tensor(indices), _as_tensor(values), dim)


def _label_sets(path: Path, column: pa.ListArray, meta: dict[str, Any]) -> LabelSets:
    from tailkit.labels import LabelSets

    try:
        return LabelSets.from_arrow(column, int(meta["num_classes"]))
    except (KeyError, ValueError) as exc:
        raise DataValidationError(f"{path}: bad multi-label column 'label' ({exc})") from exc


def read_features(
    path: str | Path,
    columns: Iterable[str] | None = None,
    kinds: Collection[str] = KINDS,
) -> FeatureTable:
    """Read a feature file; dense and image ``x`` is a zero-copy view of the Arrow buffer.

    ``columns`` picks a subset of ``row_id``, ``label``, ``x`` (e.g. ``["label"]`` for a
    sampler fit, which then never decodes ``x``); ``x`` means the feature columns of whatever
    kind the file holds. ``kinds`` are the feature kinds the caller handles: reading ``x`` of
    another kind is a one-line :class:`DataValidationError` (by default every kind is read).
    A missing or corrupt file, a column
    the file lacks or with the wrong type, or data disagreeing with its metadata raises
    :class:`DataValidationError` naming ``path``.
    """
    path = Path(path)
    wanted = list(COLUMNS if columns is None else dict.fromkeys(columns))
    unknown = [c for c in wanted if c not in COLUMNS]
    if unknown:
        raise ValueError(f"unknown feature column {unknown[0]!r}; expected some of {COLUMNS}")
    schema = _schema(path)
    meta = _decode_metadata(path, schema)
    dim, n = int(meta["dim"]), int(meta["num_rows"])
    kind: FeatureKind = meta.get("kind", "dense")
    if "x" in wanted and kind not in kinds:
        raise DataValidationError(
            f"{path}: holds {kind} features, but this reader takes only "
            f"{' or '.join(kinds)} features"
        )
    multilabel = bool(meta.get("multilabel", False))
    expected = _expected_types(kind, dim, multilabel)
    stored = [c for c in expected if c in wanted or (c in ("idx", "val") and "x" in wanted)]
    for name in stored:
        idx = schema.get_field_index(name)
        if idx < 0:
            raise DataValidationError(f"{path}: missing column {name!r}")
        actual = schema.field(idx).type
        if not _type_ok(actual, expected[name]):
            raise DataValidationError(
                f"{path}: column {name!r} has type {actual}; expected {expected[name]}"
            )
    # Verifying the page checksums keeps the zero-copy route: the CRC is checked over the
    # mmapped page bytes before they are decoded into the private buffers x views.
    try:
        table = parquet.read_table(path, str(path), _stage(path), columns=stored, memory_map=True)
    except FileNotFoundError as exc:  # removed since _schema looked
        raise DataValidationError(f"{path}: feature file not found") from exc
    if table.num_rows != n:
        raise DataValidationError(f"{path}: {table.num_rows} rows but the metadata says {n}")

    arrays: dict[str, pa.Array] = {}
    for name in stored:
        column = table.column(name)
        if column.null_count:
            raise DataValidationError(f"{path}: column {name!r} has {column.null_count} nulls")
        arrays[name] = _single_array(column)
    out: dict[str, Any] = dict.fromkeys(COLUMNS)
    for name in ("row_id", "label"):
        if name in arrays and not (name == "label" and multilabel):
            out[name] = _as_tensor(arrays[name].to_numpy(zero_copy_only=True))
    if multilabel and "label" in arrays:
        out["label"] = _label_sets(path, arrays["label"], meta)
    if kind == "sparse" and "x" in wanted:
        out["x"] = _sparse(path, arrays["idx"], arrays["val"], dim)
    elif "x" in wanted:
        shape = (n, *meta["shape"]) if kind == "image" else (n, dim)
        out["x"] = _as_tensor(_values(path, "x", arrays["x"]).reshape(shape))
    return FeatureTable(
        x=out["x"], labels=out["label"], row_ids=out["row_id"], metadata=meta, arrow=table
    )
