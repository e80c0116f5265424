"""What the training loop carries from step to step, and how it goes into a checkpoint and
comes back out of one (training/checkpoint.py writes the files).

A resumed run must take exactly the steps the uninterrupted run would have taken, so the
checkpoint holds everything a step reads that is not a pure function of (seed, step): the
learned tensors (this process's rows of the output layer and of the optimiser's row tables
apart, so a label shard writes only its own), the optimiser's dense state, the global and the
loop's own random generators, the learning curve so far and the running loss behind its next
point. Nothing non-finite is ever saved: a NaN or an infinity stops the run, naming the tensor.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from tailkit.components import Encoder, Loss
from tailkit.distributed.world import World
from tailkit.errors import TrainingDivergedError
from tailkit.output.optim import RowSparseOptimizer
from tailkit.output.output_layer import OutputLayer
from tailkit.training.checkpoint import Checkpointer
from tailkit.training.finite import first_non_finite


@dataclass
class Learned:
    """The parts of a run that learn: what is checkpointed, saved and checked for NaN."""

    encoder: Encoder
    layer: OutputLayer
    loss: Loss
    optimizer: RowSparseOptimizer

    def tensors(self) -> dict[str, Any]:
        return {
            "layer": self.layer.state_dict(),
            "encoder": self.encoder.state_dict(),
            "loss": self.loss.state_dict(),
            "optimizer": {**self.optimizer.state_dict(), **self.optimizer.row_tables()},
        }


@dataclass
class LoopState:
    """The loop's counters: steps taken, training seconds (validation excluded), the learning
    curve, rows seen, and the loss summed since the curve's last point."""

    step: int = 0
    seconds: float = 0.0
    curve: list[dict[str, Any]] = field(default_factory=list)
    examples: int = 0
    running: float = 0.0
    running_n: int = 0

    def add_loss(self, value: float) -> None:
        self.running += value
        self.running_n += 1

    def point(self, accuracy: float, balanced: float) -> None:
        """Close the curve's next point at this step with the validation scores."""
        self.curve.append(
            {
                "step": self.step,
                "seconds": round(self.seconds, 4),
                "loss": self.running / max(self.running_n, 1),
                "val_accuracy": accuracy,
                "val_balanced_accuracy": balanced,
            }
        )
        self.running, self.running_n = 0.0, 0


def refuse_non_finite(
    experiment: str, learned: Learned, step: int, consequence: str, world: World
) -> None:
    """One line naming the first NaN or infinite tensor of the state, on every rank."""
    bad = first_non_finite(learned.tensors())
    if world.sharded:  # every rank stops together, naming the first rank's finding
        found: list[Any] = [None] * world.size
        torch.distributed.all_gather_object(found, bad, group=world.group)
        bad = next((b for b in found if b is not None), None)
    if bad is not None:
        raise TrainingDivergedError(
            f"experiments.{experiment}: {bad} is not finite after step {step}; "
            f"{consequence}; lower optimizer.lr or check the loss's gradient"
        )


def save_checkpoint(
    checkpoint: Checkpointer,
    experiment: str,
    learned: Learned,
    state: LoopState,
    generators: tuple[torch.Generator, torch.Generator],
    world: World,
) -> None:
    """Write the state (``generators``: the loop's sampling and augmentation streams)."""
    refuse_non_finite(experiment, learned, state.step, "no checkpoint was written", world)
    layer, optimizer = learned.layer, learned.optimizer
    rows = {"layer.weight": layer.weight, "layer.bias": layer.bias}
    rows.update({f"optimizer.{k}": v for k, v in optimizer.row_tables().items()})
    sample_gen, augment_gen = generators
    checkpoint.save(
        {
            "step": state.step,
            "seconds": state.seconds,
            "curve": state.curve,
            "encoder": learned.encoder.state_dict(),
            "loss": learned.loss.state_dict(),
            "optimizer": optimizer.state_dict(),
            # dropout and other draws from the global generators, one state per process
            "rng": _gathered(torch.get_rng_state(), world),
            "cuda_rng": (
                _gathered(torch.cuda.get_rng_state(), world) if torch.cuda.is_available() else None
            ),
            "sample_gen": sample_gen.get_state(),
            "augment_gen": augment_gen.get_state(),
            "running": (state.running, state.running_n),
            "examples": state.examples,
        },
        rows,
        label_start=layer.label_start,
        world=world,
    )


def resume(
    checkpoint: Checkpointer,
    learned: Learned,
    generators: tuple[torch.Generator, torch.Generator],
    world: World,
    seed: int,
    batch_size: int,
) -> LoopState:
    """The state a checkpoint of this run holds, put back into ``learned`` and
    ``generators``; a fresh state when there is none."""
    layer, optimizer = learned.layer, learned.optimizer
    # this process's rows of the layer and the optimiser's state
    saved = checkpoint.load(
        label_start=layer.label_start, label_stop=layer.label_start + layer.num_classes, world=world
    )
    if saved is None:
        return LoopState()
    step = saved["step"]
    # a checkpoint from before rows were counted: full batches, the old estimate
    state = LoopState(
        step, saved["seconds"], saved["curve"], saved.get("examples", step * batch_size)
    )
    if tables := saved["rows"]:  # this process's rows; none for a rank without labels
        layer.load_state_dict({"weight": tables["layer.weight"], "bias": tables["layer.bias"]})
        optimizer.load_row_tables(
            {k.removeprefix("optimizer."): v for k, v in tables.items() if k[:6] != "layer."}
        )
    learned.encoder.load_state_dict(saved["encoder"])
    learned.loss.load_state_dict(saved["loss"])
    optimizer.load_state_dict(saved["optimizer"])
    _restore_rank_rng(saved, world, seed, step)
    sample_gen, augment_gen = generators
    sample_gen.set_state(saved["sample_gen"])
    if saved.get("augment_gen") is not None:
        augment_gen.set_state(saved["augment_gen"])
    state.running, state.running_n = saved["running"]
    return state


def _gathered(state: torch.Tensor, world: World) -> list[torch.Tensor]:
    """Every process's ``state`` (a generator's), in rank order."""
    if not world.sharded:
        return [state]
    every: list[Any] = [None] * world.size
    torch.distributed.all_gather_object(every, state, group=world.group)
    return every


def _restore_rank_rng(state: dict[str, Any], world: World, seed: int, step: int) -> None:
    """Put back this process's global generators (dropout's draws) as the checkpoint left
    them; a run resumed with another number of processes has no such state for each rank,
    so each seeds its own from (seed, step, rank) instead."""
    saved, cuda = state["rng"], state["cuda_rng"]
    if len(saved) == world.size:
        torch.set_rng_state(saved[world.rank])
        if cuda is not None and torch.cuda.is_available():
            torch.cuda.set_rng_state(cuda[world.rank])
        return
    if world.rank == 0:
        print(
            f"train: the checkpoint was written by {len(saved)} process(es), this run has "
            f"{world.size}: the global random streams (dropout) restart from (seed, step, rank)",
            file=sys.stderr,
        )
    torch.manual_seed(hash((seed, step, world.rank)) & (2**63 - 1))
