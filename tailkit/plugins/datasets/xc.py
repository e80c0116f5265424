"""Extreme Classification Repository datasets (manikvarma.org/downloads/XC/XMLRepository.html).

The repository's hosts are Google Drive links that need a browser or ``gdown``, so nothing here
downloads: the user downloads the archive once and sets ``path`` to it (or to a folder holding
the extracted files). ``fetch`` verifies the archive (``sha256``), reads only the members it
needs straight out of it (no extraction to disk, so no member name is ever used as a path),
parses them and writes a decoded copy under ``dest``:

* ``features.npz``: (N, D) CSR float32, training rows first, then test rows;
* ``labels.npz``: (N, L) CSR 0/1 indicator (float32);
* ``xc.json``: format, header counts, per-split statistics, propensity constants and the
  SHA-256 of the archive and of every member read. It is written last: without it ``load``
  treats the directory as never fetched.

The parts: :mod:`~tailkit.plugins.datasets.xc_format` parses the text format (its docstring
states the rules), :mod:`~tailkit.plugins.datasets.xc_files` finds the files and the format,
:mod:`~tailkit.plugins.datasets.xc_decode` decodes a whole copy; this module holds the
datasets, their published statistics and propensity constants, and the single-label view.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import scipy.sparse as sp

from tailkit.components import RawData
from tailkit.errors import DataValidationError, InvalidParameterError
from tailkit.evaluation.metrics import inverse_propensity
from tailkit.plugins.datasets.xc_decode import Decoded, decode
from tailkit.plugins.datasets.xc_files import XCFormat
from tailkit.plugins.datasets.xc_format import brief
from tailkit.registry import DEFAULT_PROPENSITY
from tailkit.storage.atomic import atomic_path, write_json

FEATURES = "features.npz"
LABELS = "labels.npz"
META = "xc.json"
REPOSITORY = "http://manikvarma.org/downloads/XC/XMLRepository.html"
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


# --- published statistics and propensity constants -------------------------------------------


#: Jain et al.'s propensity constants (A, B) per dataset, as pyxclib, the Matlab scripts and
#: AttentionXML use them; any other dataset gets the default (0.55, 1.5). The dataset declares
#: them (``XC.propensity``); subsample records them with the split for evaluation's PSP@k.
PROPENSITY_CONSTANTS: dict[str, tuple[float, float]] = {
    "WikiLSHTC-325K": (0.5, 0.4),
    "Wikipedia-500K": (0.5, 0.4),
    "Amazon-670K": (0.6, 2.6),
    "Amazon-3M": (0.6, 2.6),
    "EURLex-4K": (0.55, 1.5),
    "AmazonCat-13K": (0.55, 1.5),
    "Wiki10-31K": (0.55, 1.5),
}


@dataclass(frozen=True)
class XCStats:
    """A dataset's published statistics (XMLRepository.html, "Dataset statistics & download").

    The averages are over train and test together and are kept for reference only; ``fetch``
    checks the four counts.
    """

    name: str
    num_features: int
    num_labels: int
    num_train: int
    num_test: int
    avg_points_per_label: float
    avg_labels_per_point: float
    download: str


# --- Bamler–Mandt single-label view -------------------------------------------------------------


def to_single_label(
    labels: sp.csr_matrix, splits: dict[str, np.ndarray]
) -> tuple[np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """Bamler & Mandt's multi- to single-label conversion (algorithms.md §1.2).

    Each row keeps its **smallest** label id; rows without labels are dropped; labels are
    renumbered by descending frequency over the training rows (ties by original id), labels
    no training row keeps are dropped, and so are the other rows whose kept label is one of
    them (test rows whose label never occurs in training).

    Returns (kept row ids, new label per kept row int64, original id of each new label,
    splits as positions among the kept rows).
    """
    labels = sp.csr_matrix(labels)
    labels.sort_indices()
    has = np.diff(labels.indptr) > 0
    first = np.full(labels.shape[0], -1, dtype=np.int64)
    first[has] = labels.indices[labels.indptr[:-1][has]]
    train = splits.get("train", np.arange(labels.shape[0]))
    train = train[has[train]]
    counts = np.bincount(first[train], minlength=labels.shape[1])
    seen = np.flatnonzero(counts)
    order = seen[np.lexsort((seen, -counts[seen]))]
    rank = np.full(labels.shape[1], -1, dtype=np.int64)
    rank[order] = np.arange(order.size)
    keep = has.copy()
    keep[has] = rank[first[has]] >= 0
    rows = np.flatnonzero(keep)
    position = np.cumsum(keep) - 1
    new_splits = {name: position[ids[keep[ids]]] for name, ids in splits.items()}
    return rows, rank[first[rows]], order, new_splits


# --- the datasets -------------------------------------------------------------------------------


class XC:
    """An Extreme Classification Repository dataset from a local archive or folder (``path``).

    ``format``: ``legacy`` (train.txt/test.txt), ``split`` (trn_X_Xf.txt, trn_X_Y.txt, ...)
    or ``auto``. ``sha256`` verifies the archive. ``single_label`` applies Bamler & Mandt's
    conversion (:func:`to_single_label`) in ``load``; the decoded raw copy stays multi-label.
    ``propensity`` holds the (A, B) constants of the inverse propensities PSP@k uses.
    """

    known: ClassVar[XCStats | None] = None
    #: Printed when ``path`` is missing: where to get the data.
    download_hint: ClassVar[str] = f"download a dataset from {REPOSITORY}"

    def __init__(
        self,
        path: str | None = None,
        sha256: str | None = None,
        format: XCFormat = "auto",
        single_label: bool = False,
    ) -> None:
        if sha256 is not None and not _HEX64.fullmatch(sha256):
            raise InvalidParameterError(
                f"dataset.sha256: got {sha256!r}; expected 64 hexadecimal digits"
            )
        self.path = path
        self.sha256 = sha256
        self.format = format
        self.single_label = single_label
        self.check_stats = False

    @property
    def multilabel(self) -> bool:
        """Whether ``load`` gives label sets, known before any file is read (the fingerprint
        stage refuses a loss that cannot take them before any stage runs)."""
        return not self.single_label

    @property
    def name(self) -> str:
        return self.known.name if self.known else "XC"

    @property
    def propensity(self) -> tuple[float, float]:
        """(A, B) of Jain et al.'s propensity model for this dataset (datasets-metrics.md §2.1)."""
        if self.known is None:
            return DEFAULT_PROPENSITY
        return PROPENSITY_CONSTANTS.get(self.known.name, DEFAULT_PROPENSITY)

    def inverse_propensity(self, raw: RawData) -> np.ndarray:
        """1/p_l for every label of ``raw`` from its training rows (all rows without splits)."""
        num_rows = raw.labels.shape[0]
        train = (raw.splits or {}).get("train", np.arange(num_rows))
        if raw.multilabel:
            counts = np.diff(sp.csc_matrix(raw.labels[train]).indptr)
        else:
            counts = np.bincount(raw.labels[train], minlength=raw.num_classes)
        a, b = self.propensity
        return inverse_propensity(counts, int(train.size), a, b)

    def fetch(self, dest: Path) -> None:
        if self.path is None:
            raise InvalidParameterError(
                f"dataset.path: {self.name} cannot be downloaded automatically; "
                f"{self.download_hint}, then set dataset.path to the archive (.zip, .tar.gz, "
                ".tar.bz2) or to the folder holding its files"
            )
        decoded = decode(self.path, self.format, self.sha256)
        if self.check_stats:
            self._check(decoded)
        meta = decoded.meta | {
            "dataset": self.name,
            "propensity": {"a": self.propensity[0], "b": self.propensity[1]},
        }
        write_decoded(Path(dest), decoded.features, decoded.labels, meta)

    def _check(self, decoded: Decoded) -> None:
        known = self.known
        assert known is not None
        got = (
            decoded.num_train,
            decoded.features.shape[0] - decoded.num_train,
            decoded.features.shape[1],
            decoded.labels.shape[1],
        )
        want = (known.num_train, known.num_test, known.num_features, known.num_labels)
        if got != want:
            raise DataValidationError(
                f"{self.path}: parsed {got[0]:,} training rows, {got[1]:,} test rows, "
                f"{got[2]:,} features, {got[3]:,} labels; {known.name} has {want[0]:,}, "
                f"{want[1]:,}, {want[2]:,}, {want[3]:,} ({REPOSITORY}); a different variant "
                "or a subset? set dataset.check_stats: false to use it anyway"
            )

    def load(self, raw_dir: Path) -> RawData:
        raw_dir = Path(raw_dir)
        meta_path = raw_dir / META
        try:
            meta = json.loads(meta_path.read_text())
            num_train = int(meta["splits"]["train"]["rows"])
            num_rows = num_train + int(meta["splits"]["test"]["rows"])
            expected = (num_rows, meta["num_features"]), (num_rows, meta["num_labels"])
            features = sp.csr_matrix(sp.load_npz(raw_dir / FEATURES), dtype=np.float32)
            labels = sp.csr_matrix(sp.load_npz(raw_dir / LABELS), dtype=np.float32)
        except FileNotFoundError as exc:
            raise DataValidationError(
                f"{exc.filename or meta_path}: not found; run the download stage first"
            ) from exc
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DataValidationError(
                f"{raw_dir}: unreadable decoded XC data ({brief(exc)})"
            ) from exc
        if (features.shape, labels.shape) != expected:
            raise DataValidationError(
                f"{raw_dir}: {FEATURES} {features.shape} and {LABELS} {labels.shape} disagree "
                f"with {META}; fetch again"
            )
        features.sort_indices()
        labels.sort_indices()
        splits = {
            "train": np.arange(num_train, dtype=np.int64),
            "test": np.arange(num_train, num_rows, dtype=np.int64),
        }
        if not self.single_label:
            return RawData(
                inputs=features,
                labels=labels,
                label_names=[str(i) for i in range(labels.shape[1])],
                modality="sparse",
                splits=splits,
                values=value_kind(features.data),
            )
        rows, y, original, new_splits = to_single_label(labels, splits)
        if rows.size == 0:
            raise DataValidationError(f"{raw_dir}: no row has a label; nothing to classify")
        _say_dropped(self.name, labels, splits, new_splits)
        inputs = sp.csr_matrix(features[rows])
        inputs.sort_indices()
        return RawData(
            inputs=inputs,
            labels=y,
            label_names=[str(i) for i in original],
            modality="sparse",
            splits=new_splits,
            values=value_kind(inputs.data),
        )


