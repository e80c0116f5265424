"""Checkpoints that let an interrupted training run resume and end with the same metrics.

A checkpoint lives outside DVC's outputs (``data/checkpoints/<experiment>/``) because DVC
deletes a stage's outputs before re-running it. It carries a fingerprint of the experiment's
resolved settings and inputs; a checkpoint with another fingerprint is ignored, never resumed.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

from tailkit.atomic import atomic_path


class Checkpointer:
    """Saves and restores one experiment's training state under ``directory``."""

    def __init__(self, directory: str | Path, key: str) -> None:
        self.path = Path(directory) / "state.pt"
        self.key = key

    def save(self, state: dict[str, Any]) -> None:
        with atomic_path(self.path) as tmp:
            torch.save({"key": self.key, **state}, tmp)

    def load(self) -> dict[str, Any] | None:
        if not self.path.exists():
            return None
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=False)
        except Exception:  # noqa: BLE001 - a torn or foreign file is not worth failing over
            return None
        return state if state.get("key") == self.key else None

    def clear(self) -> None:
        shutil.rmtree(self.path.parent, ignore_errors=True)
