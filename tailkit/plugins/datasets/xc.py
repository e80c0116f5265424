r"""Extreme Classification Repository datasets (manikvarma.org/downloads/XC/XMLRepository.html).

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

Two text formats (datasets-metrics.md §1.1, §1.2), all ids 0-based:

* legacy: ``train.txt`` / ``test.txt`` (or ``<name>_train.txt``), header ``N D L``, then per
  row ``l1,l2,... f:v f:v ...``. A row without labels starts directly with its features or
  with a space (EURLex-4K has 28 such rows).
* split: ``trn_X_Xf.txt`` / ``tst_X_Xf.txt`` (header ``N D``, rows ``f:v ...``) and
  ``trn_X_Y.txt`` / ``tst_X_Y.txt`` (header ``N L``, rows ``l:v ...``, where v is a relevance
  weight, or the comma list ``l1,l2,...``; an empty line is a row without labels).

The rules the parser applies, the same to every line of a file: the file is read in blocks of
``_CHUNK`` bytes, and no rule looks beyond the row it reads, so none depends on where a block
starts. A line that breaks one is an error naming the file and the 1-based line.

* Lines end in ``\n`` or ``\r\n``. Any other ``\r`` is an error: deleting it would join the
  tokens either side (``1:2\r3`` read as feature 1 = 23).
* Only spaces and tabs separate tokens. Every feature token is ``id:value``: an integer id in
  ``[0, D)`` and a decimal value that is finite as a float32. A token without a colon is an
  error, never skipped.
* Legacy rows: the first token is the row's label list when it holds only digits and commas
  (it must then be ``l1,l2,...``, ids in ``[0, L)``). A row that starts with a space or tab, or
  whose first token holds anything else (``f:v``), has no labels; its tokens are all features.
* ``*_X_Y.txt`` rows: a row with no token has no labels; a row with a colon is ``l:v`` tokens
  (v a finite weight, then dropped); any other row is one comma list ``l1,l2,...``. Each row
  is read by its own form, so a file that mixes the two reads the same wherever its blocks end.

Feature ids within a row may be unsorted or repeated in the files: they are sorted and repeated
ids summed (as pyxclib's ``read_sparse_file(safe_read=False)`` does). Repeated labels count once
and label weights are dropped: the labels are a 0/1 indicator.

Why not scikit-learn's ``load_svmlight_file`` (what pyxclib uses): it rejects unsorted or repeated
feature ids ("should be sorted and unique"), silently skips empty and blank lines (a label-less
row of a ``*_X_Y.txt`` file, or a legacy row with neither labels nor features, which shifts
every later row), accepts ``1.5`` as a label, and its errors carry no line number. The parser
below does each block of lines in Arrow kernels: a regex splits the label field off, and the
features become a two-column CSV (``f,v`` per token) for Arrow's CSV reader. Measured side by
side in one process on a generated 90 MB legacy file (100,000 rows, 6 M sorted features, 2 CPU
cores), ``parse_file`` (hashing and range checks included) took 1.9–2.8 s against 5.1–5.7 s for
scikit-learn 1.9.1 on the same body, 2.1–2.6× faster. A block that fails the fast path is
re-read line by line in Python to name the line at fault.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import tarfile
import zipfile
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import IO, Any, ClassVar, Literal, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pcsv
import scipy.sparse as sp

from tailkit.atomic import atomic_path, write_json
from tailkit.components import DEFAULT_PROPENSITY, RawData
from tailkit.errors import DataValidationError, InvalidParameterError
from tailkit.evaluation.metrics import inverse_propensity

XCFormat = Literal["auto", "legacy", "split"]

FEATURES = "features.npz"
LABELS = "labels.npz"
META = "xc.json"
REPOSITORY = "http://manikvarma.org/downloads/XC/XMLRepository.html"
SPLIT_FILES = {
    "train": ("trn_X_Xf.txt", "trn_X_Y.txt"),
    "test": ("tst_X_Xf.txt", "tst_X_Y.txt"),
}
_CHUNK = 32 << 20  # bytes read per block of lines
_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
_LABEL_FIELD = r"^[0-9,]+(?:[ \t]|$)"  # a legacy row's label field (absent when row has none)
_LABEL_LIST = re.compile(rb"[0-9]+(?:,[0-9]+)*")
_BLANK = b" \t"  # the only token separators, in every kind of file
_TO_CSV = bytes.maketrans(b" \t:", b"\n\n,")  # "f:v f:v" -> "f,v\nf,v"
_CSV_PARSE = pcsv.ParseOptions(
    delimiter=",", quote_char=False, double_quote=False, escape_char=False, ignore_empty_lines=True
)
_CSV_CONVERT = pcsv.ConvertOptions(
    column_types={"i": pa.int64(), "v": pa.float64()},
    null_values=[],
    strings_can_be_null=False,
    quoted_strings_can_be_null=False,
)


# --- parsing ----------------------------------------------------------------------------------


@dataclass
class Parsed:
    """One parsed file: its header and its rows as CSR parts (``None`` for absent parts)."""

    header: tuple[int, ...]
    rows: int
    feat_counts: np.ndarray | None = None
    feat_ids: np.ndarray | None = None
    feat_vals: np.ndarray | None = None
    label_counts: np.ndarray | None = None
    label_ids: np.ndarray | None = None
    sha256: str = ""


class _Malformed(Exception):
    """The fast path could not parse a block; the slow path names the line."""


Kind = Literal["legacy", "features", "labels"]
_HEADERS: dict[str, tuple[str, ...]] = {
    "legacy": ("N", "D", "L"),
    "features": ("N", "D"),
    "labels": ("N", "L"),
}


def parse_file(stream: IO[bytes], kind: Kind, where: str) -> Parsed:
    """Parse one XC text file from a binary stream.

    ``kind`` is ``legacy`` (``train.txt``: labels and features), ``features`` (``*_X_Xf.txt``)
    or ``labels`` (``*_X_Y.txt``); ``where`` names the file in every error message. Ids are
    checked against the header's D and L and the row count against its N.
    """
    hasher = hashlib.sha256()
    blocks = _blocks(stream, hasher, where)
    try:
        first = next(blocks)
    except StopIteration:
        raise DataValidationError(f"{where}:1: empty file; expected a header line") from None
    _, head_block = first
    header_line, _, rest = head_block.partition(b"\n")
    header = _header(header_line, kind, where)
    limits = dict(zip(_HEADERS[kind], header, strict=True))

    parts: dict[str, list[np.ndarray]] = {
        k: [] for k in ("feat_counts", "feat_ids", "feat_vals", "label_counts", "label_ids")
    }
    rows = 0

    def chunks() -> Iterator[tuple[int, bytes]]:
        if b"\n" in head_block:
            yield 2, rest
        yield from blocks

    for lineno, block in chunks():
        try:
            out = _parse_block(block, kind)
        except (_Malformed, pa.ArrowInvalid) as exc:
            _diagnose(block, lineno, kind, where)
            raise DataValidationError(
                f"{where}:{lineno}: cannot parse the lines from here on ({_brief(exc)})"
            ) from exc
        if "feat_ids" in out:
            _check_range(out["feat_ids"], out["feat_counts"], limits["D"], "feature", where, lineno)
            vals = out["feat_vals"]
            if not np.isfinite(vals).all():
                bad = int(np.flatnonzero(~np.isfinite(vals))[0])
                row = _row_of(bad, out["feat_counts"])
                raise DataValidationError(
                    f"{where}:{lineno + row}: feature value {vals[bad]} is not a finite float32"
                )
        if "label_ids" in out:
            _check_range(out["label_ids"], out["label_counts"], limits["L"], "label", where, lineno)
        for key, value in out.items():
            parts[key].append(value)
        rows += block.count(b"\n") + 1

    if rows != limits["N"]:
        raise DataValidationError(
            f"{where}:1: the header says {limits['N']:,} rows but the file has {rows:,}"
        )
    joined = {k: np.concatenate(v) if v else None for k, v in parts.items()}
    return Parsed(header=header, rows=rows, sha256=hasher.hexdigest(), **joined)


def _blocks(stream: IO[bytes], hasher: Any, where: str) -> Iterator[tuple[int, bytes]]:
    """(line number of the first line, complete lines without their final newline)."""
    lineno, carry = 1, b""
    while True:
        try:
            chunk = stream.read(_CHUNK)
        except (OSError, EOFError, zipfile.BadZipFile, tarfile.TarError) as exc:
            raise DataValidationError(
                f"{where}: unreadable, truncated or corrupted ({_brief(exc)})"
            ) from exc
        if not chunk:
            break
        hasher.update(chunk)
        data = carry + chunk
        cut = data.rfind(b"\n")
        if cut < 0:
            carry = data
            continue
        block, carry = data[:cut], data[cut + 1 :]
        if b"\r" in block:
            # The newline cut off after the block ends a final "\r\n" too.
            block = _crlf(block, lineno, where, newline_follows=True)
        yield lineno, block
        lineno += block.count(b"\n") + 1
    if carry:
        if b"\r" in carry:
            carry = _crlf(carry, lineno, where, newline_follows=False)
        yield lineno, carry


def _crlf(block: bytes, lineno: int, where: str, newline_follows: bool) -> bytes:
    r"""``block`` with its ``\r\n`` line endings made ``\n``; any other ``\r`` names its line.

    A lone ``\r`` is refused: deleting it joins the tokens either side (``1:2\r3`` read as
    feature 1 = 23), and reading it as a separator or a line break guesses at the writer's intent.
    """
    # numpy finds what follows each \r, then one replace drops them: about twice as fast as
    # block.replace(b"\r\n", b"\n"), which searches for a two-byte pattern.
    codes = np.frombuffer(block, dtype=np.uint8)
    returns = np.flatnonzero(codes == ord("\r"))
    following = np.full(len(returns), ord("\n") if newline_follows else 0, dtype=np.uint8)
    inside = returns + 1 < len(codes)
    following[inside] = codes[returns[inside] + 1]
    lone = returns[following != ord("\n")]
    if len(lone):
        line = lineno + block.count(b"\n", 0, int(lone[0]))
        raise DataValidationError(
            f"{where}:{line}: carriage return (\\r) not followed by a newline; lines must end "
            "in \\n or \\r\\n"
        )
    return block.replace(b"\r", b"")


def _header(line: bytes, kind: Kind, where: str) -> tuple[int, ...]:
    names = _HEADERS[kind]
    fields = line.split()
    if len(fields) != len(names) or not all(f.isdigit() for f in fields):
        shown = line[:60].decode("utf-8", "replace")
        hint = (
            " (the LIBSVM-site copies have no header and 1-based ids; use the XC repository's)"
            if kind == "legacy"
            else ""
        )
        raise DataValidationError(
            f"{where}:1: header {shown!r} is not '{' '.join(names)}' "
            f"({len(names)} non-negative integers){hint}"
        )
    return tuple(int(f) for f in fields)


def _parse_block(block: bytes, kind: Kind) -> dict[str, np.ndarray]:
    lines = pc.split_pattern(pa.array([block], pa.large_binary()), b"\n")[0].values
    if kind == "labels":
        return _label_rows(lines)
    out: dict[str, np.ndarray] = {}
    if kind == "legacy":
        field = pc.extract_regex(lines, r"^(?P<l>[0-9,]+)(?:[ \t]|$)")
        has = field.is_valid()
        label_text = field.field("l").filter(has)
        pieces = pc.split_pattern(label_text, b",")
        counts = np.zeros(len(lines), dtype=np.int64)
        counts[has.to_numpy(zero_copy_only=False)] = pc.list_value_length(pieces).to_numpy()
        out["label_counts"] = counts
        out["label_ids"] = pc.cast(pieces.flatten(), pa.int64()).to_numpy()
        lines = pc.replace_substring_regex(lines, _LABEL_FIELD, b"")
    counts, ids, vals = _pairs(lines)
    with np.errstate(over="ignore"):
        out["feat_vals"] = vals.astype(np.float32)
    out["feat_counts"], out["feat_ids"] = counts, ids
    return out


def _pairs(lines: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of ``id:value`` tokens: per-row token counts, then every id and value in order."""
    counts = pc.count_substring(lines, b":").to_numpy().astype(np.int64)
    total = int(counts.sum())
    if not total:
        # The CSV reader below is what refuses a token without a colon, so with no colon at all
        # such a token must be refused here, or it would vanish without a trace.
        if pc.any(pc.match_substring_regex(lines, r"[^ \t]")).as_py():
            raise _Malformed("a token without ':'")
        return counts, np.zeros(0, np.int64), np.zeros(0, np.float64)
    sep = pa.scalar(b"\n", pa.large_binary())
    joined = pc.binary_join_element_wise(lines, sep, pa.scalar(b"", pa.large_binary()))
    offsets = np.frombuffer(joined.buffers()[1], np.int64)
    text = joined.buffers()[2].to_pybytes()[offsets[0] : offsets[-1]].translate(_TO_CSV)
    table = pcsv.read_csv(
        io.BytesIO(text),
        # Arrow's CSV thread pool, once torch is imported, made 17 of 20 processes abort at
        # exit ("terminate called without an active exception", exit 134) after a correct
        # parse; one thread reads a 23 MB file as fast on two cores (0.25 s either way).
        read_options=pcsv.ReadOptions(column_names=["i", "v"], use_threads=False),
        parse_options=_CSV_PARSE,
        convert_options=_CSV_CONVERT,
    )
    # Every CSV row must have two columns, so one row per colon means every token is one pair.
    if table.num_rows != total:
        raise _Malformed(f"{table.num_rows} id:value pairs for {total} colons")
    return counts, table.column("i").to_numpy(), table.column("v").to_numpy()


