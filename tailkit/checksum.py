"""Stable content hashes for params and files."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any


def params_hash(value: Any) -> str:
    """Short SHA-256 of a JSON-able value with sorted keys."""
    blob = json.dumps(value, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def file_sha256(path: str | Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()
