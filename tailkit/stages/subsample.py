"""Stage ``subsample``: deal the dataset's rows into ``data/split/{train,val,test}.parquet``
with the long-tail profile of ``params.subsample`` (:mod:`tailkit.pipeline.subsampling` says how), and
write the label table (names, per-split counts) and ``meta.json`` beside them.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tailkit.params import Params
from tailkit.paths import Layout
from tailkit.pipeline.subsampling import plan_splits
from tailkit.registry import Registry, dataset_propensity
from tailkit.storage.atomic import atomic_dir, write_json
from tailkit.storage.splits import SPLITS, write_labels, write_split


def run(params: Params, layout: Layout, registry: Registry) -> dict[str, Any]:
    dataset = registry.build("datasets", params.dataset, "dataset")
    raw = dataset.load(layout.raw_data(params.dataset["name"]))
    labels, rows = plan_splits(raw, params.subsample, f"dataset {params.dataset['name']!r}")
    meta: dict[str, Any] = {
        "dataset": params.dataset,
        "subsample": {**params.subsample.__dict__},
        "num_classes": raw.num_classes,
        # the dataset's PSP@k constants travel with the data (evaluation reads them here)
        "propensity": list(dataset_propensity(dataset)),
    }
    if raw.splits is not None:
        meta["given_splits"] = sorted(raw.splits)
    if not isinstance(labels, np.ndarray):  # LabelSets (imported only with them: it needs torch)
        meta["multilabel"] = True
    counts = {}
    with atomic_dir(layout.split) as tmp:
        for name in SPLITS:
            chosen = labels[rows[name]]
            write_split(tmp / f"{name}.parquet", rows[name], chosen)
            if isinstance(chosen, np.ndarray):
                counts[name] = np.bincount(chosen, minlength=raw.num_classes)
            else:
                counts[name] = chosen.counts()
                meta[f"{name}_rows"] = len(chosen)
        write_labels(tmp, raw.label_names, counts)
        write_json(tmp / "meta.json", meta)
    return {**meta, **{f"{name}_counts": c for name, c in counts.items()}}
