"""How one run of the training loop is set up from its resolved settings: the loop's
configuration and which validation rows its learning curve scores how often, shared by
``train@`` and the cRT second stage of ``train-decoupled@``."""

from __future__ import annotations

import torch

from tailkit.params import Params, ResolvedExperiment
from tailkit.training.cadence import ValidationSchedule, plan_validation, step_work
from tailkit.training.loop import LoopConfig, validation_rows


def loop_config(
    params: Params,
    experiment: str,
    settings: ResolvedExperiment,
    *,
    num_classes: int,
    dim: int,
    negatives: int,
    sampled_labels: int | None,
) -> LoopConfig:
    """The loop's configuration; ``sampled_labels`` is 1 + m for a sampled step, None for a
    full one (the step's work, which the validation budget is a share of)."""
    return LoopConfig(
        experiment=experiment,
        epochs=settings.epochs,
        batch_size=settings.batch_size,
        negatives=negatives,
        max_steps=settings.max_steps,
        checkpoint_every=params.train.checkpoint_every,
        checkpoint_budget=params.train.checkpoint_budget,
        step_work=step_work(settings.batch_size, num_classes, dim, sampled_labels),
        seed=params.base.seed,
        row_sampling=settings.row_sampling,
        label_chunk=params.train.label_chunk,
        matmul=params.train.matmul,
    )


def validation_plan(
    params: Params,
    cfg: LoopConfig,
    *,
    train_rows: int,
    val_rows: int,
    num_classes: int,
    dim: int,
    sampled_labels: int | None,
    correction_per_label: float = 0.0,
) -> tuple[ValidationSchedule, torch.Tensor]:
    """The learning curve's schedule (set on ``cfg``) and its validation rows: the seeded
    pick every experiment shares, cut to the rows the budget affords."""
    schedule = plan_validation(
        eval_every=params.train.eval_every,
        val_rows=params.train.val_rows,
        val_budget=params.train.val_budget,
        available_rows=val_rows,
        total_steps=cfg.total_steps(train_rows),
        batch_size=cfg.batch_size,
        num_classes=num_classes,
        dim=dim,
        sampled_labels=sampled_labels,
        correction_per_label=correction_per_label,
    )
    cfg.eval_every = schedule.every
    pick = validation_rows(val_rows, params.base.seed, params.train.val_rows)
    return schedule, pick[: schedule.rows]
