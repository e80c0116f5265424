"""Random label trees of any size, for tests and benchmarks of the tree sampler's correction.

Fitting a tree on 10^6 labels takes minutes; a tree with random node weights exercises the same
evaluation paths in milliseconds. Two shapes: the labels on a random subset of the leaves
(padding anywhere), or where a fit puts them (``fitted_shape``): tree/fit.py's balanced splits
send ⌈c/2⌉ of a node's c labels right, so every padding leaf sits beside one label under a
node of the last level, and such a one-label node routes right with w = 0, b = +1000.
"""

from __future__ import annotations

import torch

from tailkit.plugins.samplers.tree import TreeSampler
from tailkit.plugins.samplers.tree.fit import ROUTE_RIGHT, tree_depth


def _balanced_counts(num_classes: int, depth: int) -> list[torch.Tensor]:
    """Labels under each node, level by level (levels 0 … D), as balanced splits leave them."""
    counts = [torch.tensor([num_classes])]
    for _ in range(depth):
        c = counts[-1]
        counts.append(torch.stack([c // 2, c - c // 2], dim=1).reshape(-1))
    return counts


def random_tree(
    num_classes: int, dim: int, k: int = 16, seed: int = 0, *, fitted_shape: bool = False
) -> TreeSampler:
    """A :class:`TreeSampler` over ``num_classes`` labels for ``dim``-dim inputs, k-dim routing."""
    g = torch.Generator().manual_seed(seed)
    depth = tree_depth(num_classes)
    if fitted_shape:
        counts = _balanced_counts(num_classes, depth)
        filled = counts[-1].nonzero().squeeze(1)
        leaves = filled[torch.randperm(num_classes, generator=g)]
    else:
        leaves = torch.randperm(1 << depth, generator=g)[:num_classes]
    # drawn in the order this function always drew them: a seed's scattered tree is the one
    # that earlier benchmarks and tests measured
    mean = torch.randn(dim, generator=g)
    transform = torch.randn(k, dim, generator=g) / dim**0.5
    weight = torch.randn((1 << depth) - 1, k, generator=g)
    bias = torch.randn((1 << depth) - 1, generator=g)
    if fitted_shape:
        nodes = torch.cat(counts[:-1])  # heap order
        weight[nodes < 2] = 0.0
        bias[nodes < 2] = 0.0
        bias[nodes == 1] = ROUTE_RIGHT
    label_of_leaf = torch.full((1 << depth,), -1, dtype=torch.int64)
    label_of_leaf[leaves] = torch.arange(num_classes)
    sampler = TreeSampler(k=k)
    sampler.load_state_dict(
        {
            "num_classes": num_classes,
            "depth": depth,
            "mean": mean,
            "transform": transform,
            "weight": weight,
            "bias": bias,
            "leaf_of_label": leaves,
            "label_of_leaf": label_of_leaf,
        }
    )
    return sampler
