"""``tailkit predict``: new rows through the experiment's re-fitted featurizer give the same
top-k, scores and probabilities as the cached split, which match evaluate's metrics and the
dense definition; thresholds, output formats and bad input."""

from __future__ import annotations

import json
import types
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp
import yaml
from click.testing import CliRunner
from conftest import prepare_stages

from tailkit import hookimpl
from tailkit.cli import cli
from tailkit.components import RawData
from tailkit.errors import DataValidationError, InvalidParameterError
from tailkit.params import parse_params
from tailkit.paths import Layout
from tailkit.pipeline import predict_new_rows as predicting
from tailkit.plugins.datasets.geonames import PLACES, GeoNames
from tailkit.registry import make_registry
from tailkit.stages import download, evaluate, featurize, subsample, train
from tailkit.storage import tensorfile
from tailkit.storage.feature_cache import read_features
from tailkit.storage.splits import read_labels, read_split

ADAGRAD = {"name": "adagrad", "lr": 0.1}


class SparseWords:
    """Bag-of-words rows whose words name their class (a sparse dataset with no decode_rows)."""

    def fetch(self, dest: Path) -> None:
        (dest / "done").write_text("1")

    def load(self, raw_dir: Path) -> RawData:
        rng = np.random.default_rng(0)
        n, classes, words = 600, 6, 40
        labels = rng.integers(0, classes, n)
        counts = rng.poisson(0.3, (n, words)).astype(np.float32)
        counts[np.arange(n), labels * 5] += 2
        names = [f"c{i}" for i in range(classes)]
        return RawData(sp.csr_matrix(counts), labels.astype(np.int64), names, "sparse")


def _plugin():
    mod = types.SimpleNamespace()

    @hookimpl
    def register_datasets(register):
        register("sparse-words", SparseWords)

    mod.register_datasets = register_datasets
    return mod


REGISTRY = make_registry(extra_plugins=[("test-predict", _plugin())])

DENSE = {
    "base": {"device": "cpu"},
    "dataset": {"name": "synthetic", "num_classes": 12, "num_examples": 1500, "dim": 4},
    "subsample": {"profile": "natural", "val_fraction": 0.15, "test_fraction": 0.15},
    "featurize": {"rff": {"name": "rff", "dim": 32, "bandwidth": 1.0}},
    "samplers": {"tree": {"name": "tree", "k": 3}},
    "train": {"epochs": 2, "batch_size": 64, "eval_every": 1000},
    "evaluate": {"batch_size": 50, "label_chunk": 5},
    "experiments": {
        "softmax": {
            "loss": {"name": "softmax"},
            "sampler": "none",
            "features": "rff",
            "optimizer": ADAGRAD,
        },
        "posthoc": {
            "loss": {"name": "logit-adjusted", "adjustment": "posthoc"},
            "sampler": "none",
            "features": "rff",
            "optimizer": ADAGRAD,
        },
        "tree-ns": {
            "loss": {"name": "negative-sampling"},
            "sampler": "tree",
            "features": "rff",
            "negatives": 3,
            "optimizer": ADAGRAD,
        },
        "hinge": {
            "loss": {"name": "decoupled", "margin_loss": "hinge"},
            "sampler": "none",
            "features": "rff",
            "optimizer": ADAGRAD,
        },
    },
}


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    params = parse_params(DENSE, "test-params")
    layout = Layout(tmp_path_factory.mktemp("predict"))
    prepare_stages(params, layout, REGISTRY, "rff")
    metrics = {}
    for name in DENSE["experiments"]:
        train.run(params, layout, REGISTRY, name)
        metrics[name] = evaluate.run(params, layout, REGISTRY, name)
    return params, layout, metrics


def _raw_test_table(params, layout) -> pa.Table:
    """The test rows' raw inputs as a user would hand them over: numeric columns and an id."""
    raw = REGISTRY.build("datasets", params.dataset, "dataset").load(layout.raw_data("synthetic"))
    rows = read_split(layout.split, "test")[0]
    x = raw.inputs[rows]
    columns = {"id": [f"place-{r}" for r in rows]}
    columns.update({f"x{j}": x[:, j].astype(np.float64) for j in range(x.shape[1])})
    return pa.table(columns)


def _lists(table: pa.Table, column: str) -> list:
    return table.column(column).to_pylist()


