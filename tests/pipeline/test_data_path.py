"""The new data kinds through the real stages: a dataset's own splits, images and sparse inputs.

Fake datasets are registered like any plugin (``make_registry(extra_plugins=...)``); the stages
``download``, ``subsample`` and ``featurize`` run as ``dvc repro`` would run them, on a scratch
layout.
"""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from tailkit import hookimpl
from tailkit.components import RawData
from tailkit.errors import InvalidParameterError, PluginError
from tailkit.params import parse_params
from tailkit.paths import Layout
from tailkit.registry import make_registry
from tailkit.stages import download, evaluate, featurize, fit_sampler, subsample, train
from tailkit.storage.feature_cache import KINDS, read_features
from tailkit.storage.splits import read_meta, read_split

CIFAR10_LT_100 = [5000, 2997, 1796, 1077, 645, 387, 232, 139, 83, 50]  # datasets-metrics §3.1


class _Fake:
    """Fetches a marker file; ``load`` builds its rows from the options alone."""

    def fetch(self, dest: Path) -> None:
        (dest / "fake.txt").write_text("fake\n")


class TinyImages(_Fake):
    """Tiny RGB images with a predefined train/test split (CIFAR's layout, shrunk)."""

    def __init__(self, *, train_per_class: int = 12, test_per_class: int = 3) -> None:
        self.train_per_class = train_per_class
        self.test_per_class = test_per_class

    def load(self, raw_dir: Path) -> RawData:
        classes = 4
        n_train = classes * self.train_per_class
        labels = np.concatenate(
            [np.arange(n_train) % classes, np.arange(classes * self.test_per_class) % classes]
        )
        rng = np.random.default_rng(0)
        images = rng.integers(0, 256, size=(labels.size, 6, 5, 3), dtype=np.uint8)
        splits = {"train": np.arange(n_train), "test": np.arange(n_train, labels.size)}
        names = [f"c{i}" for i in range(classes)]
        return RawData(images, labels.astype(np.int64), names, modality="image", splits=splits)


class LabelsOnlyCifar(_Fake):
    """CIFAR-10's labels and split sizes: 5,000 training and 1,000 test rows per class."""

    def load(self, raw_dir: Path) -> RawData:
        train, test = np.arange(50_000) % 10, np.arange(10_000) % 10
        labels = np.concatenate([train, test]).astype(np.int64)
        splits = {"train": np.arange(50_000), "test": np.arange(50_000, 60_000)}
        inputs = np.zeros((60_000, 1), np.float32)
        return RawData(inputs, labels, [f"c{i}" for i in range(10)], splits=splits)


class TinyXC(_Fake):
    """Bag-of-words counts over 40 words, the XC repository's trn/tst split; multi-label
    (CSR) unless ``single_label``."""

    def __init__(self, *, single_label: bool = True) -> None:
        self.single_label = single_label

    def load(self, raw_dir: Path) -> RawData:
        rng = np.random.default_rng(1)
        n, words, classes = 90, 40, 3
        labels = np.arange(n) % classes
        counts = rng.poisson(0.3, size=(n, words)).astype(np.float32)
        counts[np.arange(n), labels * 5] += 3  # each class has its own words
        inputs = sp.csr_matrix(counts)
        splits = {"train": np.arange(60), "test": np.arange(60, n)}
        names = [f"l{i}" for i in range(classes)]
        if not self.single_label:
            indicator = sp.csr_matrix((np.ones(n), (np.arange(n), labels)), shape=(n, classes))
            return RawData(inputs, indicator, names, modality="sparse", splits=splits)
        return RawData(inputs, labels, names, modality="sparse", splits=splits)


class SparseIdentity:
    """Keeps sparse inputs sparse (float32 CSR)."""

    accepts: ClassVar[tuple[str, ...]] = ("sparse",)
    output: ClassVar[str] = "sparse"

    def fit(self, inputs):
        return self

    def transform(self, inputs):
        return sp.csr_matrix(inputs, dtype=np.float32)


class LiesAboutOutput(SparseIdentity):
    """Declares image output but returns a sparse matrix."""

    output: ClassVar[str] = "image"


def _plugin():
    mod = types.SimpleNamespace()

    @hookimpl
    def register_datasets(register):
        register("tiny-images", TinyImages)
        register("labels-only-cifar", LabelsOnlyCifar)
        register("tiny-xc", TinyXC)

    @hookimpl
    def register_featurizers(register):
        register("keep-sparse", SparseIdentity)
        register("lies-about-output", LiesAboutOutput)

    mod.register_datasets = register_datasets
    mod.register_featurizers = register_featurizers
    return mod