def _label_rows(lines: pa.Array) -> dict[str, np.ndarray]:
    """Rows of a ``*_X_Y.txt`` file, each read by its own form (module docstring), never by a
    form guessed for its block: where a block starts must not change how a row reads."""
    pairs = pc.match_substring(lines, b":").to_numpy(zero_copy_only=False)
    counts = np.zeros(len(lines), dtype=np.int64)
    pair_ids = list_ids = np.zeros(0, np.int64)
    if pairs.any():
        pair_lines = lines if pairs.all() else lines.filter(pa.array(pairs))
        pair_counts, pair_ids, weights = _pairs(pair_lines)
        counts[pairs] = pair_counts
        if not np.isfinite(weights).all():  # weights are validated, then dropped
            raise _Malformed("non-finite label weight")
    if not pairs.all():
        listed = pc.replace_substring_regex(lines.filter(pa.array(~pairs)), r"^[ \t]+|[ \t]+$", b"")
        if pc.any(pc.match_substring(listed, b"-")).as_py():
            raise _Malformed("'-' in a label list")  # the int64 cast would read "-0" as 0
        blank = pc.equal(pc.binary_length(listed), 0)
        pieces = pc.split_pattern(listed.filter(pc.invert(blank)), b",")
        list_counts = np.zeros(len(listed), dtype=np.int64)
        list_counts[~blank.to_numpy(zero_copy_only=False)] = pc.list_value_length(pieces).to_numpy()
        counts[~pairs] = list_counts
        list_ids = pc.cast(pieces.flatten(), pa.int64()).to_numpy()
    if pairs.all():
        return {"label_counts": counts, "label_ids": pair_ids}
    if not pairs.any():
        return {"label_counts": counts, "label_ids": list_ids}
    # Both forms in this block: put each form's ids back in their rows' places.
    from_pairs = np.repeat(pairs, counts)
    ids = np.empty(len(from_pairs), dtype=np.int64)
    ids[from_pairs], ids[~from_pairs] = pair_ids, list_ids
    return {"label_counts": counts, "label_ids": ids}


