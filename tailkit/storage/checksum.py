"""Content hashes: stable hashes of params, and files read against a pinned SHA-256."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from tailkit.errors import DataValidationError


def params_hash(value: Any) -> str:
    """Short SHA-256 of a JSON-able value with sorted keys."""
    blob = json.dumps(value, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def read_pinned(path: Path, sha256: str, *, unreadable: str, pin: str) -> tuple[bytes, str]:
    """The bytes of ``path`` and their SHA-256, which must be ``sha256``.

    The hash is taken over the very bytes returned, so nothing can change between check and
    use. Errors are one line naming the path; ``unreadable`` follows a read failure (what to
    install) and ``pin`` a mismatch (what the pin is for).
    """
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataValidationError(f"{path}: cannot read ({exc.strerror}); {unreadable}") from exc
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise DataValidationError(
            f"{path}: SHA-256 mismatch: expected {sha256}, got {actual} ({pin})"
        )
    return data, actual
