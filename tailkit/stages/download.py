"""Stage ``download``: materialise the dataset's raw files under ``data/raw/<dataset>/``.

The dataset plugin fetches into an empty temporary directory (verifying checksums); the
directory replaces ``data/raw`` only when the fetch succeeded, so no partial raw data survives.

Two ``tailkit download`` runs in one project take turns on ``data/.raw.lock`` (beside the DVC
output, so not part of it; ``data/`` is git-ignored): the second waits, and when the first
published the same ``dataset`` params meanwhile it keeps that result instead of fetching again.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from tailkit.params import Params
from tailkit.paths import Layout
from tailkit.registry import Registry
from tailkit.storage.atomic import atomic_dir, output_lock, write_json

RECORD = "dataset.json"  # the dataset params data/raw was fetched with


def run(params: Params, layout: Layout, registry: Registry) -> Path:
    dataset = registry.build("datasets", params.dataset, "dataset")
    name = params.dataset["name"]
    record = layout.raw / RECORD
    before: list[Any] = []

    def waiting(lock_file: Path) -> None:
        before.append(_stamp(record))
        print(
            f"download: another process is writing {layout.raw} (it holds {lock_file}); waiting",
            file=sys.stderr,
        )

    with output_lock(layout.raw, on_wait=waiting):
        # Reuse only what the other process published while this one waited: an output that
        # was there before may come from older plugin code, which is why DVC re-ran the stage.
        published = before and _stamp(record) != before[0]
        if published and _fetched_with(record, params.dataset) and layout.raw_data(name).is_dir():
            return layout.raw_data(name)
        with atomic_dir(layout.raw) as tmp:
            dest = tmp / name
            dest.mkdir()
            dataset.fetch(dest)
            write_json(tmp / RECORD, params.dataset)
    return layout.raw_data(name)


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """Identity of a file version: a publish writes a new file (new inode, new mtime)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns


def _fetched_with(record: Path, spec: dict[str, Any]) -> bool:
    try:
        written = json.loads(record.read_text())
    except (OSError, ValueError):
        return False
    # Round-trip the params through JSON as write_json stored them (tuples become lists).
    return written == json.loads(json.dumps(spec))
