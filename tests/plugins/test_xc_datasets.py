"""XC repository datasets: tiny files in the exact legacy and split formats, in zip and tar
archives and plain folders, with the traps of the real files (label-less rows, unsorted and
repeated feature ids) and the errors a broken copy must give."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import re
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.datasets import load_svmlight_file

from tailkit.errors import DataValidationError, InvalidParameterError
from tailkit.evaluation.metrics import inverse_propensity
from tailkit.plugins.datasets import xc, xc_decode, xc_format
from tailkit.plugins.datasets.xc import (
    PROPENSITY_CONSTANTS,
    XC,
    Amazon670K,
    EURLex4K,
    WikiLSHTC325K,
    to_single_label,
)
from tailkit.plugins.datasets.xc_format import parse_file
from tailkit.registry import DEFAULT_PROPENSITY, make_registry

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


def _parse(
    text: str, kind: xc_format.Kind = "legacy", where: str = "train.txt"
) -> xc_format.Parsed:
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
    features = xc_format.csr(parsed.feat_counts, parsed.feat_ids, parsed.feat_vals, (7, 8))
    labels = xc_format.csr(parsed.label_counts, parsed.label_ids, None, (7, 4))
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
    ours = xc_format.csr(parsed.feat_counts, parsed.feat_ids, parsed.feat_vals, (200, 50))
    theirs, y = load_svmlight_file(
        io.BytesIO(body.encode()), n_features=50, multilabel=True, zero_based=True
    )
    np.testing.assert_allclose(ours.toarray(), theirs.toarray(), rtol=1e-6)
    ours_y = xc_format.csr(parsed.label_counts, parsed.label_ids, None, (200, 9))
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
    labels = xc_format.csr(parsed.label_counts, parsed.label_ids, None, (3, 4))
    np.testing.assert_array_equal(labels.toarray(), _dense_labels([[0, 2], [], [3]]))


def test_blocks_split_anywhere_keep_rows_and_line_numbers(monkeypatch) -> None:
    monkeypatch.setattr(xc_format, "_CHUNK", 5)  # many blocks, boundaries inside tokens
    parsed = _parse(LEGACY_TRAIN)
    features = xc_format.csr(parsed.feat_counts, parsed.feat_ids, parsed.feat_vals, (7, 8))
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
def test_broken_files_name_file_and_line(text: str, kind: xc_format.Kind, message: str) -> None:
    with pytest.raises(DataValidationError, match=message) as err:
        _parse(text, kind, "f")
    assert "\n" not in str(err.value)


# --- reading rules (xc_format.py): no token dropped, no lone \r, each row by its own form ---


def _parse_in_blocks(
    data: bytes, kind: xc_format.Kind, chunk: int, where: str = "f"
) -> xc_format.Parsed:
    """parse_file reading ``chunk`` bytes at a time, so blocks end where the test wants."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(xc_format, "_CHUNK", chunk)
        return parse_file(io.BytesIO(data), kind, where)


@pytest.mark.parametrize(
    ("data", "kind", "chunk", "message"),
    [
        # No colon anywhere in the file: the colon-less token used to vanish.
        (b"1 8 4\n0 5\n", "legacy", 1 << 20, "f:2: malformed token '5'; expected feature:value"),
        (b"1 8\n7\n", "features", 1 << 20, "f:2: malformed token '7'; expected feature:value"),
        # The bad row alone in its block: read as "label 1, no features" before.
        (b"2 8 4\n0 1:1\n1 5\n", "legacy", 4, "f:3: malformed token '5'; expected feature:value"),
    ],
    ids=["legacy-file", "features-file", "alone-in-its-block"],
)
def test_f1_token_without_colon_names_its_line(
    data: bytes, kind: xc_format.Kind, chunk: int, message: str
) -> None:
    with pytest.raises(DataValidationError) as err:
        _parse_in_blocks(data, kind, chunk)
    assert str(err.value) == message


