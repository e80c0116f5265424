"""Per-label tables live in Parquet: no JSON under data/ grows with the number of labels."""

from __future__ import annotations

import copy

import numpy as np
import polars as pl
import pyarrow.parquet as pq
import pytest
from conftest import TINY_PARAMS

from tailkit.errors import DataValidationError
from tailkit.params import parse_params
from tailkit.paths import Layout
from tailkit.registry import make_registry
from tailkit.stages import download, featurize, subsample
from tailkit.storage.label_table import read_label_table, write_label_table
from tailkit.storage.splits import SPLITS, read_labels, read_meta, read_split


def _data_stages(root, num_classes: int) -> Layout:
    raw = copy.deepcopy(TINY_PARAMS)
    raw["dataset"].update(num_classes=num_classes, num_examples=20 * num_classes)
    params = parse_params(raw, "test-params")
    layout, registry = Layout(root), make_registry()
    download.run(params, layout, registry)
    subsample.run(params, layout, registry)
    featurize.run(params, layout, registry, "rff")
    return layout


def test_json_sizes_do_not_grow_with_the_label_count(tmp_path):
    small = _data_stages(tmp_path / "small", 30)
    large = _data_stages(tmp_path / "large", 3000)
    sizes = {}
    for name, layout in (("small", small), ("large", large)):
        files = sorted((layout.root / "data").rglob("*.json"))
        sizes[name] = {str(p.relative_to(layout.root)): p.stat().st_size for p in files}
    assert sizes["small"].keys() == sizes["large"].keys() and sizes["small"]
    for path, size in sizes["small"].items():
        # 100× the labels; a digit or two more in a count, nothing per label
        assert sizes["large"][path] <= size + 64, path
    # the counts are all there, in the label table, for both folders
    for directory in (large.split, large.feature_set("rff")):
        meta = read_meta(directory)
        table = read_labels(directory)
        assert table.height == 3000 and table["label"].to_list() == list(range(3000))
        assert meta["train_counts"].shape == (3000,) and meta["train_counts"].sum() > 0
        for split in SPLITS:
            _, labels = read_split(large.split, split)
            np.testing.assert_array_equal(
                meta[f"{split}_counts"], np.bincount(labels, minlength=3000)
            )
    np.testing.assert_array_equal(
        read_meta(large.split)["val_counts"], read_meta(large.feature_set("rff"))["val_counts"]
    )


def _flip_bit_in_last_page(path, column: str) -> None:
    """Flip one bit in the last byte of ``column``'s chunk in row group 0: the end of its last
    data page's body, past the page header (which the page checksum does not cover)."""
    meta = pq.ParquetFile(path).metadata.row_group(0)
    names = [meta.column(i).path_in_schema for i in range(meta.num_columns)]
    chunk = meta.column(names.index(column))
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    end = start + chunk.total_compressed_size
    assert end - 1 > chunk.data_page_offset
    data = bytearray(path.read_bytes())
    data[end - 1] ^= 0x08
    path.write_bytes(bytes(data))


# Every column here decodes the flip silently without the page checksum (polars, which wrote
# and read label tables before, has none): the dictionary indices and the random scores do not
# compress, so zstd stores them as raw blocks and cannot notice.
@pytest.mark.parametrize("column", ["label", "name", "score"])
@pytest.mark.parametrize("where", ["per-class", "split"])
def test_a_flipped_bit_in_a_label_table_names_the_file_and_its_stage(tmp_path, column, where):
    rng = np.random.default_rng(0)
    n = 1000
    frame = pl.DataFrame(
        {"label": np.arange(n), "name": [f"label {j}" for j in range(n)], "score": rng.random(n)}
    )
    if where == "per-class":
        path, stage = tmp_path / "per_class.parquet", "evaluate@a"
        write_label_table(path, frame, {"tailkit.k": "5"})

        def read():
            return read_label_table(path, str(path), stage)
    else:
        directory = tmp_path / "data" / "split"
        path, stage = directory / "labels.parquet", "subsample"
        write_label_table(path, frame)

        def read():
            return read_labels(directory)

    assert read().equals(frame)
    _flip_bit_in_last_page(path, column)
    assert not pl.read_parquet(path).equals(frame)  # polars reads the damage without a word
    with pytest.raises(DataValidationError) as caught:
        read()
    assert str(caught.value) == (
        f"{path}: not a readable Parquet file (could not verify page integrity, CRC checksum "
        f"verification failed for page_ordinal 0); rebuild it with `dvc repro {stage}`"
    )
