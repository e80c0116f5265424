"""How rows are dealt into train/val/test: stratified held-out splits, then a long-tail profile.

Held-out rows are split off first, per class (or a fixed number per class with
``balanced_test``), so that a long-tail profile changes only the training pool, as the
CIFAR-LT recipe leaves the test set alone. The profile then keeps, for the class of rank r
(classes ranked by training-pool size, ties by id):

* ``natural``: every row;
* ``exp``: ``floor(n_max · ratio^(-r/(C-1)))`` rows (LDAM-DRW's ``imb_type='exp'``);
* ``step``: ``n_max`` for the first half of the ranks and ``floor(n_max / ratio)`` for the rest,

capped by what the class has. Rows within a class are taken in a seeded random order. A class
left with fewer than ``min_class_count`` training rows is an error, before anything is written.

A dataset with its own partition (``RawData.splits``, e.g. CIFAR's 50,000/10,000) keeps its
test split, and its val split if it has one, exactly as given; the profile applies to the given
training rows only, with ``n_max`` the largest class among them, so CIFAR-10 with ``exp`` and
ratio 100 keeps the recipe's 12,406 training rows (5,000 … 50) and the untouched 10,000 test
rows. A missing test split is carved out of the given training rows as above. A missing val
split is ``val_fraction`` of each class's given training rows, drawn from the rows the profile
leaves out (as ImageNet-LT's validation images are ImageNet training images outside the LT
set), so the profile's counts stay the recipe's; a class the profile uses up entirely (the
largest, under ``exp``) has no validation rows. ``natural`` leaves nothing out, so there the
validation rows come first and the rest is trained on, as without given splits.

Multi-label rows (an XC dataset's label sets) have no single class to stratify or to cap by, so
they take the ``natural`` profile only: the given splits are kept, and a missing test or val
split is a seeded random ``test_fraction`` / ``val_fraction`` of the given training rows. Their
split files hold ``label`` as ``list<int32>``; ``<split>_counts`` are then the rows carrying
each label, and ``<split>_rows`` the rows (the N of the propensity model).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import numpy as np
import scipy.sparse as sp

from tailkit.components import RawData
from tailkit.errors import DataValidationError
from tailkit.params import SubsampleParams
from tailkit.storage.splits import SPLITS

if TYPE_CHECKING:  # labels.py imports torch, which single-label rows never need
    from tailkit.labels import LabelSets


def _round_half_up(x: np.ndarray) -> np.ndarray:
    return np.floor(x + 0.5).astype(np.int64)


def profile_quota(pool: np.ndarray, p: SubsampleParams) -> np.ndarray:
    """Training rows to keep per class, given each class's training-pool size."""
    if p.profile == "natural":
        return pool.copy()
    num_classes = pool.shape[0]
    rank_order = np.lexsort((np.arange(num_classes), -pool))  # largest pool first, ties by id
    n_max = int(pool.max())
    ranks = np.arange(num_classes)
    if p.profile == "exp":
        target = np.floor(n_max * p.imbalance_ratio ** (-ranks / max(num_classes - 1, 1)))
    else:  # step
        target = np.where(ranks < num_classes // 2, n_max, np.floor(n_max / p.imbalance_ratio))
    quota = np.empty(num_classes, dtype=np.int64)
    quota[rank_order] = target.astype(np.int64)
    return np.minimum(quota, pool)


def _n_test(counts: np.ndarray, p: SubsampleParams) -> np.ndarray:
    """Test rows per class, carved out of pools of ``counts`` rows (at least one row stays)."""
    if p.balanced_test:
        return np.minimum(p.test_per_class, np.maximum(counts - 1, 0))
    return np.minimum(_round_half_up(counts * p.test_fraction), np.maximum(counts - 1, 0))


def _n_val(counts: np.ndarray, n_test: np.ndarray, p: SubsampleParams) -> np.ndarray:
    """Validation rows per class, beside ``n_test`` (at least one row stays for training)."""
    return np.minimum(_round_half_up(counts * p.val_fraction), np.maximum(counts - 1 - n_test, 0))


def _check_quota(quota: np.ndarray, counts: np.ndarray, p: SubsampleParams) -> None:
    short = np.flatnonzero(quota < p.min_class_count)
    if short.size:
        c = int(short[0])
        raise DataValidationError(
            f"subsample: {short.size} of {quota.size} classes keep fewer than "
            f"min_class_count={p.min_class_count} training rows (e.g. class id {c} keeps "
            f"{int(quota[c])} of {int(counts[c])}) with profile={p.profile!r}, "
            f"imbalance_ratio={p.imbalance_ratio:g}; lower subsample.imbalance_ratio or "
            "subsample.val_fraction/test_fraction"
        )


def _deal(
    labels: np.ndarray, num_classes: int, segments: dict[str, np.ndarray], seed: int
) -> dict[str, np.ndarray]:
    """Deal each class's rows, in a seeded random order, to the segments in turn: segment s
    gets the next ``segments[s][c]`` rows of class c. Returns sorted positions in ``labels``."""
    counts = np.bincount(labels, minlength=num_classes)
    rng = np.random.default_rng(seed)
    noise = cast(np.ndarray, rng.random(labels.shape[0]))  # an array: the stubs read a float
    order = np.lexsort((noise, labels))  # by class, random within
    start = np.concatenate([[0], np.cumsum(counts)[:-1]])
    sorted_labels = labels[order]
    rank = np.arange(labels.shape[0]) - start[sorted_labels]
    out, end = {}, np.zeros(num_classes, dtype=np.int64)
    for name, size in segments.items():
        lo, end = end, end + size
        mask = (rank >= lo[sorted_labels]) & (rank < end[sorted_labels])
        out[name] = np.sort(order[mask])
    return out


def split_rows(labels: np.ndarray, num_classes: int, p: SubsampleParams) -> dict[str, np.ndarray]:
    """Row indices of each split (sorted), per the module docstring."""
    counts = np.bincount(labels, minlength=num_classes)
    n_test = _n_test(counts, p)
    n_val = _n_val(counts, n_test, p)
    quota = profile_quota(counts - n_test - n_val, p)
    _check_quota(quota, counts, p)
    return _deal(labels, num_classes, {"test": n_test, "val": n_val, "train": quota}, p.seed)


def _check_given(given: dict[str, Any], num_rows: int, where: str) -> dict[str, np.ndarray]:
    """The dataset's own splits as int64 arrays, checked: known names, a train split, row ids
    in range, no row in two splits."""
    unknown = sorted(set(given) - set(SPLITS))
    if unknown or "train" not in given:
        raise DataValidationError(
            f"{where}: splits names {sorted(given)}; expected 'train' and optionally 'val', 'test'"
        )
    out, seen = {}, np.zeros(num_rows, dtype=bool)
    for name in SPLITS:
        if name not in given:
            continue
        rows = np.asarray(given[name])
        if rows.ndim != 1 or not (rows.size == 0 or np.issubdtype(rows.dtype, np.integer)):
            raise DataValidationError(
                f"{where}: splits[{name!r}] must be a 1-D integer array; got {rows.dtype} "
                f"of shape {rows.shape}"
            )
        rows = rows.astype(np.int64, copy=False)
        if rows.size and (rows.min() < 0 or rows.max() >= num_rows):
            raise DataValidationError(
                f"{where}: splits[{name!r}] has row ids outside [0, {num_rows})"
            )
        if seen[rows].any() or np.unique(rows).size != rows.size:
            raise DataValidationError(f"{where}: splits[{name!r}] repeats a row or shares one")
        seen[rows] = True
        out[name] = np.sort(rows)
    return out


def split_given(
    labels: np.ndarray,
    num_classes: int,
    given: dict[str, np.ndarray],
    p: SubsampleParams,
    where: str = "subsample",
) -> dict[str, np.ndarray]:
    """Row indices of each split (sorted) for a dataset with its own ``splits``, per the module
    docstring. ``where`` names the dataset in errors."""
    given = _check_given(given, labels.shape[0], where)
    pool = given["train"]
    pool_labels = labels[pool]
    counts = np.bincount(pool_labels, minlength=num_classes)
    none = np.zeros_like(counts)
    n_test = none if "test" in given else _n_test(counts, p)
    n_val = none if "val" in given else _n_val(counts, n_test, p)
    remaining = counts - n_test
    if p.profile == "natural":
        quota = remaining - n_val
    else:
        quota = profile_quota(remaining, p)
        n_val = np.minimum(n_val, remaining - quota)
    _check_quota(quota, counts, p)
    if "val" not in given and not n_val.any():
        raise DataValidationError(
            f"{where}: no validation rows: the dataset gives no val split and "
            f"profile={p.profile!r}, imbalance_ratio={p.imbalance_ratio:g} trains on every "
            "given training row; raise subsample.imbalance_ratio or use profile 'natural'"
        )
    segments = {"test": n_test, "train": quota, "val": n_val}
    dealt = _deal(pool_labels, num_classes, segments, p.seed)
    out = {name: pool[dealt[name]] for name in segments}
    out.update((name, given[name]) for name in ("val", "test") if name in given)
    return {name: out[name] for name in SPLITS}


def split_multilabel(
    num_rows: int, given: dict[str, np.ndarray] | None, p: SubsampleParams, where: str
) -> dict[str, np.ndarray]:
    """Row indices of each split (sorted) for multi-label rows, per the module docstring."""
    if p.profile != "natural" or p.balanced_test:
        setting = f"profile={p.profile!r}" if p.profile != "natural" else "balanced_test=true"
        raise DataValidationError(
            f"{where}: multi-label rows have no single class to draw by, so subsample "
            f"{setting} does not apply; use profile 'natural' (and balanced_test false), or "
            "dataset option `single_label: true` for a single-label long-tail profile"
        )
    given = _check_given(given or {"train": np.arange(num_rows)}, num_rows, where)
    pool = np.random.default_rng(p.seed).permutation(given["train"])
    out = dict(given)
    for name, fraction in (("test", p.test_fraction), ("val", p.val_fraction)):
        if name not in given:
            take = min(int(_round_half_up(np.array(pool.size * fraction))), max(pool.size - 1, 0))
            out[name], pool = np.sort(pool[:take]), pool[take:]
    out["train"] = np.sort(pool)
    if out["val"].size == 0:
        raise DataValidationError(f"{where}: no validation rows; raise subsample.val_fraction")
    return {name: out[name] for name in SPLITS}


def _out_of_range(row: int, label: int, num_classes: int, where: str) -> DataValidationError:
    return DataValidationError(
        f"{where}: row {row} has label id {label}; label ids must lie in [0, {num_classes}) "
        "(one per label name)"
    )


def _labels(raw: RawData, where: str) -> np.ndarray | LabelSets:
    """The labels of ``raw``, checked: (N,) int64 ids, or :class:`LabelSets`. An id outside
    ``[0, C)`` is refused here, naming its row, before any split is written: later stages
    index tables by label id, and a bad id in a row they never visit would pass unseen."""
    if raw.multilabel:
        try:
            csr = sp.csr_matrix(raw.labels)
        except (ValueError, TypeError) as exc:
            raise DataValidationError(f"{where}: multi-label labels: {exc}") from exc
        outside = np.flatnonzero((csr.indices < 0) | (csr.indices >= raw.num_classes))
        if outside.size:
            p = int(outside[0])
            row = int(np.searchsorted(csr.indptr, p, side="right") - 1)
            raise _out_of_range(row, int(csr.indices[p]), raw.num_classes, where)
        from tailkit.labels import LabelSets

        try:
            return LabelSets.from_csr(csr, raw.num_classes)
        except (ValueError, TypeError) as exc:
            raise DataValidationError(f"{where}: multi-label labels: {exc}") from exc
    labels = np.asarray(raw.labels)
    if labels.ndim != 1 or not (labels.size == 0 or np.issubdtype(labels.dtype, np.integer)):
        raise DataValidationError(
            f"{where}: labels must be a 1-D integer array; got {labels.dtype} of shape "
            f"{labels.shape}"
        )
    labels = labels.astype(np.int64, copy=False)
    outside = np.flatnonzero((labels < 0) | (labels >= raw.num_classes))
    if outside.size:
        row = int(outside[0])
        raise _out_of_range(row, int(labels[row]), raw.num_classes, where)
    present = np.unique(labels)
    if present.size < 2:  # no margin, no ranking, nothing to tell apart (margins: IndexError)
        raise DataValidationError(
            f"{where}: every row has the label "
            f"{raw.label_names[int(present[0])] if present.size else 'none'!r}; a "
            "classification needs rows of at least two classes"
        )
    return labels


#: What to change when a split comes out empty, by split.
_EMPTY_HINTS = {
    "train": "lower subsample.test_fraction and subsample.val_fraction, or use more rows",
    "val": "raise subsample.val_fraction (each class gives round(rows · val_fraction) and "
    "keeps one training row), or use more rows per class",
    "test": "raise subsample.test_fraction (or test_per_class with balanced_test), or use more "
    "rows per class",
}


def check_nonempty(
    rows: dict[str, np.ndarray], given: dict[str, np.ndarray] | None, where: str
) -> None:
    """Refuse a split with no rows, naming every split's size and the setting to change: an
    empty train split would leave an untrained model, an empty val split NaN learning curves,
    and an empty test split nothing to evaluate."""
    empty = [name for name in SPLITS if rows[name].size == 0]
    if not empty:
        return
    sizes = ", ".join(f"{n} {rows[n].size}" for n in SPLITS)
    total = sum(rows[n].size for n in SPLITS)
    hints = [
        f"the dataset's own {name!r} split is empty"
        if given is not None and name in given
        else _EMPTY_HINTS[name]
        for name in empty
    ]
    what = f"the {empty[0]} split" if len(empty) == 1 else f"the {' and '.join(empty)} splits"
    raise DataValidationError(
        f"{where}: {what} would be empty ({sizes} of {total} rows); {'; '.join(hints)}"
    )


def plan_splits(
    raw: RawData, p: SubsampleParams, where: str
) -> tuple[np.ndarray | LabelSets, dict[str, np.ndarray]]:
    """The dataset's labels (checked) and the row ids of each split, refused in one line when a
    split would be empty; ``where`` names the dataset in messages."""
    labels = _labels(raw, where)
    if not isinstance(labels, np.ndarray):  # LabelSets
        rows = split_multilabel(len(labels), raw.splits, p, where)
    elif raw.splits is None:
        rows = split_rows(labels, raw.num_classes, p)
    else:
        rows = split_given(labels, raw.num_classes, raw.splits, p, where)
    check_nonempty(rows, raw.splits, where)
    return labels, rows
