"""Per-label results of an evaluation as a label table, and the bounded plot data drawn from it.

``per_class.parquet`` has one row per label (``label`` id, ``name``, ``train_count``,
``val_count``, ``test_count``, many/medium/few ``group``), then what the evaluation measured:
``support`` (test rows carrying the label), ``recall@1`` and ``recall@k`` (the share of those
rows whose top 1 / top k include it; null without test rows), ``precision@1`` (the share of
rows ranking the label first that carry it; null where no row does) and, for multi-label data,
``propensity`` (the XC repository's p_l, from the training count). Its metadata holds the
experiment, k and :func:`data_key`, the key of the data the numbers were measured on, so that a
comparison can refuse two tables of different data.

``plots/classes/<experiment>.tsv`` aggregates the table per frequency bin (quarter-octave bins
of the training count): a few dozen rows at any C, so that ``dvc plots show`` and ``dvc plots
diff`` stay readable at 10^6 labels.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import polars as pl

from tailkit.evaluation.metrics import label_recall, shot_groups
from tailkit.groups import DEFAULT_GROUPS, GROUPS, GroupThresholds
from tailkit.storage.atomic import atomic_path
from tailkit.storage.label_table import write_label_table

GROUP_TYPE = pl.Enum(GROUPS)
#: Bins per doubling of the training count in the plot file (compare's tables use 1).
PLOT_BINS_PER_OCTAVE = 4
PLOT_COLUMNS = ("count_low", "count_high", "train_count", "labels", "test_rows", "accuracy")


def data_key(train_counts: np.ndarray, test_rows: np.ndarray, test_truth: tuple) -> str:
    """12 hex digits naming the data a model was trained and tested on: the per-label training
    counts, the test rows' ids and their labels (CSR pair). Two evaluations with the same key
    scored the same test rows against the same labels."""
    digest = hashlib.sha256()
    for array in (train_counts, test_rows, *test_truth):
        digest.update(np.ascontiguousarray(array, dtype=np.int64).tobytes())
        digest.update(b"|")
    return digest.hexdigest()[:12]


def per_label_results(
    ranked: np.ndarray, truth: tuple[np.ndarray, np.ndarray], num_labels: int
) -> dict[str, np.ndarray]:
    """Per label, from each row's ranking (N, k; −1 pads) and its true labels as a CSR pair
    (indptr, indices): support, recall@1, recall@k and precision@1 (NaN where undefined)."""
    recall_k, support = label_recall(ranked, truth, num_labels)
    indptr, indices = truth
    rows = np.repeat(np.arange(ranked.shape[0]), np.diff(indptr))
    top = ranked[:, 0]
    # (row, label) pairs whose label the row ranks first: per label, both the rows that rank it
    # first rightly (precision's numerator) and its rows found at rank 1 (recall@1's)
    right = np.bincount(indices[top[rows] == indices], minlength=num_labels)
    ranked_first = np.bincount(top[top >= 0], minlength=num_labels)
    with np.errstate(invalid="ignore", divide="ignore"):
        recall_1, precision = right / support, right / ranked_first
    return {
        "support": support,
        "recall@1": recall_1,
        "recall@k": recall_k,
        "precision@1": precision,
    }


def group_of(train_counts: np.ndarray, groups: GroupThresholds = DEFAULT_GROUPS) -> pl.Series:
    """Each label's many/medium/few group by its training count."""
    codes = np.zeros(len(train_counts), dtype=np.uint8)
    for code, mask in enumerate(shot_groups(train_counts, groups).values()):
        codes[mask] = code
    return pl.Series("group", np.asarray(GROUPS)[codes], dtype=GROUP_TYPE)


def per_class_frame(
    labels: pl.DataFrame,
    results: dict[str, np.ndarray],
    k: int,
    propensity: np.ndarray | None = None,
    groups: GroupThresholds = DEFAULT_GROUPS,
) -> pl.DataFrame:
    """The per-class table: the label table (ids, names, split counts) beside the results of
    :func:`per_label_results`, ``recall@k`` named with its k."""
    counts = labels["train_count"].to_numpy()
    measured = {
        "support": results["support"].astype(np.int64),
        "recall@1": results["recall@1"],
        f"recall@{k}": results["recall@k"],
        "precision@1": results["precision@1"],
    }
    if propensity is not None:
        measured["propensity"] = propensity
    frame = labels.with_columns(group_of(counts, groups)).hstack(pl.DataFrame(measured))
    floats = [c for c, v in measured.items() if v.dtype.kind == "f"]
    return frame.with_columns(pl.col(floats).fill_nan(None))


