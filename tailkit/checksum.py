"""Stable content hashes of params."""

from __future__ import annotations

import hashlib
import json
from typing import Any


def params_hash(value: Any) -> str:
    """Short SHA-256 of a JSON-able value with sorted keys."""
    blob = json.dumps(value, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
