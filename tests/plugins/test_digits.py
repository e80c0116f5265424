"""scikit-learn's bundled digits: the real file against its pin, and malformed copies of it."""

from __future__ import annotations

import gzip
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_digits

from tailkit.components import Dataset
from tailkit.errors import DataValidationError
from tailkit.plugins.datasets.digits import (
    FILE,
    ROWS,
    SHA256,
    Digits,
    fetch_from,
    package_file,
)
from tailkit.validation import option_signature


def test_real_file_matches_scikit_learn(tmp_path: Path) -> None:
    assert hashlib.sha256(package_file().read_bytes()).hexdigest() == SHA256
    ds = Digits()
    assert isinstance(ds, Dataset) and option_signature(Digits) == {}
    ds.fetch(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [FILE, "source.json"]
    assert json.loads((tmp_path / "source.json").read_text())["sha256"] == SHA256
    raw = ds.load(tmp_path)
    reference = load_digits()
    assert raw.inputs.shape == (ROWS, 64) and raw.inputs.dtype == np.float32
    np.testing.assert_array_equal(raw.inputs, reference.data)
    np.testing.assert_array_equal(raw.labels, reference.target)
    assert raw.labels.dtype == np.int64 and raw.modality == "dense"
    assert raw.label_names == [str(d) for d in range(10)]
    assert np.bincount(raw.labels).min() >= 170  # nearly balanced: a long tail needs subsample


def _gz(tmp_path: Path, lines: list[str]) -> tuple[Path, str]:
    path = tmp_path / "digits.csv.gz"
    data = gzip.compress(("\n".join(lines) + "\n").encode())
    path.write_bytes(data)
    return path, hashlib.sha256(data).hexdigest()


GOOD = ",".join(["0"] * 63 + ["16", "7"])


def test_small_file_in_the_same_format(tmp_path: Path) -> None:
    src, sha = _gz(tmp_path, [GOOD, ",".join(["1"] * 64 + ["0"])])
    fetch_from(src, tmp_path / "raw", sha)
    raw = Digits().load(tmp_path / "raw")
    assert raw.labels.tolist() == [7, 0]
    assert raw.inputs[0, 63] == 16 and raw.inputs[1].sum() == 64


def test_checksum_mismatch_leaves_dest_empty(tmp_path: Path) -> None:
    src, sha = _gz(tmp_path, [GOOD])
    dest = tmp_path / "raw"
    dest.mkdir()
    with pytest.raises(DataValidationError) as info:
        fetch_from(src, dest)  # the real pin
    message = str(info.value)
    assert str(src) in message and SHA256 in message and sha in message and "\n" not in message
    assert list(dest.iterdir()) == []


@pytest.mark.parametrize(
    ("line", "match"),
    [
        (",".join(["0"] * 64), "line 2 has 64 fields; expected 65"),
        (",".join(["0"] * 63 + ["17", "1"]), "line 2 is out of range"),
        (",".join(["0"] * 64 + ["10"]), "line 2 is out of range"),
        (",".join(["0"] * 63 + ["1.5", "1"]), "line 2: invalid literal"),
    ],
)
def test_malformed_line_is_named(tmp_path: Path, line: str, match: str) -> None:
    src, sha = _gz(tmp_path, [GOOD, line])
    with pytest.raises(DataValidationError, match=rf"digits\.csv\.gz: {match}"):
        fetch_from(src, tmp_path / "raw", sha)
    assert not (tmp_path / "raw").exists()


def test_not_gzip_and_not_fetched(tmp_path: Path) -> None:
    src = tmp_path / "digits.csv.gz"
    src.write_bytes(b"0,1,2")
    with pytest.raises(DataValidationError, match="not a gzip-compressed ASCII CSV"):
        fetch_from(src, tmp_path / "raw", hashlib.sha256(b"0,1,2").hexdigest())
    with pytest.raises(
        DataValidationError, match=r"digits\.csv\.gz: not found; run `dvc repro download`"
    ):
        Digits().load(tmp_path / "empty")
