"""``omikuji``: Parabel and Bonsai-style label-tree forests (Prabhu et al., Khandagale et al.),
as implemented by the omikuji library, as a model.

Each tree splits the labels recursively by balanced spherical k-means of their centroids (the
mean TF-IDF of their rows) and trains, at every node, one linear classifier per child on the
rows that reach it; prediction is a beam search through each tree, the forest averaging the
leaves' scores. omikuji's defaults, kept here, are Parabel's: 3 trees, 2-means, at most 100
labels per leaf, liblinear L2-regularised hinge-loss nodes (C = 1), weights below 0.1 pruned,
beam 10. Options are the tool's own, by its own names; scores are its probability estimates.

omikuji reads training rows only from a file in the Extreme Classification Repository's text
format, so ``fit`` writes one (:func:`tailkit.plugins.datasets.xc_decode.write_legacy`) to a
scratch directory. Rows without labels are left out: a label-tree node trains on the rows of the
labels below it, which such a row is not; so are rows without features, which omikuji's reader
refuses ("Failed to load data") and which carry nothing to learn from (a place alone in every
one of its grid cells under ``geocells``' ``min_count`` 2). The model is the directory omikuji
writes (``settings.json`` and one CBOR file per tree), read back by the tool itself. omikuji
takes no seed (its clustering draws from the operating system's entropy), so two fits give
different forests: ``deterministic = False``.
"""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np

from tailkit.components import Learner
from tailkit.plugins.datasets.xc_decode import write_legacy
from tailkit.plugins.peers.tooling import (
    as_csr,
    label_matrix,
    quiet_console,
    ranked_arrays,
    require,
)
from tailkit.validation import Constraint, Interval

_LOSS_TYPES = {"hinge": 0, "log": 1}  # omikuji's LossType enum


class Omikuji(Learner):
    """omikuji's Parabel-like forest of balanced k-means label trees with linear nodes."""

    requires: ClassVar[tuple[str, ...]] = ("omikuji",)
    deterministic: bool = False
    constraints: ClassVar[dict[str, Constraint]] = {
        "n_trees": Interval(1, None),
        "min_branch_size": Interval(2, None),
        "max_depth": Interval(1, None),
        "cluster_k": Interval(2, None),
        "linear_c": Interval(0, None, closed="neither"),
        "linear_eps": Interval(0, None, closed="neither"),
        "linear_max_iter": Interval(1, None),
        "linear_weight_threshold": Interval(0, None),
        "collapse_every_n_layers": Interval(0, None),
        "beam_size": Interval(1, None),
        "threads": Interval(1, None),
    }

    def __init__(
        self,
        in_dim: int,
        /,
        *,
        n_trees: int = 3,
        min_branch_size: int = 100,
        max_depth: int = 20,
        cluster_k: int = 2,
        cluster_balanced: bool = True,
        linear_loss: Literal["hinge", "log"] = "hinge",
        linear_c: float = 1.0,
        linear_eps: float = 0.1,
        linear_max_iter: int = 20,
        linear_weight_threshold: float = 0.1,
        collapse_every_n_layers: int = 0,
        beam_size: int = 10,
        threads: int | None = None,  # omikuji's None: every core
    ) -> None:
        require("omikuji", "omikuji")
        self.in_dim = in_dim
        self.hyper = {
            "n_trees": n_trees,
            "min_branch_size": min_branch_size,
            "max_depth": max_depth,
            "cluster_k": cluster_k,
            "cluster_balanced": cluster_balanced,
            "linear_loss_type": _LOSS_TYPES[linear_loss],
            "linear_c": linear_c,
            "linear_eps": linear_eps,
            "linear_max_iter": linear_max_iter,
            "linear_weight_threshold": linear_weight_threshold,
            "collapse_every_n_layers": collapse_every_n_layers,
        }
        self.beam_size = beam_size
        self.threads = threads
        self._model: Any = None  # an omikuji.Model once fitted or loaded

    def fit(self, x, labels, num_classes: int, directory: Path, seed: int) -> None:
        import omikuji

        x, y = as_csr(x), label_matrix(labels, num_classes)
        # rows with labels and features (module docstring)
        keep = np.flatnonzero((np.diff(y.indptr) > 0) & (np.diff(x.indptr) > 0))
        hyper = omikuji.Model.default_hyper_param()
        for key, value in self.hyper.items():
            setattr(hyper, key, value)
        with tempfile.TemporaryDirectory(prefix="tailkit-omikuji-") as scratch:
            data = Path(scratch) / "train.txt"
            write_legacy(data, x[keep], y[keep])
            with quiet_console():
                model = omikuji.Model.train_on_data(str(data), hyper, n_threads=self.threads)
                model.save(str(directory))
        self._model = model

    def load(self, directory: Path) -> None:
        import omikuji

        with quiet_console():
            self._model = omikuji.Model.load(str(directory))

    def predict_topk(self, x, k: int) -> tuple[np.ndarray, np.ndarray]:
        x = as_csr(x)
        indptr, indices, values = x.indptr, x.indices.tolist(), x.data.tolist()
        rows = []
        with quiet_console():
            for a, b in itertools.pairwise(indptr.tolist()):
                pairs = list(zip(indices[a:b], values[a:b], strict=True))
                rows.append(self._model.predict(pairs, beam_size=self.beam_size, top_k=k))
        return ranked_arrays(rows, k)