@pytest.mark.parametrize(
    ("data", "line"),
    [
        (b"1 8 4\n0 1:2\r3\n", 2),  # was read as feature 1 = 23.0
        (b"2 8 4\r\n0 1:1\r\n1 2:1\r", 3),  # the last line has no newline for its \r
        (b"2 8 4\n0 1:1\r\r\n1 2:1\n", 2),  # one \r of two before the newline is lone
        (b"1 8 4\r0 1:1\n", 1),  # classic Mac line ending
    ],
    ids=["inside-a-token", "at-end-of-file", "cr-cr-lf", "cr-line-ending"],
)
def test_f2_lone_carriage_return_names_its_line(data: bytes, line: int) -> None:
    for chunk in (1, 3, 1 << 20):  # wherever the \r falls relative to a block's end
        with pytest.raises(DataValidationError) as err:
            _parse_in_blocks(data, "legacy", chunk)
        assert str(err.value) == (
            f"f:{line}: carriage return (\\r) not followed by a newline; lines must end in \\n "
            "or \\r\\n"
        )
    crlf = LEGACY_TRAIN.replace("\n", "\r\n").encode()  # \r\n is a line ending, even split
    plain = _parse(LEGACY_TRAIN)
    for chunk in (1, 2, 5, 1 << 20):
        parsed = _parse_in_blocks(crlf, "legacy", chunk)
        for part in ("feat_counts", "feat_ids", "feat_vals", "label_counts", "label_ids"):
            np.testing.assert_array_equal(getattr(parsed, part), getattr(plain, part))
        assert parsed.sha256 == hashlib.sha256(crlf).hexdigest()


def test_f3_label_row_form_is_read_per_row_at_any_block_size() -> None:
    """A *_X_Y.txt row is l:v pairs if it has a colon, else a comma list, whatever came before.

    The form used to be guessed once from the first non-blank row met, so a blank first block
    made " " an error, and a comma row after pair rows was an error or, alone in its block, read
    as no labels."""
    data = b"5 4\n \n0:1 3:0.5\n0,2\n\t1 \n\n"
    for chunk in [*range(1, len(data) + 1), 1 << 20]:
        parsed = _parse_in_blocks(data, "labels", chunk)
        assert parsed.rows == 5
        assert parsed.label_counts.tolist() == [0, 2, 2, 1, 0], chunk
        assert parsed.label_ids.tolist() == [0, 3, 0, 2, 1], chunk
    with pytest.raises(DataValidationError) as err:
        _parse_in_blocks(b"2 4\n0:1\n0,1 2\n", "labels", 3)
    assert str(err.value) == (
        "f:3: malformed label list '0,1 2'; expected l1,l2,... (0-based integer ids) or l:v pairs"
    )


# --- fuzz: the blocked Arrow parser against a plain line-by-line reading of the same rules ---

_D, _L = 8, 4
_INT = rb"-?[0-9]+"
_FLOAT = rb"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"


def _reference_row(line: bytes, kind: str) -> tuple[list[tuple[int, float]], list[int]]:
    """One row read by the documented rules alone; ValueError when the row breaks one."""
    tokens = [t for t in re.split(rb"[ \t]+", line) if t]
    labels: list[int] = []
    if kind == "labels" and tokens and b":" not in line:
        if len(tokens) != 1 or not re.fullmatch(rb"[0-9]+(?:,[0-9]+)*", tokens[0]):
            raise ValueError("label list")
        return [], [_in_range(int(t), _L) for t in tokens[0].split(b",")]
    first = tokens[0] if tokens and line[:1] not in b" \t" else b""
    if kind == "legacy" and re.fullmatch(rb"[0-9,]+", first):
        if not re.fullmatch(rb"[0-9]+(?:,[0-9]+)*", tokens[0]):
            raise ValueError("label list")
        labels = [_in_range(int(t), _L) for t in tokens[0].split(b",")]
        tokens = tokens[1:]
    pairs = []
    for token in tokens:
        match = re.fullmatch(rb"(" + _INT + rb"):(" + _FLOAT + rb")", token)
        if match is None:
            raise ValueError("token")
        key, value = int(match[1]), float(match[2])
        if kind == "labels":
            if not np.isfinite(value):
                raise ValueError("weight")
            labels.append(_in_range(key, _L))
        else:
            with np.errstate(over="ignore"):
                value = np.float32(value)
            if not np.isfinite(value):
                raise ValueError("value")
            pairs.append((_in_range(key, _D), float(value)))
    return pairs, labels


def _in_range(value: int, limit: int) -> int:
    if not 0 <= value < limit:
        raise ValueError("range")
    return value