@pytest.mark.parametrize("experiment", ["softmax", "posthoc", "tree-ns"])
def test_new_rows_predict_what_the_cached_test_split_does_and_evaluate_scored(
    dense, tmp_path, experiment
) -> None:
    params, layout, metrics = dense
    path = tmp_path / "rows.parquet"
    pq.write_table(_raw_test_table(params, layout), path)
    fresh = predicting.run(params, layout, REGISTRY, experiment, input_path=path, k=5)
    cached = predicting.run(params, layout, REGISTRY, experiment, split="test", k=5)
    # the re-fitted featurizer gives the cached features, so the very same bits come out
    for column in ("labels", "scores", "probabilities", "names"):
        assert _lists(fresh, column) == _lists(cached, column), column
    assert _lists(fresh, "id")[:2] == [
        f"place-{r}" for r in read_split(layout.split, "test")[0][:2]
    ]
    # and the ranking is evaluate's (with the loss's prediction-time adjustment)
    y = read_features(layout.feature_set("rff") / "test.parquet").labels.numpy()
    ranked = np.array(_lists(cached, "labels"))
    test = metrics[experiment]["test"]
    assert (ranked[:, 0] == y).mean() == test["accuracy"]
    assert (ranked == y[:, None]).any(axis=1).mean() == test["top5_accuracy"]


def test_scores_and_probabilities_are_the_dense_softmax_of_the_model(dense) -> None:
    params, layout, _ = dense
    table = predicting.run(params, layout, REGISTRY, "softmax", split="test", k=3)
    state = tensorfile.load(layout.model("softmax") / "model.safetensors")
    x = read_features(layout.feature_set("rff") / "test.parquet").x.double().numpy()
    w, b = state["layer"]["weight"].double().numpy(), state["layer"]["bias"].double().numpy()
    scores = x @ w.T + b
    expected = np.argsort(-scores, axis=1, kind="stable")[:, :3]
    np.testing.assert_array_equal(np.array(_lists(table, "labels")), expected)
    logz = np.logaddexp.reduce(scores, axis=1, keepdims=True)
    probabilities = np.take_along_axis(np.exp(scores - logz), expected, axis=1)
    np.testing.assert_allclose(np.array(_lists(table, "probabilities")), probabilities, atol=1e-5)
    names = read_labels(layout.feature_set("rff"), ["name"])["name"].to_list()
    assert _lists(table, "names") == [[names[j] for j in row] for row in expected]


def test_a_threshold_keeps_exactly_the_labels_whose_probability_reaches_it(dense) -> None:
    params, layout, _ = dense
    full = predicting.run(params, layout, REGISTRY, "softmax", split="val", k=5)
    kept = predicting.run(params, layout, REGISTRY, "softmax", split="val", k=5, threshold=0.3)
    for labels, probs, kept_labels in zip(
        _lists(full, "labels"), _lists(full, "probabilities"), _lists(kept, "labels"), strict=True
    ):
        assert kept_labels == [j for j, p in zip(labels, probs, strict=True) if p >= 0.3]
    assert any(len(x) == 0 for x in _lists(kept, "labels"))  # a row may keep nothing
    assert any(len(x) > 0 for x in _lists(kept, "labels"))


def test_a_loss_without_probabilities_ranks_but_refuses_a_threshold(dense) -> None:
    params, layout, _ = dense
    table = predicting.run(params, layout, REGISTRY, "hinge", split="test", k=2)
    assert set(_lists(table, "probabilities")) == {None}
    with pytest.raises(InvalidParameterError, match="gives no probabilities"):
        predicting.run(params, layout, REGISTRY, "hinge", split="test", threshold=0.5)


def test_the_command_writes_json_lines_and_parquet(dense, tmp_path, monkeypatch) -> None:
    params, layout, _ = dense
    monkeypatch.chdir(layout.root)
    (layout.root / "params.yaml").write_text(yaml.safe_dump(DENSE))
    path = tmp_path / "rows.csv"
    pa_csv.write_csv(_raw_test_table(params, layout).slice(0, 4), path)
    runner = CliRunner()
    args = ["predict", "--experiment", "posthoc", "--input", str(path), "--top-k", "2"]
    result = runner.invoke(cli, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["id"] for r in rows] == _lists(_raw_test_table(params, layout), "id")[:4]
    assert all(len(r["labels"]) == len(r["names"]) == len(r["probabilities"]) == 2 for r in rows)
    out = tmp_path / "out.parquet"
    result = runner.invoke(cli, [*args, "--output", str(out)])
    assert result.exit_code == 0, result.output
    assert pq.read_table(out).to_pylist() == rows
    result = runner.invoke(cli, [*args, "--output", str(tmp_path / "out.txt")])
    assert result.exit_code == 2 and "expected a .parquet or .jsonl" in result.output
    assert not (tmp_path / "out.txt").exists()