REGISTRY = make_registry(extra_plugins=[("test-data-path", _plugin())])


def _params(dataset, featurize="identity", model="linear", **subsample):
    return parse_params(
        {
            "dataset": dataset,
            "subsample": {"val_fraction": 0.25, **subsample},
            "featurize": {"x": featurize},
            "experiments": {
                "softmax": {
                    "loss": {"name": "softmax"},
                    "sampler": "none",
                    "features": "x",
                    "model": model if isinstance(model, dict) else {"name": model},
                    "optimizer": {"name": "adagrad", "lr": 0.1},
                }
            },
        },
        "test-params",
    )


def _prepare(tmp_path: Path, params) -> Layout:
    layout = Layout(tmp_path)
    download.run(params, layout, REGISTRY)
    subsample.run(params, layout, REGISTRY)
    return layout


def test_images_end_to_end_keep_the_given_test_split(tmp_path: Path) -> None:
    params = _params("tiny-images", "pixels", profile="exp", imbalance_ratio=4)
    layout = _prepare(tmp_path, params)
    raw = TinyImages().load(layout.raw)
    split_meta = read_meta(layout.split)
    assert split_meta["given_splits"] == ["test", "train"]
    assert split_meta["train_counts"].tolist() == [12, 7, 4, 3]  # floor(12 · 4^(-r/3))
    assert split_meta["test_counts"].tolist() == [3, 3, 3, 3]

    meta = featurize.run(params, layout, REGISTRY, "x")
    assert (meta["kind"], meta["shape"], meta["dim"]) == ("image", [6, 5, 3], 90)
    assert json.loads((layout.feature_set("x") / "meta.json").read_text())["kind"] == "image"
    tables = {
        name: read_features(layout.feature_set("x") / f"{name}.parquet")
        for name in subsample.SPLITS
    }
    np.testing.assert_array_equal(tables["test"].row_ids.numpy(), raw.splits["test"])
    for name, table in tables.items():
        assert table.kind == "image" and table.x.dtype == torch.uint8
        assert table.shape == tuple(table.x.shape) == (table.num_rows, 6, 5, 3)
        rows = table.row_ids.numpy()
        np.testing.assert_array_equal(table.x.numpy(), raw.inputs[rows])
        np.testing.assert_array_equal(table.labels.numpy(), raw.labels[rows])
        assert table.metadata["split"] == name
    # training and validation come from the given training rows only
    for name in ("train", "val"):
        assert np.isin(tables[name].row_ids.numpy(), raw.splits["train"]).all()


def test_a_featurizer_that_does_not_take_the_modality_is_refused_before_fitting(
    tmp_path: Path,
) -> None:
    params = _params("tiny-images", {"name": "rff", "dim": 8})
    layout = _prepare(tmp_path, params)
    with pytest.raises(InvalidParameterError) as info:
        featurize.run(params, layout, REGISTRY, "x")
    message = str(info.value)
    assert message.startswith("featurize.x.name: featurizer 'rff' accepts dense inputs")
    assert "dataset 'tiny-images' is image" in message and "pixels" in message
    assert "\n" not in message and not layout.feature_set("x").exists()


def test_cifar_lt_counts_through_the_subsample_stage(tmp_path: Path) -> None:
    params = _params("labels-only-cifar", profile="exp", imbalance_ratio=100, val_fraction=0.1)
    layout = _prepare(tmp_path, params)
    meta = read_meta(layout.split)
    assert meta["train_counts"].tolist() == CIFAR10_LT_100 and meta["train_counts"].sum() == 12406
    assert meta["test_counts"].tolist() == [1000] * 10
    assert meta["val_counts"].tolist() == [0] + [500] * 9
    test_rows, test_labels = read_split(layout.split, "test")
    np.testing.assert_array_equal(test_rows, np.arange(50_000, 60_000))
    np.testing.assert_array_equal(test_labels, np.arange(10_000) % 10)
    train_rows, _ = read_split(layout.split, "train")
    assert train_rows.size == 12406 and train_rows.max() < 50_000


def test_sparse_inputs_through_tfidf_svd_into_the_dense_cache(tmp_path: Path) -> None:
    params = _params("tiny-xc", {"name": "tfidf-svd", "dim": 8})
    layout = _prepare(tmp_path, params)
    meta = featurize.run(params, layout, REGISTRY, "x")
    assert (meta["kind"], meta["dim"]) == ("dense", 8)
    test = read_features(layout.feature_set("x") / "test.parquet")
    assert test.kind == "dense" and test.x.dtype == torch.float32
    assert tuple(test.x.shape) == (30, 8)
    np.testing.assert_array_equal(test.row_ids.numpy(), np.arange(60, 90))
    assert torch.isfinite(test.x).all()