def _reference(data: bytes, kind: str) -> list[tuple[list[tuple[int, float]], list[int]]] | set:
    """The rows of an XC file read line by line, or the set of its lines at fault (1-based)."""
    pieces = data.split(b"\n")
    lines, bad = [], set()
    for number, piece in enumerate(pieces, 1):
        if number == len(pieces) and not piece:
            break  # a final newline ends the last line; it does not start another
        if number < len(pieces) and piece.endswith(b"\r"):
            piece = piece[:-1]  # \r\n
        if b"\r" in piece:
            bad.add(number)
        lines.append(piece)
    if not lines:
        return {1}
    fields = lines[0].split()
    width = 3 if kind == "legacy" else 2
    well_formed = len(fields) == width and all(f.isdigit() for f in fields)
    if not well_formed or int(fields[0]) != len(lines) - 1:
        bad.add(1)
    rows = []
    for number, line in enumerate(lines[1:], 2):
        try:
            rows.append(_reference_row(line, kind))
        except ValueError:
            bad.add(number)
    return bad or rows


_VALUES = ["1", "0.5", "-2", "1e-3", "2.5E2", ".5", "3.", "1.e2", "-.25", "1e-50"]
_BAD_VALUES = ["1e39", "inf", "nan", "x", "", "1e", "0x1"]
_BAD_TOKENS = ["7", "x", ":1", "1:", "1:2:3", "1,2", "+1:1", "1:2\r3", "1:1\x0b2:1", "0,1:1"]
_LABEL_LISTS = ["0", "3", "1,3", "2,0,2", "003"]
_BAD_LABEL_LISTS = ["4", "0,,1", "1,", ",1", "1.5", "-1", "-0", "0,1 2"]
_SEPARATORS = st.sampled_from([" ", " ", "\t", "  ", " \t"])


@st.composite
def _xc_files(draw) -> tuple[bytes, str]:
    """A small XC file of one kind: clean, or with a few flaws (a token without a colon, a lone
    \\r, an id out of range, a bad label list, a wrong row count) among good rows."""
    kind = draw(st.sampled_from(["legacy", "features", "labels"]))
    flawed = draw(st.booleans())

    def pick(good: list[str], bad: list[str]) -> st.SearchStrategy[str]:
        if not flawed:
            return st.sampled_from(good)
        # About one pick in six is bad, so that faults sit among good lines and blocks.
        return st.one_of(*[st.sampled_from(good)] * 5, st.sampled_from(bad))

    limit = _L if kind == "labels" else _D
    ids = pick([str(i) for i in range(limit)], ["-1", str(limit), "99"])
    pair = st.builds("{}:{}".format, ids, pick(_VALUES, _BAD_VALUES))
    token = pick(["pair"], ["bad"]).flatmap(
        lambda which: pair if which == "pair" else st.sampled_from(_BAD_TOKENS)
    )
    label_list = pick(_LABEL_LISTS, _BAD_LABEL_LISTS)
    rows = []
    for _ in range(draw(st.integers(0, 10))):
        form = draw(st.sampled_from(["pairs", "pairs", "list", "bare"]))
        tokens = draw(st.lists(token, max_size=4)) if form != "bare" else []
        lead = draw(st.sampled_from(["", "", " ", "\t"]))
        if kind == "labels" and form == "list":  # the comma-list form of a *_X_Y.txt row
            tokens = [draw(label_list)]
        elif kind == "legacy" and form == "list":  # a labelled legacy row: no lead allowed
            tokens = [draw(label_list), *tokens]
            lead = draw(pick([""], [" "]))
        body = "".join((draw(_SEPARATORS) if i else "") + t for i, t in enumerate(tokens))
        rows.append(lead + body + draw(st.sampled_from(["", "", " "])))
    count = len(rows) + draw(pick(["0"], ["1", "-1"]).map(int))
    sizes = f"{_D} {_L}" if kind == "legacy" else str(limit)
    endings = pick(["\n", "\n", "\r\n"], ["\r", "\r\r\n"])
    text = "".join(line + draw(endings) for line in [f"{count} {sizes}", *rows])
    if draw(st.booleans()):
        text = text.removesuffix("\n")  # a last line without its newline
    return text.encode(), kind


