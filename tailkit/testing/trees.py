"""Random label trees of any size, for tests and benchmarks of the tree sampler's correction.

Fitting a tree on 10^6 labels takes minutes; a tree with random node weights and the labels on
a random subset of the leaves exercises the same evaluation paths (padding leaves included) in
milliseconds.
"""

from __future__ import annotations

import torch

from tailkit.plugins.samplers.tree import TreeSampler
from tailkit.plugins.samplers.tree_fit import tree_depth


def random_tree(num_classes: int, dim: int, k: int = 16, seed: int = 0) -> TreeSampler:
    """A :class:`TreeSampler` over ``num_classes`` labels for ``dim``-dim inputs, k-dim routing."""
    g = torch.Generator().manual_seed(seed)
    depth = tree_depth(num_classes)
    leaves = torch.randperm(1 << depth, generator=g)[:num_classes]
    label_of_leaf = torch.full((1 << depth,), -1, dtype=torch.int64)
    label_of_leaf[leaves] = torch.arange(num_classes)
    sampler = TreeSampler(k=k)
    sampler.load_state_dict(
        {
            "num_classes": num_classes,
            "depth": depth,
            "mean": torch.randn(dim, generator=g),
            "transform": torch.randn(k, dim, generator=g) / dim**0.5,
            "weight": torch.randn((1 << depth) - 1, k, generator=g),
            "bias": torch.randn((1 << depth) - 1, generator=g),
            "leaf_of_label": leaves,
            "label_of_leaf": label_of_leaf,
        }
    )
    return sampler