def write_per_class(
    path: Path,
    frame: pl.DataFrame,
    experiment: str,
    k: int,
    key: str,
    multilabel: bool,
    groups: GroupThresholds = DEFAULT_GROUPS,
) -> None:
    metadata = {
        "tailkit.experiment": experiment,
        "tailkit.k": str(k),
        "tailkit.data_key": key,
        "tailkit.multilabel": str(multilabel).lower(),
        "tailkit.groups": json.dumps(groups.as_dict(), sort_keys=True),
    }
    write_label_table(path, frame, metadata)


def frequency_bin(train_counts: np.ndarray, per_octave: int) -> np.ndarray:
    """Bin of each training count: 0 holds count 0; bin b ≥ 1 holds [2^((b−1)/s), 2^(b/s)),
    s = ``per_octave``."""
    counts = np.asarray(train_counts, dtype=np.float64)
    out = np.zeros(counts.shape, dtype=np.int64)
    seen = counts >= 1
    out[seen] = 1 + np.floor(per_octave * np.log2(counts[seen])).astype(np.int64)
    return out


def bin_edges(bins: np.ndarray, per_octave: int) -> tuple[np.ndarray, np.ndarray]:
    """[low, high) count range of each bin of :func:`frequency_bin`."""
    bins = np.asarray(bins, dtype=np.float64)
    low = np.where(bins == 0, 0.0, 2.0 ** ((bins - 1) / per_octave))
    high = np.where(bins == 0, 1.0, 2.0 ** (bins / per_octave))
    return low, high


def aggregate(
    keys: np.ndarray, sums: dict[str, np.ndarray], means: dict[str, np.ndarray]
) -> pl.DataFrame:
    """Per distinct key (sorted): ``key``, ``labels`` (rows with it), the sum of each of
    ``sums`` and the mean of each of ``means``. numpy's bincount adds in row order, so the
    result has the same bits on every run (a polars group_by sums in thread order)."""
    unique, inverse = np.unique(keys, return_inverse=True)
    n = np.bincount(inverse, minlength=unique.size)

    def total(values: np.ndarray) -> np.ndarray:
        return np.bincount(inverse, weights=values.astype(np.float64), minlength=unique.size)

    return pl.DataFrame(
        {
            "key": unique,
            "labels": n,
            **{name: total(v).astype(np.int64) for name, v in sums.items()},
            **{name: total(v) / n for name, v in means.items()},
        }
    )


def binned(frame: pl.DataFrame, metric: str, per_octave: int) -> pl.DataFrame:
    """Per frequency bin with evaluated labels: its count range, the mean training count and
    the number of evaluated labels and test rows, and the mean of ``metric`` over them."""
    evaluated = frame.filter(pl.col("support") > 0)
    counts = evaluated["train_count"].to_numpy()
    out = aggregate(
        frequency_bin(counts, per_octave),
        {"test_rows": evaluated["support"].to_numpy()},
        {"train_count": counts, "accuracy": evaluated[metric].to_numpy()},
    )
    low, high = bin_edges(out["key"].to_numpy(), per_octave)
    return out.rename({"key": "bin"}).with_columns(
        pl.Series("count_low", low), pl.Series("count_high", high)
    )


def write_class_plot(path: Path, frame: pl.DataFrame, metric: str) -> None:
    """``plots/classes/<experiment>.tsv``: :func:`binned` at :data:`PLOT_BINS_PER_OCTAVE`."""
    table = binned(frame, metric, PLOT_BINS_PER_OCTAVE)
    lines = ["\t".join(PLOT_COLUMNS)]
    for row in table.select(PLOT_COLUMNS).iter_rows():
        lines.append("\t".join(f"{v:.6g}" for v in row))
    with atomic_path(path) as tmp:
        tmp.write_text("\n".join(lines) + "\n")