@settings(max_examples=200, deadline=None, database=None)
@given(_xc_files(), st.sampled_from([1, 2, 3, 5, 8, 13, 40, 1 << 20]))
def test_fuzz_parse_matches_line_by_line_reference(file: tuple[bytes, str], chunk: int) -> None:
    """Every file, cut into blocks anywhere, reads as the line-by-line reference reads it, or
    fails with one line naming the file and a line the reference also finds at fault."""
    data, kind = file
    expected = _reference(data, kind)
    if isinstance(expected, set):
        with pytest.raises(DataValidationError) as err:
            _parse_in_blocks(data, kind, chunk, "fuzz.txt")
        message = str(err.value)
        assert "\n" not in message
        match = re.match(r"fuzz\.txt:(\d+): ", message)
        assert match is not None and int(match[1]) in expected, (message, expected)
        return
    parsed = _parse_in_blocks(data, kind, chunk, "fuzz.txt")
    assert parsed.rows == len(expected)
    features = [pair for pairs, _ in expected for pair in pairs]
    labels = [label for _, row_labels in expected for label in row_labels]
    if kind != "labels":
        assert _listed(parsed.feat_counts) == [len(pairs) for pairs, _ in expected]
        assert _listed(parsed.feat_ids) == [i for i, _ in features]
        assert _listed(parsed.feat_vals) == [v for _, v in features]  # float32 values, exactly
    else:
        assert parsed.feat_counts is None
    if kind != "features":
        assert _listed(parsed.label_counts) == [len(row_labels) for _, row_labels in expected]
        assert _listed(parsed.label_ids) == labels
    else:
        assert parsed.label_counts is None


def _listed(part: np.ndarray | None) -> list:
    return [] if part is None else part.tolist()  # a file with no rows has no parts


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


def test_load_single_label(tmp_path: Path, capsys) -> None:
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
    said = capsys.readouterr().err.splitlines()  # nothing dropped without a word
    keeps = "; single_label: false keeps every row, multi-label"
    assert said == [
        "dataset 'XC': single_label: dropped 2 of 7 train rows (2 with no label)" + keeps,
        "dataset 'XC': single_label: dropped 1 of 2 test rows (1 whose first label no training "
        "row keeps)" + keeps,
    ]


def test_write_legacy_is_read_back_exactly_by_parse_file(tmp_path: Path) -> None:
    """The legacy writer (omikuji's training file, the synthetic benchmark set) and the parser
    agree: header, every row's sorted features and values, label sets, a label-less row."""
    features = sp.csr_matrix(
        np.array([[0, 1.5, 0, 2], [0.25, 0, 0, 0], [0, 0, 3, 0]], dtype=np.float32)
    )
    labels = sp.csr_matrix(np.array([[1, 0, 1], [0, 0, 0], [0, 1, 0]], dtype=np.float32))
    xc_decode.write_legacy(tmp_path / "train.txt", features, labels)
    with (tmp_path / "train.txt").open("rb") as f:
        parsed = parse_file(f, "legacy", "train.txt")
    assert parsed.header == (3, 4, 3) and parsed.rows == 3
    np.testing.assert_array_equal(parsed.feat_counts, np.diff(features.indptr))
    np.testing.assert_array_equal(parsed.feat_ids, features.indices)
    np.testing.assert_array_equal(parsed.feat_vals, features.data)
    np.testing.assert_array_equal(parsed.label_counts, np.diff(labels.indptr))
    np.testing.assert_array_equal(parsed.label_ids, labels.indices)


def test_a_file_of_no_rows_decodes_to_empty_matrices(tmp_path: Path) -> None:
    """A header of N = 0 gives every part of its kind empty (not None), so a copy whose test
    file holds no row decodes to a (0, D) matrix and (0, L) labels, and the split is refused
    later in one line rather than with a TypeError inside decode."""
    for kind, text, parts in (
        ("legacy", b"0 5 3\n", ("feat_counts", "feat_ids", "feat_vals", "label_ids")),
        ("features", b"0 5", ("feat_counts", "feat_ids", "feat_vals")),
        ("labels", b"0 3\n", ("label_counts", "label_ids")),
    ):
        parsed = parse_file(io.BytesIO(text), kind, "f.txt")
        assert parsed.rows == 0
        assert all(getattr(parsed, p).size == 0 for p in parts), kind
    features = sp.csr_matrix(np.array([[0, 1.5, 0, 2, 0]], dtype=np.float32))
    labels = sp.csr_matrix(np.array([[1, 0, 1]], dtype=np.float32))
    xc_decode.write_legacy(tmp_path / "train.txt", features, labels)
    (tmp_path / "test.txt").write_bytes(b"0 5 3\n")
    decoded = xc_decode.decode(tmp_path)
    assert decoded.num_train == 1
    assert decoded.features.shape == (1, 5) and decoded.labels.shape == (1, 3)