def test_bad_requests_are_one_line_errors(dense, tmp_path) -> None:
    params, layout, _ = dense
    with pytest.raises(InvalidParameterError, match="no experiment 'nope'"):
        predicting.run(params, layout, REGISTRY, "nope", split="test")
    with pytest.raises(InvalidParameterError, match="either --input FILE or --split NAME"):
        predicting.run(params, layout, REGISTRY, "softmax")
    with pytest.raises(InvalidParameterError, match="--split: got 'dev'"):
        predicting.run(params, layout, REGISTRY, "softmax", split="dev")
    narrow = tmp_path / "narrow.csv"
    narrow.write_text("id,a,b\n1,0.5,0.25\n")
    with pytest.raises(DataValidationError, match=r"narrow.csv: the dataset's rows have 4 input"):
        predicting.run(params, layout, REGISTRY, "softmax", input_path=narrow)
    holes = tmp_path / "holes.csv"
    holes.write_text("a,b,c,d\n1,2,3,4\n1,,3,4\n")
    with pytest.raises(DataValidationError, match=r"holes.csv: row 1: column 'b' is nan"):
        predicting.run(params, layout, REGISTRY, "softmax", input_path=holes)
    (tmp_path / "x.txt").write_text("a,b,c,d\n")
    with pytest.raises(
        DataValidationError,
        match=r"expected a table file ending in \.parquet, \.csv, \.tsv, \.jsonl",
    ):
        predicting.run(params, layout, REGISTRY, "softmax", input_path=tmp_path / "x.txt")
    with pytest.raises(DataValidationError, match="no such file"):
        predicting.run(params, layout, REGISTRY, "softmax", input_path=tmp_path / "y.csv")


def test_a_featurizer_that_no_longer_gives_the_cached_features_is_refused(dense, tmp_path) -> None:
    params, layout, _ = dense
    moved = parse_params(
        {**DENSE, "featurize": {"rff": {"name": "rff", "dim": 32, "bandwidth": 2.0}}}, "moved"
    )
    path = tmp_path / "rows.parquet"
    pq.write_table(_raw_test_table(params, layout).slice(0, 3), path)
    with pytest.raises(DataValidationError, match=r"run `dvc repro evaluate@softmax` first"):
        predicting.run(moved, layout, REGISTRY, "softmax", input_path=path)


def test_sparse_rows_come_as_id_value_tokens(tmp_path) -> None:
    params = parse_params(
        {
            "base": {"device": "cpu"},
            "dataset": {"name": "sparse-words"},
            "subsample": {"val_fraction": 0.15, "test_fraction": 0.15},
            "featurize": {"tfidf": {"name": "tfidf"}},
            "train": {"epochs": 2, "batch_size": 64, "eval_every": 1000},
            "experiments": {
                "linear": {
                    "loss": {"name": "softmax"},
                    "model": {"name": "sparse-linear", "dim": 8},
                    "sampler": "none",
                    "features": "tfidf",
                    "optimizer": ADAGRAD,
                }
            },
        },
        "test-params",
    )
    layout = Layout(tmp_path / "project")
    for stage in (download, subsample):
        stage.run(params, layout, REGISTRY)
    featurize.run(params, layout, REGISTRY, "tfidf")
    train.run(params, layout, REGISTRY, "linear")
    raw = SparseWords().load(tmp_path)
    rows = read_split(layout.split, "test")[0]
    lines = [
        " ".join(f"{j}:{v:.9g}" for j, v in zip(r.indices, r.data, strict=True))
        for r in raw.inputs[rows]
    ]
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"features": lines}), path)
    fresh = predicting.run(params, layout, REGISTRY, "linear", input_path=path, k=3)
    cached = predicting.run(params, layout, REGISTRY, "linear", split="test", k=3)
    assert _lists(fresh, "labels") == _lists(cached, "labels")
    assert _lists(fresh, "scores") == _lists(cached, "scores")
    assert _lists(fresh, "id") == list(range(len(rows)))
    bad = tmp_path / "bad.csv"
    bad.write_text("features\n3:1 99:2\n")
    with pytest.raises(DataValidationError, match=r"bad.csv: row 0: token '99:2' is not"):
        predicting.run(params, layout, REGISTRY, "linear", input_path=bad)


def test_geonames_decodes_latitude_and_longitude_as_load_does(tmp_path) -> None:
    dataset = GeoNames()
    dataset.fetch(tmp_path)
    raw = dataset.load(tmp_path)
    places = pq.read_table(tmp_path / PLACES).sort_by("geonameid").slice(0, 50)
    np.testing.assert_array_equal(dataset.decode_rows(places), raw.inputs[:50])
    off = pa.table({"latitude": [10.0, 95.0], "longitude": [0.0, 0.0]})
    with pytest.raises(DataValidationError, match=r"row 1: latitude 95.0 is not in \[-90, 90\]"):
        dataset.decode_rows(off)
    with pytest.raises(DataValidationError, match="no longitude column"):
        dataset.decode_rows(pa.table({"latitude": [1.0]}))
