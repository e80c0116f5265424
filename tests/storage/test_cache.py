"""The Parquet feature cache: dense, image and sparse round trips, zero-copy reads, projection,
atomic writes, bad files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp
import torch

from tailkit.errors import DataValidationError
from tailkit.sparse import SparseRows
from tailkit.storage.feature_cache import (
    KINDS,
    ROW_GROUP_SIZE,
    read_features,
    read_metadata,
    write_features,
)


def _data(n: int, d: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d), dtype=np.float32)
    labels = rng.integers(0, 50, size=n, dtype=np.int64)
    row_ids = rng.permutation(10 * n)[:n].astype(np.int64)
    return x, labels, row_ids


def _buffer_array(table: pa.Table) -> np.ndarray:
    """A NumPy view of the float buffer behind the Arrow table's ``x`` column."""
    chunk = table.column("x").chunk(0)
    buf = chunk.values.buffers()[1]
    return np.frombuffer(buf, dtype=np.float32)


def test_round_trip_and_metadata(tmp_path: Path) -> None:
    x, labels, row_ids = _data(1000, 7)
    path = tmp_path / "train.parquet"
    write_features(path, x, labels, row_ids, {"featurizer": "rff", "params_hash": "abc"})

    table = read_features(path)
    assert table.x.dtype == torch.float32 and table.x.shape == (1000, 7)
    assert table.labels.dtype == torch.int64 and table.row_ids.dtype == torch.int64
    np.testing.assert_array_equal(table.x.numpy(), x)
    np.testing.assert_array_equal(table.labels.numpy(), labels)
    np.testing.assert_array_equal(table.row_ids.numpy(), row_ids)
    expected = {"featurizer": "rff", "params_hash": "abc", "dim": 7, "num_rows": 1000}
    assert table.metadata == expected
    assert read_metadata(path) == expected
    assert (table.num_rows, table.dim) == (1000, 7)
    assert [p.name for p in tmp_path.iterdir()] == ["train.parquet"]  # no temp files left


def test_encoding_follows_the_layout(tmp_path: Path) -> None:
    x, labels, row_ids = _data(ROW_GROUP_SIZE + 10, 3)
    path = tmp_path / "f.parquet"
    write_features(path, x, labels, row_ids, {})
    meta = pq.read_metadata(path)
    assert meta.num_row_groups == 2
    assert meta.row_group(0).num_rows == ROW_GROUP_SIZE
    cols = {
        meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i) for i in range(3)
    }
    x_col = cols["x.list.element"]
    assert x_col.compression == "ZSTD"
    assert "BYTE_STREAM_SPLIT" in x_col.encodings
    assert not any("DICTIONARY" in e for e in x_col.encodings)
    assert pq.read_schema(path).field("x").type == pa.list_(
        pa.field("element", pa.float32(), nullable=False), 3
    )


def test_x_is_not_copied(tmp_path: Path) -> None:
    x, labels, row_ids = _data(5000, 16)
    path = tmp_path / "f.parquet"
    write_features(path, x, labels, row_ids, {})
    table = read_features(path)
    view = table.x.numpy()
    assert np.shares_memory(view, _buffer_array(table.arrow))
    assert table.x.data_ptr() == table.arrow.column("x").chunk(0).values.buffers()[1].address
    assert not np.shares_memory(view, x)  # the writer's array is not what we read back
    assert table.x.is_contiguous()


def test_multi_row_group_file_reads_whole(tmp_path: Path) -> None:
    # Several row groups give several chunks: combine_chunks copies once, values still right.
    x, labels, row_ids = _data(2 * ROW_GROUP_SIZE + 3, 2)
    path = tmp_path / "f.parquet"
    write_features(path, x, labels, row_ids, {})
    table = read_features(path)
    np.testing.assert_array_equal(table.x.numpy(), x)
    np.testing.assert_array_equal(table.labels.numpy(), labels)


def test_label_only_projection(tmp_path: Path) -> None:
    x, labels, row_ids = _data(300, 4)
    path = tmp_path / "f.parquet"
    write_features(path, x, labels, row_ids, {"k": 1})
    table = read_features(path, columns=["label"])
    assert table.x is None and table.row_ids is None
    np.testing.assert_array_equal(table.labels.numpy(), labels)
    assert table.arrow.column_names == ["label"]
    assert table.metadata["dim"] == 4


def test_empty_split_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "f.parquet"
    empty = np.zeros(0, dtype=np.int64)
    write_features(path, np.zeros((0, 5), np.float32), empty, empty, {})
    table = read_features(path)
    assert table.x.shape == (0, 5) and table.labels.shape == (0,)


