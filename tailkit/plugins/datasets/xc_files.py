"""Finding the files of an Extreme Classification Repository copy and detecting its format.

A copy is a zip or tar archive (``.zip``, ``.tar.gz``, ``.tar.bz2``) or a folder holding the
extracted files. An archive is verified (``sha256``) and its members are read straight out of
it (no extraction to disk, so no member name is ever used as a path). The format is ``legacy``
(``train.txt`` / ``test.txt``, or ``<name>_train.txt``), ``split`` (``trn_X_Xf.txt``,
``trn_X_Y.txt``, ``tst_X_Xf.txt``, ``tst_X_Y.txt``) or ``auto``: whichever set of files is
there (:mod:`tailkit.plugins.datasets.xc_format` describes both).
"""

from __future__ import annotations

import hashlib
import re
import tarfile
import zipfile
from contextlib import ExitStack
from pathlib import Path, PurePosixPath
from typing import IO, Any, Literal

from tailkit.errors import DataValidationError, InvalidParameterError
from tailkit.plugins.datasets.xc_format import brief

XCFormat = Literal["auto", "legacy", "split"]

SPLIT_FILES = {
    "train": ("trn_X_Xf.txt", "trn_X_Y.txt"),
    "test": ("tst_X_Xf.txt", "tst_X_Y.txt"),
}


# --- finding the files ------------------------------------------------------------------------


class Source:
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
                f"{path}: not a readable zip or tar archive (truncated or corrupted?): {brief(exc)}"
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


def choose(source: Source, fmt: XCFormat) -> tuple[Literal["legacy", "split"], dict[str, str]]:
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
