"""scikit-learn's bundled handwritten digits: a small, real, offline image set in dense form.

The scikit-learn wheel ships ``sklearn/datasets/data/digits.csv.gz`` (the test set of the UCI
"Optical Recognition of Handwritten Digits" data): 1,797 rows of 65 comma-separated integers,
the 8×8 pixel counts in ``[0, 16]`` in row-major order followed by the digit ``0``–``9``.
``fetch`` copies that file out of the installed package after checking its SHA-256 (pinned from
scikit-learn 1.9.1; a release that changes the bytes fails loudly instead of silently changing
the experiment), and writes ``source.json`` beside it. ``load`` parses it into 64 float32
features per row, raw counts (a featurizer scales them), with label names ``"0"``–``"9"``.
"""

from __future__ import annotations

import gzip
import zlib
from importlib import resources
from pathlib import Path

import numpy as np

from tailkit.components import RawData
from tailkit.errors import DataValidationError
from tailkit.storage.atomic import atomic_path, write_json
from tailkit.storage.checksum import read_pinned

FILE = "digits.csv.gz"
SOURCE = "source.json"
SHA256 = "09f66e6debdee2cd2b5ae59e0d6abbb73fc2b0e0185d2e1957e9ebb51e23aa22"
ROWS, FEATURES, CLASSES, MAX_VALUE = 1797, 64, 10, 16


def package_file() -> Path:
    """Where the installed scikit-learn keeps ``digits.csv.gz``."""
    return Path(str(resources.files("sklearn.datasets") / "data" / FILE))


def fetch_from(src: str | Path, dest: str | Path, expected_sha256: str = SHA256) -> None:
    """Verify ``src`` and copy its very bytes (no window between check and use) to ``dest``."""
    src, dest = Path(src), Path(dest)
    data, actual = read_pinned(
        src,
        expected_sha256,
        unreadable="is scikit-learn installed?",
        pin="the pin is for scikit-learn 1.9.1's digits.csv.gz",
    )
    _parse(src, data)  # refuse to copy a file load could not read
    dest.mkdir(parents=True, exist_ok=True)
    with atomic_path(dest / FILE) as tmp:
        tmp.write_bytes(data)
    write_json(dest / SOURCE, {"file": src.name, "sha256": actual, "package": "scikit-learn"})


def _parse(path: Path, data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """(inputs (N, 64) float32, labels (N,) int64), or a one-line error naming the line."""
    try:
        text = gzip.decompress(data).decode("ascii")
    except (OSError, EOFError, zlib.error, UnicodeDecodeError) as exc:
        raise DataValidationError(f"{path}: not a gzip-compressed ASCII CSV ({exc})") from exc
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        fields = line.split(",")
        if len(fields) != FEATURES + 1:
            raise DataValidationError(
                f"{path}: line {number} has {len(fields)} fields; expected {FEATURES + 1}"
            )
        try:
            values = [int(f) for f in fields]
        except ValueError as exc:
            raise DataValidationError(f"{path}: line {number}: {exc}") from exc
        if not all(0 <= v <= MAX_VALUE for v in values[:-1]) or not 0 <= values[-1] < CLASSES:
            raise DataValidationError(
                f"{path}: line {number} is out of range (pixels in [0, {MAX_VALUE}], "
                f"digit in [0, {CLASSES - 1}])"
            )
        rows.append(values)
    if not rows:
        raise DataValidationError(f"{path}: no rows")
    table = np.asarray(rows, dtype=np.int64)
    return table[:, :-1].astype(np.float32), np.ascontiguousarray(table[:, -1])


class Digits:
    """scikit-learn's 8×8 handwritten digits: 1,797 images as 64 features, 10 classes (offline).

    ``fetch`` copies the file bundled with scikit-learn, checked against a pinned SHA-256.
    """

    def fetch(self, dest: Path) -> None:
        fetch_from(package_file(), dest)

    def load(self, raw_dir: Path) -> RawData:
        path = Path(raw_dir) / FILE
        try:
            data = path.read_bytes()
        except FileNotFoundError as exc:
            raise DataValidationError(f"{path}: not found; run `dvc repro download` first") from exc
        except OSError as exc:
            raise DataValidationError(f"{path}: cannot read ({exc.strerror})") from exc
        inputs, labels = _parse(path, data)
        return RawData(inputs=inputs, labels=labels, label_names=[str(d) for d in range(CLASSES)])
