"""``check_model``: an encoder maps its inputs to finite, differentiable embeddings and
restores from its state_dict; a Learner fits, predicts top-k and reloads from its files."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tailkit.components import Encoder
from tailkit.registry import Component, is_learner, model_input_kind
from tailkit.sparse import SparseRows
from tailkit.testing.contracts.common import (
    IMAGE_SHAPE,
    IN_DIM,
    SEED,
    B,
    _build,
    _expect,
    _finite,
    _resolve,
)


def check_model(factory: Callable[..., Any] | Component, /, **options: Any) -> None:
    """``factory(in_dim, **options)`` is an Encoder mapping (B, in_dim) to finite (B, out_dim),
    differentiable, whose state_dict restores the same function in a fresh instance; or a model
    that trains itself (:func:`_check_learner`).

    A model whose class declares ``input_kind = "image"`` is built with ``in_dim`` = (H, W, 3)
    and fed uint8 pixels (B, H, W, 3) instead of float rows; one with ``input_kind =
    "sparse"`` is fed :class:`~tailkit.sparse.SparseRows` (with an empty row among them), and
    its output must equal the same model on the rows one at a time (a batch must not mix rows).
    """
    factory, label = _resolve(factory, "model")
    if is_learner(factory):
        return _check_learner(factory, label, options)
    kind = model_input_kind(factory)
    image = kind == "image"
    in_dim = IMAGE_SHAPE if image else IN_DIM
    model = _build(factory, label, options, in_dim)
    _expect(isinstance(model, Encoder), label, f"built a {type(model).__name__}, not an Encoder")
    out_dim = getattr(model, "out_dim", None)
    _expect(
        isinstance(out_dim, int) and not isinstance(out_dim, bool) and out_dim >= 1,
        label,
        f"out_dim is {out_dim!r}; expected a positive int",
    )
    gen = torch.Generator().manual_seed(SEED)
    x: torch.Tensor | SparseRows
    if image:
        x = torch.randint(0, 256, (B, *IMAGE_SHAPE), generator=gen, dtype=torch.uint8)
    elif kind == "sparse":
        x = _sparse_rows(gen)
    else:
        x = torch.randn(B, IN_DIM, generator=gen, requires_grad=True)
    z = model(x)
    _expect(
        isinstance(z, torch.Tensor) and z.shape == (B, out_dim),
        label,
        f"forward of {tuple(x.shape)} gave shape {tuple(getattr(z, 'shape', ()))}; expected "
        f"({B}, {out_dim})",
    )
    _expect(z.is_floating_point() and _finite(z), label, "forward gave non-finite embeddings")
    _expect(z.requires_grad, label, "the embeddings are not differentiable")
    z.sum().backward()
    for name, grad in [("input", getattr(x, "grad", None))] + [
        (n, p.grad) for n, p in model.named_parameters() if p.requires_grad
    ]:
        if grad is not None and grad.is_sparse:
            grad = grad.coalesce().values()
        _expect(grad is None or _finite(grad), label, f"the gradient on {name} is not finite")
    if kind == "sparse":
        model.eval()
        with torch.no_grad():
            one_by_one = torch.cat([model(x[i : i + 1]) for i in range(B)])
            _expect(
                torch.allclose(model(x), one_by_one, rtol=1e-5, atol=1e-6),
                label,
                "a batch of sparse rows gives other embeddings than its rows one at a time",
            )
        model.train()
    fresh = _build(factory, label, options, in_dim)
    fresh.load_state_dict(model.state_dict())
    model.eval()
    fresh.eval()
    with torch.no_grad():
        _expect(
            torch.equal(fresh(x), model(x)),
            label,
            "a fresh instance loaded from state_dict() computes different embeddings",
        )


def _check_learner(factory: Callable[..., Any], label: str, options: dict[str, Any]) -> None:
    """A model that trains itself (:class:`~tailkit.components.Learner`): on rows whose class
    owns two feature columns, ``fit`` leaves its files (no pickle) in the directory it is given
    and learns the classes; ``predict_topk`` gives (N, k) int64 ids in [−1, C) without repeats
    and float32 scores in descending order; a fresh instance ``load``-ed from the directory
    predicts the same."""
    classes, per_class, k = 6, 12, 3
    rows = classes * per_class
    y = torch.arange(rows) % classes
    gen = torch.Generator().manual_seed(SEED)
    noise = torch.randint(0, 2 * classes, (rows,), generator=gen)
    ids = torch.stack([2 * y, 2 * y + 1, 2 * classes + noise], dim=1).sort(dim=1).values
    x: SparseRows | torch.Tensor = SparseRows(
        torch.arange(0, 3 * rows + 1, 3), ids.reshape(-1), torch.ones(3 * rows), 4 * classes
    )
    if model_input_kind(factory) != "sparse":
        x = x.to_dense()
    with tempfile.TemporaryDirectory(prefix="tailkit-contract-") as tmp:
        directory = Path(tmp) / "model"
        model = _build(factory, label, options, 4 * classes)
        model.fit(x, y, classes, directory, SEED)
        files = [f for f in directory.rglob("*") if f.is_file()] if directory.is_dir() else []
        _expect(bool(files), label, f"fit left no files in the directory it was given ({tmp})")
        pickled = [f.name for f in files if f.read_bytes()[:1] == b"\x80"]
        _expect(not pickled, label, f"fit wrote pickled files: {', '.join(pickled)}")
        top, scores = model.predict_topk(x, k)
        _expect(
            isinstance(top, np.ndarray) and top.dtype == np.int64 and top.shape == (rows, k),
            label,
            f"predict_topk gave ids {getattr(top, 'dtype', type(top))} "
            f"{getattr(top, 'shape', '')}; expected int64 ({rows}, {k})",
        )
        _expect(
            isinstance(scores, np.ndarray)
            and scores.dtype == np.float32
            and scores.shape == (rows, k),
            label,
            f"predict_topk gave scores {getattr(scores, 'dtype', type(scores))} "
            f"{getattr(scores, 'shape', '')}; expected float32 ({rows}, {k})",
        )
        _expect(bool(((top >= -1) & (top < classes)).all()), label, "predict_topk ids out of range")
        valid = top >= 0
        repeats = any(
            len(set(r[v].tolist())) < int(v.sum()) for r, v in zip(top, valid, strict=True)
        )
        _expect(not repeats, label, "predict_topk repeats a label within a row")
        ordered = np.where(valid[:, 1:], scores[:, :-1] >= scores[:, 1:], True).all()
        _expect(bool(ordered), label, "predict_topk scores are not in descending order")
        accuracy = float((top[:, 0] == y.numpy()).mean())
        _expect(
            accuracy >= 0.9,
            label,
            f"training accuracy {accuracy:.2f} on rows whose class owns two columns",
        )
        fresh = _build(factory, label, options, 4 * classes)
        fresh.load(directory)
        again, _ = fresh.predict_topk(x, k)
        _expect(
            np.array_equal(again, top), label, "a fresh instance load()-ed predicts differently"
        )


def _sparse_rows(gen: torch.Generator) -> SparseRows:
    """B rows over IN_DIM columns, 1–4 sorted ids each, row 1 empty."""
    lengths = torch.randint(1, 5, (B,), generator=gen)
    lengths[1] = 0
    indices = torch.cat(
        [torch.randperm(IN_DIM, generator=gen)[: int(n)].sort().values for n in lengths]
    )
    indptr = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
    return SparseRows(indptr, indices, torch.rand(len(indices), generator=gen) + 0.1, IN_DIM)
