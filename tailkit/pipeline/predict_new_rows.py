"""``tailkit predict``: a trained experiment's top-k labels, with its loss's calibrated
probabilities, for rows outside the pipeline (or for one of its own splits).

New rows come as a Parquet, CSV, TSV or JSON-lines table of raw inputs. The dataset decodes them
(``Dataset.decode_rows``: GeoNames reads latitude and longitude); a dataset without that
method gets the generic reading: dense inputs from the table's numeric columns, in order, and
sparse ones from a ``features`` column of ``id:value`` tokens (a row of the Extreme
Classification Repository's format without its labels). An ``id`` column, when present, is
carried to the output instead of the row number.

A featurizer that hands over its fitted state as data (``text-tfidf``'s terms and idf;
:mod:`tailkit.storage.featurizer_state`) is restored from ``featurizer.parquet`` beside the
cache. Any other is fitted again on the training rows, exactly as ``featurize@<set>`` fitted
it (nothing tailkit writes may run code when read, so no pickled state). Either way it is
checked against the cache: it must give the cached features of the first test rows bit for
bit, else the code or data moved since the stage ran and the predictions would not be the
evaluated model's.

Scores go through the same chunked prediction as evaluation, with the loss's prediction-time
adjustment (post-hoc logit adjustment, Bamler–Mandt's log p_n(y|x)), so on the test split the
ranking is evaluate's. Probabilities are ``Loss.confidence`` of each ranked label (softmax,
σ(s), σ(2s); None for a loss without a probability model); ``threshold`` keeps the labels whose
probability reaches it (a row may keep none).

The output has one record per row: ``id``, ``labels`` (ids, best first), ``names``,
``scores`` and ``probabilities``; as Parquet (list columns) or JSON lines.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import scipy.sparse as sp
import torch

from tailkit.errors import DataValidationError, InvalidParameterError
from tailkit.evaluation.predict import predict
from tailkit.evaluation.results import probabilities_of
from tailkit.native.device import resolve_device
from tailkit.params import Params
from tailkit.paths import Layout
from tailkit.pipeline.experiment import feature_dir, trains_itself
from tailkit.pipeline.featurizing import as_output
from tailkit.pipeline.trained import restore, restore_learner
from tailkit.registry import Registry, featurizer_output
from tailkit.sparse import SparseRows
from tailkit.storage.atomic import atomic_path
from tailkit.storage.feature_cache import read_features
from tailkit.storage.featurizer_state import FILE as STATE_FILE
from tailkit.storage.featurizer_state import keeps_state, read_state
from tailkit.storage.parquet import read_table, write_table
from tailkit.storage.splits import SPLITS, read_labels, read_split
from tailkit.storage.user_table import read_user_table

#: Test rows the re-fitted featurizer must reproduce from the cache.
CHECK_ROWS = 64
FORMATS = ("parquet", "jsonl")


def read_rows(path: Path) -> pa.Table:
    """The input table: Parquet, CSV, TSV or JSON lines by the file's suffix."""
    if not path.is_file():
        raise DataValidationError(f"{path}: no such file")
    if path.suffix.lower() == ".parquet":
        return read_table(path, str(path), "predict")
    return read_user_table(path).to_arrow()


def _numeric_inputs(table: pa.Table, dim: int, source: str) -> np.ndarray:
    columns = [
        name
        for name, kind in zip(table.column_names, table.schema.types, strict=True)
        if name != "id" and (pa.types.is_integer(kind) or pa.types.is_floating(kind))
    ]
    if len(columns) != dim:
        raise DataValidationError(
            f"{source}: the dataset's rows have {dim} input values; the table has "
            f"{len(columns)} numeric columns besides id ({', '.join(columns) or 'none'})"
        )
    values = np.stack(
        [table.column(c).to_numpy(zero_copy_only=False).astype(np.float64) for c in columns],
        axis=1,
    )
    bad = np.argwhere(~np.isfinite(values))
    if bad.size:
        i, j = bad[0]
        raise DataValidationError(f"{source}: row {i}: column {columns[j]!r} is {values[i, j]}")
    return values.astype(np.float32)


