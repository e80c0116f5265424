"""``napkinxc-plt``: napkinXC's probabilistic label tree (Jasinska-Kobus et al.) as a model.

A PLT factorises P(y | x) along the path from the root of a label tree to leaf y, each node a
logistic classifier of "some label below me is relevant" trained on the rows that reach its
parent; prediction is a beam (here exact top-k) search down the tree. napkinXC's defaults, kept
here: a balanced hierarchical 2-means tree over label centroids (``arity`` 2, ``max_leaves`` 100
labels per leaf node), nodes trained by liblinear (L2-regularised logistic regression, C = 10),
weights below 0.1 pruned. Options are the tool's own, by its own names; scores are the PLT's
probability estimates.

The model is the directory napkinXC writes (its binary ``tree.bin``, ``weights.bin`` and
``args.bin``), read back by the tool itself. napkinXC's ``seed`` fixes its tree; its liblinear
nodes shuffle their coordinates with the C library's global ``rand()``, which napkinXC never
seeds. So ``fit`` seeds it (``srand(seed)``) first, and trains on one thread by default: with
one thread two fits give the same bytes; with ``threads`` > 1 the nodes draw from that one
stream in whatever order the threads reach it, which is faster on several cores but not
reproducible, and the model says so (``deterministic``).
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from tailkit.components import Learner
from tailkit.plugins.peers.tooling import (
    as_csr,
    label_lists,
    quiet_console,
    ranked_arrays,
    require,
)
from tailkit.validation import Constraint, Interval


class NapkinXCPLT(Learner):
    """napkinXC's probabilistic label tree (PLT): a k-means label tree of logistic nodes."""

    requires: ClassVar[tuple[str, ...]] = ("napkinxc",)
    constraints: ClassVar[dict[str, Constraint]] = {
        "arity": Interval(2, None),
        "max_leaves": Interval(1, None),
        "liblinear_c": Interval(0, None, closed="neither"),
        "liblinear_eps": Interval(0, None, closed="neither"),
        "weights_threshold": Interval(0, None),
        "ensemble": Interval(1, None),
        "threads": Interval(0, None),
    }

    def __init__(
        self,
        in_dim: int,
        /,
        *,
        arity: int = 2,
        max_leaves: int = 100,
        liblinear_c: float = 10.0,
        liblinear_eps: float = 0.1,
        loss: Literal["log", "l2"] = "log",
        weights_threshold: float = 0.1,
        ensemble: int = 1,
        threads: int = 1,  # napkinXC's 0 means every core (module docstring)
    ) -> None:
        require("napkinxc", "napkinxc-plt")
        self.in_dim = in_dim
        self.options = {
            "arity": arity,
            "max_leaves": max_leaves,
            "liblinear_c": liblinear_c,
            "liblinear_eps": liblinear_eps,
            "loss": loss,
            "weights_threshold": weights_threshold,
            "ensemble": ensemble,
            "threads": threads,
        }
        self.deterministic = threads == 1
        self._model: Any = None  # a napkinxc PLT once fitted or loaded

    def fit(self, x, labels, num_classes: int, directory: Path, seed: int) -> None:
        from napkinxc.models import PLT

        model = PLT(str(directory), seed=seed, verbose=0, **self.options)
        ctypes.CDLL(None).srand(seed)  # liblinear's rand() (module docstring)
        with quiet_console():
            model.fit(as_csr(x), label_lists(labels))
        self._model = model

    def load(self, directory: Path) -> None:
        from napkinxc.models import PLT

        model = PLT(str(directory), threads=self.options["threads"], verbose=0)
        with quiet_console():
            model.load()
        self._model = model

    def predict_topk(self, x, k: int) -> tuple[np.ndarray, np.ndarray]:
        with quiet_console():
            rows = self._model.predict_proba(as_csr(x), top_k=k)
        return ranked_arrays(rows, k)
