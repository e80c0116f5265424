"""The Parquet feature cache: round trip, zero-copy read, projection, bad files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from tailkit.cache import ROW_GROUP_SIZE, read_features, read_metadata, write_features
from tailkit.errors import DataValidationError


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
