"""Checkpoints that let an interrupted training run resume and end with the same model.

A checkpoint lives outside DVC's outputs (``data/checkpoints/<experiment>/``) because DVC
deletes a stage's outputs before re-running it. It carries a fingerprint of the experiment's
resolved settings, inputs and code; a checkpoint with another fingerprint is ignored, with a
one-line notice, and training starts afresh.

The file is read with ``torch.load(weights_only=True)``: tensors, numbers, strings and
containers only. A planted pickle that would run code is refused with a one-line error naming
the file, before anything in it runs.
"""

from __future__ import annotations

import pickle
import shutil
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from tailkit.atomic import atomic_path
from tailkit.errors import DataValidationError


class Checkpointer:
    """Saves and restores one experiment's training state under ``directory``."""

    def __init__(self, directory: str | Path, key: str, owner: str = "train") -> None:
        self.path = Path(directory) / "state.pt"
        self.key = key
        self.owner = owner

    def save(self, state: dict[str, Any]) -> None:
        with atomic_path(self.path) as tmp:
            torch.save({"key": self.key, **state}, tmp)

    def load(self) -> dict[str, Any] | None:
        if not self.path.exists():
            return None
        try:
            with warnings.catch_warnings():  # torch warns about a foreign pickle protocol
                warnings.simplefilter("ignore")
                state = torch.load(self.path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            raise DataValidationError(
                f"{self.path}: refused: it holds objects other than tensors and plain "
                f"containers, which could run code if unpickled; delete it to start {self.owner} "
                "afresh"
            ) from exc
        except (zipfile.BadZipFile, RuntimeError, EOFError, OSError) as exc:
            raise DataValidationError(
                f"{self.path}: not a readable checkpoint ({type(exc).__name__}); delete it to "
                f"start {self.owner} afresh"
            ) from exc
        if not isinstance(state, dict) or state.get("key") != self.key:
            print(
                f"{self.owner}: ignoring checkpoint {self.path} (written by other settings, "
                "inputs or code); starting afresh",
                file=sys.stderr,
            )
            return None
        print(
            f"{self.owner}: resuming from {self.path} at step {state.get('step')}", file=sys.stderr
        )
        return state

    def clear(self) -> None:
        shutil.rmtree(self.path.parent, ignore_errors=True)
