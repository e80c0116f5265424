"""``check_dataset``: a dataset fetches only under its ``dest`` and loads consistent RawData
(inputs, labels and splits), and refuses to load what was never fetched."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from tailkit.components import MODALITIES, Dataset, RawData
from tailkit.errors import TailkitError
from tailkit.registry import Component
from tailkit.testing.contracts.common import ContractError, _build, _expect, _resolve


def check_dataset(
    factory: Callable[..., Any] | Component, tmp_path: Path | None, /, **options: Any
) -> None:
    """The options validate and build a Dataset; ``load`` of an empty directory raises a
    :class:`TailkitError`; and, unless ``tmp_path`` is None (for data too large for a unit
    test), ``fetch`` writes only under its ``dest`` and ``load`` returns consistent RawData:

    * inputs as ``modality`` says: dense (N, D) float32, finite; sparse (N, D) float32 CSR with
      sorted, unique indices, finite; image (N, H, W, 3) uint8 or an (N,) object array of paths
      to existing files; text an (N,) object array of str;
    * labels: (N,) int64 in [0, C), or an (N, C) CSR 0/1 indicator with sorted indices;
    * ``splits``, when given: names among train/val/test including train, each a sorted,
      unique, in-range int64 array of row ids, no row in two splits.
    """
    factory, label = _resolve(factory, "dataset")
    dataset = _build(factory, label, options)
    _expect(isinstance(dataset, Dataset), label, "built an object without fetch and load")
    _expect(
        callable(dataset.fetch) and callable(dataset.load), label, "fetch/load are not callable"
    )
    if tmp_path is None:
        return
    tmp_path = Path(tmp_path)
    empty = tmp_path / "never-fetched"
    empty.mkdir(parents=True)
    try:
        dataset.load(empty)
    except TailkitError:
        pass
    except Exception as exc:  # the point is which exception escapes
        raise ContractError(
            f"{label}: load of an empty directory raised {type(exc).__name__}: {exc}; expected "
            "a TailkitError (e.g. DataValidationError) telling the user to fetch first"
        ) from exc
    else:
        raise ContractError(f"{label}: load of an empty directory returned instead of raising")

    dest = tmp_path / "raw"
    dest.mkdir()
    before = set(tmp_path.iterdir())
    dataset.fetch(dest)
    _expect(set(tmp_path.iterdir()) == before, label, "fetch wrote files outside dest")
    _expect(any(dest.iterdir()), label, "fetch left dest empty")
    raw = dataset.load(dest)
    _expect(isinstance(raw, RawData), label, f"load returned a {type(raw).__name__}, not RawData")
    n = _check_raw_inputs(label, raw)
    _expect(
        isinstance(raw.label_names, list) and all(isinstance(n, str) for n in raw.label_names),
        label,
        "label_names must be a list of strings",
    )
    _check_raw_labels(label, raw, n)
    _check_raw_splits(label, raw.splits, n)


def _kind_of(value: Any) -> str:
    kind = getattr(value, "dtype", type(value).__name__)
    return f"{kind} of shape {getattr(value, 'shape', None)}"


def _check_raw_inputs(label: str, raw: RawData) -> int:
    """The inputs match ``raw.modality`` (see :class:`RawData`); returns the number of rows."""
    inputs, modality = raw.inputs, raw.modality
    _expect(
        modality in MODALITIES,
        label,
        f"modality {modality!r} is not one of {', '.join(map(repr, MODALITIES))}",
    )
    if modality == "dense":
        _expect(
            isinstance(inputs, np.ndarray) and inputs.dtype == np.float32 and inputs.ndim == 2,
            label,
            f"inputs must be a 2-D float32 array; got {_kind_of(inputs)}",
        )
        _expect(np.isfinite(inputs).all(), label, "inputs hold non-finite values")
    elif modality == "sparse":
        _expect(
            sp.issparse(inputs)
            and inputs.format == "csr"
            and inputs.dtype == np.float32
            and inputs.ndim == 2,
            label,
            f"sparse inputs must be a float32 CSR matrix; got {type(inputs).__name__} "
            f"{_kind_of(inputs)}",
        )
        _expect(
            inputs.has_canonical_format,
            label,
            "sparse inputs must have sorted, unique column indices in every row",
        )
        _expect(np.isfinite(inputs.data).all(), label, "inputs hold non-finite values")
    elif modality == "text":
        _expect(
            isinstance(inputs, np.ndarray)
            and inputs.ndim == 1
            and inputs.dtype == object
            and all(isinstance(t, str) for t in inputs),
            label,
            f"text inputs must be an (N,) object array of str; got {_kind_of(inputs)}",
        )
    elif isinstance(inputs, np.ndarray) and inputs.dtype == object:
        _expect(
            inputs.ndim == 1 and all(isinstance(p, str | os.PathLike) and p for p in inputs),
            label,
            f"image paths must be an (N,) object array of file paths; got shape {inputs.shape}",
        )
        missing = [p for p in inputs if not os.path.isfile(p)]
        _expect(
            not missing,
            label,
            f"{len(missing)} of {inputs.size} image paths are not files, e.g. {missing[:1]}",
        )
    else:
        _expect(
            isinstance(inputs, np.ndarray)
            and inputs.dtype == np.uint8
            and inputs.ndim == 4
            and inputs.shape[-1] == 3,
            label,
            "image inputs must be a (N, H, W, 3) uint8 array or an (N,) object array of paths; "
            f"got {_kind_of(inputs)}",
        )
    n = int(inputs.shape[0])
    _expect(n > 0, label, "load returned no rows")
    return n


def _check_raw_labels(label: str, raw: RawData, n: int) -> None:
    """One int64 label per row in [0, C), or an (N, C) CSR 0/1 indicator (multi-label)."""
    labels = raw.labels
    if sp.issparse(labels):
        _expect(
            labels.format == "csr" and labels.shape == (n, raw.num_classes),
            label,
            f"a multi-label indicator must be an (N, C) = ({n}, {raw.num_classes}) CSR matrix; "
            f"got {labels.format} of shape {labels.shape}",
        )
        _expect(
            labels.has_canonical_format,
            label,
            "the label indicator must have sorted, unique label ids in every row",
        )
        _expect(
            bool(np.all(labels.data == 1)),
            label,
            "the label indicator holds values other than 1",
        )
        return
    _expect(
        isinstance(labels, np.ndarray) and labels.dtype == np.int64 and labels.ndim == 1,
        label,
        f"labels must be a 1-D int64 array or a CSR indicator; got "
        f"{getattr(labels, 'dtype', type(labels).__name__)}",
    )
    _expect(labels.shape[0] == n, label, f"{labels.shape[0]} labels for {n} input rows")
    _expect(
        labels.min() >= 0 and labels.max() < raw.num_classes,
        label,
        f"label ids span [{labels.min()}, {labels.max()}], outside [0, {raw.num_classes})",
    )


def _check_raw_splits(label: str, splits: Any, n: int) -> None:
    """When a dataset fixes its own splits: known names, a train split, and sorted, unique,
    in-range row ids that no two splits share."""
    if splits is None:
        return
    _expect(
        isinstance(splits, Mapping) and "train" in splits,
        label,
        f"splits must map 'train' (and optionally 'val', 'test') to row ids; got "
        f"{sorted(splits) if isinstance(splits, Mapping) else type(splits).__name__}",
    )
    taken = np.zeros(n, dtype=bool)
    for name, rows in splits.items():
        _expect(
            name in ("train", "val", "test"),
            label,
            f"split {name!r} is not one of 'train', 'val', 'test'",
        )
        _expect(
            isinstance(rows, np.ndarray) and rows.dtype == np.int64 and rows.ndim == 1,
            label,
            f"split {name!r} must be a 1-D int64 array of row ids; got {_kind_of(rows)}",
        )
        _expect(rows.size > 0, label, f"split {name!r} is empty")
        _expect(
            bool(np.all(np.diff(rows) > 0)),
            label,
            f"split {name!r} row ids are not sorted and unique",
        )
        _expect(
            rows[0] >= 0 and rows[-1] < n,
            label,
            f"split {name!r} row ids span [{rows[0]}, {rows[-1]}], outside [0, {n})",
        )
        _expect(not taken[rows].any(), label, f"split {name!r} shares rows with another split")
        taken[rows] = True
