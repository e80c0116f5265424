"""``check_featurizer``: a featurizer fits and transforms every modality it accepts to the
output it declares, row by row and reproducibly, without touching its input."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from tailkit.components import MODALITIES, Featurizer
from tailkit.registry import Component, featurizer_accepts, featurizer_output
from tailkit.testing.contracts.common import SEED, ContractError, _build, _expect, _resolve


def _featurizer_inputs(modality: str, workdir: Path) -> list[tuple[str, Any]]:
    """(what, inputs): 40 rows of ``modality``, as a dataset's ``load`` returns them."""
    rng = np.random.default_rng(SEED)
    if modality == "dense":
        return [("dense (40, 3) float32", rng.standard_normal((40, 3)).astype(np.float32))]
    if modality == "sparse":
        counts = rng.poisson(0.3, size=(40, 50)).astype(np.float32)
        counts[np.arange(40), rng.integers(50, size=40)] += 1  # no empty row
        return [("sparse (40, 50) CSR counts", sp.csr_matrix(counts))]
    if modality == "text":
        words = np.array(["tail", "head", "label", "rare", "common", "row", "text", "word"])
        texts = np.empty(40, dtype=object)
        for i in range(40):  # a few words a row, some repeated, every row different
            texts[i] = " ".join(words[rng.integers(len(words), size=3 + i % 4)]) + f" r{i:02d}"
        return [("(40,) text strings", texts)]
    from PIL import Image  # only image featurizers need Pillow

    pixels = rng.integers(0, 256, size=(40, 8, 8, 3), dtype=np.uint8)
    paths = np.empty(40, dtype=object)
    for i in range(40):  # files of varied sizes, so a resizing featurizer has work to do
        h, w = 6 + i % 5, 7 + i % 4
        path = workdir / f"image-{i:02d}.png"
        Image.fromarray(rng.integers(0, 256, size=(h, w, 3), dtype=np.uint8)).save(path)
        paths[i] = str(path)
    return [("uint8 (40, 8, 8, 3) images", pixels), ("(40,) image file paths", paths)]


def _equal(a: Any, b: Any) -> bool:
    if sp.issparse(a) or sp.issparse(b):
        if not (sp.issparse(a) and sp.issparse(b)) or a.shape != b.shape:
            return False
        a, b = a.toarray(), b.toarray()
    return a.shape == b.shape and bool(np.array_equal(a, b))


def _close(a: Any, b: Any) -> bool:
    if sp.issparse(a) or sp.issparse(b):
        if not (sp.issparse(a) and sp.issparse(b)):
            return False
        a, b = a.toarray(), b.toarray()
    if a.shape != b.shape:
        return False
    if a.dtype == np.uint8:
        return bool(np.array_equal(a, b))
    return bool(np.allclose(a, b, rtol=1e-5, atol=1e-6))


def _check_features(where: str, out: Any, output: str, inputs: Any) -> None:
    """``out`` is what ``output`` promises, for the rows of ``inputs``."""
    n = inputs.shape[0]
    if output == "image":
        _expect(isinstance(out, np.ndarray), where, f"transform returned a {type(out).__name__}")
        _expect(
            out.dtype == np.uint8,
            where,
            f"transform returned dtype {out.dtype}, not uint8 (image output keeps the pixels' "
            "dtype)",
        )
        _expect(
            out.ndim == 4 and out.shape[0] == n and out.shape[3] == 3 and min(out.shape) >= 1,
            where,
            f"transform of shape {inputs.shape} returned shape {out.shape}; expected "
            f"({n}, H, W, 3)",
        )
        return
    if output == "sparse":
        _expect(
            sp.issparse(out) and out.format == "csr",
            where,
            f"transform returned a {type(out).__name__}, not a CSR matrix",
        )
        data = out.data
    else:
        _expect(isinstance(out, np.ndarray), where, f"transform returned a {type(out).__name__}")
        data = out
    _expect(out.dtype == np.float32, where, f"transform returned dtype {out.dtype}, not float32")
    _expect(
        out.ndim == 2 and out.shape[0] == n and out.shape[1] >= 1,
        where,
        f"transform of shape {inputs.shape} returned shape {out.shape}; expected ({n}, D')",
    )
    _expect(np.isfinite(data).all(), where, "transform returned non-finite features")


def check_featurizer(factory: Callable[..., Any] | Component, /, **options: Any) -> None:
    """A featurizer declares what it takes and gives: ``accepts``, a tuple of modalities
    (``"dense"``, ``"sparse"``, ``"image"``; ``("dense",)`` when absent), and ``output``
    (``"dense"``, ``"sparse"`` or ``"image"``; ``"dense"`` when absent).

    For every accepted modality (dense: (40, 3) float32; sparse: (40, 50) float32 CSR counts;
    image: (40, 8, 8, 3) uint8 and an (40,) object array of PNG paths) a fresh instance fits on
    the first 30 rows and transforms all 40 to the declared output (dense: finite float32
    (N, D'); sparse: a finite float32 CSR matrix (N, D'); image: uint8 (N, H, W, 3)), row by
    row, the same way for two fresh instances, without touching its input.
    """
    factory, label = _resolve(factory, "featurizer")
    probe = _build(factory, label, options)
    _expect(isinstance(probe, Featurizer), label, "built an object without fit and transform")
    accepts = featurizer_accepts(probe)
    output = featurizer_output(probe)
    _expect(
        isinstance(accepts, tuple) and accepts and set(accepts) <= set(MODALITIES),
        label,
        f"accepts is {accepts!r}; expected a non-empty tuple of {', '.join(map(repr, MODALITIES))}",
    )
    _expect(
        output in MODALITIES,
        label,
        f"output is {output!r}; expected one of {', '.join(map(repr, MODALITIES))}",
    )
    with tempfile.TemporaryDirectory(prefix="tailkit-featurizer-") as workdir:
        for modality in accepts:
            for what, inputs in _featurizer_inputs(modality, Path(workdir)):
                where = f"{label} on {what}"
                original = inputs.copy()
                featurizer = _build(factory, label, options)
                try:
                    featurizer.fit(inputs[:30])
                    out = featurizer.transform(inputs)
                except Exception as exc:  # the point is which input kind it fails on
                    raise ContractError(
                        f"{where}: fit/transform raised {type(exc).__name__}: {exc}; yet it "
                        f"declares accepts = {accepts!r}"
                    ) from exc
                _check_features(where, out, output, inputs)
                _expect(_equal(inputs, original), where, "fit or transform modified its input")
                part = featurizer.transform(inputs[:5])
                _expect(
                    _close(part, out[:5]),
                    where,
                    "transform of the first 5 rows differs from the first 5 rows of the full "
                    "transform",
                )
                twin = _build(factory, label, options)
                twin.fit(inputs[:30])
                _expect(
                    _equal(twin.transform(inputs), out),
                    where,
                    "two fresh instances with the same options give different features",
                )