def test_truncated_file_names_the_path(tmp_path: Path) -> None:
    x, labels, row_ids = _data(1000, 8)
    path = tmp_path / "f.parquet"
    write_features(path, x, labels, row_ids, {})
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    for call in (read_features, read_metadata):
        with pytest.raises(DataValidationError, match=str(path)):
            call(path)


def test_missing_file_and_missing_column(tmp_path: Path) -> None:
    with pytest.raises(DataValidationError, match="not found"):
        read_features(tmp_path / "nope.parquet")
    path = tmp_path / "f.parquet"
    x, labels, row_ids = _data(10, 2)
    write_features(path, x, labels, row_ids, {})
    table = pq.read_table(path).drop_columns(["label"])
    pq.write_table(table, path)  # keeps the schema metadata, loses a column
    with pytest.raises(DataValidationError, match=rf"{path}.*'label'"):
        read_features(path)
    np.testing.assert_array_equal(read_features(path, columns=["x"]).x.numpy(), x)


def test_foreign_parquet_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "f.parquet"
    pq.write_table(pa.table({"label": [1, 2]}), path)
    with pytest.raises(DataValidationError, match="not a feature file"):
        read_features(path)


def test_bad_inputs_are_refused_and_write_nothing(tmp_path: Path) -> None:
    x, labels, row_ids = _data(10, 2)
    path = tmp_path / "f.parquet"
    with pytest.raises(ValueError, match="float32"):
        write_features(path, x.astype(np.float64), labels, row_ids, {})
    with pytest.raises(ValueError, match="label"):
        write_features(path, x, labels[:5], row_ids, {})
    with pytest.raises(ValueError, match="dim"):
        write_features(path, x, labels, row_ids, {"dim": 3})
    with pytest.raises(ValueError):  # NaN is not JSON
        write_features(path, x, labels, row_ids, {"a": float("nan")})
    assert list(tmp_path.iterdir()) == []


# --- image and sparse features -------------------------------------------------------------


def _images(n: int, h: int = 4, w: int = 5, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, h, w, 3), dtype=np.uint8)


def _csr(n: int, d: int, seed: int = 0) -> sp.csr_matrix:
    x = sp.random(n, d, density=0.2, format="csr", dtype=np.float32, random_state=seed)
    x.data += 1.0  # no explicit zeros, so the round trip compares exactly
    return x


def test_dense_files_carry_no_kind(tmp_path: Path) -> None:
    # Dense files are what they were before the other kinds: no ``kind`` key, read as dense.
    x, labels, row_ids = _data(20, 3)
    path = tmp_path / "f.parquet"
    write_features(path, x, labels, row_ids, {})
    assert "kind" not in read_metadata(path)
    table = read_features(path)
    assert table.kind == "dense" and table.shape == (20, 3)


def test_image_round_trip_and_metadata(tmp_path: Path) -> None:
    images = _images(300)
    labels, row_ids = np.arange(300) % 7, np.arange(300)[::-1].copy()
    path = tmp_path / "train.parquet"
    write_features(path, images, labels, row_ids, {"featurizer": "pixels"})

    table = read_features(path)
    assert table.x.dtype == torch.uint8 and tuple(table.x.shape) == (300, 4, 5, 3)
    np.testing.assert_array_equal(table.x.numpy(), images)
    np.testing.assert_array_equal(table.labels.numpy(), labels)
    np.testing.assert_array_equal(table.row_ids.numpy(), row_ids)
    expected = {"featurizer": "pixels", "kind": "image", "shape": [4, 5, 3], "dim": 60}
    assert table.metadata == {**expected, "num_rows": 300} == read_metadata(path)
    assert (table.kind, table.shape, table.dim) == ("image", (300, 4, 5, 3), 60)
    # a batch of images is index_select-ed as training does, still uint8
    assert table.x.index_select(0, torch.tensor([0, 2])).dtype == torch.uint8


def test_image_column_layout_and_encoding(tmp_path: Path) -> None:
    path = tmp_path / "f.parquet"
    write_features(path, _images(50), np.zeros(50, np.int64), np.arange(50), {})
    assert pq.read_schema(path).field("x").type == pa.list_(
        pa.field("element", pa.uint8(), nullable=False), 60
    )
    column = pq.read_metadata(path).row_group(0).column(2)
    assert column.path_in_schema == "x.list.element" and column.compression == "ZSTD"
    assert "BYTE_STREAM_SPLIT" in column.encodings
    assert not any("DICTIONARY" in e for e in column.encodings)


def test_images_are_not_copied(tmp_path: Path) -> None:
    images = _images(2000, 8, 8)
    path = tmp_path / "f.parquet"
    write_features(path, images, np.zeros(2000, np.int64), np.arange(2000), {})
    table = read_features(path)
    buffer = table.arrow.column("x").chunk(0).values.buffers()[1]
    assert table.x.data_ptr() == buffer.address
    assert np.shares_memory(table.x.numpy(), np.frombuffer(buffer, dtype=np.uint8))
    assert not np.shares_memory(table.x.numpy(), images)
    assert table.x.is_contiguous()


