"""Each test row's outcome as evaluate scored it: ``data/evaluation/<experiment>/rows.parquet``.

A paired comparison resamples the same test rows for two experiments, so it needs what every
metric is a sum over, row by row, and not only the totals in ``metrics/``: the row's id, its
true labels, the model's top-k ranking (−1 pads) and, where the model gives them, the
log-likelihood of the true label and the probability of each ranked label. From these
:func:`tailkit.evaluation.intervals.metric_set` rebuilds every scalar of the ``test`` and
``ranking`` blocks, so the report's paired tests (:mod:`tailkit.reporting.paired`) and
``tailkit compare``'s per-label tests score exactly what evaluate scored.

Two files with the same ``tailkit.data_key`` (:func:`tailkit.evaluation.per_class.data_key`)
hold the same rows in the same order against the same labels: only such experiments are
paired.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from tailkit.errors import DataValidationError
from tailkit.storage.atomic import atomic_path
from tailkit.storage.parquet import Source, read_table, write_table


@dataclass(frozen=True)
class Outcomes:
    """One experiment's scored test rows."""

    experiment: str
    data_key: str
    rows: np.ndarray  # (N,) row ids of the split
    truth: tuple[np.ndarray, np.ndarray]  # true labels as a CSR pair (indptr, indices)
    single: bool  # one label per row
    ranked: np.ndarray  # (N, k) label ids, −1 pads
    log_likelihood: np.ndarray | None  # (N,)
    probabilities: np.ndarray | None  # (N, k)

    @property
    def num_rows(self) -> int:
        return int(self.rows.shape[0])


def _fixed(values: np.ndarray, kind: pa.DataType) -> pa.FixedSizeListArray:
    flat = pa.array(np.ascontiguousarray(values).ravel(), type=kind)
    return pa.FixedSizeListArray.from_arrays(flat, values.shape[1])


def write_outcomes(path: Path, outcomes: Outcomes) -> None:
    indptr, indices = outcomes.truth
    labels = pa.ListArray.from_arrays(
        pa.array(np.asarray(indptr, dtype=np.int32)), pa.array(indices, type=pa.int64())
    )
    columns = {
        "row": pa.array(outcomes.rows, type=pa.int64()),
        "labels": labels,
        "ranked": _fixed(np.asarray(outcomes.ranked, dtype=np.int64), pa.int64()),
    }
    if outcomes.log_likelihood is not None:
        columns["log_likelihood"] = pa.array(outcomes.log_likelihood, type=pa.float64())
    if outcomes.probabilities is not None:
        columns["probabilities"] = _fixed(
            np.asarray(outcomes.probabilities, dtype=np.float64), pa.float64()
        )
    metadata = {
        "tailkit.experiment": outcomes.experiment,
        "tailkit.data_key": outcomes.data_key,
        "tailkit.single_label": str(outcomes.single).lower(),
    }
    table = pa.table(columns).replace_schema_metadata(metadata)
    with atomic_path(path) as tmp:
        write_table(table, tmp, compression="zstd", write_statistics=False)


def read_outcomes(source: Source, stage: str, name: str | None = None) -> Outcomes:
    """The outcomes in ``source`` (a path, or ``name``'s bytes); a file that is not one is one
    line naming it and ``stage``, the stage that rebuilds it."""
    path = name or str(source)
    table = read_table(source, path, stage)
    meta = {k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()}
    needed = {"row", "labels", "ranked"}
    if not needed <= set(table.column_names) or "tailkit.data_key" not in meta:
        raise DataValidationError(
            f"{path}: not a file of test-row outcomes (columns row, labels, ranked and the "
            f"data key); rebuild it with `dvc repro {stage}`"
        )
    labels = table.column("labels").combine_chunks()
    ranked = table.column("ranked").combine_chunks()
    width = ranked.type.list_size
    probabilities = None
    if "probabilities" in table.column_names:
        column = table.column("probabilities").combine_chunks()
        probabilities = column.flatten().to_numpy().reshape(-1, width)
    log_likelihood = None
    if "log_likelihood" in table.column_names:
        log_likelihood = table.column("log_likelihood").to_numpy()
    return Outcomes(
        experiment=meta.get("tailkit.experiment", ""),
        data_key=meta["tailkit.data_key"],
        rows=table.column("row").to_numpy(),
        truth=(
            labels.offsets.to_numpy().astype(np.int64),
            labels.flatten().to_numpy().astype(np.int64),
        ),
        single=meta.get("tailkit.single_label") == "true",
        ranked=ranked.flatten().to_numpy().reshape(-1, width),
        log_likelihood=log_likelihood,
        probabilities=probabilities,
    )
