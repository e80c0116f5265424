"""Bamler & Mandt's adversarial negative sampler: a probabilistic binary tree over the labels.

p_n(y|x) is a balanced binary decision tree fitted on whitened PCA features (k = 16); a draw
walks from the root to a leaf, going right at node ν with probability σ(w_ν·x̃ + b_ν), so a
draw and its exact log-probability cost O(k log C). Negatives drawn from it are hard (likely
under the data), and the main model's scores ξ_y(x) + log p_n(y|x) are unbiased at prediction
(the negative-sampling loss adds it). See fit.py for the fit and its two split rules.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, ClassVar, Literal

import numpy as np
import torch

from tailkit.components import Sampler
from tailkit.evaluation.correction import (
    CorrectionColumns,
    OrderedCorrection,
    TableColumns,
    inverse_order,
)
from tailkit.progress import notice
from tailkit.sparse import SparseRows
from tailkit.validation import Constraint, Interval

if TYPE_CHECKING:
    from tailkit.plugins.samplers.tree.correction_kernels import KernelLayout

# numba and scikit-learn (~2 s of imports) are imported where they are used, not here: every
# `tailkit` command registers this sampler, and most never fit or draw from a tree.

#: Cap on the (rows × 2^(D+1)) floats of the level-wise torch evaluation (256 MiB).
_DENSE_BUDGET = 1 << 26


def _versions(x: torch.Tensor | SparseRows) -> tuple[int, ...] | None:
    """The version counters of ``x``'s tensors; None where one has none (inference mode)."""
    parts = (x,) if isinstance(x, torch.Tensor) else (x.indptr, x.indices, x.values)
    if any(t.is_inference() for t in parts):
        return None
    return tuple(t._version for t in parts)