def _tokens(line: bytes) -> list[bytes]:
    """A row's tokens: only spaces and tabs separate them, as in the fast path."""
    return [token for token in re.split(rb"[ \t]+", line) if token]


def _diagnose(block: bytes, first: int, kind: Kind, where: str) -> None:
    """Re-read a block that failed the fast path line by line; raise at the first bad line."""
    for offset, line in enumerate(block.split(b"\n")):
        at = f"{where}:{first + offset}"
        tokens = _tokens(line)
        if kind == "labels" and tokens and b":" not in line:
            if len(tokens) != 1 or not _LABEL_LIST.fullmatch(tokens[0]):
                raise DataValidationError(
                    f"{at}: malformed label list {_show(line.strip(_BLANK))}; expected l1,l2,... "
                    "(0-based integer ids) or l:v pairs"
                )
            continue
        if kind == "legacy":
            field = re.match(_LABEL_FIELD.encode(), line)
            if field:
                text = field.group().strip(_BLANK)
                if not _LABEL_LIST.fullmatch(text):
                    raise DataValidationError(
                        f"{at}: malformed label list {_show(text)}; expected l1,l2,... "
                        "(0-based integer ids, no spaces)"
                    )
                tokens = _tokens(line[field.end() :])
        what = "label:weight" if kind == "labels" else "feature:value"
        for token in tokens:
            key, colon, value = token.partition(b":")
            if not colon or not _is_int(key) or not _is_float(value):
                raise DataValidationError(f"{at}: malformed token {_show(token)}; expected {what}")
            if kind == "labels" and not np.isfinite(float(value)):
                raise DataValidationError(f"{at}: label weight {_show(value)} is not finite")


