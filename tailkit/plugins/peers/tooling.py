"""What the wrapped tools (napkinXC, omikuji) share: finding the tool, keeping its console
output out of the pipeline's, and handing it tailkit's rows and labels in the forms it takes."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import itertools
import os
import sys
import tempfile
from collections.abc import Iterator
from types import ModuleType

import numpy as np
import scipy.sparse as sp
import torch

from tailkit.labels import LabelSets
from tailkit.sparse import SparseRows

INSTALL = "pip install 'tailkit[peers]'"


def available(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def require(module: str, model: str) -> ModuleType:
    """The tool's module, or a one-line error saying how to install it (registry.build turns
    the ValueError into a parameter error naming the experiment)."""
    if not available(module):
        raise ValueError(f"model {model!r} needs the {module!r} package: {INSTALL}")
    return importlib.import_module(module)


@contextlib.contextmanager
def quiet_console() -> Iterator[None]:
    """Send what native code writes to file descriptors 1 and 2 (omikuji logs every phase on
    stdout and draws a progress bar per few rows on stderr) to a scratch file instead of the
    pipeline's console; when the tool fails, its last line of output is attached to the
    exception."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = {fd: os.dup(fd) for fd in (1, 2)}
    with tempfile.TemporaryFile() as sink:
        for fd in saved:
            os.dup2(sink.fileno(), fd)
        try:
            yield
        except Exception as exc:
            sink.seek(0)
            lines = sink.read()[-4096:].decode(errors="replace").strip().splitlines()
            if lines:
                exc.add_note(f"last output of the tool: {lines[-1].strip()[-300:]}")
            raise
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, copy in saved.items():
                os.dup2(copy, fd)
                os.close(copy)


def as_csr(x: SparseRows | torch.Tensor) -> sp.csr_matrix:
    """Rows as scipy CSR (zero-copy for SparseRows; a dense tensor is converted)."""
    if isinstance(x, SparseRows):
        return x.to_scipy()
    return sp.csr_matrix(np.ascontiguousarray(x.cpu().numpy(), dtype=np.float32))


def label_matrix(labels: torch.Tensor | LabelSets, num_classes: int) -> sp.csr_matrix:
    """The (N, C) 0/1 indicator of each row's labels (one per row, or a set)."""
    if isinstance(labels, LabelSets):
        return labels.to_csr()
    y = labels.cpu().numpy().astype(np.int64)
    n = y.shape[0]
    return sp.csr_matrix(
        (np.ones(n, dtype=np.float32), y, np.arange(n + 1)), shape=(n, num_classes)
    )


def label_lists(labels: torch.Tensor | LabelSets) -> list[list[int]]:
    """Each row's label ids as a list (napkinXC's form of multi-label targets)."""
    if isinstance(labels, LabelSets):
        indptr, indices = labels.csr_pair()
        ids = indices.tolist()
        return [ids[a:b] for a, b in itertools.pairwise(indptr.tolist())]
    return labels.cpu().numpy().astype(np.int64)[:, None].tolist()


def ranked_arrays(rows: list[list[tuple[int, float]]], k: int) -> tuple[np.ndarray, np.ndarray]:
    """(ids, scores) of per-row (label, score) lists, best first, −1 / −inf past a short row."""
    ids = np.full((len(rows), k), -1, dtype=np.int64)
    scores = np.full((len(rows), k), -np.inf, dtype=np.float32)
    for i, row in enumerate(rows):
        row = row[:k]
        if row:
            ids[i, : len(row)] = [label for label, _ in row]
            scores[i, : len(row)] = [score for _, score in row]
    return ids, scores