class _SubtreeColumns(CorrectionColumns):
    """The CPU path of :meth:`TreeSampler.correction_columns`."""

    def __init__(self, sampler: TreeSampler, xt: torch.Tensor) -> None:
        from tailkit.plugins.samplers.tree.correction_kernels import subtree_roots

        self.sampler, self.xt = sampler, xt.numpy()
        t = sampler._kernel_tables()
        self.roots = np.empty((xt.shape[0], t.first_out.shape[0] - 1), dtype=np.float32)
        subtree_roots(self.xt, t.weight, t.bias, sampler.depth, self.roots)

    def columns(self, start: int, stop: int) -> torch.Tensor:
        return self._expand(start, stop, None)

    def added_to(self, scores: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        # Fused when the columns are whole subtrees (prediction's chunk bounds make them so):
        # the kernel writes scores + log p in one pass instead of a table and then the sum.
        bounds = self.sampler._kernel_tables().first_out
        aligned = start in bounds and stop in bounds
        plain = scores.dtype == torch.float32 and scores.device.type == "cpu"
        if not (aligned and plain) or scores.requires_grad:
            return super().added_to(scores, start, stop)
        return self._expand(start, stop, scores.contiguous().numpy())

    def _expand(self, start: int, stop: int, plus: np.ndarray | None) -> torch.Tensor:
        import numba

        from tailkit.plugins.samplers.tree.correction_kernels import subtree_leaves

        s = self.sampler
        t = s._kernel_tables()
        bounds = t.first_out
        r_lo = int(np.searchsorted(bounds, start, side="right")) - 1
        r_hi = int(np.searchsorted(bounds, stop, side="left"))
        lo, hi = int(bounds[r_lo]), int(bounds[r_hi])
        out = np.empty((self.xt.shape[0], hi - lo), dtype=np.float32)
        subtree_leaves(
            self.xt,
            t.weight,
            t.bias,
            s.depth,
            self.roots,
            r_lo,
            r_hi,
            t.slot,
            bounds,
            t.computed,
            t.delta,
            out,
            np.empty((0, 0), dtype=np.float32) if plus is None else plus,
            numba.get_num_threads(),
        )
        s.leaf_columns += out.size
        return torch.from_numpy(out[:, start - lo : stop - lo])


class TreeSampler(OrderedCorrection, Sampler):
    """Adversarial negatives from a label tree fitted on PCA features (Bamler & Mandt 2020).

    Options: ``k`` whitened correlation-matrix PCA dimensions (paper: 16); ``reg`` the node
    regulariser λ_n of −λ_n(‖w‖² + b²) (paper: 0.1; the reference code's ``--reg`` is 2λ_n);
    ``split_rule`` ``paper`` (re-split by Δ_y = w·e_y + n_y b until stable) or ``reference``
    (the released code's split by the stale initial direction); ``frequency_reg`` scales λ_n by
    a node's number of labels (reference ``--frequency_reg``); ``max_rounds`` caps the
    alternation of Newton and discrete steps per node.

    Draws are per example (B, m), i.i.d. from p_n(·|x); ``log_q`` is the exact log p_n of each
    drawn label. On the CPU draws and per-label log-probabilities run in compiled kernels;
    elsewhere (CUDA) the same walk runs as batched torch ops, level by level.
    """

    shared: bool = False
    conditional: ClassVar[bool] = True
    constraints: ClassVar[dict[str, Constraint]] = {
        "k": Interval(1, 1024),
        "reg": Interval(0, None, closed="neither"),
        "max_rounds": Interval(1, None),
    }

    def __init__(
        self,
        k: int = 16,
        reg: float = 0.1,
        split_rule: Literal["paper", "reference"] = "paper",
        frequency_reg: bool = False,
        max_rounds: int = 50,
    ) -> None:
        self.k = k
        self.reg = reg
        self.split_rule = split_rule
        self.frequency_reg = frequency_reg
        self.max_rounds = max_rounds
        self.num_classes = 0
        self.depth = 0
        self._report: dict[str, Any] = {}
        self._tables: dict[str, torch.Tensor] = {}
        self._transposed: torch.Tensor | None = None  # Tᵀ (D, k), contiguous
        self._shift: torch.Tensor | None = None  # μ·Tᵀ (k,), for sparse rows
        # the last input whitened, its version and x̃: a step whitens its batch for the draws
        # and again for the positives' log q (see whiten)
        self._whitened: tuple[Any, tuple[int, ...], torch.Tensor] | None = None
        self._kernel: KernelLayout | None = None  # the all-leaves kernels' tables
        self._order: torch.Tensor | None = None
        self._position: torch.Tensor | None = None  # inverse of _order
        self.leaf_columns = 0

    # --- fitting ---------------------------------------------------------------------------

    def fit(self, features: torch.Tensor | None, labels: torch.Tensor, num_classes: int) -> None:
        """Whitened PCA on the training features, then the greedy tree fit on them."""
        if features is None:
            raise ValueError("the tree sampler needs the training features (it is conditional)")
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        if isinstance(features, SparseRows):
            x = features.to("cpu").to_scipy()
        else:
            x = features.detach().to("cpu", torch.float32).numpy()
        y = labels.detach().reshape(-1).to("cpu", torch.int64).numpy()
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"{x.shape[0]} feature rows but {y.shape[0]} labels")
        if y.size == 0:
            raise ValueError("the tree sampler needs at least one training row")
        if y.min() < 0 or y.max() >= num_classes:
            raise ValueError(f"labels must lie in [0, {num_classes}); got values outside it")
        from tailkit.plugins.samplers.tree.fit import fit_tree
        from tailkit.plugins.samplers.tree.pca import WhitenedPCA

        start = time.perf_counter()
        pca = WhitenedPCA(self.k).fit(x)
        pca_seconds = time.perf_counter() - start
        if pca.dim < self.k:
            notice(
                f"tree sampler: k={self.k} asks for {self.k} principal directions, but the "
                f"{x.shape[0]} × {x.shape[1]} training features have {pca.dim}; fitted with "
                f"k={pca.dim}"
            )
        tree = fit_tree(
            pca.transform(x),
            y,
            num_classes,
            reg=self.reg,
            split_rule=self.split_rule,
            frequency_reg=self.frequency_reg,
            max_rounds=self.max_rounds,
        )
        self.num_classes = int(num_classes)
        self.depth = tree.depth
        mean, transform = pca.mean, pca.transform_matrix
        assert mean is not None and transform is not None  # set by fit
        self._tables = {
            "mean": torch.from_numpy(mean.astype(np.float32)),
            "transform": torch.from_numpy(transform.astype(np.float32)),
            "weight": torch.from_numpy(tree.weight),
            "bias": torch.from_numpy(tree.bias),
            "leaf_of_label": torch.from_numpy(tree.leaf_of_label),
            "label_of_leaf": torch.from_numpy(tree.label_of_leaf),
        }
        self._transposed = self._shift = self._whitened = None
        self._kernel = self._order = self._position = None
        self._warm_up()
        self._report = {
            "depth": tree.depth,
            "k": pca.dim,
            "split_rule": self.split_rule,
            "pca_seconds": round(pca_seconds, 4),
            "tree_seconds": round(tree.stats["fit_tree_seconds"], 4),
            "discrete_rounds": tree.stats["discrete_rounds"],
            "newton_steps": tree.stats["newton_steps"],
        }

    def fit_report(self) -> dict[str, Any]:
        return dict(self._report)

    # --- the tables ------------------------------------------------------------------------

    def _table(self, name: str) -> torch.Tensor:
        if not self._tables:
            raise RuntimeError("TreeSampler: call fit (or load_state_dict) before sampling")
        return self._tables[name]

    def whiten(self, x: torch.Tensor | SparseRows) -> torch.Tensor:
        """x̃ = (x − μ) Tᵀ, the k-dim features the tree routes on, float32 contiguous; on the
        CPU each row's x̃ is the same whichever rows come with it (a compiled fixed-order sum).

        Sparse rows are never centred in place (that would densify them): x̃ = x·Tᵀ − μ·Tᵀ.

        The last input's x̃ is kept: a training step asks for the same batch twice (its draws,
        then its positives' log q), and whitening is a tenth of a Bamler–Mandt step at
        d = 128. It is reused only for the very same object whose tensors (and x̃'s) are
        unchanged since by torch's in-place ops (their version counters); a write that
        bypasses the counter (through ``.numpy()`` or ``.data``) is not seen. Tensors made
        under ``torch.inference_mode`` have no counter and are never reused.
        """
        versions = _versions(x)
        memo = self._whitened
        if (
            versions is not None
            and memo is not None
            and memo[0] is x
            and memo[1] == (*versions, memo[2]._version)
        ):
            return memo[2]
        xt = self._whiten(x)
        self._whitened = None
        if versions is not None and not xt.is_inference():
            self._whitened = (x, (*versions, xt._version), xt)
        return xt

    def _whiten(self, x: torch.Tensor | SparseRows) -> torch.Tensor:
        mean, transform = self._table("mean"), self._table("transform")
        if x.shape[-1] != mean.shape[0]:
            raise ValueError(
                f"the tree was fitted on {mean.shape[0]}-dim features, got {x.shape[-1]}"
            )
        t = self._transform_t()
        if isinstance(x, SparseRows):
            if self._shift is None:
                self._shift = self._mapped_mean(mean, t)
            return (x.to(t.device).matmul(t) - self._shift).contiguous()
        if mean.device.type == "cpu":
            from tailkit.plugins.samplers.tree.draw_kernels import whiten_rows

            out = np.empty((x.shape[0], t.shape[1]), dtype=np.float32)
            whiten_rows(x.to(mean).contiguous().numpy(), mean.numpy(), t.numpy(), out)
            return torch.from_numpy(out)
        return ((x.to(mean) - mean) @ transform.t()).contiguous()

    def _transform_t(self) -> torch.Tensor:
        """Tᵀ (D, k) contiguous, built once per tree: ``embedding_bag``'s table for sparse rows
        and the whitening kernel's for dense ones (each input reads one row of it)."""
        if self._transposed is None:
            self._transposed = self._table("transform").t().contiguous()
        return self._transposed

    @staticmethod
    def _mapped_mean(mean: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """μ·Tᵀ (k,). On the CPU a fixed-order float64 sum: ``mean @ t`` over a sparse input's
        D (830,909 GeoNames cells) splits the sum between torch's threads, so its last bits,
        and with them every whitened row and the adversarial model trained on them, changed
        with the thread count (1 and 2 threads gave different model bytes)."""
        if mean.device.type != "cpu":
            return mean @ t
        from tailkit.plugins.samplers.tree.draw_kernels import whiten_rows

        out = np.empty((1, t.shape[1]), dtype=np.float32)
        m = mean.contiguous().numpy()
        whiten_rows(m[None, :], np.zeros_like(m), t.numpy(), out)
        return torch.from_numpy(out[0])

    def _on_cpu(self) -> bool:
        return self._table("weight").device.type == "cpu"

    # --- sampling --------------------------------------------------------------------------

    def sample(
        self, x: torch.Tensor, y: torch.Tensor, m: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``m`` i.i.d. labels from p_n(·|x) per row: ids (B, m) and their exact log p_n."""
        xt = self.whiten(x)
        if self._on_cpu():
            from tailkit.plugins.samplers.tree.draw_kernels import sample_paths

            seed = int(torch.randint(2**62, (1,), generator=generator))
            ids = np.empty((xt.shape[0], m), dtype=np.int64)
            log_q = np.empty((xt.shape[0], m), dtype=np.float32)
            sample_paths(
                xt.numpy(),
                self._table("weight").numpy(),
                self._table("bias").numpy(),
                self._table("label_of_leaf").numpy(),
                self.depth,
                m,
                seed,
                ids,
                log_q,
            )
            return torch.from_numpy(ids), torch.from_numpy(log_q)
        return self._sample_torch(xt, m, generator)

    def _sample_torch(
        self, xt: torch.Tensor, m: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The same walk as batched torch ops (the CUDA path): D gathers of (B·m) node rows."""
        weight, bias = self._table("weight"), self._table("bias")
        rows = xt.shape[0]
        node = torch.ones(rows, m, dtype=torch.int64, device=xt.device)
        log_q = torch.zeros(rows, m, device=xt.device)
        for _ in range(self.depth):
            row = node - 1
            z = torch.einsum("bmk,bk->bm", weight[row], xt) + bias[row]
            u = torch.rand(rows, m, generator=generator, device=xt.device)
            right = u < torch.sigmoid(z)
            log_q += torch.nn.functional.logsigmoid(torch.where(right, z, -z))
            node = 2 * node + right
        ids = self._table("label_of_leaf")[node - (1 << self.depth)]
        return ids, log_q

    # --- log-probabilities -----------------------------------------------------------------

    def log_prob(self, x: torch.Tensor | None, labels: torch.Tensor) -> torch.Tensor:
        """log p_n(labels | x): labels (B, n) → (B, n); labels (n,) → (B, n) for every row."""
        if x is None:
            raise ValueError("the tree sampler is conditional: log_prob needs x")
        rows, n = x.shape[0], labels.shape[-1]
        if labels.dim() == 1 and n * self.depth > (2 << self.depth) // 4:
            # Many labels for every row (evaluation): one pass over all nodes costs 2^(D+1)
            # per row instead of n·D path walks.
            return self._log_prob_of(x, labels)
        leaf = self._table("leaf_of_label")[labels.to(self._table("leaf_of_label").device)]
        xt = self.whiten(x)
        leaf = leaf.reshape(1 if labels.dim() == 1 else rows, n)
        if self._on_cpu():
            from tailkit.plugins.samplers.tree.draw_kernels import path_log_prob

            out = np.empty((rows, n), dtype=np.float32)
            path_log_prob(
                xt.numpy(),
                self._table("weight").numpy(),
                self._table("bias").numpy(),
                leaf.contiguous().numpy(),
                self.depth,
                out,
            )
            return torch.from_numpy(out)
        return self._path_log_prob_torch(xt, leaf.expand(rows, n))

    def _path_log_prob_torch(self, xt: torch.Tensor, leaf: torch.Tensor) -> torch.Tensor:
        weight, bias = self._table("weight"), self._table("bias")
        target = leaf + (1 << self.depth)
        out = torch.zeros(leaf.shape, device=xt.device)
        for level in range(self.depth):
            row = (target >> (self.depth - level)) - 1
            right = ((target >> (self.depth - 1 - level)) & 1).bool()
            z = torch.einsum("bnk,bk->bn", weight[row], xt) + bias[row]
            out += torch.nn.functional.logsigmoid(torch.where(right, z, -z))
        return out

    def correction_work_per_label(self) -> float:
        # two nodes per leaf, each a k-dim dot product and a log σ (~24 operations)
        return 2.0 * (self.k + 24)

    def label_order(self) -> torch.Tensor:
        """The labels sorted by leaf: the column order of :meth:`log_prob_all_ordered`, which
        its kernel writes sequentially (prediction scores labels in this order)."""
        if self._order is None:
            label_of_leaf = self._table("label_of_leaf")
            self._order = label_of_leaf[label_of_leaf >= 0]
        return self._order

    def log_prob_all(self, x: torch.Tensor) -> torch.Tensor:
        """log p_n(y|x) for every label y, (B, C) in label order: one pass over the tree per row.

        The caller bounds B (the table is B × C floats); prediction sizes its row blocks so
        (``tailkit.evaluation.predict``), and computes it once per row for all label chunks.
        """
        return self._log_prob_of(x, torch.arange(self.num_classes, device=x.device))

    def _log_prob_of(self, x: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """(B, n) for labels (n,): the leaf-ordered table, gathered once at their columns."""
        if self._position is None:
            self._position = inverse_order(self.label_order())
        columns = self._position.index_select(0, labels.to(self._position.device))
        return self.log_prob_all_ordered(x).index_select(1, columns.to(x.device))

    def log_prob_all_ordered(self, x: torch.Tensor) -> torch.Tensor:
        """log p_n of every label for every row, (B, C), column j = label ``label_order()[j]``,
        each row's tree walked once (see :meth:`correction_columns`)."""
        return self.correction_columns(x).columns(0, self.num_classes)

    def correction_floats_per_row(self, num_classes: int) -> int:
        # on the CPU only the subtree roots are held per row; the torch path holds the table
        return len(self._kernel_tables().first_out) - 1 if self._on_cpu() else num_classes

    def chunk_bounds(self, num_classes: int, label_chunk: int) -> list[int]:
        """Column bounds of about ``label_chunk`` labels that fall between bottom subtrees, so
        that every subtree is expanded once per row (on the CPU; elsewhere any bounds do)."""
        if not self._on_cpu():
            return super().chunk_bounds(num_classes, label_chunk)
        first_out = self._kernel_tables().first_out
        bounds = [0]
        while bounds[-1] < num_classes:
            at = bounds[-1]
            reach = first_out[np.searchsorted(first_out, at + label_chunk, side="right") - 1]
            bounds.append(int(reach if reach > at else first_out[first_out > at][0]))
        return bounds

    def correction_columns(self, x: torch.Tensor) -> CorrectionColumns:
        """log p_n(·|x) of the rows ``x`` by column range, in :meth:`label_order`.

        On the CPU the top levels are expanded once here (``subtree_roots``) and each
        ``columns(start, stop)`` expands the bottom subtrees under those columns while their
        weights sit in cache (``subtree_leaves``, correction_kernels.py): memory per row is the
        subtree roots, not C. Elsewhere (CUDA) the whole table is built level by level as
        batched torch ops, in row blocks whose temporaries stay under the dense budget.
        ``leaf_columns`` counts the (row, label) values computed: C per row when every column
        is asked once (tests check that no row's tree is walked twice).
        """
        xt = self.whiten(x)
        if self._on_cpu():
            return _SubtreeColumns(self, xt)
        self.leaf_columns += xt.shape[0] * self.num_classes
        leaves = self._table("leaf_of_label")[self.label_order()]
        block = max(1, _DENSE_BUDGET // (2 << self.depth))
        parts = [
            self._leaf_log_prob(xt[lo : lo + block]).index_select(1, leaves)
            for lo in range(0, xt.shape[0], block)
        ]
        return TableColumns(torch.cat(parts) if len(parts) > 1 else parts[0])

    @property
    def full_tree_rows(self) -> float:
        """Rows whose whole tree was evaluated: ``leaf_columns`` / C."""
        return self.leaf_columns / max(self.num_classes, 1)

    def _kernel_tables(self) -> KernelLayout:
        """The CPU all-leaves kernels' tables (correction_kernels.kernel_layout), built once per tree."""
        if self._kernel is None:
            from tailkit.plugins.samplers.tree.correction_kernels import kernel_layout

            self._kernel = kernel_layout(
                self._table("weight").numpy(),
                self._table("bias").numpy(),
                self._table("label_of_leaf").numpy(),
                self.depth,
            )
        return self._kernel

    def _leaf_log_prob(self, xt: torch.Tensor) -> torch.Tensor:
        """(b, 2^D) log-probabilities of every leaf, level by level into one preallocated heap:
        children = parent + log σ(∓z) (the torch path, for CUDA)."""
        z = torch.addmm(self._table("bias"), xt, self._table("weight").t())
        heap = torch.empty(xt.shape[0], (2 << self.depth) - 1, device=xt.device)
        heap[:, 0] = 0.0
        for level in range(self.depth):
            first, width = (1 << level) - 1, 1 << level
            zl = z[:, first : first + width]
            right = torch.nn.functional.logsigmoid(zl)
            parent = heap[:, first : first + width]
            children = heap[:, first + width : first + 3 * width].view(-1, width, 2)
            children[:, :, 0] = parent + (right - zl)
            children[:, :, 1] = parent + right
        return heap[:, (1 << self.depth) - 1 :]

    # --- state -----------------------------------------------------------------------------

    def to(self, device: torch.device) -> TreeSampler:
        self._tables = {k: v.to(device) for k, v in self._tables.items()}
        self._transposed = self._shift = self._whitened = None
        self._kernel = self._order = self._position = None
        return self

    def state_dict(self) -> dict[str, Any]:
        self._table("weight")
        return {
            "num_classes": self.num_classes,
            "depth": self.depth,
            # The fit's times vary from run to run; the state a later stage reads must not.
            "report": {k: v for k, v in self._report.items() if not k.endswith("_seconds")},
            **{k: v.cpu() for k, v in self._tables.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        c, depth = int(state["num_classes"]), int(state["depth"])
        shapes = {
            "weight": (2**depth - 1, None),
            "bias": (2**depth - 1,),
            "leaf_of_label": (c,),
            "label_of_leaf": (2**depth,),
        }
        for key, shape in shapes.items():
            got = tuple(state[key].shape)
            mismatch = len(got) != len(shape) or any(
                s is not None and g != s for g, s in zip(got, shape, strict=True)
            )
            if mismatch:
                raise ValueError(f"tree sampler state: {key} has shape {got}, expected {shape}")
        from tailkit.plugins.samplers.tree.fit import tree_depth  # numba: see the imports

        if depth != tree_depth(c):
            raise ValueError(f"tree sampler state: depth {depth} does not fit {c} labels")
        self.num_classes, self.depth = c, depth
        self._report = dict(state.get("report", {}))
        self._tables = {
            k: state[k]
            for k in ("mean", "transform", "weight", "bias", "leaf_of_label", "label_of_leaf")
        }
        self._transposed = self._shift = self._whitened = None
        self._kernel = self._order = self._position = None
        self._warm_up()

    def _warm_up(self) -> None:
        """Compile (or load from numba's cache) the kernels now, not inside a timed step."""
        if self._on_cpu():
            x = self._table("mean").unsqueeze(0)
            self.sample(x, torch.zeros(1, dtype=torch.int64), 1, torch.Generator())
            self.log_prob(x, torch.zeros(1, 1, dtype=torch.int64))
