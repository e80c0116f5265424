"""Indices grouped by an integer key, in index order within each group: a counting sort.

Compiled kernels that must visit each group's members in a fixed order use it: the tree fit
regroups its points and labels by node at each level (tailkit/plugins/samplers/tree/fit.py), and
a per-example sampled step sums each gathered row's gradient contributions in the order
autograd's ``index_add_`` would (tailkit/output/row_gradient_kernels.py). Linear in the keys
and stable, where a comparison sort is neither.
"""

from __future__ import annotations

import numba
import numpy as np

from tailkit.native import kernel_cache  # noqa: F401  (before any cache=True kernel: its locator)


@numba.njit(cache=True)
def group_by(keys, num_keys):
    """(order, start) for ``keys`` (N,) in [0, num_keys): order[start[j]:start[j + 1]] are the
    indices i with keys[i] = j, ascending."""
    start = np.zeros(num_keys + 1, dtype=np.int64)
    for i in range(keys.shape[0]):
        start[keys[i] + 1] += 1
    for j in range(num_keys):
        start[j + 1] += start[j]
    fill = start[:-1].copy()
    order = np.empty(keys.shape[0], dtype=np.int64)
    for i in range(keys.shape[0]):
        order[fill[keys[i]]] = i
        fill[keys[i]] += 1
    return order, start
