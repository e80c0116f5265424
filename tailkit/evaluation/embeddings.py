"""Geometry of the learned embeddings Φ(x): the maximum intra-class distance (ELM, figure 4)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from tailkit.components import Encoder
from tailkit.evaluation.metrics import shot_groups
from tailkit.groups import DEFAULT_GROUPS, GroupThresholds


def pick_rows(labels: np.ndarray, max_per_class: int, seed: int = 0) -> np.ndarray:
    """Row ids keeping at most ``max_per_class`` rows of every class (a seeded choice), so the
    pairwise distances of a head class stay O(max_per_class²)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(labels.shape[0])
    # Stable sort by label keeps the random order inside each class; take each class's first k.
    by_label = order[np.argsort(labels[order], kind="stable")]
    sorted_labels = labels[by_label]
    starts = np.searchsorted(sorted_labels, sorted_labels, side="left")
    rank = np.arange(by_label.shape[0]) - starts
    return np.sort(by_label[rank < max_per_class])


@torch.no_grad()
def embed(encoder: Encoder, x: torch.Tensor, device: torch.device, batch: int = 4096):
    encoder.eval()
    out = [encoder(x[lo : lo + batch].to(device)).float().cpu() for lo in range(0, len(x), batch)]
    encoder.train()
    return torch.cat(out) if out else torch.empty(0, encoder.out_dim)


def class_diameters(z: torch.Tensor, labels: np.ndarray, num_classes: int) -> np.ndarray:
    """max_{x, x⁺ of class c} ‖Φ(x) − Φ(x⁺)‖ / max_x ‖Φ(x)‖ per class (NaN below 2 rows).

    Normalised by the largest embedding norm of the evaluated rows, as ELM does, so models
    whose embeddings differ in scale compare.
    """
    out = np.full(num_classes, np.nan)
    scale = float(z.norm(dim=1).max()) if len(z) else 0.0
    if scale == 0.0:
        return out
    labels_t = torch.as_tensor(labels)
    order = torch.argsort(labels_t, stable=True)
    z, sorted_labels = z[order].double(), labels_t[order]
    classes, sizes = torch.unique_consecutive(sorted_labels, return_counts=True)
    start = 0
    for c, n in zip(classes.tolist(), sizes.tolist(), strict=True):
        if n >= 2:
            block = z[start : start + n]
            out[c] = float(torch.cdist(block, block).max()) / scale
        start += n
    return out


def diameter_summary(
    diameters: np.ndarray, train_counts: np.ndarray, groups: GroupThresholds = DEFAULT_GROUPS
) -> dict[str, Any]:
    """Mean and median normalised class diameter per many/medium/few group (classes with ≥ 2
    evaluated rows); None for a group without such a class."""
    out: dict[str, Any] = {}
    for group, mask in shot_groups(train_counts, groups).items():
        values = diameters[mask & ~np.isnan(diameters)]
        out[group] = (
            {
                "mean": float(values.mean()),
                "median": float(np.median(values)),
                "classes": int(values.size),
            }
            if values.size
            else None
        )
    return out