def test_sparse_features_are_cached_as_idx_val_and_train_a_sparse_model(tmp_path: Path) -> None:
    params = _params("tiny-xc", "keep-sparse")
    layout = _prepare(tmp_path, params)
    meta = featurize.run(params, layout, REGISTRY, "x")
    assert (meta["kind"], meta["dim"]) == ("sparse", 40)
    path = layout.feature_set("x") / "train.parquet"
    raw = TinyXC().load(layout.raw)
    table = read_features(path, kinds=KINDS)
    rows = table.row_ids.numpy()
    np.testing.assert_array_equal(table.x.to_dense().numpy(), raw.inputs[rows].toarray())
    # a dense model on sparse features: one line naming the models that read them, no model
    with pytest.raises(InvalidParameterError) as info:
        train.run(params, layout, REGISTRY, "softmax")
    message = str(info.value)
    assert message.startswith("experiments.softmax.model: model 'linear' reads dense features")
    assert "sparse-linear, sparse-mlp" in message and "\n" not in message
    assert not layout.model("softmax").exists()
    # the sparse encoder trains and is evaluated on the same cache
    sparse = _params("tiny-xc", "keep-sparse", {"name": "sparse-linear", "dim": 8})
    train.run(sparse, layout, REGISTRY, "softmax")
    metrics = evaluate.run(sparse, layout, REGISTRY, "softmax")
    assert metrics["test"]["rows"] == 30 and metrics["train"]["steps"] > 0


def test_multi_label_rows_keep_their_label_sets_through_featurize(tmp_path: Path) -> None:
    params = _params({"name": "tiny-xc", "single_label": False}, "tfidf-svd")
    layout = _prepare(tmp_path, params)
    featurize.run(params, layout, REGISTRY, "x")
    test = read_features(layout.feature_set("x") / "test.parquet")
    assert test.labels.indices.tolist() == (np.arange(60, 90) % 3).tolist()
    assert test.labels.sizes.tolist() == [1] * 30


def test_a_featurizer_whose_output_is_not_what_it_declares_is_a_plugin_error(
    tmp_path: Path,
) -> None:
    params = _params("tiny-xc", "lies-about-output")
    layout = _prepare(tmp_path, params)
    with pytest.raises(PluginError, match=r"declares output 'image'.*sparse matrix"):
        featurize.run(params, layout, REGISTRY, "x")
    assert not layout.feature_set("x").exists()


def test_resnet32_trains_and_evaluates_on_cached_images_through_the_stages(tmp_path: Path):
    """pixels → uint8 cache → train@ (resnet32, SGD momentum, warmup, augmentation) →
    evaluate@: the image path of the CIFAR-LT recipe, a few CPU steps on non-square images."""
    raw = parse_params(
        {
            "base": {"device": "cpu"},
            "dataset": {"name": "tiny-images", "train_per_class": 40, "test_per_class": 10},
            "subsample": {"val_fraction": 0.25},
            "featurize": {"x": "pixels"},
            "train": {"epochs": 2, "batch_size": 16, "eval_every": 5, "val_rows": 32},
            "evaluate": {"batch_size": 16},
            "experiments": {
                "ce": {
                    "loss": {"name": "softmax"},
                    "model": {"name": "resnet32"},
                    "sampler": "none",
                    "features": "x",
                    "optimizer": {
                        "name": "sgd",
                        "lr": 0.05,
                        "momentum": 0.9,
                        "weight_decay": 2e-4,
                        "schedule": {"name": "step", "warmup_epochs": 1, "milestones": [1]},
                    },
                }
            },
        },
        "test-params",
    )
    layout = _prepare(tmp_path, raw)
    meta = featurize.run(raw, layout, REGISTRY, "x")
    assert meta["kind"] == "image" and meta["shape"] == [6, 5, 3]
    fit_sampler.run(raw, layout, REGISTRY)
    summary = train.run(raw, layout, REGISTRY, "ce")
    assert summary["steps"] > 0
    # batches reach the model as uint8 (B, 6, 5, 3): it needs no shape from in_dim (= 90)
    assert json.loads((layout.model("ce") / "model.json").read_text())["in_dim"] == 90
    metrics = evaluate.run(raw, layout, REGISTRY, "ce")
    assert metrics["test"]["rows"] == 40
    assert 0.0 <= metrics["test"]["accuracy"] <= 1.0
    assert metrics["plugins"]["model"].startswith("resnet32 (tailkit ")