def _say_dropped(
    name: str,
    labels: sp.csr_matrix,
    splits: dict[str, np.ndarray],
    kept: dict[str, np.ndarray],
) -> None:
    """Print, per split, how many rows the single-label conversion dropped and why: nothing
    leaves the data without a word (a test set can lose most of its rows this way)."""
    empty = np.diff(labels.indptr) == 0
    for split, ids in splits.items():
        dropped = ids.size - kept[split].size
        if not dropped:
            continue
        unlabelled = int(np.count_nonzero(empty[ids]))
        parts = [f"{unlabelled:,} with no label"] if unlabelled else []
        if dropped - unlabelled:
            parts.append(f"{dropped - unlabelled:,} whose first label no training row keeps")
        print(
            f"dataset {name!r}: single_label: dropped {dropped:,} of {ids.size:,} {split} rows "
            f"({'; '.join(parts)}); single_label: false keeps every row, multi-label",
            file=sys.stderr,
        )


def value_kind(values: np.ndarray) -> Literal["counts", "weights"]:
    """What a file's feature values are: non-negative integers are counts; anything else is
    weights, as the repository's TF-IDF files hold (a count times its feature's idf, rows not
    normalised; docs/xc-features.md). The same format carries a user's own counts."""
    integral = bool(np.all(values >= 0) and np.all(values == np.floor(values)))
    return "counts" if integral else "weights"