def _sparse_inputs(table: pa.Table, dim: int, source: str) -> sp.csr_matrix:
    if "features" not in table.column_names:
        raise DataValidationError(
            f"{source}: sparse inputs come in a 'features' column of 'id:value' tokens"
        )
    indptr, indices, values = [0], [], []
    for i, text in enumerate(table.column("features").to_pylist()):
        for token in (text or "").split():
            column, colon, value = token.partition(":")
            try:
                j, v = int(column), float(value)
            except ValueError:
                j, v = -1, math.nan
            if not colon or not 0 <= j < dim or not math.isfinite(v):
                raise DataValidationError(
                    f"{source}: row {i}: token {token!r} is not 'id:value' with 0 <= id < {dim}"
                )
            indices.append(j)
            values.append(v)
        indptr.append(len(indices))
    matrix = sp.csr_matrix(
        (np.asarray(values, np.float32), np.asarray(indices, np.int64), np.asarray(indptr)),
        shape=(len(indptr) - 1, dim),
    )
    matrix.sum_duplicates()
    return matrix


def decode_rows(dataset: Any, table: pa.Table, raw_inputs: Any, source: str) -> Any:
    """The raw inputs of ``table``'s rows in the form the dataset's ``load`` gives them."""
    if hasattr(dataset, "decode_rows"):
        try:
            return dataset.decode_rows(table)
        except DataValidationError as exc:
            raise DataValidationError(f"{source}: {exc}") from None
    if sp.issparse(raw_inputs):
        return _sparse_inputs(table, raw_inputs.shape[1], source)
    if isinstance(raw_inputs, np.ndarray) and raw_inputs.ndim == 2:
        return _numeric_inputs(table, raw_inputs.shape[1], source)
    raise InvalidParameterError(
        f"{source}: predict reads dense or sparse raw inputs from a table; this dataset's "
        "inputs are images (predict on one of its splits with --split)"
    )


def _as_model_input(x: Any) -> Any:
    """A featurizer's output as the cache hands it to a model."""
    if sp.issparse(x):
        return SparseRows.from_scipy(x)
    if isinstance(x, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(x))
    return x


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, SparseRows) and isinstance(b, SparseRows):
        a, b = a.to_scipy(), b.to_scipy()
        return (
            np.array_equal(a.indptr, b.indptr)
            and np.array_equal(a.indices, b.indices)
            and np.array_equal(a.data, b.data)
        )
    return bool(torch.equal(torch.as_tensor(a), torch.as_tensor(b)))


def featurize_rows(
    params: Params,
    layout: Layout,
    registry: Registry,
    experiment: str,
    table: pa.Table,
    source: str,
) -> Any:
    """``table``'s rows through the experiment's featurizer, restored or fitted again on the
    training rows, and checked against the cached test features (module docstring)."""
    features = params.experiment(experiment).features
    spec = params.featurize[features]
    dataset = registry.build("datasets", params.dataset, "dataset")
    featurizer = registry.build("featurizers", spec, f"featurize.{features}")
    output = featurizer_output(featurizer)
    raw = dataset.load(layout.raw_data(params.dataset["name"]))
    rows = decode_rows(dataset, table, raw.inputs, source)
    state = feature_dir(params, layout, experiment) / STATE_FILE
    if keeps_state(featurizer) and state.is_file():
        featurizer.restore_state(read_state(state))
    else:
        featurizer.fit(raw.inputs[read_split(layout.split, "train")[0]])

    def transform(inputs: Any, where: str) -> Any:
        return _as_model_input(as_output(featurizer.transform(inputs), output, spec["name"], where))

    test_rows = read_split(layout.split, "test")[0][:CHECK_ROWS]
    cached = read_features(feature_dir(params, layout, experiment) / "test.parquet").x
    assert cached is not None
    if not _same(transform(raw.inputs[test_rows], " (test split)"), cached[: len(test_rows)]):
        raise DataValidationError(
            f"featurizer {spec['name']!r} fitted again does not give the cached features of "
            f"data/features/{features}: its code or data changed since featurize@{features} "
            f"ran; run `dvc repro evaluate@{experiment}` first"
        )
    return transform(rows, f" ({source})")


def cached_rows(params: Params, layout: Layout, experiment: str, split: str) -> Any:
    """The features of one of the pipeline's own splits, from the cache."""
    if split not in SPLITS:
        raise InvalidParameterError(f"--split: got {split!r}; expected one of {', '.join(SPLITS)}")
    x = read_features(feature_dir(params, layout, experiment) / f"{split}.parquet", ["x"]).x
    assert x is not None
    return x


