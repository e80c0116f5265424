"""Decoding a whole Extreme Classification Repository copy, and writing the legacy format.

:func:`decode` finds the train and test files of a copy (an archive or a folder), parses them
and returns one (N, D) CSR float32 feature matrix and one (N, L) CSR 0/1 label indicator,
training rows first, with the metadata ``xc.json`` records: format, header counts, per-split
statistics and the SHA-256 of the archive and of every member read.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import scipy.sparse as sp

from tailkit.errors import DataValidationError
from tailkit.plugins.datasets.xc_files import Source, XCFormat, choose
from tailkit.plugins.datasets.xc_format import Kind, Parsed, csr, parse_file

# --- decoding a whole copy ----------------------------------------------------------------------


@dataclass
class Decoded:
    features: sp.csr_matrix
    labels: sp.csr_matrix
    num_train: int
    meta: dict[str, Any]


def write_legacy(path: Path, features: sp.csr_matrix, labels: sp.csr_matrix) -> None:
    """Write (N, D) CSR features and an (N, L) CSR 0/1 label indicator in the legacy format
    that :func:`parse_file` reads: the header ``N D L``, then per row ``l1,l2,... f:v f:v ...``
    with zero-based ids (scikit-learn's svmlight writer produces exactly those row lines).
    omikuji trains only from such a file; the synthetic XC benchmark set is stored as one."""
    from sklearn.datasets import dump_svmlight_file

    with path.open("wb") as f:
        f.write(f"{features.shape[0]} {features.shape[1]} {labels.shape[1]}\n".encode())
        dump_svmlight_file(features, labels, f, zero_based=True, multilabel=True)


def decode(path: str | Path, fmt: XCFormat = "auto", sha256: str | None = None) -> Decoded:
    """Parse the train and test files of the copy at ``path`` (an archive or a folder)."""
    path = Path(path).expanduser()
    with ExitStack() as stack:
        source = Source(path, stack, sha256)
        fmt, roles = choose(source, fmt)
        members: dict[str, str] = {}

        def parse(role: str, kind: Kind) -> Parsed:
            name = roles[role]
            parsed = parse_file(source.open(name, stack), kind, source.where(name))
            members[name] = parsed.sha256
            return parsed

        if fmt == "legacy":
            train, test = parse("train", "legacy"), parse("test", "legacy")
            if train.header[1:] != test.header[1:]:
                raise DataValidationError(
                    f"{source.where(roles['test'])}:1: header has D={test.header[1]}, "
                    f"L={test.header[2]} but {roles['train']} has D={train.header[1]}, "
                    f"L={train.header[2]}"
                )
            dims = train.header[1], train.header[2]
            pairs = [(train, train), (test, test)]
        else:
            pairs = []
            for split in ("train", "test"):
                x, y = parse(f"{split}_X", "features"), parse(f"{split}_Y", "labels")
                if x.rows != y.rows:
                    raise DataValidationError(
                        f"{source.where(roles[f'{split}_Y'])}:1: {y.rows:,} rows, but "
                        f"{roles[f'{split}_X']} has {x.rows:,}"
                    )
                pairs.append((x, y))
            (trx, try_), (tex, tey) = pairs
            if (tex.header[1], tey.header[1]) != (trx.header[1], try_.header[1]):
                raise DataValidationError(
                    f"{source.where(roles['test_X'])}:1: test files have D={tex.header[1]}, "
                    f"L={tey.header[1]} but the training files D={trx.header[1]}, "
                    f"L={try_.header[1]}"
                )
            dims = trx.header[1], try_.header[1]
    num_features, num_labels = dims
    # The parts of each file's kind: None only for a file of no rows.
    feats = [
        csr(
            cast(np.ndarray, x.feat_counts),
            cast(np.ndarray, x.feat_ids),
            x.feat_vals,
            (x.rows, num_features),
        )
        for x, _ in pairs
    ]
    labels = [
        csr(
            cast(np.ndarray, y.label_counts),
            cast(np.ndarray, y.label_ids),
            None,
            (y.rows, num_labels),
        )
        for _, y in pairs
    ]
    features = sp.csr_matrix(sp.vstack(feats, format="csr", dtype=np.float32))
    indicator = sp.csr_matrix(sp.vstack(labels, format="csr", dtype=np.float32))
    features.sort_indices()
    indicator.sort_indices()
    meta = {
        "format": fmt,
        "num_features": num_features,
        "num_labels": num_labels,
        "splits": {
            split: split_stats(f, y)
            for split, f, y in zip(("train", "test"), feats, labels, strict=True)
        },
        "source": {
            "path": str(path),
            "archive_sha256": source.archive_sha256,
            "files": members,
        },
    }
    return Decoded(features, indicator, feats[0].shape[0], meta)


def split_stats(features: sp.csr_matrix, labels: sp.csr_matrix) -> dict[str, Any]:
    per_row = np.diff(labels.indptr)
    return {
        "rows": int(features.shape[0]),
        "feature_nnz": int(features.nnz),
        "label_nnz": int(labels.nnz),
        "rows_without_labels": int((per_row == 0).sum()),
        "labels_used": int(np.unique(labels.indices).size),
    }