def write_decoded(
    dest: Path, features: sp.csr_matrix, labels: sp.csr_matrix, meta: dict[str, Any]
) -> None:
    """The decoded copy ``load`` reads: features, labels, then ``xc.json`` (last: its presence
    marks a complete fetch); nothing is left behind when a write fails."""
    written: list[Path] = []
    try:
        for file, matrix in ((FEATURES, features), (LABELS, labels)):
            with atomic_path(dest / file) as tmp, tmp.open("wb") as fh:
                sp.save_npz(fh, matrix, compressed=True)
            written.append(dest / file)
        write_json(dest / META, meta)
    except BaseException:
        for done in written:
            done.unlink(missing_ok=True)
        raise


class _KnownXC(XC):
    """A named XC dataset; ``fetch`` checks the parsed counts against the published ones.

    ``check_stats: false`` accepts a subset or a variant (record which in the results).
    """

    def __init__(
        self,
        path: str | None = None,
        sha256: str | None = None,
        format: XCFormat = "auto",
        single_label: bool = False,
        check_stats: bool = True,
    ) -> None:
        super().__init__(path=path, sha256=sha256, format=format, single_label=single_label)
        self.check_stats = check_stats


def _drive(file_id: str) -> str:
    return f"https://drive.google.com/file/d/{file_id}"


