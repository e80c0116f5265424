"""The unigram (label-frequency) proposal, drawn through a Walker alias table."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import torch

from tailkit.components import Sampler
from tailkit.validation import Constraint, Interval


def build_alias_table(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker/Vose alias table for the distribution ∝ ``weights`` (C,), without a Python loop.

    Returns ``(prob, alias)``, float64 and int64 of shape (C,): draw a bucket ``i`` uniformly,
    keep ``i`` with probability ``prob[i]``, else take ``alias[i]``. Label ``i`` then has
    probability ``(prob[i] + Σ_{j: alias[j] = i} (1 − prob[j])) / C``.

    Vose's two-pointer loop is inherently sequential, but its outcome has a closed form, which
    is what makes a C = 10^6 build take milliseconds instead of seconds of Python: scale the
    weights so their mean is 1; buckets below 1 ("small") have deficit ``1 − p``, the others
    ("large") excess ``p − 1``. The loop lets large ``l_1`` fill smalls in order until its own
    value drops below 1, then ``l_2`` tops ``l_1`` up and carries on, and so on. With ``D`` the
    cumulative deficits of the smalls and ``E`` the cumulative excesses of the larges, small
    ``i`` is filled by the first large ``k`` with ``E_k ≥ D_{i−1}``; large ``k`` runs dry at the
    first small ``i`` with ``D_i > E_k``, keeps ``1 + E_k − D_i`` and aliases ``l_{k+1}``. A
    zero weight is a small with ``prob = 0`` and is never anyone's alias, so it is never drawn.

    The sums run in int64 fixed point (the bucket is 2^k units, C·2^k ≤ 2^62), so ``D`` and
    ``E`` end on exactly the same total. In floating point the cumulative sums over 10^6 terms
    drift by ~10^−6 of a bucket and all of that drift lands on the last large label.
    """
    w = np.asarray(weights, dtype=np.float64)
    if w.ndim != 1 or w.size == 0:
        raise ValueError(f"weights must be a non-empty vector, got shape {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("weights must be finite and non-negative")
    total = w.sum()
    if not total > 0:
        raise ValueError("weights sum to zero: nothing can be drawn")
    n = w.size
    if n >= 2**40:
        raise ValueError(f"alias table too large: {n} labels")
    bits = 62 - int(n - 1).bit_length()
    unit = np.int64(1) << np.int64(bits)  # one bucket
    # Quantise to units for the bookkeeping; the rounding residual (~10^−16 of the total) goes
    # to the heaviest label.
    p = np.floor(w * (float(n * (1 << bits)) / total)).astype(np.int64)
    p[np.argmax(w)] += np.int64(n) * unit - p.sum()

    prob = np.ones(n, dtype=np.float64)
    alias = np.arange(n, dtype=np.int64)
    small = np.flatnonzero(p < unit)
    large = np.flatnonzero(p >= unit)  # never empty: the mean of p is exactly one bucket
    if small.size == 0:  # exactly uniform: every bucket keeps itself
        return prob, alias
    deficit = unit - p[small]
    d_incl = np.cumsum(deficit)
    d_excl = d_incl - deficit
    e_incl = np.cumsum(p[large] - unit)  # e_incl[-1] == d_incl[-1], exactly

    # Smalls keep their own mass; the rest of the bucket goes to the large that fills them.
    # Their own mass is taken in floating point, not in units, so that a label far below
    # 2^−k of a bucket keeps its relative accuracy (and stays drawable); the donor absorbs
    # the < 1 unit difference.
    donor = np.minimum(np.searchsorted(e_incl, d_excl, side="left"), large.size - 1)
    prob[small] = np.minimum(w[small] * (n / total), 1.0)
    alias[small] = large[donor]

    # A large that runs dry is topped up by the next one; the last one keeps its bucket.
    dry_at = np.searchsorted(d_incl, e_incl, side="right")
    dry = np.flatnonzero(dry_at < small.size)
    dry = dry[dry < large.size - 1]
    prob[large[dry]] = (unit + e_incl[dry] - d_incl[dry_at[dry]]) / unit
    alias[large[dry]] = large[dry + 1]
    return prob, alias


class UnigramSampler(Sampler):
    """Unigram proposal q(y) ∝ (count_y + offset)^alpha (Walker alias table, O(1) per draw).

    Frequent labels are the hard negatives on a long-tailed dataset, so drawing them in
    proportion to their frequency gives far more informative negatives than uniform draws.
    ``alpha`` flattens the distribution (word2vec uses 0.75; 0 is uniform over the labels with
    positive weight) and ``offset`` gives unseen labels a chance (Bamler–Mandt's frequency
    baseline is offset 1, alpha 1). A label whose ``count + offset`` is 0 gets q = 0
    (log q = −inf) for every alpha, including alpha = 0, and is never drawn.

    ``torch.multinomial`` rescans all C probabilities per call and an inverse-CDF search costs
    O(log C) per draw; the alias table makes a draw two gathers and a compare, which is what
    keeps the sampler a small part of a training step at C = 10^6 (see performance.md §4.4).
    """

    constraints: ClassVar[dict[str, Constraint]] = {
        "alpha": Interval(0, None),
        "offset": Interval(0, None),
    }

    def __init__(self, alpha: float = 1.0, offset: float = 0.0, shared: bool = True) -> None:
        self.alpha = float(alpha)
        self.offset = float(offset)
        self.shared = shared
        self.num_classes = 0
        self._prob: torch.Tensor | None = None  # (C,) float32, keep-probability per bucket
        self._alias: torch.Tensor | None = None  # (C,) int64
        self._log_q: torch.Tensor | None = None  # (C,) float32

    def weights(self, counts: np.ndarray) -> np.ndarray:
        """Unnormalised q from label counts, float64; 0 where ``count + offset`` is 0."""
        base = np.asarray(counts, dtype=np.float64) + self.offset
        out = np.zeros_like(base)
        pos = base > 0
        out[pos] = base[pos] ** self.alpha
        return out

    def fit(self, features: torch.Tensor | None, labels: torch.Tensor, num_classes: int) -> None:
        """Count the training labels and build the alias and log q tables (on the CPU)."""
        if num_classes < 1:
            raise ValueError(f"num_classes must be >= 1, got {num_classes}")
        labels = labels.detach().reshape(-1).to("cpu", torch.int64)
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
            raise ValueError(f"labels must lie in [0, {num_classes}); got values outside it")
        counts = torch.bincount(labels, minlength=num_classes).numpy()
        w = self.weights(counts)
        if not w.sum() > 0:
            raise ValueError(
                "unigram sampler: every label has zero weight (no training labels and offset 0)"
            )
        prob, alias = build_alias_table(w)
        with np.errstate(divide="ignore"):
            log_q = np.log(w) - np.log(w.sum())
        self.num_classes = int(num_classes)
        self._prob = torch.from_numpy(prob.astype(np.float32))
        self._alias = torch.from_numpy(alias)
        self._log_q = torch.from_numpy(log_q.astype(np.float32))

    def _tables(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if self._prob is None or self._alias is None or self._log_q is None:
            raise RuntimeError("UnigramSampler: call fit (or load_state_dict) before sampling")
        return self._prob, self._alias, self._log_q

    def sample(
        self, x: torch.Tensor, y: torch.Tensor, m: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``m`` i.i.d. draws, shared ``(m,)`` or per example ``(B, m)``, on the tables' device.

        The tables must already be where ``y`` is (:meth:`to`); ``generator`` too.
        """
        prob, alias, log_q = self._tables()
        shape = (m,) if self.shared else (y.shape[0], m)
        n = m if self.shared else y.shape[0] * m
        bucket = torch.randint(
            self.num_classes, (n,), generator=generator, device=y.device, dtype=torch.int64
        )
        # float64: float32 uniforms come in steps of 2^−24, which would round the keep
        # probability of a label far in the tail (prob ≪ 10^−5) to the wrong value.
        u = torch.rand(n, generator=generator, device=y.device, dtype=torch.float64)
        # index_select on a 1-D index is ~2× faster than advanced indexing on the CPU.
        ids = torch.where(u < prob.index_select(0, bucket), bucket, alias.index_select(0, bucket))
        return ids.view(shape), log_q.index_select(0, ids).view(shape)

    def log_prob(self, x: torch.Tensor | None, labels: torch.Tensor) -> torch.Tensor:
        return self._tables()[2].index_select(0, labels.reshape(-1)).view(labels.shape)

    def to(self, device: torch.device) -> UnigramSampler:
        if self._prob is not None:
            prob, alias, log_q = self._tables()
            self._prob, self._alias, self._log_q = (t.to(device) for t in (prob, alias, log_q))
        return self

    def state_dict(self) -> dict[str, Any]:
        prob, alias, log_q = self._tables()
        return {"num_classes": self.num_classes, "prob": prob, "alias": alias, "log_q": log_q}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        c = int(state["num_classes"])
        tables = [state[k] for k in ("prob", "alias", "log_q")]
        if any(t.shape != (c,) for t in tables):
            raise ValueError(f"unigram sampler state: tables must have shape ({c},)")
        self.num_classes = c
        self._prob = tables[0].to(torch.float32)
        self._alias = tables[1].to(torch.int64)
        self._log_q = tables[2].to(torch.float32)
