"""Stage ``download``: materialise the dataset's raw files under ``data/raw/<dataset>/``.

The dataset plugin fetches into an empty temporary directory (verifying checksums); the
directory replaces ``data/raw`` only when the fetch succeeded, so no partial raw data survives.
"""

from __future__ import annotations

from pathlib import Path

from tailkit.atomic import atomic_dir, write_json
from tailkit.params import Params
from tailkit.paths import Layout
from tailkit.registry import Registry


def run(params: Params, layout: Layout, registry: Registry) -> Path:
    dataset = registry.build("datasets", params.dataset, "dataset")
    name = params.dataset["name"]
    with atomic_dir(layout.raw) as tmp:
        dest = tmp / name
        dest.mkdir()
        dataset.fetch(dest)
        write_json(tmp / "dataset.json", params.dataset)
    return layout.raw_data(name)