def test_multi_row_group_images(tmp_path: Path) -> None:
    n = ROW_GROUP_SIZE + 5
    images = _images(n, 1, 2)
    path = tmp_path / "f.parquet"
    write_features(path, images, np.arange(n) % 3, np.arange(n), {})
    np.testing.assert_array_equal(read_features(path).x.numpy(), images)


def test_sparse_round_trip_and_metadata(tmp_path: Path) -> None:
    x = _csr(200, 30)
    labels, row_ids = np.arange(200) % 5, np.arange(200)
    path = tmp_path / "f.parquet"
    write_features(path, x, labels, row_ids, {"featurizer": "bow"})
    schema = pq.read_schema(path)
    assert schema.field("idx").type == pa.list_(pa.field("element", pa.int32(), nullable=False))
    assert schema.field("val").type == pa.list_(pa.field("element", pa.float32(), nullable=False))
    assert "x" not in schema.names

    expected = {"featurizer": "bow", "kind": "sparse", "dim": 30, "nnz": x.nnz, "num_rows": 200}
    assert read_metadata(path) == expected
    table = read_features(path, kinds=KINDS)
    assert isinstance(table.x, SparseRows) and tuple(table.x.shape) == (200, 30)
    assert (table.kind, table.shape) == ("sparse", (200, 30))
    assert table.x.values.dtype == torch.float32
    np.testing.assert_array_equal(table.x.indptr.numpy(), x.indptr)
    np.testing.assert_array_equal(table.x.indices.numpy(), x.indices)
    np.testing.assert_array_equal(table.x.values.numpy(), x.data)
    np.testing.assert_array_equal(table.x.to_dense().numpy(), x.toarray())
    np.testing.assert_array_equal(table.labels.numpy(), labels)
    # the row pointer and values are the decoded Arrow buffers, not copies
    idx = table.arrow.column("idx").chunk(0)
    assert table.x.indptr.data_ptr() == idx.offsets.buffers()[1].address
    assert table.x.indices.data_ptr() == idx.values.buffers()[1].address


def test_sparse_encoding_and_canonical_rows(tmp_path: Path) -> None:
    # unsorted ids and a duplicate are summed and sorted on the way in, as CSR readers expect
    x = sp.csr_matrix(
        (np.array([1, 2, 3, 4], np.float32), np.array([3, 1, 1, 0]), np.array([0, 3, 4])),
        shape=(2, 5),
    )
    path = tmp_path / "f.parquet"
    write_features(path, x, np.array([0, 1]), np.array([0, 1]), {})
    table = read_features(path, kinds=KINDS)
    assert table.x.indices.tolist() == [1, 3, 0]
    np.testing.assert_array_equal(table.x.to_dense().numpy(), x.toarray())
    encodings = {
        c.path_in_schema: c.encodings
        for c in (pq.read_metadata(path).row_group(0).column(i) for i in range(4))
    }
    assert "DELTA_BINARY_PACKED" in encodings["idx.list.element"]
    assert "BYTE_STREAM_SPLIT" in encodings["val.list.element"]


def test_sparse_empty_and_multi_row_group(tmp_path: Path) -> None:
    path = tmp_path / "empty.parquet"
    empty = np.zeros(0, np.int64)
    write_features(path, sp.csr_matrix((0, 4), dtype=np.float32), empty, empty, {})
    table = read_features(path, kinds=KINDS)
    assert tuple(table.x.shape) == (0, 4) and table.x.indptr.tolist() == [0]
    n = ROW_GROUP_SIZE + 7
    x = _csr(n, 6, seed=1)
    path = tmp_path / "big.parquet"
    write_features(path, x, np.zeros(n, np.int64), np.arange(n), {})
    got = read_features(path, kinds=KINDS).x
    np.testing.assert_array_equal(got.indptr.numpy(), x.indptr)
    np.testing.assert_array_equal(got.indices.numpy(), x.indices)


def test_a_reader_can_refuse_sparse_but_labels_read(tmp_path: Path) -> None:
    path = tmp_path / "f.parquet"
    write_features(path, _csr(10, 4), np.arange(10), np.arange(10), {})
    with pytest.raises(DataValidationError, match=r"holds sparse features.*only dense") as info:
        read_features(path, kinds=("dense",))
    assert str(path) in str(info.value) and "\n" not in str(info.value)
    table = read_features(path, columns=["label"])
    assert table.x is None and table.labels.tolist() == list(range(10))


