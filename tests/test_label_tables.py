"""Per-label tables live in Parquet: no JSON under data/ grows with the number of labels."""

from __future__ import annotations

import copy

import numpy as np
from conftest import TINY_PARAMS

from tailkit.params import parse_params
from tailkit.paths import Layout
from tailkit.registry import make_registry
from tailkit.splits import SPLITS, read_labels, read_meta, read_split
from tailkit.stages import download, featurize, subsample


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
