"""Stage ``featurize@<set>``: fit one feature set's featurizer on the training rows and write
its feature cache.

``params.featurize`` names the feature sets (an experiment trains on one of them); each is a
stage of its own, so changing one set's options re-runs only the experiments that train on it.
Raw inputs are decoded once; each split becomes ``data/features/<set>/<split>.parquet`` (see
:mod:`tailkit.cache`), and ``meta.json`` and ``labels.parquet`` (names and counts,
:mod:`tailkit.splits`) are carried forward so later stages read only ``data/features/<set>``.

The featurizer's ``accepts`` (the RawData modalities it takes; ``("dense",)`` when it declares
none) is checked against the dataset's modality before anything is fitted. Its ``output``
decides what is cached: ``dense`` features as float32, ``image`` pixels as uint8 (N, H, W, 3),
``sparse`` features as a float32 CSR matrix. ``meta.json`` records that ``kind``, ``dim`` (the
values per row: D, or H·W·3) and, for images, ``shape`` = [H, W, 3].
"""

from __future__ import annotations

import shutil
from typing import Any

import numpy as np
import scipy.sparse as sp

from tailkit.atomic import atomic_dir, write_json
from tailkit.cache import KINDS, write_features
from tailkit.checksum import params_hash
from tailkit.components import featurizer_accepts, featurizer_output
from tailkit.errors import DataValidationError, InvalidParameterError, PluginError
from tailkit.params import Params
from tailkit.paths import Layout
from tailkit.progress import each
from tailkit.registry import Registry
from tailkit.sparse import canonical, check_rows
from tailkit.splits import LABELS, SPLITS, read_meta, read_split


def check_modality(
    featurizer: Any, params: Params, features: str, modality: str, registry: Registry
) -> None:
    """A one-line error when the featurizer does not take the dataset's modality, naming the
    featurizers that do."""
    taken = tuple(featurizer_accepts(featurizer))
    if modality in taken:
        return
    fits = [
        c.name
        for c in registry.components("featurizers")
        if modality in featurizer_accepts(c.factory)
    ]
    raise InvalidParameterError(
        f"featurize.{features}.name: featurizer {params.featurize[features]['name']!r} accepts "
        f"{', '.join(taken)} inputs, but dataset {params.dataset['name']!r} is {modality}; "
        f"featurizers for {modality} data: {', '.join(fits) or '(none installed)'}"
    )


#: Rows per block of the finiteness scan: its boolean mask stays a few MiB at any width.
_SCAN_ROWS = 1 << 14


def first_non_finite(x: np.ndarray, rows: np.ndarray | None = None) -> tuple[int, int] | None:
    """(i, j) of the first NaN or ±inf in a dense (N, D) array (row-major order), or None;
    ``rows`` restricts the scan to those rows (i then indexes ``rows``). Scanned in row blocks
    so that no (N, D) mask is ever built."""
    count = x.shape[0] if rows is None else rows.shape[0]
    for lo in range(0, count, _SCAN_ROWS):
        block = x[lo : lo + _SCAN_ROWS] if rows is None else x[rows[lo : lo + _SCAN_ROWS]]
        bad = ~np.isfinite(block)
        if bad.any():
            i, j = np.argwhere(bad)[0]
            return lo + int(i), int(j)
    return None


def check_finite_inputs(raw_inputs: Any, splits: dict[str, Any], dataset: str) -> None:
    """Refuse dense raw inputs holding NaN or ±inf in a row a split uses, naming the dataset
    row and column, before a featurizer is fitted on them (a NaN would otherwise surface as a
    traceback in some later stage: ECE at evaluation, a PCA's SVD, a diverged loss)."""
    if not (isinstance(raw_inputs, np.ndarray) and raw_inputs.dtype.kind == "f"):
        return
    for split, (rows, _) in splits.items():
        found = first_non_finite(raw_inputs, np.asarray(rows))
        if found is not None:
            i, j = found
            row = int(rows[i])
            raise DataValidationError(
                f"dataset {dataset!r}: row {row} (in the {split} split) has "
                f"{raw_inputs[row, j]} in column {j}; features must be finite: drop or impute "
                "such rows in the dataset"
            )


