"""Which training rows an epoch visits: the data samplers of Kang et al., "Decoupling
Representation and Classifier for Long-Tailed Recognition" (ICLR 2020), "Sampling strategies".

Kang et al. draw a class j with probability p_j = n_j^q / Σ_i n_i^q (n_j: its training rows),
then one of its rows uniformly:

- ``instance`` (q = 1): every row equally often, the plain pass over the data;
- ``class-balanced`` (q = 0): every class equally often, whatever its size;
- ``square-root`` (q = 1/2): in between;
- ``progressive``: p_j(t) = (1 − t/T)·p_j^IB + (t/T)·p_j^CB, sliding from instance-balanced at
  the first epoch (t = 0) towards class-balanced as t nears T, the number of epochs. t counts
  from 0, so the last epoch (t = T − 1) is still 1/T instance-balanced; T is the ``epochs``
  setting, whether or not ``max_steps`` ends the run first.

``instance`` is a seeded ``randperm``: without replacement, so each row is seen once per epoch,
and the very permutation tailkit drew before the other samplers existed, so models trained
without setting ``row_sampling`` do not change. The others draw as many rows as the training set
holds, with replacement (a tail class's few rows are seen many times an epoch), so an epoch has
the same steps whichever sampler runs. A class with no training row has n_j^0 taken as 0: it
cannot be drawn.

Every epoch's rows come from a generator seeded with (seed, epoch) alone, so a run resumed from
a checkpoint mid-epoch rebuilds the interrupted epoch's rows without having saved them.

Multi-label rows are refused for all but ``instance``: a row holds several classes, so drawing
a class and then "a row of it" does not give class j the share p_j (the row brings its other
labels along; Wu et al., ECCV 2020, "Distribution-Balanced Loss"), and Kang et al. define
the samplers for one label per row only.
"""

from __future__ import annotations

from typing import get_args

import torch

from tailkit.labels import LabelSets
from tailkit.params import RowSampling

ROW_SAMPLINGS: tuple[str, ...] = get_args(RowSampling)

# Kang et al.'s exponent q of p_j ∝ n_j^q for the fixed samplers.
_EXPONENT = {"instance": 1.0, "class-balanced": 0.0, "square-root": 0.5}


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """The generator of one epoch's rows: a function of (seed, epoch) only (module docstring)."""
    return torch.Generator().manual_seed(seed * 1_000_003 + epoch)


class RowSampler:
    """Draws each epoch's training rows for one of :data:`ROW_SAMPLINGS`.

    ``labels`` are the training rows' classes, ``epochs`` the run's number of epochs
    (progressive's T; a fractional one is taken as it is). Multi-label rows (:class:`LabelSets`)
    take ``instance`` only (module docstring); the train stage refuses the others on one line
    before any data is read (:func:`tailkit.pipeline.experiment.check_row_sampling`).
    """

    def __init__(
        self, mode: str, labels: torch.Tensor | LabelSets, num_classes: int, epochs: float
    ) -> None:
        if mode not in ROW_SAMPLINGS:
            raise ValueError(f"row_sampling: got {mode!r}; expected one of {ROW_SAMPLINGS}")
        self.mode, self.rows, self.epochs = mode, len(labels), float(epochs)
        if mode == "instance":
            return  # a permutation of the rows: no class structure needed
        if isinstance(labels, LabelSets):
            raise TypeError(f"row_sampling {mode!r} needs one label per row; got label sets")
        labels = labels.to("cpu", torch.int64)
        self.counts = torch.bincount(labels, minlength=num_classes).double()
        # The rows sorted by class, as a CSR: class c's rows are by_class[start[c] : start[c+1]],
        # so "a uniform row of class c" is one gather, with no loop over classes or rows.
        self.by_class = torch.argsort(labels, stable=True)
        self.start = torch.cumsum(self.counts, 0).long() - self.counts.long()

    def class_probabilities(self, epoch: int) -> torch.Tensor:
        """p_j of every class at ``epoch`` (float64, sums to 1)."""
        if self.mode == "progressive":
            t = min(epoch / self.epochs, 1.0)
            return (1 - t) * self._power(1.0) + t * self._power(0.0)
        return self._power(_EXPONENT[self.mode])

    def _power(self, q: float) -> torch.Tensor:
        # n^0 is 1 only for a class that has rows: an empty class has nothing to draw.
        weight = torch.where(self.counts > 0, self.counts.pow(q), 0.0)
        return weight / weight.sum()

    def epoch_rows(self, seed: int, epoch: int) -> torch.Tensor:
        """The rows epoch ``epoch`` visits, in order: ``self.rows`` int64 row indices."""
        g = epoch_generator(seed, epoch)
        if self.mode == "instance":
            return torch.randperm(self.rows, generator=g)
        # A class by inverse CDF (float64, so a class of p_j ≈ 1e-12 among 10^6 still gets its
        # share), then a uniform row within it: O(C + rows·log C) per epoch.
        cdf = torch.cumsum(self.class_probabilities(epoch), 0)
        u = torch.rand(self.rows, dtype=torch.float64, generator=g)
        last = int(torch.nonzero(self.counts).max())  # the top of the CDF belongs to it
        classes = torch.searchsorted(cdf, u * cdf[-1], right=True).clamp_(max=last)
        return self.row_of(classes, torch.rand(self.rows, dtype=torch.float64, generator=g))

    def row_of(self, classes: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """A row of each of ``classes`` (each with rows), uniform over the class's rows for
        ``u`` uniform in [0, 1) (float64): row floor(u·n_c) of the class's block of the CSR."""
        size = self.counts.long()[classes]
        # For u < 1 in float64, u·n stays below n (n < 2^53); the minimum keeps a row of the
        # class even for a caller's u of exactly 1.
        offset = (u * size).long().minimum(size - 1)
        return self.by_class[self.start[classes] + offset]
