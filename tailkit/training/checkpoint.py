"""Checkpoints that let an interrupted training run resume and end with the same model.

A checkpoint lives outside DVC's outputs (``data/checkpoints/<experiment>/``) because DVC
deletes a stage's outputs before re-running it. It carries a fingerprint of the experiment's
resolved settings, inputs and code; a checkpoint with another fingerprint is ignored, with a
one-line notice, and training starts afresh.

Layout: ``state.pt`` holds what is not per output row (step, curve, encoder, loss, generators)
and names the files of the per-row state, which lie under ``rows-<step>/``: one file per block
of :data:`~tailkit.distributed.world.LABEL_BLOCK` labels (cut where a process's labels begin
and end), each holding that block's rows of every row table (the layer's weight and bias, the
optimiser's accumulators), with their sha256 in ``state.pt``. A label-sharded run (W processes, each owning whole blocks) writes them in
parallel, each process its own blocks, and rank 0 writes ``state.pt`` last, once every block
is on disk: the rename of ``state.pt`` is what publishes a checkpoint. Block files do not depend
on W, so a run checkpointed at one number of processes resumes at any other, each reading the
blocks of its own labels (docs: the distributed design note, §3.6); a missing block, or one
whose bytes do not match, makes every process start afresh together, with a notice.

Every file is read with ``torch.load(weights_only=True)``: tensors, numbers, strings and
containers only. A planted pickle that would run code is refused with a one-line error naming
the file, before anything in it runs.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import pickle
import shutil
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from tailkit.distributed.world import LABEL_BLOCK, ONE_PROCESS, World
from tailkit.errors import DataValidationError
from tailkit.storage.atomic import atomic_path
from tailkit.training.finite import first_non_finite


class Checkpointer:
    """Saves and restores one experiment's training state under ``directory``."""

    def __init__(self, directory: str | Path, key: str, owner: str = "train") -> None:
        self.directory = Path(directory)
        self.path = self.directory / "state.pt"
        self.key = key
        self.owner = owner

    def save(
        self,
        state: dict[str, Any],
        rows: dict[str, torch.Tensor] | None = None,
        *,
        label_start: int = 0,
        world: World = ONE_PROCESS,
        block: int = LABEL_BLOCK,
    ) -> None:
        """Write ``state`` and this process's ``rows`` (tables of the labels ``label_start``
        on, all with the same number of rows). Every process of ``world`` calls it."""
        pieces: list[list[Any]] = []  # [first label, rows, file name, sha256]
        folder = f"rows-{int(state.get('step', 0)):012d}"
        # a write that fails (a full disk) leaves no half-written folder beside the checkpoint
        # it could not replace; the OSError names the file (storage/atomic.py)
        fresh = not (self.directory / folder).exists()
        try:
            self._write_all(state, rows, folder, pieces, label_start, world, block)
        except BaseException:
            if fresh:
                shutil.rmtree(self.directory / folder, ignore_errors=True)
            raise

    def _write_all(
        self,
        state: dict[str, Any],
        rows: dict[str, torch.Tensor] | None,
        folder: str,
        pieces: list[list[Any]],
        label_start: int,
        world: World,
        block: int,
    ) -> None:
        """:meth:`save`'s writes: this process's row files, then (rank 0) the state file
        that names them, then the previous checkpoint's folders go."""
        if rows:
            count = _row_count(rows)
            # cut at global multiples of `block`: with shards of whole blocks (what a sharded
            # run uses) the files are the same whatever the number of processes
            edges = range(-(-label_start // block) * block, label_start + count, block)
            cuts = [label_start, *edges, label_start + count]
            for first, stop in itertools.pairwise(cuts):
                if stop <= first:
                    continue
                part = {name: t[first - label_start : stop - label_start]
                        for name, t in rows.items()}  # fmt: skip
                name = f"rows-{first:012d}.pt"
                sha = _write(self.directory / folder / name, part)
                pieces.append([first, stop - first, name, sha])
        if world.sharded:
            gathered: list[Any] = [None] * world.size
            dist.all_gather_object(gathered, pieces, group=world.group)
            pieces = sorted(piece for part in gathered for piece in part)
        if world.rank == 0:
            record = None
            if rows is not None:
                record = {"folder": folder, "tables": sorted(rows), "pieces": pieces}
            with atomic_path(self.path) as tmp:
                torch.save(_compact({"key": self.key, **state, "rows": record}), tmp)
            for old in self.directory.glob("rows-*"):
                if old.name != folder:
                    shutil.rmtree(old, ignore_errors=True)
        if world.sharded:  # nobody writes the next checkpoint's blocks while old ones go
            dist.barrier(group=world.group)

    def load(
        self, *, label_start: int = 0, label_stop: int | None = None, world: World = ONE_PROCESS
    ) -> dict[str, Any] | None:
        """The saved state, with ``"rows"`` replaced by this process's rows (labels
        ``label_start`` … ``label_stop`` − 1, all of them when None) of every row table; None
        when there is no checkpoint of this run. Every process of ``world`` calls it."""
        state = self._read_state()
        rows: dict[str, torch.Tensor] | None = None
        problem = None
        if state is not None and state.get("rows") is not None:
            try:
                rows = self._read_rows(state["rows"], label_start, label_stop)
            except _Unusable as exc:
                problem = str(exc)
        if state is not None and problem is None:  # never resume into a diverged run
            bad = first_non_finite({k: v for k, v in state.items() if k != "rows"})
            bad = bad or first_non_finite(rows or {})
            if bad is not None:
                problem = f"it holds a non-finite {bad}"
        if world.sharded:  # one process's bad block makes them all start afresh
            flags: list[Any] = [None] * world.size
            dist.all_gather_object(flags, problem, group=world.group)
            problem = next((p for p in flags if p is not None), None)
        if state is None:
            return None
        if problem is not None:
            if world.rank == 0:
                print(f"{self.owner}: ignoring checkpoint {self.path} ({problem}); starting "
                      "afresh", file=sys.stderr)  # fmt: skip
            return None
        if world.rank == 0:
            print(f"{self.owner}: resuming from {self.path} at step {state.get('step')}",
                  file=sys.stderr)  # fmt: skip
        return {**state, "rows": rows}

    def clear(self) -> None:
        shutil.rmtree(self.directory, ignore_errors=True)

    def _read_state(self) -> dict[str, Any] | None:
        if not self.path.exists():
            return None
        state = _load(self.path, self.path.read_bytes(), self.owner)
        if not isinstance(state, dict) or state.get("key") != self.key:
            print(
                f"{self.owner}: ignoring checkpoint {self.path} (written by other settings, "
                "inputs or code); starting afresh",
                file=sys.stderr,
            )
            return None
        return state

    def _read_rows(
        self, record: dict[str, Any], start: int, stop: int | None
    ) -> dict[str, torch.Tensor]:
        """This process's rows (labels ``start`` … ``stop`` − 1) from the pieces that hold
        them; {} for a process without labels."""
        pieces = record["pieces"]
        if stop is None:
            stop = max((first + count for first, count, _, _ in pieces), default=0)
        parts: dict[str, list[torch.Tensor]] = {name: [] for name in record["tables"]}
        covered = start
        for first, count, name, sha in pieces:
            if first + count <= start or first >= stop:
                continue
            if first > covered:
                break
            path = self.directory / record["folder"] / name
            try:
                data = path.read_bytes()
            except OSError as exc:
                raise _Unusable(f"{path.name}: {type(exc).__name__}") from exc
            if hashlib.sha256(data).hexdigest() != sha:
                raise _Unusable(f"{path}: its bytes do not match the sha256 in {self.path.name}")
            tables = _load(path, data, self.owner)
            lo, hi = max(start, first) - first, min(stop, first + count) - first
            for table, kept in parts.items():
                kept.append(tables[table][lo:hi])
            covered = first + hi
        if covered < stop:
            raise _Unusable(f"it has no rows for labels {covered}…{stop - 1}")
        return {name: torch.cat(p) for name, p in parts.items() if p}


class _Unusable(Exception):
    """A checkpoint's row files cannot give this process its rows."""


def _row_count(rows: dict[str, torch.Tensor]) -> int:
    counts = {t.shape[0] for t in rows.values()}
    if len(counts) != 1:
        raise ValueError(f"row tables of different lengths: {sorted(counts)}")
    return counts.pop()


def _compact(obj: Any) -> Any:
    """``obj`` with every tensor on the CPU and holding only its own elements.

    torch.save writes a tensor's whole storage: a 4,096-row piece sliced from a 10^6-row table
    would carry all 10^6 rows (264 MB a piece at d = 32 with Adagrad's state, 55 GB for one
    checkpoint before this copy)."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu()
        own = t.numel() * t.element_size()
        if t.untyped_storage().nbytes() != own or not t.is_contiguous():
            t = t.clone(memory_format=torch.contiguous_format)
        return t
    if isinstance(obj, dict):
        return {k: _compact(v) for k, v in obj.items()}
    if type(obj) in (list, tuple):
        return type(obj)(_compact(v) for v in obj)
    return obj


def _write(path: Path, tables: dict[str, torch.Tensor]) -> str:
    """Save ``tables`` to ``path`` atomically; the sha256 of the bytes written."""
    buffer = io.BytesIO()
    torch.save(_compact(tables), buffer)
    data = buffer.getvalue()
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return hashlib.sha256(data).hexdigest()


def _load(path: Path, data: bytes, owner: str) -> Any:
    """``torch.load(weights_only=True)`` of a checkpoint file's bytes, refusing anything else
    in one line naming ``path``."""
    try:
        with warnings.catch_warnings():  # torch warns about a foreign pickle protocol
            warnings.simplefilter("ignore")
            return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise DataValidationError(
            f"{path}: refused: it holds objects other than tensors and plain containers, "
            f"which could run code if unpickled; delete it to start {owner} afresh"
        ) from exc
    except (zipfile.BadZipFile, RuntimeError, EOFError, OSError) as exc:
        raise DataValidationError(
            f"{path}: not a readable checkpoint ({type(exc).__name__}); delete it to start "
            f"{owner} afresh"
        ) from exc
