"""Stage ``featurize@<set>``: fit one feature set's featurizer on the training rows and write
its feature cache.

``params.featurize`` names the feature sets (an experiment trains on one of them); each is a
stage of its own, so changing one set's options re-runs only the experiments that train on it.
Raw inputs are decoded once; each split becomes ``data/features/<set>/<split>.parquet`` (see
:mod:`tailkit.storage.feature_cache`), and ``meta.json`` and ``labels.parquet`` (names and counts,
:mod:`tailkit.storage.splits`) are carried forward so later stages read only ``data/features/<set>``,
with ``featurizer.parquet``, the fitted state of a featurizer that hands it over as data
(:mod:`tailkit.storage.featurizer_state`).

The featurizer's ``accepts`` (the RawData modalities it takes; ``("dense",)`` when it declares
none) is checked against the dataset's modality before anything is fitted. Its ``output``
decides what is cached: ``dense`` features as float32, ``image`` pixels as uint8 (N, H, W, 3),
``sparse`` features as a float32 CSR matrix. ``meta.json`` records that ``kind``, ``dim`` (the
values per row: D, or H·W·3) and, for images, ``shape`` = [H, W, 3].
"""

from __future__ import annotations

import shutil
from typing import Any

import numpy as np

from tailkit.errors import DataValidationError, InvalidParameterError, PluginError
from tailkit.params import Params
from tailkit.paths import Layout
from tailkit.pipeline.featurizing import as_output, check_finite_inputs, check_modality
from tailkit.progress import each
from tailkit.registry import Registry, featurizer_output
from tailkit.storage.atomic import atomic_dir, write_json
from tailkit.storage.checksum import params_hash
from tailkit.storage.feature_cache import KINDS, write_features
from tailkit.storage.featurizer_state import FILE as STATE_FILE
from tailkit.storage.featurizer_state import keeps_state, write_state
from tailkit.storage.splits import LABELS, SPLITS, read_meta, read_split


def run(params: Params, layout: Layout, registry: Registry, features: str) -> dict[str, Any]:
    """Write feature set ``features`` (a key of ``params.featurize``); returns its meta."""
    if features not in params.featurize:
        raise InvalidParameterError(
            f"{params.source}: featurize: no feature set {features!r}; defined: "
            + ", ".join(params.featurize)
        )
    spec = params.featurize[features]
    dataset = registry.build("datasets", params.dataset, "dataset")
    featurizer = registry.build("featurizers", spec, f"featurize.{features}")
    name = spec["name"]
    output = featurizer_output(featurizer)
    if output not in KINDS:
        raise PluginError(
            f"featurizer {name!r} declares output {output!r}; expected one of {KINDS}"
        )
    raw = dataset.load(layout.raw_data(params.dataset["name"]))
    check_modality(featurizer, params, features, raw.modality, registry)
    meta = read_meta(layout.split)
    splits = {split: read_split(layout.split, split) for split in SPLITS}
    if raw.modality == "dense":
        check_finite_inputs(raw.inputs, splits, params.dataset["name"])

    if raw.values == "weights" and getattr(featurizer, "takes_counts", False):
        raise DataValidationError(
            f"{params.source}: featurize.{features}: dataset {params.dataset['name']!r} holds "
            f"TF-IDF weights, not counts, and featurizer {name!r} would weight them again; use "
            "`name: sparse-identity` (the values as given, rows at unit L2 norm, as Parabel, "
            "omikuji and napkinXC train on them) or set `counts: false`"
        )
    try:
        featurizer.fit(raw.inputs[splits["train"][0]])
    except ValueError as exc:  # the contract's one-line refusal of the data it was handed
        raise DataValidationError(
            f"featurize.{features} on dataset {params.dataset['name']!r}: {exc}"
        ) from exc
    info = {
        "dataset": params.dataset,
        "features": features,
        "featurize": spec,
        **({} if raw.values is None else {"values": raw.values}),
        # Identifies the data a model is trained on (a stale checkpoint must not resume on
        # another split), so the subsample settings recorded with the split are part of it.
        "params_hash": params_hash(
            {
                "dataset": params.dataset,
                "subsample": meta["subsample"],
                "featurize": spec,
            }
        ),
    }
    row_shapes = {}
    with atomic_dir(layout.feature_set(features)) as tmp:
        for split, (rows, labels) in each(splits.items(), "featurize", unit="split"):
            x = as_output(featurizer.transform(raw.inputs[rows]), output, name, f" ({split} split)")
            write_features(tmp / f"{split}.parquet", x, labels, rows, {**info, "split": split})
            row_shapes[split] = tuple(int(s) for s in x.shape[1:])
        if len(set(row_shapes.values())) > 1:
            raise PluginError(
                f"featurizer {name!r} gave rows of different shapes per split: {row_shapes}"
            )
        row_shape = row_shapes["train"]
        scalars = {k: v for k, v in meta.items() if not isinstance(v, np.ndarray)}
        meta = {**scalars, **info, "kind": output, "dim": int(np.prod(row_shape))}
        if output == "image":
            meta["shape"] = list(row_shape)
        if keeps_state(featurizer):  # predict restores it rather than fitting it again
            write_state(tmp / STATE_FILE, featurizer.fitted_state(), name)
        write_json(tmp / "meta.json", meta)
        shutil.copyfile(layout.split / LABELS, tmp / LABELS)  # the per-label table, as it is
    return meta
