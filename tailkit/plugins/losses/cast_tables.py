"""Per-class tables kept in float64 and handed to each step in the logits' dtype, cast once.

A loss builds its per-class tables (log prior, margins, class weights) in float64 in ``setup``,
so that float64 checks see them exactly; a float32 step needs them as float32 on the logits'
device. Casting per step is a (C,) copy every step, which at C = 10^5–10^6 is no longer free;
:func:`table_like` keeps the cast copy beside the module and recasts only when the table itself
changes (a new ``setup``, a move to another device, an in-place edit).
"""

from __future__ import annotations

import torch

_CACHE_ATTRIBUTE = "_tables_cast_once"


def table_like(module: torch.nn.Module, name: str, like: torch.Tensor) -> torch.Tensor:
    """The tensor attribute ``name`` of ``module`` in the dtype and on the device of ``like``.

    The copy is remembered with the table's storage address and version counter, so a table
    that is replaced or edited in place is cast again; the copy never carries a gradient.
    """
    table: torch.Tensor = getattr(module, name)
    cache: dict = module.__dict__.setdefault(_CACHE_ATTRIBUTE, {})
    key = (name, like.dtype, like.device)
    stamp = (table.data_ptr(), table._version, table.device)
    held = cache.get(key)
    if held is None or held[0] != stamp:
        held = (stamp, table.detach().to(dtype=like.dtype, device=like.device))
        cache[key] = held
    cast: torch.Tensor = held[1]
    return cast