def test_bad_image_and_sparse_inputs_write_nothing(tmp_path: Path) -> None:
    path = tmp_path / "f.parquet"
    n = np.arange(4)
    with pytest.raises(ValueError, match="uint8"):
        write_features(path, _images(4).astype(np.float32), n, n, {})
    with pytest.raises(ValueError, match="shape"):
        write_features(path, _images(4), n, n, {"shape": [5, 4, 3]})
    with pytest.raises(ValueError, match="kind"):
        write_features(path, _data(4, 2)[0], n, n, {"kind": "image"})
    with pytest.raises(ValueError, match="float32 CSR"):
        write_features(path, sp.csr_matrix(np.eye(4)), n, n, {})
    assert list(tmp_path.iterdir()) == []


def test_a_failed_write_leaves_the_old_file(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "f.parquet"
    write_features(path, _images(5), np.arange(5), np.arange(5), {"v": 1})
    before = path.read_bytes()

    def crash(table, where, **kwargs):
        Path(where).write_bytes(b"PAR1 partial")
        raise OSError("disk full")

    monkeypatch.setattr(pq, "write_table", crash)
    with pytest.raises(OSError, match="disk full"):
        write_features(path, _csr(5, 3), np.arange(5), np.arange(5), {"v": 2})
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["f.parquet"]


def test_inconsistent_image_metadata_is_rejected(tmp_path: Path) -> None:
    path = tmp_path / "f.parquet"
    write_features(path, _images(3), np.arange(3), np.arange(3), {})
    table = pq.read_table(path)
    meta = json.loads(table.schema.metadata[b"tailkit"])
    for bad, match in (({"shape": [4, 4, 3]}, "shape"), ({"kind": "video"}, "video")):
        encoded = json.dumps({**meta, **bad}).encode()
        pq.write_table(table.replace_schema_metadata({b"tailkit": encoded}), path)
        with pytest.raises(DataValidationError, match=match):
            read_features(path)
    # a dense-typed x under image metadata is a type error naming the column
    x = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(3 * 60, np.float32)), 60)
    pq.write_table(
        table.set_column(2, "x", x).replace_schema_metadata({b"tailkit": json.dumps(meta)}),
        path,
    )
    with pytest.raises(DataValidationError, match=r"column 'x' has type"):
        read_features(path)


def _flip_bit_in_last_page(path: Path, column: str) -> None:
    """Flip one bit in the last byte of ``column``'s chunk in row group 0: the end of its last
    data page's body, past the page header (which the page checksum does not cover)."""
    meta = pq.ParquetFile(path).metadata.row_group(0)
    names = [meta.column(i).path_in_schema.split(".")[0] for i in range(meta.num_columns)]
    chunk = meta.column(names.index(column))
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    end = start + chunk.total_compressed_size
    assert end - 1 > chunk.data_page_offset
    data = bytearray(path.read_bytes())
    data[end - 1] ^= 0x08
    path.write_bytes(bytes(data))


# row_id: random ids are incompressible, so zstd stores the page as a raw block and the flip
# decodes to a wrong id with no error at all: only the page checksum catches it. label and x
# compress: there the flip would also break zstd, but the checksum is checked first.
@pytest.mark.parametrize("column", ["row_id", "label", "x"])
def test_a_flipped_bit_in_a_page_names_the_file_and_the_featurize_stage(
    tmp_path: Path, column: str
) -> None:
    rng = np.random.default_rng(0)
    n = 2000
    x = rng.standard_normal((n, 8), dtype=np.float32)
    row_ids = rng.integers(0, 2**62, n)
    path = tmp_path / "features" / "rff" / "train.parquet"
    write_features(path, x, rng.integers(0, 10, n), row_ids, {})
    _flip_bit_in_last_page(path, column)
    if column == "row_id":  # without verification the damage goes unnoticed
        silent = pq.read_table(path, columns=["row_id"])["row_id"].to_numpy()
        assert (silent != row_ids).sum() == 1
    with pytest.raises(DataValidationError) as caught:
        read_features(path)
    assert str(caught.value) == (
        f"{path}: not a readable Parquet file (could not verify page integrity, CRC checksum "
        "verification failed for page_ordinal 0); rebuild it with `dvc repro featurize@rff`"
    )
    # a projection that skips the damaged column still reads
    others = [c for c in ("row_id", "label") if c != column]
    assert read_features(path, columns=others).num_rows == n


def test_files_without_page_checksums_still_read(tmp_path: Path) -> None:
    """Feature files written before checksums existed carry none; pyarrow skips the check."""
    x, labels, row_ids = _data(50, 3)
    path = tmp_path / "f.parquet"
    write_features(path, x, labels, row_ids, {})
    table = pq.read_table(path)
    pq.write_table(table, path, compression="zstd", write_page_checksum=False)
    np.testing.assert_array_equal(read_features(path).x.numpy(), x)
