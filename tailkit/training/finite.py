"""Nothing non-finite is saved: the first NaN or infinite tensor of a model or training state.

A loss can stay finite while its gradient is NaN (a ``torch.where`` whose untaken branch is
NaN), so checking the loss alone lets a NaN model through; the parameters themselves are
checked before every checkpoint and before a model is written, and a checkpoint is checked
again before a run resumes from it.

The check costs one read of each tensor and no copy: a floating tensor's sum is finite only if
every element is (a NaN or an infinity propagates through addition, and an overflow makes the
sum infinite), so the elementwise test runs only when the sum is not finite, to tell a real
NaN or infinity from an overflow of a large but finite tensor.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch


def first_non_finite(tree: Any, prefix: str = "") -> str | None:
    """The dotted name of the first floating tensor in ``tree`` (nested mappings, lists and
    tuples of tensors, in their order) holding a NaN or an infinity; None if there is none."""
    if isinstance(tree, torch.Tensor):
        return None if _finite(tree) else prefix or "tensor"
    if isinstance(tree, Mapping):
        items: Any = ((f"{prefix}.{k}" if prefix else str(k), v) for k, v in tree.items())
    elif isinstance(tree, list | tuple):
        items = ((f"{prefix}[{i}]", v) for i, v in enumerate(tree))
    else:
        return None
    for name, value in items:
        found = first_non_finite(value, name)
        if found is not None:
            return found
    return None


def _finite(t: torch.Tensor) -> bool:
    if not t.is_floating_point() or t.numel() == 0:
        return True
    if math.isfinite(t.sum().item()):
        return True
    return bool(torch.isfinite(t).all())
