"""How often the training loop validates and checkpoints: a function of the parameters and
shapes only, never of measured time, so reruns stay byte-identical.

Work is counted in multiply-adds at a GEMM's rate. One validation scores ``rows`` × C labels
(d each, plus the sampler's per-label correction when the loss adds one) in GEMMs. One training
step scores B × C labels (full loss: GEMMs) or B × (1 + m) (sampled loss: gathered rows, a
batched product and row-sparse updates, which ran ``SAMPLED_FACTOR`` = 8 times slower per
multiply-add than the GEMMs on the 2-core machine), three times over for the forward and
backward passes, plus ``STEP_OVERHEAD`` for what every step costs besides (Python, the
optimiser's bookkeeping, the sampler's draws: ~1 ms). With ``train.eval_every: auto`` (the
default) the curve may spend ``train.val_budget`` (10 %) of the training work on validation in
all:

* rows = min(``train.val_rows``, what one validation within the whole budget can afford),
  and never fewer than ``MIN_ROWS`` (a curve over fewer rows is noise);
* validations = how many such validations the budget holds, at most ``MAX_POINTS``, at least
  the one after the last step;
* every = ⌈steps / validations⌉.

At C = 10^6 with a sampled loss this validates once, at the end, on a few thousand rows; with
full softmax, whose steps are themselves O(C), every few hundred steps as before. Counting
multiply-adds undercounts a training step (the sampler's draws, the optimiser, Python), so
the share of wall time spent validating comes out below the budget (at C = 10^6, d = 32, a
sampled step's real cost was ~18 times its count here, a validation row's ~3 times).

Checkpoints (``train.checkpoint_every: auto``): a checkpoint's bytes (output layer, optimiser
state, encoder, loss; counted from the tensors it will hold) are weighed at ``BYTE_WORK`` GEMM
multiply-adds each (serialising and writing ~0.5 GB/s against ~50 GFLOP/s), and one is written
every ⌈bytes × BYTE_WORK / (``train.checkpoint_budget`` × step work)⌉ steps. At C = 10^6,
d = 32 (264 MB, Adagrad) that is every ~9,000 sampled steps; a run shorter than that writes
none and a killed run starts again from step 0, which reproduces the same bytes. An integer
``train.eval_every`` fixes the schedule instead: ``val_rows`` rows every ``eval_every`` steps.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

#: Fewest rows an automatic schedule validates on.
MIN_ROWS = 500
#: Most points an automatic schedule puts on a curve.
MAX_POINTS = 20
#: A sampled step's multiply-adds cost this many GEMM multiply-adds (module docstring).
SAMPLED_FACTOR = 8.0
#: What a training step costs besides its scores, in GEMM multiply-adds.
STEP_OVERHEAD = 5e7
#: A checkpoint byte costs this many GEMM multiply-adds (module docstring).
BYTE_WORK = 100.0


def step_work(batch_size: int, num_classes: int, dim: int, sampled_labels: int | None) -> float:
    """One training step's work in GEMM multiply-adds (module docstring)."""
    if sampled_labels is None:
        return 3.0 * batch_size * num_classes * dim + STEP_OVERHEAD
    return SAMPLED_FACTOR * 3.0 * batch_size * sampled_labels * dim + STEP_OVERHEAD


def checkpoint_interval(every: int | str, state_bytes: int, work: float, budget: float) -> int:
    """Steps between checkpoints: ``every`` when it is a number, else from the budget."""
    if every != "auto":
        return int(every)
    return max(1, math.ceil(state_bytes * BYTE_WORK / (budget * work)))


@dataclass(frozen=True)
class ValidationSchedule:
    rows: int
    every: int
    rule: str

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_validation(
    *,
    eval_every: int | str,
    val_rows: int,
    val_budget: float,
    available_rows: int,
    total_steps: int,
    batch_size: int,
    num_classes: int,
    dim: int,
    sampled_labels: int | None,
    correction_per_label: float = 0.0,
) -> ValidationSchedule:
    """The schedule for one training run (module docstring).

    ``sampled_labels`` is 1 + m, the labels a sampled step scores per row (None: all C, a full
    loss); ``correction_per_label`` the multiply-adds per label of the prediction-time
    correction (the tree's ~2(k + 24), 0 for none).
    """
    rows_cap = min(val_rows, available_rows)
    if eval_every != "auto":
        return ValidationSchedule(rows=rows_cap, every=int(eval_every), rule="fixed")
    per_step = step_work(batch_size, num_classes, dim, sampled_labels)
    per_row = num_classes * (dim + correction_per_label)
    budget = val_budget * per_step * max(total_steps, 1)
    rows = max(min(rows_cap, MIN_ROWS), min(rows_cap, math.floor(budget / per_row)))
    validations = max(1, min(MAX_POINTS, math.floor(budget / (rows * per_row))))
    every = math.ceil(max(total_steps, 1) / validations)
    return ValidationSchedule(
        rows=rows,
        every=every,
        rule=f"auto: {val_budget:g} of the training multiply-adds",
    )