def _is_int(text: bytes) -> bool:
    return re.fullmatch(rb"-?[0-9]+", text) is not None  # what Arrow's int64 parser takes


def _is_float(text: bytes) -> bool:
    return re.fullmatch(rb"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", text) is not None


def _brief(exc: BaseException) -> str:
    """An exception's message cut to its first line (messages here are one line)."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return lines[0].rstrip(":")


def _show(text: bytes) -> str:
    shown = text.decode("utf-8", "replace")
    return repr(shown if len(shown) <= 40 else shown[:37] + "...")


def _row_of(position: int, counts: np.ndarray) -> int:
    return int(np.searchsorted(np.cumsum(counts), position, side="right"))


def _check_range(
    ids: np.ndarray, counts: np.ndarray, limit: int, what: str, where: str, first: int
) -> None:
    bad = (ids < 0) | (ids >= limit)
    if bad.any():
        position = int(np.flatnonzero(bad)[0])
        letter = "D" if what == "feature" else "L"
        raise DataValidationError(
            f"{where}:{first + _row_of(position, counts)}: {what} id {ids[position]} is outside "
            f"[0, {limit}) ({letter} = {limit} in the header)"
        )


def _csr(
    counts: np.ndarray, ids: np.ndarray, values: np.ndarray | None, shape: tuple[int, int]
) -> sp.csr_matrix:
    """A canonical CSR (sorted ids, repeats summed); ``values`` None makes a 0/1 indicator."""
    indptr = np.zeros(len(counts) + 1, dtype=np.int64)
    np.cumsum(counts, out=indptr[1:])
    index_dtype = np.int32 if max(shape[1], len(ids)) < 2**31 else np.int64
    data = np.ones(len(ids), np.float32) if values is None else values.astype(np.float32)
    matrix = sp.csr_matrix(
        (data, ids.astype(index_dtype), indptr.astype(index_dtype)), shape=shape, dtype=np.float32
    )
    matrix.sum_duplicates()
    if values is None:
        matrix.data[:] = 1.0
    return matrix


# --- finding the files ------------------------------------------------------------------------


class _Source:
    """The files of one dataset copy, in an archive or a folder: names, and streams to read."""

    def __init__(self, path: Path, stack: ExitStack, sha256: str | None) -> None:
        self.path = path
        self.archive_sha256: str | None = None
        self._zip: zipfile.ZipFile | None = None
        self._tar: tarfile.TarFile | None = None
        self._files: dict[str, Any] = {}
        if path.is_dir():
            if sha256 is not None:
                raise InvalidParameterError(
                    f"dataset.sha256: {path} is a folder; sha256 verifies an archive file"
                )
            for file in sorted(path.rglob("*.txt")):
                self._files[file.relative_to(path).as_posix()] = file
            return
        if not path.is_file():
            raise InvalidParameterError(f"dataset.path: {path} does not exist")
        fh = stack.enter_context(path.open("rb"))
        # Hash and read the same open file, so what was verified is what gets parsed.
        self.archive_sha256 = _sha256_stream(fh)
        if sha256 is not None and self.archive_sha256 != sha256.lower():
            raise DataValidationError(
                f"{path}: SHA-256 mismatch: expected {sha256.lower()}, got {self.archive_sha256}"
            )
        fh.seek(0)
        magic = fh.read(6)
        fh.seek(0)
        if magic == b"7z\xbc\xaf\x27\x1c":
            raise DataValidationError(
                f"{path}: 7z archives are not supported; extract it and set dataset.path to "
                "the folder"
            )
        members: dict[str, zipfile.ZipInfo | tarfile.TarInfo]
        try:
            if zipfile.is_zipfile(fh):
                fh.seek(0)
                self._zip = stack.enter_context(zipfile.ZipFile(fh))
                members = {i.filename: i for i in self._zip.infolist() if not i.is_dir()}
            else:
                fh.seek(0)
                tar = tarfile.open(fileobj=fh, mode="r:*")  # noqa: SIM115 - closed by the stack
                self._tar = stack.enter_context(tar)
                members = {m.name: m for m in self._tar.getmembers() if not m.isdir()}
        except (tarfile.TarError, zipfile.BadZipFile, OSError, EOFError) as exc:
            raise DataValidationError(
                f"{path}: not a readable zip or tar archive (truncated or corrupted?): "
                f"{_brief(exc)}"
            ) from exc
        for name, member in members.items():
            pure = PurePosixPath(name.replace("\\", "/"))
            if pure.is_absolute() or ".." in pure.parts or re.match(r"[A-Za-z]:", name):
                raise DataValidationError(
                    f"{path}: member {name!r} points outside the archive (path traversal); "
                    "refusing the archive"
                )
            self._files[pure.as_posix()] = member

    def find(self, basename: str) -> list[str]:
        return [
            name
            for name in self._files
            if _basename(name) == basename or _basename(name).endswith("_" + basename)
            if not _basename(name).startswith("._") and not name.startswith("__MACOSX/")
        ]

    def find_exact(self, basename: str) -> list[str]:
        return [n for n in self.find(basename) if _basename(n) == basename]

    def where(self, name: str) -> str:
        """How messages name a file: ``folder/name``, or ``archive[member]``."""
        if self._zip is None and self._tar is None:
            return str(self.path / name)
        return f"{self.path}[{name}]"

    def open(self, name: str, stack: ExitStack) -> IO[bytes]:
        entry = self._files[name]
        if self._zip is not None:
            return stack.enter_context(self._zip.open(entry))
        if self._tar is not None:
            if not entry.isfile():
                raise DataValidationError(
                    f"{self.where(name)}: not a regular file (a link or device); refusing it"
                )
            stream = self._tar.extractfile(entry)
            assert stream is not None  # a regular file always has a stream
            return stack.enter_context(stream)
        return stack.enter_context(Path(entry).open("rb"))


def _basename(name: str) -> str:
    return name.rsplit("/", 1)[-1]


def _sha256_stream(fh: IO[bytes]) -> str:
    hasher = hashlib.sha256()
    while chunk := fh.read(1 << 20):
        hasher.update(chunk)
    return hasher.hexdigest()


def _choose(source: _Source, fmt: XCFormat) -> tuple[Literal["legacy", "split"], dict[str, str]]:
    """The format and the file of each role (``train``, ``test``, or ``train_X``…)."""

    def one(candidates: list[str], role: str) -> str | None:
        if len(candidates) > 1:
            raise DataValidationError(
                f"{source.path}: several candidates for the {role} file: "
                f"{', '.join(sorted(candidates))}; point dataset.path at one copy"
            )
        return candidates[0] if candidates else None

    legacy = {role: one(source.find(f"{role}.txt"), role) for role in ("train", "test")}
    split = {
        f"{split}_{part}": one(source.find_exact(name), name)
        for split, names in SPLIT_FILES.items()
        for part, name in zip(("X", "Y"), names, strict=True)
    }
    has_legacy = all(legacy.values())
    has_split = all(split.values())
    if fmt == "auto":
        if has_legacy and has_split:
            raise DataValidationError(
                f"{source.path}: holds both legacy (train.txt/test.txt) and split "
                "(trn_X_Xf.txt, ...) files; set dataset.format to 'legacy' or 'split'"
            )
        fmt = "legacy" if has_legacy else "split" if has_split else "auto"
    if fmt == "legacy" and has_legacy:
        return "legacy", {k: v for k, v in legacy.items() if v}
    if fmt == "split" and has_split:
        return "split", {k: v for k, v in split.items() if v}
    wanted = {
        "legacy": "train.txt and test.txt",
        "split": "trn_X_Xf.txt, trn_X_Y.txt, tst_X_Xf.txt and tst_X_Y.txt",
        "auto": "train.txt and test.txt (legacy format) or trn_X_Xf.txt, trn_X_Y.txt, "
        "tst_X_Xf.txt and tst_X_Y.txt (split format)",
    }[fmt]
    raise DataValidationError(f"{source.path}: no XC data found; expected {wanted}")


# --- decoding a whole copy ----------------------------------------------------------------------


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
        source = _Source(path, stack, sha256)
        fmt, roles = _choose(source, fmt)
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
        _csr(
            cast(np.ndarray, x.feat_counts),
            cast(np.ndarray, x.feat_ids),
            x.feat_vals,
            (x.rows, num_features),
        )
        for x, _ in pairs
    ]
    labels = [
        _csr(
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
            split: _split_stats(f, y)
            for split, f, y in zip(("train", "test"), feats, labels, strict=True)
        },
        "source": {
            "path": str(path),
            "archive_sha256": source.archive_sha256,
            "files": members,
        },
    }
    return Decoded(features, indicator, feats[0].shape[0], meta)


def _split_stats(features: sp.csr_matrix, labels: sp.csr_matrix) -> dict[str, Any]:
    per_row = np.diff(labels.indptr)
    return {
        "rows": int(features.shape[0]),
        "feature_nnz": int(features.nnz),
        "label_nnz": int(labels.nnz),
        "rows_without_labels": int((per_row == 0).sum()),
        "labels_used": int(np.unique(labels.indices).size),
    }


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
        dest = Path(dest)
        written: list[Path] = []
        try:
            for file, matrix in ((FEATURES, decoded.features), (LABELS, decoded.labels)):
                with atomic_path(dest / file) as tmp, tmp.open("wb") as fh:
                    sp.save_npz(fh, matrix, compressed=True)
                written.append(dest / file)
            write_json(dest / META, meta)  # last: its presence marks a complete fetch
        except BaseException:
            for done in written:
                done.unlink(missing_ok=True)
            raise

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
                f"{raw_dir}: unreadable decoded XC data ({_brief(exc)})"
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
            )
        rows, y, original, new_splits = to_single_label(labels, splits)
        if rows.size == 0:
            raise DataValidationError(f"{raw_dir}: no row has a label; nothing to classify")
        inputs = sp.csr_matrix(features[rows])
        inputs.sort_indices()
        return RawData(
            inputs=inputs,
            labels=y,
            label_names=[str(i) for i in original],
            modality="sparse",
            splits=new_splits,
        )


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
