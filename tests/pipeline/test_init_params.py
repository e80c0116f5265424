"""`tailkit init`: a params.yaml for the user's table, read and checked as the pipeline will
read it, that the stages' own parser accepts, naming the right feature set and losses."""

from __future__ import annotations

import pytest
import yaml
from click.testing import CliRunner

from tailkit.cli import cli
from tailkit.errors import DataValidationError, InvalidParameterError
from tailkit.params import parse_params
from tailkit.pipeline.init_params import describe, write_params
from tailkit.plugins.datasets.table import Table
from tailkit.testing.tables import zipf_text_table, zipf_vector_table


def test_text_with_one_label_a_row(tmp_path):
    data = tmp_path / "rows.csv"
    zipf_text_table(400, 20).write_csv(data)
    shape = write_params(Table(path=str(data)), tmp_path / "params.yaml", force=False)
    assert (shape.rows, shape.multilabel, shape.modality) == (400, False, "text")
    text = (tmp_path / "params.yaml").read_text()
    assert text.startswith(f"# tailkit params for {data}: 400 rows, {shape.labels} labels")
    params = parse_params(yaml.safe_load(text), "params.yaml")
    assert params.featurize == {"words": {"name": "text-tfidf", "word_ngrams": [1, 2], "min_df": 2}}
    assert list(params.experiments) == ["softmax", "logit-adjusted", "sampled-unigram"]
    assert params.dataset == {"name": "table", "path": str(data), "input": "text", "label": "label"}


def test_vectors_with_label_lists(tmp_path):
    data = tmp_path / "rows.parquet"
    zipf_vector_table(300, 12, dim=5, multilabel=True).write_parquet(data)
    dataset = Table(path=str(data), input="embedding")
    shape = describe(dataset)
    assert shape.multilabel and shape.modality == "dense" and shape.width == 5
    assert 1.0 < shape.labels_per_row < 3.0
    write_params(dataset, tmp_path / "params.yaml", force=False)
    params = yaml.safe_load((tmp_path / "params.yaml").read_text())
    assert params["featurize"] == {"vectors": {"name": "identity"}}
    assert params["experiments"]["softmax"]["model"] == {"name": "linear"}
    assert params["experiments"]["sampled-unigram"]["negatives"] == 3  # a quarter of 12 labels


def test_an_existing_file_stays_and_bad_rows_are_refused_before_writing(tmp_path):
    data = tmp_path / "rows.csv"
    data.write_text("text,label\na b,x\nc d,\n")
    out = tmp_path / "params.yaml"
    with pytest.raises(DataValidationError, match=r"row 1 \(line 3\), column 'label'"):
        write_params(Table(path=str(data)), out, force=False)
    assert not out.exists()
    out.write_text("mine\n")
    with pytest.raises(InvalidParameterError, match="exists; --force replaces it"):
        write_params(Table(path=str(data)), out, force=False)
    assert out.read_text() == "mine\n"


def test_the_command(tmp_path):
    data = tmp_path / "rows.jsonl"
    zipf_text_table(200, 10, multilabel=True).write_ndjson(data)
    out = tmp_path / "mine.yaml"
    args = ["init", "--data", str(data), "--input", "text", "--label", "label", "--out", str(out)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert "200 rows" in result.output and "label lists" in result.output
    assert "table" in out.read_text()
    again = CliRunner().invoke(cli, args)
    assert again.exit_code != 0 and "exists" in again.output


def test_a_table_of_one_label_is_refused_naming_the_file(tmp_path):
    data = tmp_path / "one.csv"
    data.write_text("text,label\na b,only\nc d,only\n")
    out = tmp_path / "params.yaml"
    result = CliRunner().invoke(
        cli, ["init", "--data", str(data), "--input", "text", "--label", "label", "--out", str(out)]
    )
    assert result.exit_code != 0 and not out.exists()
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and str(data) in lines[0] and "'only'" in lines[0], lines