def as_output(x: Any, output: str, name: str, where: str = "") -> Any:
    """``transform``'s result in the cache's form for ``output``, or a one-line PluginError
    when it is not what the featurizer declared or holds a NaN or ±inf (``where`` follows
    "output" in the message, e.g. " (train split)")."""
    if sp.issparse(x):
        if output == "sparse":
            matrix = canonical(sp.csr_matrix(x, dtype=np.float32))
            try:  # a NaN or an id past D would reach every later stage; name the row now
                check_rows(matrix.indptr, matrix.indices, matrix.data, matrix.shape[1], where)
            except ValueError as exc:
                raise PluginError(f"featurizer {name!r} output{exc}") from exc
            return matrix
    elif output == "dense":
        array = np.asarray(x)
        if array.ndim == 2 and array.dtype.kind in "biuf":
            with np.errstate(over="ignore"):  # a value past float32's range: inf, caught below
                array = np.ascontiguousarray(array, dtype=np.float32)
            found = first_non_finite(array)
            if found is not None:
                i, j = found
                raise PluginError(
                    f"featurizer {name!r} output{where}: row {i}: value {array[i, j]} in column {j}"
                )
            return array
    elif output == "image":
        image = isinstance(x, np.ndarray) and x.ndim == 4 and x.shape[-1] == 3
        if image and x.dtype == np.uint8:
            return np.ascontiguousarray(x)  # the very array when already contiguous
    got = f"a sparse matrix of shape {x.shape}" if sp.issparse(x) else None
    got = got or f"{getattr(x, 'dtype', type(x).__name__)} of shape {getattr(x, 'shape', None)}"
    expected = {
        "dense": "an (N, D) real array",
        "image": "an (N, H, W, 3) uint8 array",
        "sparse": "a sparse (N, D) matrix",
    }[output]
    raise PluginError(
        f"featurizer {name!r} declares output {output!r} ({expected}) but transform returned {got}"
    )


def run(params: Params, layout: Layout, registry: Registry, features: str) -> dict[str, Any]:
    """Write feature set ``features`` (a key of ``params.featurize``); returns its meta."""
    if features not in params.featurize:
        raise InvalidParameterError(
            f"{params.source}: featurize: no feature set {features!r}; defined: "
            + ", ".join(params.featurize)
        )
    spec = params.featurize[features]
    dataset = registry.build("datasets", params.dataset, "dataset")
    featurizer = registry.build("featurizers", spec, f"featurize.{features}")
    name = spec["name"]
    output = featurizer_output(featurizer)
    if output not in KINDS:
        raise PluginError(
            f"featurizer {name!r} declares output {output!r}; expected one of {KINDS}"
        )
    raw = dataset.load(layout.raw_data(params.dataset["name"]))
    check_modality(featurizer, params, features, raw.modality, registry)
    meta = read_meta(layout.split)
    splits = {split: read_split(layout.split, split) for split in SPLITS}
    if raw.modality == "dense":
        check_finite_inputs(raw.inputs, splits, params.dataset["name"])

    featurizer.fit(raw.inputs[splits["train"][0]])
    info = {
        "dataset": params.dataset,
        "features": features,
        "featurize": spec,
        # Identifies the data a model is trained on (a stale checkpoint must not resume on
        # another split), so the subsample settings recorded with the split are part of it.
        "params_hash": params_hash(
            {
                "dataset": params.dataset,
                "subsample": meta["subsample"],
                "featurize": spec,
            }
        ),
    }
    row_shapes = {}
    with atomic_dir(layout.feature_set(features)) as tmp:
        for split, (rows, labels) in each(splits.items(), "featurize", unit="split"):
            x = as_output(featurizer.transform(raw.inputs[rows]), output, name, f" ({split} split)")
            write_features(tmp / f"{split}.parquet", x, labels, rows, {**info, "split": split})
            row_shapes[split] = tuple(int(s) for s in x.shape[1:])
        if len(set(row_shapes.values())) > 1:
            raise PluginError(
                f"featurizer {name!r} gave rows of different shapes per split: {row_shapes}"
            )
        row_shape = row_shapes["train"]
        scalars = {k: v for k, v in meta.items() if not isinstance(v, np.ndarray)}
        meta = {**scalars, **info, "kind": output, "dim": int(np.prod(row_shape))}
        if output == "image":
            meta["shape"] = list(row_shape)
        write_json(tmp / "meta.json", meta)
        shutil.copyfile(layout.split / LABELS, tmp / LABELS)  # the per-label table, as it is
    return meta
