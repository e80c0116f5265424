"""0/1 targets of label lists, for the losses that score every label of a row on its own
(per-label sigmoid losses)."""

from __future__ import annotations

import torch


def multi_hot(labels: torch.Tensor, num_classes: int, dtype: torch.dtype) -> torch.Tensor:
    """(B, C) 0/1 targets from (B,) ids or (B, k) ids padded with −1.

    Padding is scattered into one extra last column that is then dropped, so every write
    stores 1 and a padded slot can never clear a real positive."""
    ids = labels.long()
    if ids.ndim == 1:
        ids = ids.unsqueeze(1)
    out = torch.zeros(ids.shape[0], num_classes + 1, dtype=dtype, device=ids.device)
    out.scatter_(1, torch.where(ids < 0, num_classes, ids), 1.0)
    return out[:, :num_classes]
