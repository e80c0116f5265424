"""Content hashes of the user's data files, so that the file behind a dataset's ``path`` is a
dependency of the pipeline like its code.

DVC hashes only what dvc.yaml names, and a dataset's ``path`` is a params value pointing
anywhere (an archive in ~/data, a folder of the user's tables): regenerating the file left
``dvc status`` clean and the old results standing. The fingerprint stage, which always runs,
records the SHA-256 of each such file (of every file under a folder, by relative path) in
``fingerprints/dataset.json``, which download and everything after it depend on.

Hashing a multi-GB archive on every run would cost more than the stage it guards, so a
file's hash is kept under ``$XDG_CACHE_HOME/tailkit/file-hashes.json`` keyed by its absolute
path, size, modification time and inode, as DVC's own state does: an unchanged file costs a
``stat``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from tailkit.errors import InvalidParameterError
from tailkit.paths import cache_dir
from tailkit.storage.atomic import write_json

#: The dataset options that name the user's files (a plugin's ``path`` counts the same).
DATA_OPTIONS = ("path", "split_dir", "annotations")
_CHUNK = 1 << 20


def data_fingerprint(dataset: dict, cache: Path | None) -> dict[str, str]:
    """{option: sha256} for each of :data:`DATA_OPTIONS` that ``dataset`` (its params) sets."""
    known = _load(cache)
    seen = dict(known)
    out = {}
    for option in DATA_OPTIONS:
        value = dataset.get(option)
        if not isinstance(value, str):
            continue
        target = Path(value).expanduser()
        if not target.exists():
            raise InvalidParameterError(f"dataset.{option}: {value}: no such file or folder")
        out[option] = _tree_hash(target, seen)
    if cache is not None and seen != known:
        write_json(cache, seen)
    return out


def _tree_hash(target: Path, seen: dict[str, str]) -> str:
    if target.is_file():
        return _file_hash(target, seen)
    digest = hashlib.sha256()
    for path in sorted(p for p in target.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(target).as_posix()}\0{_file_hash(path, seen)}\n".encode())
    return digest.hexdigest()


def _file_hash(path: Path, seen: dict[str, str]) -> str:
    st = path.stat()
    key = f"{path.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}"
    if key not in seen:
        digest = hashlib.sha256()
        with path.open("rb") as f:
            while block := f.read(_CHUNK):
                digest.update(block)
        seen[key] = digest.hexdigest()
    return seen[key]


def _load(cache: Path | None) -> dict[str, str]:
    if cache is None or not cache.is_file():
        return {}
    try:
        data = json.loads(cache.read_text())
    except (OSError, ValueError):  # a damaged cache is rebuilt, never trusted
        return {}
    return data if isinstance(data, dict) else {}


def default_cache() -> Path:
    return cache_dir() / "file-hashes.json"  # beside the component catalog's cache
