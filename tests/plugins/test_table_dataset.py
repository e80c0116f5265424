"""The ``table`` dataset: a user's Parquet, CSV, TSV or JSON-lines file, text or vectors, one
label or a list, read without a plugin; every bad row refused on one line naming file, row and
column, with nothing left under ``dest``."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pytest

from tailkit.errors import DataValidationError, InvalidParameterError
from tailkit.plugins.datasets.table import Table


def _fetch_load(tmp_path: Path, frame_or_text, name: str, **options):
    path = tmp_path / name
    if isinstance(frame_or_text, str):
        path.write_text(frame_or_text)
    elif name.endswith(".parquet"):
        frame_or_text.write_parquet(path)
    elif name.endswith(".jsonl"):
        frame_or_text.write_ndjson(path)
    else:
        frame_or_text.write_csv(path, separator="\t" if name.endswith(".tsv") else ",")
    dataset = Table(path=str(path), **options)
    dest = tmp_path / f"raw-{name}"
    dest.mkdir()
    dataset.fetch(dest)
    return dataset, dataset.load(dest)


def test_text_with_one_string_label_a_row_from_csv(tmp_path):
    frame = pl.DataFrame(
        {"body": ["a b", "c d e", "f", "g h"], "tag": ["zeta", "alpha", "zeta", "mu"]}
    )
    dataset, raw = _fetch_load(tmp_path, frame, "rows.csv", input="body", label="tag")
    assert raw.modality == "text" and raw.inputs.dtype == object
    assert raw.inputs.tolist() == ["a b", "c d e", "f", "g h"]
    assert raw.label_names == ["alpha", "mu", "zeta"]  # sorted, as written
    assert raw.labels.dtype == np.int64 and raw.labels.tolist() == [2, 0, 2, 1]
    assert raw.splits is None and dataset.multilabel is False


def test_integer_labels_sort_numerically_and_keep_their_spelling(tmp_path):
    frame = pl.DataFrame({"text": list("abcd"), "label": [10, 9, 100, 9]})
    _, raw = _fetch_load(tmp_path, frame, "rows.tsv")
    assert raw.label_names == ["9", "10", "100"]
    assert raw.labels.tolist() == [1, 0, 2, 0]


def test_vector_lists_with_label_lists_and_a_split_column(tmp_path, capsys):
    vectors = [[0.5, 1.0, -2.0], [1.0, 0.0, 3.0], [2.0, 2.0, 2.0], [0.0, 0.0, 1.5]]
    frame = pl.DataFrame(
        {
            "emb": vectors,
            "tags": [["b", "a"], ["c"], [], ["a", "a", "c"]],
            "part": ["train", "train", "test", "val"],
        }
    )
    for name in ("rows.parquet", "rows.jsonl"):
        dataset, raw = _fetch_load(tmp_path, frame, name, input="emb", label="tags", split="part")
        assert dataset.multilabel is True and raw.multilabel and raw.modality == "dense"
        assert raw.inputs.dtype == np.float32
        np.testing.assert_array_equal(raw.inputs, np.asarray(vectors, np.float32))
        assert raw.label_names == ["a", "b", "c"]
        np.testing.assert_array_equal(
            raw.labels.toarray(), [[1, 1, 0], [0, 0, 1], [0, 0, 0], [1, 0, 1]]
        )
        assert {k: v.tolist() for k, v in raw.splits.items()} == {
            "train": [0, 1],
            "val": [3],
            "test": [2],
        }
    err = capsys.readouterr().err
    assert "1 rows list a label more than once" in err
    assert "1 rows have an empty label list" in err


def test_numeric_columns_and_a_separated_label_string(tmp_path):
    text = "x,y,z,labels\n1,2,3,a|b\n4,5,6, c \n7,8,9.5,b\n"
    dataset, raw = _fetch_load(
        tmp_path, text, "rows.csv", input=["x", "y", "z"], label="labels", label_separator="|"
    )
    assert dataset.multilabel is True
    np.testing.assert_array_equal(raw.inputs, [[1, 2, 3], [4, 5, 6], [7, 8, 9.5]])
    assert raw.label_names == ["a", "b", "c"]
    np.testing.assert_array_equal(raw.labels.toarray(), [[1, 1, 0], [0, 0, 1], [0, 1, 0]])


def test_fixed_size_vectors_and_new_rows_for_predict(tmp_path):
    values = pa.FixedSizeListArray.from_arrays(pa.array(np.arange(8, dtype=np.float64)), 2)
    table = pa.table({"v": values, "label": ["p", "q", "p", "q"]})
    path = tmp_path / "rows.parquet"
    pl.from_arrow(table).write_parquet(path)
    dataset = Table(path=str(path), input="v")
    dest = tmp_path / "raw"
    dest.mkdir()
    dataset.fetch(dest)
    raw = dataset.load(dest)
    assert raw.inputs.shape == (4, 2) and raw.inputs[3].tolist() == [6.0, 7.0]
    new = dataset.decode_rows(pa.table({"v": [[1.5, 2.5]]}))
    assert new.dtype == np.float32 and new.tolist() == [[1.5, 2.5]]


BAD = [
    ("text,label\na,x\nb,\n", {}, r"rows\.csv: row 1 \(line 3\), column 'label': no label"),
    ("text,tag\na,x\n", {}, r"rows\.csv: no column 'label'; the table has 'text', 'tag'"),
    (
        '{"text": "a", "label": ["x", ""]}\n',
        {},
        r"row 0 \(line 1\), column 'label': an empty label",
    ),
    (
        '{"v": [1.0, 2.0], "label": "x"}\n{"v": [1.0], "label": "y"}\n',
        {"input": "v"},
        r"row 1 \(line 2\), column 'v': a vector of 1 values; row 0 has 2",
    ),
    (
        '{"v": [1.0, 2.0], "label": "x"}\n{"v": [1.0, NaN], "label": "y"}\n',
        {"input": "v"},
        r"rows\.jsonl: (not a readable|row 1 .*'v' \(value 1\): nan)",
    ),
    (
        "x,label\n1.0,a\n1e39,b\n",
        {"input": ["x"]},
        r"row 1 \(line 3\), column 'x': 1e\+39 is not a finite float32",
    ),
    ("x,label\n1.0,a\n,b\n", {"input": ["x"]}, r"row 1 \(line 3\), column 'x': empty \(null\)"),
    (
        "text,label,part\na,x,train\nb,y,tst\n",
        {"split": "part"},
        r"row 1 \(line 3\), column 'part': split 'tst'; expected one of train, val, test",
    ),
    ("text,label\na,1.5\n", {}, r"column 'label' holds Float64 labels"),
    ("text,label\n", {}, r"the table has no rows"),
]


@pytest.mark.parametrize(("content", "options", "message"), BAD)
def test_bad_rows_are_one_line_naming_file_row_and_column(tmp_path, content, options, message):
    name = "rows.jsonl" if content.startswith("{") else "rows.csv"
    path = tmp_path / name
    path.write_text(content)
    dest = tmp_path / "raw"
    dest.mkdir()
    with pytest.raises(DataValidationError, match=message) as caught:
        Table(path=str(path), **options).fetch(dest)
    assert "\n" not in str(caught.value)
    assert list(dest.iterdir()) == []  # nothing partial


def test_a_nan_inside_a_vector_names_the_value(tmp_path):
    frame = pl.DataFrame({"v": [[1.0, 2.0], [3.0, math.nan]], "label": ["a", "b"]})
    path = tmp_path / "rows.parquet"
    frame.write_parquet(path)
    with pytest.raises(DataValidationError, match=r"row 1, column 'v' \(value 1\): nan"):
        Table(path=str(path), input="v").fetch(tmp_path)


def test_options_are_checked_when_built(tmp_path):
    with pytest.raises(DataValidationError, match=r"expected a table file ending in"):
        Table(path=str(tmp_path / "rows.xlsx"))
    with pytest.raises(InvalidParameterError, match=r"dataset\.sha256"):
        Table(path=str(tmp_path / "rows.csv"), sha256="abc")


def test_a_pinned_sha256_refuses_other_bytes(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("text,label\na,x\n")
    with pytest.raises(DataValidationError, match="SHA256 mismatch"):
        Table(path=str(path), sha256="0" * 64).fetch(tmp_path)


def test_load_before_fetch_says_to_run_download(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("text,label\na,x\n")
    with pytest.raises(DataValidationError, match="run the download stage first"):
        Table(path=str(path)).load(tmp_path)
    dest = tmp_path / "raw"
    dest.mkdir()
    Table(path=str(path)).fetch(dest)
    assert json.loads((dest / "table.json").read_text())["modality"] == "text"
