"""Per-label results (tailkit/evaluation/per_class.py) and the one label-table reader and
writer (tailkit/storage/label_table.py)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from tailkit.errors import DataValidationError
from tailkit.evaluation.per_class import (
    PLOT_COLUMNS,
    binned,
    data_key,
    per_class_frame,
    per_label_results,
    write_class_plot,
    write_per_class,
)
from tailkit.reporting.figures import read_class_bins
from tailkit.storage.label_table import read_label_table, read_table_metadata, write_label_table


def _random_case(rng, rows: int, labels: int, k: int, multilabel: bool):
    """Random rankings (some rows padded with −1) and true label sets as lists and CSR."""
    ranked = np.stack([rng.permutation(labels)[:k] for _ in range(rows)])
    ranked[rng.random(rows) < 0.1, k - 1] = -1
    if multilabel:
        truth = [sorted(rng.choice(labels, rng.integers(0, 4), replace=False)) for _ in range(rows)]
    else:
        truth = [[int(j)] for j in rng.integers(0, labels, rows)]
    indptr = np.cumsum([0] + [len(t) for t in truth])
    indices = np.array([j for t in truth for j in t], dtype=np.int64)
    return ranked, truth, (indptr, indices)


@pytest.mark.parametrize("multilabel", [False, True])
def test_per_label_results_equal_their_definitions_row_by_row(multilabel):
    rng = np.random.default_rng(3)
    labels, k = 9, 3
    ranked, truth, csr = _random_case(rng, 200, labels, k, multilabel)
    got = per_label_results(ranked, csr, labels)
    for j in range(labels):
        carrying = [i for i, t in enumerate(truth) if j in t]
        first = [i for i in range(len(truth)) if ranked[i, 0] == j]
        assert got["support"][j] == len(carrying)
        if carrying:
            assert got["recall@1"][j] == pytest.approx(
                np.mean([ranked[i, 0] == j for i in carrying])
            )
            assert got["recall@k"][j] == pytest.approx(np.mean([j in ranked[i] for i in carrying]))
        else:
            assert np.isnan(got["recall@1"][j]) and np.isnan(got["recall@k"][j])
        if first:
            assert got["precision@1"][j] == pytest.approx(np.mean([j in truth[i] for i in first]))
        else:
            assert np.isnan(got["precision@1"][j])


def _frame(rng, labels: int, k: int = 5) -> pl.DataFrame:
    counts = np.minimum(rng.zipf(1.6, labels) - 1, 10**6)
    table = pl.DataFrame(
        {
            "label": np.arange(labels, dtype=np.int64),
            "name": [f"label {j}" for j in range(labels)],
            "train_count": counts,
            "val_count": counts // 10,
            "test_count": counts // 5,
        }
    )
    support = np.asarray(counts // 5)
    recall = np.where(support > 0, rng.integers(0, 4, labels) / 3, np.nan)  # ties on purpose
    results = {
        "support": support,
        "recall@1": recall,
        "recall@k": np.where(support > 0, np.maximum(recall, rng.random(labels)), np.nan),
        "precision@1": np.where(rng.random(labels) < 0.5, rng.random(labels), np.nan),
    }
    return per_class_frame(table, results, k)


def test_per_class_parquet_round_trips_exactly(tmp_path):
    frame = _frame(np.random.default_rng(0), 5000)
    path = tmp_path / "per_class.parquet"
    write_per_class(path, frame, "softmax", 5, "0123456789ab", multilabel=False)
    back = read_label_table(path, str(path), "evaluate@softmax")
    assert back.equals(frame) and back.schema == frame.schema
    assert back["recall@1"].null_count() == int((frame["support"] == 0).sum())
    meta = read_table_metadata(path, str(path), "evaluate@softmax")
    assert meta["tailkit.data_key"] == "0123456789ab" and meta["tailkit.k"] == "5"
    # the same frame gives the same bytes (artifacts are pure functions of their inputs)
    again = tmp_path / "again.parquet"
    write_per_class(again, frame, "softmax", 5, "0123456789ab", multilabel=False)
    assert again.read_bytes() == path.read_bytes()


def test_the_class_plot_stays_small_at_a_million_labels_and_equals_a_histogram(tmp_path):
    frame = _frame(np.random.default_rng(1), 10**6)
    path = tmp_path / "classes.tsv"
    write_class_plot(path, frame, "recall@1")
    bins = read_class_bins(path)
    assert 10 < len(bins["accuracy"]) <= 1000
    assert path.read_text().splitlines()[0].split("\t") == list(PLOT_COLUMNS)
    # independent: numpy histograms over quarter-octave edges, count 0 in [0, 1)
    counts = frame["train_count"].to_numpy().astype(np.float64)
    support = frame["support"].to_numpy()
    recall = frame["recall@1"].to_numpy()
    seen = support > 0
    edges = np.concatenate([[0.0], 2.0 ** (np.arange(0, 4 * 21) / 4)])
    n, _ = np.histogram(counts[seen], edges)
    total, _ = np.histogram(counts[seen], edges, weights=recall[seen])
    rows, _ = np.histogram(counts[seen], edges, weights=support[seen])
    mean_count, _ = np.histogram(counts[seen], edges, weights=counts[seen])
    keep = n > 0
    np.testing.assert_allclose(bins["count_low"], edges[:-1][keep], rtol=1e-5)
    np.testing.assert_allclose(bins["labels"], n[keep])
    np.testing.assert_allclose(bins["test_rows"], rows[keep], rtol=1e-5)
    np.testing.assert_allclose(bins["accuracy"], total[keep] / n[keep], rtol=1e-5)
    np.testing.assert_allclose(bins["train_count"], mean_count[keep] / n[keep], rtol=1e-5)


def test_bins_by_octave_hold_each_count_once():
    frame = _frame(np.random.default_rng(2), 3000)
    table = binned(frame, "recall@1", per_octave=1)
    assert table["labels"].sum() == int((frame["support"] > 0).sum())
    low, high = table["count_low"].to_numpy(), table["count_high"].to_numpy()
    assert (low[1:] >= high[:-1]).all()
    np.testing.assert_array_equal(high, np.where(low == 0, 1.0, 2 * low))  # [2^j, 2^(j+1))
    np.testing.assert_array_equal(np.log2(low[low > 0]) % 1, 0.0)
    counts = frame.filter(pl.col("support") > 0)["train_count"].to_numpy()
    inside = [((counts >= lo) & (counts < hi)).sum() for lo, hi in zip(low, high, strict=True)]
    assert inside == table["labels"].to_list()


def test_the_data_key_follows_the_test_rows_and_the_training_counts():
    counts, rows = np.array([3, 1, 0]), np.array([5, 9])
    truth = (np.array([0, 1, 2]), np.array([0, 1]))
    key = data_key(counts, rows, truth)
    assert key == data_key(counts.copy(), rows.copy(), truth) and len(key) == 12
    assert key != data_key(counts, np.array([5, 8]), truth)
    assert key != data_key(np.array([3, 0, 1]), rows, truth)
    assert key != data_key(counts, rows, (truth[0], np.array([0, 2])))


def _table(ids) -> pl.DataFrame:
    return pl.DataFrame({"label": np.asarray(ids, np.int64), "x": np.arange(len(ids))})


@pytest.mark.parametrize(
    ("ids", "message"),
    [
        ([0, 1, 1], "label id 1 appears twice"),
        ([0, 1, 7], r"label id 7 \(row 2\) is out of range 0..2"),
        ([0, -1, 2], "label id -1"),
    ],
)
def test_bad_label_ids_are_one_line_naming_the_file(tmp_path, ids, message):
    path = tmp_path / "per_class.parquet"
    _table(ids).write_parquet(path)
    with pytest.raises(DataValidationError, match=message) as caught:
        read_label_table(path, str(path), "evaluate@x")
    assert str(path) in str(caught.value) and "\n" not in str(caught.value)


def test_a_table_with_too_few_labels_or_another_order_is_checked(tmp_path):
    path = tmp_path / "t.parquet"
    _table([0, 1]).write_parquet(path)
    with pytest.raises(DataValidationError, match="holds 2 labels, expected 3"):
        read_label_table(path, str(path), "x", num_labels=3)
    _table([2, 0, 1]).write_parquet(path)
    assert read_label_table(path, str(path), "x")["x"].to_list() == [1, 2, 0]


def test_missing_and_corrupt_tables_name_the_file_and_the_stage(tmp_path):
    path = tmp_path / "per_class.parquet"
    with pytest.raises(DataValidationError, match=r"missing; run `dvc repro evaluate@a` first"):
        read_label_table(path, str(path), "evaluate@a")
    path.write_bytes(b"PAR1 not really")
    with pytest.raises(DataValidationError, match=r"not a readable Parquet.*evaluate@a`$"):
        read_label_table(path, str(path), "evaluate@a")
    _table([0, 1]).write_parquet(path)
    with pytest.raises(DataValidationError, match="lacks a column"):
        read_label_table(path, str(path), "evaluate@a", columns=["recall@1"])


def test_the_writer_refuses_ids_out_of_order(tmp_path):
    with pytest.raises(ValueError, match="in order"):
        write_label_table(tmp_path / "t.parquet", _table([1, 0]))
    assert not list(tmp_path.iterdir())  # nothing partial left behind