def rank(
    params: Params, layout: Layout, registry: Registry, experiment: str, x: Any, k: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Top-k label ids (N, k), their scores and their probabilities (None: the model has
    none), as evaluation computes them."""
    if trains_itself(params, experiment, registry):
        model, _, meta = restore_learner(params, layout, registry, experiment)
        ranked, scores = model.predict_topk(x, min(k, meta["num_classes"]))
        probabilities = scores.astype(np.float64) if model.scores_are_probabilities else None
        return ranked, scores, probabilities
    device = resolve_device(params.base.device)
    t = restore(params, layout, registry, experiment, device)
    preds, _ = predict(
        t.encoder,
        t.layer,
        t.loss,
        t.ctx,
        x,
        None,
        k=k,
        batch_size=params.evaluate.batch_size,
        label_chunk=params.evaluate.label_chunk,
        unadjusted=False,
    )
    return preds.topk.cpu().numpy(), preds.top_scores.cpu().numpy(), probabilities_of(preds, t.loss)


def records(
    ids: list[Any],
    ranked: np.ndarray,
    scores: np.ndarray,
    probabilities: np.ndarray | None,
    names: list[str],
    threshold: float | None,
) -> pa.Table:
    """One record per row (module docstring); ``threshold`` drops the labels below it."""
    keep = ranked >= 0  # a model that ranks fewer than k labels pads with -1
    if threshold is not None:
        assert probabilities is not None
        keep &= probabilities >= threshold
    labels, label_names, score_lists, probability_lists = [], [], [], []
    for i in range(ranked.shape[0]):
        row = keep[i]
        labels.append(ranked[i, row].tolist())
        label_names.append([names[j] for j in ranked[i, row]])
        score_lists.append(scores[i, row].astype(np.float64).tolist())
        probability_lists.append(None if probabilities is None else probabilities[i, row].tolist())
    return pa.table(
        {
            "id": ids,
            "labels": pa.array(labels, pa.list_(pa.int64())),
            "names": pa.array(label_names, pa.list_(pa.string())),
            "scores": pa.array(score_lists, pa.list_(pa.float64())),
            "probabilities": pa.array(probability_lists, pa.list_(pa.float64())),
        }
    )


def write_records(table: pa.Table, out: Path | None, fmt: str) -> str | None:
    """Write ``table`` to ``out`` atomically (None: return the JSON lines instead)."""
    if fmt == "parquet":
        assert out is not None
        with atomic_path(out) as tmp:
            write_table(table, tmp)
        return None
    lines = "".join(json.dumps(row, separators=(",", ":")) + "\n" for row in table.to_pylist())
    if out is None:
        return lines
    with atomic_path(out) as tmp:
        tmp.write_text(lines)
    return None


def run(
    params: Params,
    layout: Layout,
    registry: Registry,
    experiment: str,
    *,
    input_path: Path | None = None,
    split: str | None = None,
    k: int = 5,
    threshold: float | None = None,
) -> pa.Table:
    """The predictions of ``experiment`` for the rows of ``input_path`` or of ``split``."""
    params.experiment(experiment)  # an unknown experiment: one line naming the defined ones
    if (input_path is None) == (split is None):
        raise InvalidParameterError("predict: give either --input FILE or --split NAME")
    if k < 1:
        raise InvalidParameterError(f"--top-k: got {k}; expected at least 1")
    if threshold is not None and not 0.0 <= threshold <= 1.0:
        raise InvalidParameterError(f"--threshold: got {threshold}; expected a value in [0, 1]")
    if input_path is not None:
        table = read_rows(input_path)
        x = featurize_rows(params, layout, registry, experiment, table, str(input_path))
        ids = (
            table.column("id").to_pylist()
            if "id" in table.column_names
            else list(range(table.num_rows))
        )
    else:
        assert split is not None
        x = cached_rows(params, layout, experiment, split)
        ids = read_split(layout.split, split)[0].tolist()  # the dataset's row ids
    ranked, scores, probabilities = rank(params, layout, registry, experiment, x, k)
    if threshold is not None and probabilities is None:
        raise InvalidParameterError(
            f"--threshold: experiment {experiment!r} gives no probabilities (its loss has no "
            "probability model); rank without a threshold"
        )
    names = read_labels(feature_dir(params, layout, experiment), ["name"])["name"].to_list()
    return records(ids, ranked, scores, probabilities, names, threshold)
