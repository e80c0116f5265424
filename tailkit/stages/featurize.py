"""Stage ``featurize``: fit the featurizer on the training rows and write the feature cache.

Raw inputs are decoded once; each split becomes ``data/features/<split>.parquet`` (see
:mod:`tailkit.cache`), and ``meta.json`` carries the label names and counts forward so later
stages read only ``data/features``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tailkit.atomic import atomic_dir, write_json
from tailkit.cache import write_features
from tailkit.checksum import params_hash
from tailkit.params import Params
from tailkit.paths import Layout
from tailkit.registry import Registry
from tailkit.stages.download import raw_dir
from tailkit.stages.subsample import SPLITS, read_meta, read_split


def run(params: Params, layout: Layout, registry: Registry) -> dict[str, Any]:
    dataset = registry.build("datasets", params.dataset, "dataset")
    featurizer = registry.build("featurizers", params.featurize, "featurize")
    raw = dataset.load(raw_dir(layout, params))
    meta = read_meta(layout.split)
    splits = {name: read_split(layout.split, name) for name in SPLITS}

    featurizer.fit(raw.inputs[splits["train"][0]])
    info = {
        "dataset": params.dataset,
        "featurize": params.featurize,
        # Identifies the data a model is trained on (a stale checkpoint must not resume on
        # another split), so the subsample settings recorded with the split are part of it.
        "params_hash": params_hash(
            {
                "dataset": params.dataset,
                "subsample": meta["subsample"],
                "featurize": params.featurize,
            }
        ),
    }
    with atomic_dir(layout.features) as tmp:
        for name, (rows, labels) in splits.items():
            x = np.ascontiguousarray(featurizer.transform(raw.inputs[rows]), dtype=np.float32)
            write_features(tmp / f"{name}.parquet", x, labels, rows, {**info, "split": name})
        meta = {**meta, **info, "dim": int(x.shape[1])}
        write_json(tmp / "meta.json", meta)
    return meta
