"""The synthetic XC-shaped dataset: deterministic bytes, the xc datasets' decoded layout, every
id in range (a partial last label cluster included) and the shape its options ask for."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from tailkit.components import Dataset
from tailkit.errors import InvalidParameterError
from tailkit.plugins.datasets.synthetic_xc import CLUSTER, SyntheticXC, generate
from tailkit.registry import make_registry
from tailkit.validation import validate_options

# 1,011 labels: the last cluster holds 11 of CLUSTER = 20
SMALL = {"num_labels": 1011, "num_features": 777, "num_train": 900, "num_test": 300, "seed": 3}


def test_fetch_writes_the_xc_layout_and_load_reads_it(tmp_path: Path) -> None:
    ds = make_registry().build("datasets", {"name": "synthetic-xc", **SMALL}, "dataset")
    assert isinstance(ds, SyntheticXC) and isinstance(ds, Dataset)
    ds.fetch(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["features.npz", "labels.npz", "xc.json"]
    meta = json.loads((tmp_path / "xc.json").read_text())
    assert meta["splits"]["train"]["rows"] == 900 and meta["splits"]["test"]["rows"] == 300
    assert meta["options"] == {**SMALL, "labels_per_row": 3.0}
    raw = ds.load(tmp_path)
    assert raw.multilabel and raw.modality == "sparse" and raw.num_classes == 1011
    assert raw.inputs.shape == (1200, 777) and raw.labels.shape == (1200, 1011)
    np.testing.assert_array_equal(raw.splits["train"], np.arange(900))
    np.testing.assert_array_equal(raw.splits["test"], np.arange(900, 1200))
    assert raw.inputs.has_sorted_indices and raw.labels.has_sorted_indices
    # what fetch wrote is the generator's output, training rows first
    x, y = generate(1200, 3, num_labels=1011, num_features=777)
    assert (raw.inputs != x).nnz == 0 and (raw.labels != y).nnz == 0


def test_same_seed_same_bytes_other_seed_other_rows(tmp_path: Path) -> None:
    for folder in ("a", "b"):
        SyntheticXC(**SMALL).fetch(tmp_path / folder)
    for name in ("features.npz", "labels.npz", "xc.json"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    x3, _ = generate(200, 3, num_labels=1011, num_features=777)
    x4, _ = generate(200, 4, num_labels=1011, num_features=777)
    assert (x3 != x4).nnz > 0


@pytest.mark.parametrize("num_labels", [1000, 1011])
def test_ids_stay_in_range_and_labels_cluster(num_labels: int) -> None:
    x, y = generate(4000, 0, num_labels=num_labels, num_features=500, labels_per_row=5.45)
    assert y.indices.max() < num_labels and x.indices.max() < 500
    assert set(np.unique(y.data)) == {1.0} and x.data.min() >= 1.0  # 0/1 labels, word counts
    # about labels_per_row labels a row (fewer: duplicates collapse), never none
    per_row = np.diff(y.indptr)
    assert per_row.min() >= 1 and 4.0 < per_row.mean() < 5.45
    # co-occurrence: a row's further labels share its first one's cluster far above chance
    first = y.indices[y.indptr[:-1]]
    rows = np.repeat(np.arange(4000), per_row)
    same = (y.indices // CLUSTER == first[rows] // CLUSTER).sum() - 4000
    assert same / (y.nnz - 4000) > 0.4  # half are drawn in the cluster; chance is ~CLUSTER/C


def test_frequencies_follow_the_power_law() -> None:
    _, y = generate(20_000, 1, num_labels=2000, num_features=300, labels_per_row=1.0)
    counts = np.diff(sp.csc_matrix(y).indptr)
    # one label a row, p(l) ∝ 1/(l + 1): the head label in 1/H(2000) ≈ 12 % of the rows
    assert abs(counts[0] / 20_000 - 1 / np.sum(1 / np.arange(1, 2001))) < 0.01
    assert counts[:10].sum() > counts[1000:].sum() / 2  # a long tail


def test_options_are_validated() -> None:
    with pytest.raises(InvalidParameterError, match=r"dataset\.num_labels"):
        validate_options("dataset", SyntheticXC, {"num_labels": 1})
    with pytest.raises(InvalidParameterError, match=r"dataset\.labels_per_row"):
        validate_options("dataset", SyntheticXC, {"labels_per_row": 0.5})
    with pytest.raises(InvalidParameterError, match=r"dataset\.propensity"):
        SyntheticXC(propensity=(0.6,))
    assert SyntheticXC(propensity=(0.6, 2.6)).propensity == (0.6, 2.6)
    assert SyntheticXC().propensity == (0.55, 1.5)  # the repository's default constants
