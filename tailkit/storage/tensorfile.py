"""Nested state (dicts of tensors, numbers, strings, lists) in one safetensors file.

Every artifact that tailkit reads back (a model, a fitted sampler) is loaded without
unpickling: a file from a shared DVC remote or a colleague's directory can hold only tensors
and JSON, never code. The tensors are stored under their path in the tree (``"layer/weight"``);
the rest of the tree is JSON in the file's metadata, with ``{"__tensor__": path}`` where a
tensor was. The bytes are a function of the content alone (sorted keys, no timestamps).
"""

from __future__ import annotations

import errno
import json
import os
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from tailkit.errors import DataValidationError

_KEY = "tailkit"
_TENSOR = "__tensor__"


def _split(tree: Any, path: str, tensors: dict[str, torch.Tensor], seen: set[int]) -> Any:
    if isinstance(tree, torch.Tensor):
        t = tree.detach().cpu().contiguous()
        if t.numel() and t.untyped_storage().data_ptr() in seen:
            t = t.clone()  # safetensors refuses two names for one memory
        seen.add(t.untyped_storage().data_ptr())
        tensors[path] = t
        return {_TENSOR: path}
    if isinstance(tree, dict):
        out = {}
        for key, value in tree.items():
            if not isinstance(key, str) or "/" in key:
                raise TypeError(f"{path or 'state'}: key {key!r} must be a string without '/'")
            out[key] = _split(value, f"{path}/{key}" if path else key, tensors, seen)
        return out
    if isinstance(tree, list | tuple):
        return [_split(v, f"{path}/{i}", tensors, seen) for i, v in enumerate(tree)]
    if tree is None or isinstance(tree, str | int | float | bool):
        return tree
    raise TypeError(f"{path or 'state'}: cannot store a {type(tree).__name__} (tensors and JSON)")


def _os_error(said: str) -> int:
    """The errno in a safetensors I/O error's text ("… (os error 28)"; older releases said
    "StorageFull" or "code: 28"), EIO where it names none."""
    found = re.search(r"(?:os error|code:) (\d+)", said)
    if found:
        return int(found.group(1))
    return errno.ENOSPC if "StorageFull" in said else errno.EIO


def save(path: str | Path, tree: dict[str, Any]) -> None:
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _split(tree, "", tensors, set())
    try:
        save_file(tensors, str(path), metadata={_KEY: json.dumps(skeleton, sort_keys=True)})
    except SafetensorError as exc:  # its I/O errors are no OSError: say which, as one
        code = _os_error(str(exc))
        raise OSError(code, os.strerror(code), str(path)) from exc


def _join(tree: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(tree, dict):
        if set(tree) == {_TENSOR}:
            return tensors[tree[_TENSOR]]
        return {k: _join(v, tensors) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_join(v, tensors) for v in tree]
    return tree


def load(path: str | Path, device: str | torch.device = "cpu") -> dict[str, Any]:
    """The tree :func:`save` wrote; anything else (a pickle, a torn file) is a one-line error
    naming the file, and nothing in it is executed."""
    try:
        with safe_open(str(path), framework="pt", device=str(device)) as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118
        skeleton = json.loads(metadata[_KEY])
        return _join(skeleton, tensors)
    except (SafetensorError, OSError, KeyError, ValueError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise DataValidationError(
            f"{path}: not a tailkit safetensors file ({reason}); refusing to load it"
        ) from exc
