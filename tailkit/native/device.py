"""Device choice and thread settings shared by the stages."""

from __future__ import annotations

import torch

from tailkit.errors import InvalidParameterError


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when present, else CPU: the same code path either way."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise InvalidParameterError("base.device: got 'cuda' but no CUDA device is available")
    return torch.device(name)
