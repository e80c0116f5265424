"""The second stage of decoupled training (Kang et al., "Decoupling Representation and
Classifier for Long-Tailed Recognition", ICLR 2020): the first stage's encoder, frozen, and a
classifier learned or adjusted on top of it.

* **cRT** (classifier re-training): a freshly initialised output layer trained on the frozen
  embeddings, with class-balanced row sampling (Kang et al.'s choice) by default.
* **τ-norm**: each class's weight vector divided by its norm to the power τ,
  w̃_j = w_j / ‖w_j‖^τ, undoing the head classes' larger norms; no training, τ chosen on
  the validation split. The bias is kept as trained, so τ = 0 is the first stage's model.
* **LWS** (learnable weight scaling): w̃_j = f_j w_j with the weights and biases frozen and
  only the C scales f learned, class-balanced; folded into the layer afterwards, so evaluation
  scores it like any linear layer.

The encoder is frozen, so its embeddings of the training and validation rows are computed
once, in evaluation mode, and the second stage trains on them: cRT runs the ordinary training
loop (row sampling, learning curve, checkpoints) with :class:`Embedded` as its encoder, at the
cost of a linear model whatever the first stage's encoder was.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tailkit.components import Encoder, FullBatch, Loss
from tailkit.errors import TrainingDivergedError
from tailkit.evaluation.correction import PredictionContext
from tailkit.evaluation.predict import predict
from tailkit.labels import LabelSets
from tailkit.output.optim import RowSparseOptimizer
from tailkit.output.output_layer import OutputLayer
from tailkit.training.loop import validation_scores
from tailkit.training.row_sampling import RowSampler

#: The τ grid of ``tau: auto``: 0, 0.05, …, 1 (Kang et al. pick τ in [0, 1] on validation).
TAU_GRID = np.round(np.linspace(0.0, 1.0, 21), 2)


class Embedded(Encoder):
    """The encoder of a second stage: its inputs are the frozen first stage's embeddings."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.out_dim = dim

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z


def check_linear(layer: OutputLayer, what: str) -> None:
    """τ-norm and LWS rescale the rows of a dot-product classifier; a cosine layer (LDAM's) has
    none to rescale."""
    if layer.cosine_scale is not None:
        raise ValueError(
            f"{what} rescales the rows of a dot-product output layer; this first stage's loss "
            "scores by cosine (its rows are normalised already): use classifier: crt"
        )


def tau_normalised(layer: OutputLayer, tau: float) -> OutputLayer:
    """A copy of ``layer`` with w_j / ‖w_j‖^τ (a zero row stays zero) and the same bias."""
    check_linear(layer, "tau-norm")
    norms = torch.linalg.vector_norm(layer.weight, dim=1, keepdim=True)
    scale = torch.where(norms > 0, norms.pow(-tau), torch.ones_like(norms))
    return layer.with_weight(layer.weight * scale if tau != 0 else layer.weight)


def scores_of(
    layer: OutputLayer, loss: Loss, ctx: PredictionContext, z: torch.Tensor, y: Any, batch: int
) -> tuple[float, float]:
    """Validation accuracy and balanced accuracy (or P@1 and the label-averaged share) of
    ``layer`` on embeddings ``z``, with the loss's prediction-time adjustment."""
    multilabel = isinstance(y, LabelSets)
    preds, _ = predict(
        Embedded(layer.dim),
        layer,
        loss,
        ctx,
        z,
        None if multilabel else y,
        k=1,
        batch_size=batch,
        unadjusted=False,
    )
    return validation_scores(preds.topk[:, 0].cpu(), y, layer.num_classes)


@dataclass
class TauSearch:
    """The τ kept and, per τ tried, the validation accuracy and balanced accuracy."""

    tau: float
    tried: list[dict[str, float]] = field(default_factory=list)


def choose_tau(
    layer: OutputLayer,
    loss: Loss,
    ctx: PredictionContext,
    z_val: torch.Tensor,
    y_val: Any,
    batch: int,
    grid: np.ndarray = TAU_GRID,
) -> TauSearch:
    """The τ of ``grid`` with the best validation balanced accuracy (the long-tail measure τ
    trades head for tail on); the lowest of equals."""
    tried = []
    for tau in grid:
        acc, bal = scores_of(tau_normalised(layer, float(tau)), loss, ctx, z_val, y_val, batch)
        tried.append({"tau": float(tau), "val_accuracy": acc, "val_balanced_accuracy": bal})
    best = max(tried, key=lambda t: (t["val_balanced_accuracy"], -t["tau"]))
    return TauSearch(best["tau"], tried)


@dataclass
class ScaleTraining:
    """What :func:`learn_scales` needs besides the layer: the batches' sizes and order, and the
    run's length."""

    experiment: str
    batch_size: int
    total_steps: int
    steps_per_epoch: int
    row_sampler: RowSampler
    seed: int


def learn_scales(
    layer: OutputLayer,
    loss: Loss,
    optimizer: RowSparseOptimizer,
    z_train: torch.Tensor,
    y_train: Any,
    log_prior: torch.Tensor,
    run: ScaleTraining,
) -> tuple[OutputLayer, list[float]]:
    """LWS: one scale per class, learned with ``loss`` on logits f_j ⟨w_j, z⟩ + b_j with the
    layer frozen; returns the layer with the scales folded in, and the mean loss per epoch."""
    check_linear(layer, "lws")
    device = layer.weight.device
    scales = torch.nn.Parameter(torch.ones(layer.num_classes, device=device))
    optimizer.attach(
        layer,
        [scales],
        steps_per_epoch=run.steps_per_epoch,
        total_steps=run.total_steps,
        owner=f"decoupled.{run.experiment}.optimizer",
    )
    weight, bias = layer.weight.detach(), layer.bias.detach()
    losses: list[float] = []
    order: torch.Tensor | None = None
    running = 0.0
    for step in range(run.total_steps):
        epoch, position = divmod(step, run.steps_per_epoch)
        if position == 0 or order is None:
            order = run.row_sampler.epoch_rows(run.seed, epoch)
            running = 0.0
        idx = order[position * run.batch_size : (position + 1) * run.batch_size]
        z = z_train.index_select(0, idx.to(device))
        y = y_train.index_select(0, idx).to(device)
        logits = torch.addcmul(bias, z @ weight.t(), scales)
        batch = FullBatch(
            labels=y.padded() if isinstance(y, LabelSets) else y,
            logits=logits,
            num_classes=layer.num_classes,
            log_prior=log_prior,
            embeddings=z,
            epoch=epoch,
            step=step,
        )
        value = loss(batch)
        value.backward()
        if not math.isfinite(value.item()):
            raise TrainingDivergedError(
                f"decoupled.{run.experiment}: loss became {value.item()} at step {step + 1}; "
                "lower optimizer.lr"
            )
        optimizer.step_dense(step)
        running += value.item()
        if position == run.steps_per_epoch - 1 or step == run.total_steps - 1:
            losses.append(running / (position + 1))
    return layer.with_weight(weight * scales.detach().unsqueeze(1)), losses
