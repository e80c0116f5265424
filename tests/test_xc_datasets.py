"""XC repository datasets: tiny files in the exact legacy and split formats, in zip and tar
archives and plain folders, with the traps of the real files (label-less rows, unsorted and
repeated feature ids) and the errors a broken copy must give."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.datasets import load_svmlight_file

from tailkit.errors import DataValidationError, InvalidParameterError
from tailkit.evaluation.metrics import DEFAULT_PROPENSITY, PROPENSITY_CONSTANTS, inverse_propensity
from tailkit.plugins.datasets import xc
from tailkit.plugins.datasets.xc import (
    XC,
    Amazon670K,
    EURLex4K,
    WikiLSHTC325K,
    parse_file,
    to_single_label,
)
from tailkit.registry import make_registry

# Seven training rows, D = 8, L = 4, as the XC repository writes them: row 2 has no labels and
# starts with a space (EURLex-4K has 28 such rows), row 4 has none and starts with its features,
# row 1 has unsorted feature ids, row 3 repeats feature 6, row 5 has labels but no features.
LEGACY_TRAIN = (
    "7 8 4\n0,2 1:0.5 4:1.25\n1 7:2 0:1 3:0.25\n 2:1\n3,1 6:1 6:0.5 5:3\n0:4 7:1\n2\n0 2:0.125\n"
)
LEGACY_TEST = "2 8 4\n3 1:1\n0,1 0:2 2:1\n"
TRAIN_X = np.array(
    [
        [0, 0.5, 0, 0, 1.25, 0, 0, 0],
        [1, 0, 0, 0.25, 0, 0, 0, 2],
        [0, 0, 1, 0, 0, 0, 0, 0],
        [0, 0, 0, 0, 0, 3, 1.5, 0],
        [4, 0, 0, 0, 0, 0, 0, 1],
        [0, 0, 0, 0, 0, 0, 0, 0],
        [0, 0, 0.125, 0, 0, 0, 0, 0],
    ],
    dtype=np.float32,
)
TRAIN_LABELS = [[0, 2], [1], [], [1, 3], [], [2], [0]]
TEST_X = np.array([[0, 1, 0, 0, 0, 0, 0, 0], [2, 0, 1, 0, 0, 0, 0, 0]], dtype=np.float32)
TEST_LABELS = [[3], [0, 1]]

# The same data in the split format: "f:v" rows, "l:v" label rows (an empty line = no labels).
SPLIT_FILES = {
    "trn_X_Xf.txt": "7 8\n1:0.5 4:1.25\n7:2 0:1 3:0.25\n2:1\n6:1 6:0.5 5:3\n0:4 7:1\n\n2:0.125\n",
    "trn_X_Y.txt": "7 4\n0:1 2:1\n1:1\n\n3:1 1:1\n\n2:1\n0:1\n",
    "tst_X_Xf.txt": "2 8\n1:1\n0:2 2:1\n",
    "tst_X_Y.txt": "2 4\n3:1\n0:1 1:1\n",
}
LEGACY_FILES = {"Tiny/tiny_train.txt": LEGACY_TRAIN, "Tiny/tiny_test.txt": LEGACY_TEST}


def _dense_labels(rows: list[list[int]], num_labels: int = 4) -> np.ndarray:
    out = np.zeros((len(rows), num_labels), dtype=np.float32)
    for i, row in enumerate(rows):
        out[i, row] = 1
    return out


def _parse(text: str, kind: xc.Kind = "legacy", where: str = "train.txt") -> xc.Parsed:
    return parse_file(io.BytesIO(text.encode()), kind, where)


def _write_folder(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def _write_zip(path: Path, files: dict[str, str]) -> Path:
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def _write_tar(path: Path, files: dict[str, str], mode: str = "w:gz") -> Path:
    with tarfile.open(path, mode) as tf:
        for name, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- parsing ----------------------------------------------------------------------------------


def test_legacy_rows_are_decoded_exactly() -> None:
    parsed = _parse(LEGACY_TRAIN)
    features = xc._csr(parsed.feat_counts, parsed.feat_ids, parsed.feat_vals, (7, 8))
    labels = xc._csr(parsed.label_counts, parsed.label_ids, None, (7, 4))
    assert parsed.header == (7, 8, 4) and parsed.rows == 7
    np.testing.assert_array_equal(features.toarray(), TRAIN_X)  # sorted, repeats summed
    np.testing.assert_array_equal(labels.toarray(), _dense_labels(TRAIN_LABELS))
    assert features.has_sorted_indices and labels.has_sorted_indices
    assert np.all(np.diff(features.indices[features.indptr[1] : features.indptr[2]]) > 0)
    assert parsed.sha256 == hashlib.sha256(LEGACY_TRAIN.encode()).hexdigest()


def test_agrees_with_sklearn_where_sklearn_can_read_the_body() -> None:
    """pyxclib's reader is load_svmlight_file on the body: same rows on sorted, unique ids.

    (Every row has a feature here: sklearn drops a row with neither labels nor features.)
    """
    rng = np.random.default_rng(0)
    rows = []
    for _ in range(200):
        ids = np.sort(rng.choice(50, rng.integers(1, 6), replace=False))
        labels = np.sort(rng.choice(9, rng.integers(0, 3), replace=False))
        feats = " ".join(f"{i}:{v:.4g}" for i, v in zip(ids, rng.random(ids.size), strict=True))
        rows.append(",".join(map(str, labels)) + " " + feats)
    body = "\n".join(rows) + "\n"
    parsed = _parse(f"200 50 9\n{body}")
    ours = xc._csr(parsed.feat_counts, parsed.feat_ids, parsed.feat_vals, (200, 50))
    theirs, y = load_svmlight_file(
        io.BytesIO(body.encode()), n_features=50, multilabel=True, zero_based=True
    )
    np.testing.assert_allclose(ours.toarray(), theirs.toarray(), rtol=1e-6)
    ours_y = xc._csr(parsed.label_counts, parsed.label_ids, None, (200, 9))
    assert [list(r.indices) for r in ours_y] == [[int(v) for v in t] for t in y]


def test_sklearn_rejects_unsorted_ids_which_the_files_have() -> None:
    """Why the hand-written parser: sklearn refuses a real row shape we must read."""
    with pytest.raises(ValueError, match="sorted and unique"):
        load_svmlight_file(io.BytesIO(b"1 7:2 0:1\n"), n_features=8, multilabel=True)
    assert _parse("1 8 4\n1 7:2 0:1\n").feat_ids.tolist() == [7, 0]


@pytest.mark.parametrize(
    "text",
    [
        "3 4\n0:1 2:0.5\n\n3:2\n",  # "l:v" pairs with weights; empty line = no labels
        "3 4\n0,2\n\n3\n",  # the comma-list variant
        "3 4\r\n0:1 2:1 2:1\r\n\r\n3:1\r\n",  # CRLF, a repeated label
    ],
)
def test_label_files(text: str) -> None:
    parsed = _parse(text, "labels", "trn_X_Y.txt")
    labels = xc._csr(parsed.label_counts, parsed.label_ids, None, (3, 4))
    np.testing.assert_array_equal(labels.toarray(), _dense_labels([[0, 2], [], [3]]))


def test_blocks_split_anywhere_keep_rows_and_line_numbers(monkeypatch) -> None:
    monkeypatch.setattr(xc, "_CHUNK", 5)  # many blocks, boundaries inside tokens
    parsed = _parse(LEGACY_TRAIN)
    features = xc._csr(parsed.feat_counts, parsed.feat_ids, parsed.feat_vals, (7, 8))
    np.testing.assert_array_equal(features.toarray(), TRAIN_X)
    with pytest.raises(DataValidationError, match=r"^train.txt:6: malformed token '0:x'"):
        _parse(LEGACY_TRAIN.replace("0:4 7:1", "0:x 7:1"))


@pytest.mark.parametrize(
    ("text", "kind", "message"),
    [
        ("3 8 4\n0 1:1\n1 2:1\n", "legacy", r"^f:1: the header says 3 rows but the file has 2$"),
        ("1 8 4\n0 1:1\n1 2:1\n", "legacy", r"^f:1: the header says 1 rows but the file has 2$"),
        ("2 8 4\n0 1:1\n1 8:1\n", "legacy", r"^f:3: feature id 8 is outside \[0, 8\) \(D = 8"),
        ("2 8 4\n0 -1:1\n1 1:1\n", "legacy", r"^f:2: feature id -1 is outside"),
        ("2 8 4\n0 1:1\n4 1:1\n", "legacy", r"^f:3: label id 4 is outside \[0, 4\) \(L = 4"),
        ("2 8 4\n0 1:1\n1 1:x\n", "legacy", r"^f:3: malformed token '1:x'; expected feature:value"),
        ("2 8 4\n0 1:1 2\n1 1:1\n", "legacy", r"^f:2: malformed token '2'"),
        ("1 8 4\n0 1::1\n", "legacy", r"^f:2: malformed token '1::1'"),
        ("1 8 4\n0 1:\n", "legacy", r"^f:2: malformed token '1:'"),
        ("1 8 4\n0,,1 1:1\n", "legacy", r"^f:2: malformed label list '0,,1'"),
        ("1 8 4\n0 1:1e300\n", "legacy", r"^f:2: feature value inf is not a finite float32"),
        ("8 4\n0 1:1\n", "legacy", r"^f:1: header '8 4' is not 'N D L' .*LIBSVM"),
        ("", "legacy", r"^f:1: empty file"),
        ("2 4\n0:1\n3:1 9:1\n", "features", r"^f:3: feature id 9 is outside \[0, 4\)"),
        ("1 4\n0:1 x\n", "features", r"^f:2: malformed token 'x'"),
        ("2 4\n0:1\n5:1\n", "labels", r"^f:3: label id 5 is outside \[0, 4\)"),
        ("2 4\n0,1\n1;2\n", "labels", r"^f:3: malformed label list '1;2'"),
        ("2 4\n0:1\n1:1e999\n", "labels", r"^f:3: label weight '1e999' is not finite"),
        ("2 4\n0:1\n1:nan\n", "labels", r"^f:3: malformed token '1:nan'"),
        ("2 4 4\n0:1\n", "labels", r"^f:1: header '2 4 4' is not 'N L'"),
    ],
)
def test_broken_files_name_file_and_line(text: str, kind: xc.Kind, message: str) -> None:
    with pytest.raises(DataValidationError, match=message) as err:
        _parse(text, kind, "f")
    assert "\n" not in str(err.value)


# --- fetch and load ---------------------------------------------------------------------------


def _check_tiny(raw) -> None:
    assert raw.modality == "sparse" and raw.multilabel
    assert isinstance(raw.inputs, sp.csr_matrix) and raw.inputs.dtype == np.float32
    assert raw.inputs.has_sorted_indices and raw.labels.has_sorted_indices
    assert isinstance(raw.labels, sp.csr_matrix) and set(raw.labels.data) == {1.0}
    np.testing.assert_array_equal(raw.inputs.toarray(), np.vstack([TRAIN_X, TEST_X]))
    np.testing.assert_array_equal(raw.labels.toarray(), _dense_labels(TRAIN_LABELS + TEST_LABELS))
    assert raw.label_names == ["0", "1", "2", "3"]
    assert raw.splits["train"].tolist() == list(range(7))
    assert raw.splits["test"].tolist() == [7, 8]
    assert raw.splits["train"].dtype == np.int64


@pytest.mark.parametrize("layout", ["folder", "zip", "tar.gz", "tar.bz2"])
@pytest.mark.parametrize("files", [LEGACY_FILES, SPLIT_FILES], ids=["legacy", "split"])
def test_fetch_and_load(layout: str, files: dict[str, str], tmp_path: Path) -> None:
    if layout == "folder":
        source = _write_folder(tmp_path / "copy", files)
    elif layout == "zip":
        source = _write_zip(tmp_path / "copy.zip", files)
    else:
        source = _write_tar(tmp_path / f"copy.{layout}", files, "w:" + layout.split(".")[1][:3])
    sha = None if layout == "folder" else _sha256(source)
    dest = tmp_path / "raw"
    dest.mkdir()
    dataset = XC(path=str(source), sha256=sha)
    dataset.fetch(dest)
    assert sorted(p.name for p in dest.iterdir()) == ["features.npz", "labels.npz", "xc.json"]
    meta = json.loads((dest / "xc.json").read_text())
    assert meta["format"] == ("legacy" if files is LEGACY_FILES else "split")
    assert (meta["num_features"], meta["num_labels"]) == (8, 4)
    assert meta["splits"]["train"] == {
        "rows": 7,
        "feature_nnz": 11,
        "label_nnz": 7,
        "rows_without_labels": 2,
        "labels_used": 4,
    }
    assert meta["source"]["archive_sha256"] == sha
    assert sorted(meta["source"]["files"].values()) == sorted(
        hashlib.sha256(t.encode()).hexdigest() for t in files.values()
    )
    _check_tiny(dataset.load(dest))


def test_format_option_and_detection(tmp_path: Path) -> None:
    both = _write_folder(tmp_path / "both", LEGACY_FILES | SPLIT_FILES)
    dest = tmp_path / "raw"
    dest.mkdir()
    with pytest.raises(DataValidationError, match=r"both legacy .* set dataset.format"):
        XC(path=str(both)).fetch(dest)
    XC(path=str(both), format="split").fetch(dest)
    assert json.loads((dest / "xc.json").read_text())["format"] == "split"
    with pytest.raises(DataValidationError, match=r"no XC data found; expected train.txt and"):
        XC(path=str(_write_folder(tmp_path / "split", SPLIT_FILES)), format="legacy").fetch(dest)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataValidationError, match=r"\(legacy format\) or trn_X_Xf.txt"):
        XC(path=str(empty)).fetch(dest)


def test_split_files_must_agree(tmp_path: Path) -> None:
    dest = tmp_path / "raw"
    dest.mkdir()
    short_y = SPLIT_FILES | {"trn_X_Y.txt": "6 4\n0:1\n1:1\n\n3:1\n\n2:1\n"}
    with pytest.raises(
        DataValidationError, match=r"trn_X_Y.txt\]:1: 6 rows, but trn_X_Xf.txt has 7$"
    ):
        XC(path=str(_write_zip(tmp_path / "a.zip", short_y))).fetch(dest)
    other_d = SPLIT_FILES | {"tst_X_Xf.txt": "2 9\n1:1\n0:2 2:1\n"}
    with pytest.raises(DataValidationError, match=r"tst_X_Xf.txt:1: test files have D=9, L=4"):
        XC(path=str(_write_folder(tmp_path / "b", other_d))).fetch(dest)
    other_l = LEGACY_FILES | {"Tiny/tiny_test.txt": LEGACY_TEST.replace("2 8 4", "2 8 5")}
    with pytest.raises(DataValidationError, match=r"tiny_test.txt:1: header has D=8, L=5"):
        XC(path=str(_write_folder(tmp_path / "c", other_l))).fetch(dest)
    assert not any(dest.iterdir())


def test_broken_body_inside_an_archive_names_member_and_line(tmp_path: Path) -> None:
    files = LEGACY_FILES | {"Tiny/tiny_test.txt": "2 8 4\n3 1:1\n0,1 0:2 9:1\n"}
    archive = _write_zip(tmp_path / "eurlex.zip", files)
    dest = tmp_path / "raw"
    dest.mkdir()
    with pytest.raises(DataValidationError, match=r"eurlex.zip\[Tiny/tiny_test.txt\]:3: feature"):
        XC(path=str(archive)).fetch(dest)
    assert not any(dest.iterdir())


def _truncated(path: Path) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda p: _truncated(_write_zip(p / "a.zip", LEGACY_FILES)), "truncated or corrupted"),
        (lambda p: _truncated(_write_tar(p / "a.tar.gz", LEGACY_FILES)), "truncated or corrupted"),
        (lambda p: _write_folder(p, {"a.7z": "x"}) / "a.7z", "7z archives are not supported"),
    ],
    ids=["zip", "tar.gz", "7z"],
)
def test_corrupted_archive_leaves_nothing(make, match: str, tmp_path: Path) -> None:
    archive = make(tmp_path)
    if archive.suffix == ".7z":
        archive.write_bytes(b"7z\xbc\xaf\x27\x1c" + b"\0" * 30)
    dest = tmp_path / "raw"
    dest.mkdir()
    with pytest.raises(DataValidationError, match=match) as err:
        XC(path=str(archive)).fetch(dest)
    assert str(archive) in str(err.value) and "\n" not in str(err.value)
    assert not any(dest.iterdir())


def test_sha256_mismatch_leaves_nothing(tmp_path: Path) -> None:
    archive = _write_zip(tmp_path / "a.zip", LEGACY_FILES)
    dest = tmp_path / "raw"
    dest.mkdir()
    wrong = "0" * 64
    with pytest.raises(DataValidationError, match=f"SHA-256 mismatch: expected {wrong}, got"):
        XC(path=str(archive), sha256=wrong).fetch(dest)
    assert not any(dest.iterdir())
    XC(path=str(archive), sha256=_sha256(archive).upper()).fetch(dest)
    assert (dest / "xc.json").exists()
    with pytest.raises(InvalidParameterError, match=r"dataset.sha256: got 'abc'; expected 64"):
        XC(path=str(archive), sha256="abc")
    with pytest.raises(InvalidParameterError, match="is a folder; sha256 verifies an archive"):
        XC(path=str(_write_folder(tmp_path / "f", LEGACY_FILES)), sha256=wrong).fetch(dest)


@pytest.mark.parametrize("name", ["../evil.txt", "/etc/evil.txt", "Tiny/../../evil.txt"])
@pytest.mark.parametrize("kind", ["zip", "tar.gz"])
def test_path_traversal_member_is_refused(name: str, kind: str, tmp_path: Path) -> None:
    files = LEGACY_FILES | {name: "pwned"}
    archive = (
        _write_zip(tmp_path / "a.zip", files)
        if kind == "zip"
        else _write_tar(tmp_path / "a.tar.gz", files)
    )
    dest = tmp_path / "out" / "raw"
    dest.mkdir(parents=True)
    with pytest.raises(DataValidationError, match="path traversal"):
        XC(path=str(archive)).fetch(dest)
    assert not any(dest.iterdir())
    assert not (tmp_path / "evil.txt").exists() and not (tmp_path / "out" / "evil.txt").exists()


def test_a_link_member_is_not_read(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        data = LEGACY_TRAIN.encode()
        info = tarfile.TarInfo("Tiny/tiny_train.txt")
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("Tiny/tiny_test.txt")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tf.addfile(link)
    dest = tmp_path / "raw"
    dest.mkdir()
    with pytest.raises(DataValidationError, match=r"tiny_test.txt\]: not a regular file"):
        XC(path=str(archive)).fetch(dest)
    assert not any(dest.iterdir())


def test_load_before_fetch_and_fetch_without_path(tmp_path: Path) -> None:
    with pytest.raises(DataValidationError, match=r"xc.json: not found; run the download stage"):
        XC().load(tmp_path)
    with pytest.raises(InvalidParameterError) as err:
        EURLex4K().fetch(tmp_path)
    message = str(err.value)
    assert message.startswith("dataset.path: EURLex-4K cannot be downloaded automatically")
    assert "drive.google.com/file/d/0B3lPMIHmG6vGU0VTR1pCejFpWjg" in message
    assert "set dataset.path to the archive" in message and "\n" not in message
    assert not any(tmp_path.iterdir())
    with pytest.raises(InvalidParameterError, match="does not exist"):
        XC(path=str(tmp_path / "missing.zip")).fetch(tmp_path)


# --- named datasets: statistics and propensity ------------------------------------------------


def test_every_xc_dataset_is_registered_and_builds_with_defaults() -> None:
    registry = make_registry()
    for name, factory in xc.DATASETS.items():
        dataset = registry.build("datasets", {"name": name}, "dataset")
        assert type(dataset) is factory and dataset.path is None


def test_known_statistics_come_from_the_repository_table() -> None:
    assert EURLex4K.known.num_train == 15_539 and EURLex4K.known.num_labels == 3_993
    assert WikiLSHTC325K.known.num_features == 1_617_899
    assert xc.Wikipedia500K.known.num_test == 783_743
    assert Amazon670K.known.avg_labels_per_point == 5.45


def test_named_dataset_checks_its_statistics(monkeypatch, tmp_path: Path) -> None:
    archive = _write_zip(tmp_path / "eurlex.zip", LEGACY_FILES)
    dest = tmp_path / "raw"
    dest.mkdir()
    with pytest.raises(DataValidationError) as err:
        EURLex4K(path=str(archive)).fetch(dest)
    assert "parsed 7 training rows, 2 test rows, 8 features, 4 labels; EURLex-4K has 15,539" in (
        str(err.value)
    )
    assert "check_stats: false" in str(err.value)
    assert not any(dest.iterdir())
    EURLex4K(path=str(archive), check_stats=False).fetch(dest)  # a subset, knowingly

    tiny = dataclasses.replace(
        EURLex4K.known, num_train=7, num_test=2, num_features=8, num_labels=4
    )
    monkeypatch.setattr(EURLex4K, "known", tiny)
    dataset = EURLex4K(path=str(archive))
    dataset.fetch(dest)
    _check_tiny(dataset.load(dest))
    assert json.loads((dest / "xc.json").read_text())["dataset"] == "EURLex-4K"


@pytest.mark.parametrize(
    ("factory", "expected"),
    [
        (EURLex4K, (0.55, 1.5)),
        (xc.AmazonCat13K, (0.55, 1.5)),
        (xc.Wiki10_31K, (0.55, 1.5)),
        (WikiLSHTC325K, (0.5, 0.4)),
        (Amazon670K, (0.6, 2.6)),
        (xc.Wikipedia500K, (0.5, 0.4)),
        (XC, DEFAULT_PROPENSITY),
    ],
)
def test_propensity_constants_reach_the_dataset(factory, expected) -> None:
    assert factory().propensity == expected
    if factory.known is not None:
        assert PROPENSITY_CONSTANTS[factory.known.name] == expected


def test_inverse_propensity_uses_the_training_split(monkeypatch, tmp_path: Path) -> None:
    tiny = dataclasses.replace(
        Amazon670K.known, num_train=7, num_test=2, num_features=8, num_labels=4
    )
    monkeypatch.setattr(Amazon670K, "known", tiny)
    dataset = Amazon670K(path=str(_write_folder(tmp_path / "copy", SPLIT_FILES)))
    dest = tmp_path / "raw"
    dest.mkdir()
    dataset.fetch(dest)
    assert json.loads((dest / "xc.json").read_text())["propensity"] == {"a": 0.6, "b": 2.6}
    q = dataset.inverse_propensity(dataset.load(dest))
    train_counts = _dense_labels(TRAIN_LABELS).sum(axis=0)  # [2, 2, 2, 1]: test rows excluded
    np.testing.assert_allclose(q, inverse_propensity(train_counts, 7, 0.6, 2.6))
    assert q[3] == pytest.approx(np.log(7))  # a label seen once gets ln N


# --- Bamler–Mandt single-label view -----------------------------------------------------------


def test_single_label_conversion_hand_checked() -> None:
    rows = [[3, 1], [], [2], [4, 2], [1], [0, 4], [4], [0, 2], [2, 3]]  # 0-5 train, 6-8 test
    labels = sp.csr_matrix(_dense_labels(rows, 5))
    splits = {"train": np.arange(6), "test": np.arange(6, 9)}
    kept, y, original, new_splits = to_single_label(labels, splits)
    # smallest ids: 1, -, 2, 2, 1, 0 | 4, 0, 2. Train counts: 1 ×2, 2 ×2, 0 ×1 -> ranks 1, 2, 0
    # (tie by id). Row 1 has no label; row 6 keeps 4, which no training row keeps.
    assert kept.tolist() == [0, 2, 3, 4, 5, 7, 8]
    assert y.tolist() == [0, 1, 1, 0, 2, 2, 1] and y.dtype == np.int64
    assert original.tolist() == [1, 2, 0]
    assert new_splits["train"].tolist() == [0, 1, 2, 3, 4]
    assert new_splits["test"].tolist() == [5, 6]


def test_load_single_label(tmp_path: Path) -> None:
    dataset = XC(path=str(_write_folder(tmp_path / "copy", LEGACY_FILES)), single_label=True)
    dest = tmp_path / "raw"
    dest.mkdir()
    dataset.fetch(dest)
    raw = dataset.load(dest)
    # train smallest labels: 0, 1, -, 1, -, 2, 0 -> 0 ×2, 1 ×2, 2 ×1; test: 3 (unseen), 0.
    assert not raw.multilabel and raw.modality == "sparse"
    assert raw.labels.tolist() == [0, 1, 1, 2, 0, 0] and raw.labels.dtype == np.int64
    assert raw.label_names == ["0", "1", "2"]
    np.testing.assert_array_equal(
        raw.inputs.toarray(), np.vstack([TRAIN_X, TEST_X])[[0, 1, 3, 5, 6, 8]]
    )
    assert raw.splits == {"train": pytest.approx([0, 1, 2, 3, 4]), "test": pytest.approx([5])}
    assert raw.inputs.has_sorted_indices
    assert json.loads((dest / "xc.json").read_text())["splits"]["test"]["rows"] == 2


def test_write_legacy_is_read_back_exactly_by_parse_file(tmp_path: Path) -> None:
    """The legacy writer (omikuji's training file, the synthetic benchmark set) and the parser
    agree: header, every row's sorted features and values, label sets, a label-less row."""
    features = sp.csr_matrix(
        np.array([[0, 1.5, 0, 2], [0.25, 0, 0, 0], [0, 0, 3, 0]], dtype=np.float32)
    )
    labels = sp.csr_matrix(np.array([[1, 0, 1], [0, 0, 0], [0, 1, 0]], dtype=np.float32))
    xc.write_legacy(tmp_path / "train.txt", features, labels)
    with (tmp_path / "train.txt").open("rb") as f:
        parsed = parse_file(f, "legacy", "train.txt")
    assert parsed.header == (3, 4, 3) and parsed.rows == 3
    np.testing.assert_array_equal(parsed.feat_counts, np.diff(features.indptr))
    np.testing.assert_array_equal(parsed.feat_ids, features.indices)
    np.testing.assert_array_equal(parsed.feat_vals, features.data)
    np.testing.assert_array_equal(parsed.label_counts, np.diff(labels.indptr))
    np.testing.assert_array_equal(parsed.label_ids, labels.indices)