class EURLex4K(_KnownXC):
    """EURLex-4K (XC repository; 15,539 + 3,809 rows, 5,000 BoW features, 3,993 labels)."""

    known = XCStats(
        "EURLex-4K",
        5_000,
        3_993,
        15_539,
        3_809,
        25.73,
        5.31,
        _drive("0B3lPMIHmG6vGU0VTR1pCejFpWjg"),
    )
    download_hint = f"download the BoW archive from {known.download} (listed on {REPOSITORY})"


class AmazonCat13K(_KnownXC):
    """AmazonCat-13K (XC repository; 1,186,239 + 306,782 rows, 203,882 features, 13,330 labels)."""

    known = XCStats(
        "AmazonCat-13K",
        203_882,
        13_330,
        1_186_239,
        306_782,
        448.57,
        5.04,
        _drive("11bI2oHQlK9wnvYdFN9IILd8ilHDqe-j1"),
    )
    download_hint = f"download the BoW archive from {known.download} (listed on {REPOSITORY})"


class Wiki10_31K(_KnownXC):
    """Wiki10-31K (XC repository; 14,146 + 6,616 rows, 101,938 features, 30,938 labels)."""

    known = XCStats("Wiki10-31K", 101_938, 30_938, 14_146, 6_616, 8.52, 18.64, REPOSITORY)
    download_hint = f"download the Wiki10-31K BoW archive from {REPOSITORY}"


class WikiLSHTC325K(_KnownXC):
    """WikiLSHTC-325K (XC repository; 1,778,351 + 587,084 rows, 325,056 labels)."""

    known = XCStats(
        "WikiLSHTC-325K", 1_617_899, 325_056, 1_778_351, 587_084, 17.46, 3.19, REPOSITORY
    )
    download_hint = f"download the WikiLSHTC-325K BoW archive from {REPOSITORY}"


class Amazon670K(_KnownXC):
    """Amazon-670K (XC repository; 490,449 + 153,025 rows, 135,909 features, 670,091 labels)."""

    known = XCStats("Amazon-670K", 135_909, 670_091, 490_449, 153_025, 3.99, 5.45, REPOSITORY)
    download_hint = f"download the Amazon-670K BoW archive from {REPOSITORY}"


class Wikipedia500K(_KnownXC):
    """Wikipedia-500K (XC repository; 1,813,391 + 783,743 rows, 501,070 labels)."""

    known = XCStats(
        "Wikipedia-500K", 2_381_304, 501_070, 1_813_391, 783_743, 24.75, 4.77, REPOSITORY
    )
    download_hint = f"download the Wikipedia-500K BoW archive from {REPOSITORY}"


#: Registered names → factories (the generic one first).
DATASETS: dict[str, type[XC]] = {
    "xc": XC,
    "eurlex-4k": EURLex4K,
    "amazoncat-13k": AmazonCat13K,
    "wiki10-31k": Wiki10_31K,
    "wikilshtc-325k": WikiLSHTC325K,
    "amazon-670k": Amazon670K,
    "wikipedia-500k": Wikipedia500K,
}
