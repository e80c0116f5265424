"""Verified downloads: a file reaches its destination only once its checksum matches.

:func:`fetch_url` wraps :func:`pooch.retrieve` with a downloader of our own, because a dataset
archive is large (CIFAR: 170 MB) and a dropped connection should not cost the bytes already
received:

* the transfer goes to a *partial* file in the download cache, named by the expected hash
  (``<alg>-<hex>.part``), never to the destination. The cache is ``$TAILKIT_DOWNLOAD_CACHE``
  or, without it, ``<user cache>/tailkit/downloads`` (``~/.cache/tailkit/downloads`` on Linux);
* a later call that finds a partial asks the server for the rest with an HTTP ``Range:
  bytes=<size>-`` request and appends the ``206 Partial Content`` answer; a server that ignores
  the Range header (``200 OK``) restarts the transfer from byte zero;
* only a complete transfer whose hash matches is handed to pooch, which checks the hash once
  more and moves the file into place; a mismatch deletes the partial (a resume cannot repair
  wrong bytes) and raises :class:`~tailkit.errors.DataValidationError`;
* an interrupted transfer keeps the partial and raises a DataValidationError that says so.

Hashes are written as pooch writes them, ``"md5:<hex>"`` or ``"sha256:<hex>"``; they are
computed with :func:`pooch.file_hash`. :func:`verify_file` checks a file the user supplied
(e.g. an archive copied onto an offline machine) against the same pin.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from http.client import HTTPException
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pooch
from tqdm import tqdm

from tailkit.errors import DataValidationError

CACHE_ENV = "TAILKIT_DOWNLOAD_CACHE"
CHUNK = 1 << 20
# Hex digest lengths of the algorithms a pin may use.
_HEX_LENGTH = {"md5": 32, "sha256": 64}
_CONTENT_RANGE = re.compile(r"bytes\s+(\d+)-(\d+)/(\d+|\*)")


def download_cache() -> Path:
    """Where partial (and cached, verified) downloads live, outside any DVC output."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path(pooch.os_cache("tailkit")) / "downloads"


def parse_hash(known_hash: str) -> tuple[str, str]:
    """``"md5:<hex>"`` → ``("md5", "<hex>")``; a malformed pin is a bug in the caller."""
    alg, sep, hexdigest = known_hash.partition(":")
    alg, hexdigest = alg.lower(), hexdigest.lower()
    if (
        not sep
        or alg not in _HEX_LENGTH
        or len(hexdigest) != _HEX_LENGTH[alg]
        or not re.fullmatch(r"[0-9a-f]+", hexdigest)
    ):
        raise ValueError(
            f"hash {known_hash!r}: expected 'md5:<32 hex digits>' or 'sha256:<64 hex digits>'"
        )
    return alg, hexdigest


def verify_file(path: str | Path, known_hash: str) -> Path:
    """Check that ``path`` has ``known_hash``; return the path, else raise a one-line error."""
    path = Path(path)
    alg, expected = parse_hash(known_hash)
    if not path.is_file():
        raise DataValidationError(f"{path}: not found (or not a regular file)")
    try:
        actual = pooch.file_hash(str(path), alg=alg)
    except OSError as exc:
        raise DataValidationError(f"{path}: cannot read ({exc.strerror})") from exc
    if actual != expected:
        raise DataValidationError(
            f"{path}: {alg.upper()} mismatch: expected {expected}, got {actual}; "
            "this is not the file the dataset is pinned to"
        )
    return path


def fetch_url(
    url: str,
    known_hash: str,
    dest_dir: str | Path,
    filename: str | None = None,
    *,
    progress: bool = False,
    timeout: float = 60.0,
) -> Path:
    """Download ``url`` to ``dest_dir/filename`` unless a file with ``known_hash`` is there.

    Resumes from a partial in :func:`download_cache` (see the module docstring). ``progress``
    shows a progress bar, and only when stderr is a terminal (never in logs or under DVC's
    captured output). Returns the verified file's path.
    """
    alg, expected = parse_hash(known_hash)
    dest_dir = Path(dest_dir)
    filename = filename or Path(unquote(urlsplit(url).path)).name
    if not filename:
        raise ValueError(f"{url}: cannot name the downloaded file; pass filename")
    target = dest_dir / filename
    if target.is_file() and pooch.file_hash(str(target), alg=alg) == expected:
        return target
    # pooch would keep a stale file with the wrong hash in place until its download succeeds.
    target.unlink(missing_ok=True)
    partial = download_cache() / f"{alg}-{expected}.part"
    downloader = ResumingDownloader(
        alg, expected, partial, progress=progress, timeout=timeout, label=filename
    )
    path = pooch.retrieve(
        url, f"{alg}:{expected}", fname=filename, path=dest_dir, downloader=downloader
    )
    return Path(path)


class ResumingDownloader:
    """A pooch downloader that resumes into ``partial`` and hands over only verified bytes.

    pooch calls it with a temporary ``output_file`` next to the destination; the bytes move
    there only after the transfer completed and its hash matched.
    """

    def __init__(
        self,
        alg: str,
        expected: str,
        partial: Path,
        *,
        progress: bool = False,
        timeout: float = 60.0,
        label: str = "",
    ) -> None:
        self.alg, self.expected, self.partial = alg, expected, Path(partial)
        self.progress, self.timeout, self.label = progress, timeout, label

    def __call__(
        self, url: str, output_file: str, pooch_: object, check_only: bool = False
    ) -> bool | None:
        if check_only:  # Pooch.is_available asks this; we are only ever used to download
            return True
        self.partial.parent.mkdir(parents=True, exist_ok=True)
        with _exclusive(self.partial.with_name(self.partial.name + ".lock"), url):
            self._transfer(url)
            actual = pooch.file_hash(str(self.partial), alg=self.alg)
            if actual != self.expected:
                self.partial.unlink(missing_ok=True)
                raise DataValidationError(
                    f"{url}: {self.alg.upper()} mismatch for {self.label or self.partial.name}: "
                    f"expected {self.expected}, got {actual}; the download was discarded"
                )
            shutil.move(self.partial, output_file)
        return None

    def _transfer(self, url: str) -> None:
        """Bring the partial up to the whole file, resuming once and restarting at most once."""
        for _attempt in range(2):
            offset = self.partial.stat().st_size if self.partial.exists() else 0
            headers = {"Accept-Encoding": "identity", "User-Agent": "tailkit"}
            if offset:
                headers["Range"] = f"bytes={offset}-"
            request = urllib.request.Request(url, headers=headers)
            try:
                response = urllib.request.urlopen(request, timeout=self.timeout)
            except urllib.error.HTTPError as exc:
                exc.close()
                if exc.code == 416 and offset:
                    # The partial is as long as the file or longer: done, or garbage.
                    total = _content_range_total(exc.headers.get("Content-Range", ""))
                    if total == offset:
                        return
                    self.partial.unlink()
                    continue
                raise DataValidationError(f"{url}: HTTP {exc.code} {exc.reason}") from exc
            except (urllib.error.URLError, HTTPException, OSError) as exc:
                reason = getattr(exc, "reason", None) or exc
                raise DataValidationError(f"{url}: cannot download ({reason})") from exc
            with response:
                if response.status == 206 and offset:
                    start, total = _content_range(response.headers.get("Content-Range", ""))
                    if start != offset:  # not the range we asked for: start over
                        self.partial.unlink()
                        continue
                    mode = "ab"
                elif response.status == 200:
                    offset, mode, total = 0, "wb", None
                else:
                    raise DataValidationError(
                        f"{url}: unexpected HTTP {response.status} {response.reason}"
                    )
                length = response.headers.get("Content-Length")
                if total is None and length is not None and length.isdigit():
                    total = offset + int(length)
                self._copy(url, response, mode, offset, total)
            return
        raise DataValidationError(f"{url}: the server does not honour a restart from byte zero")

    def _copy(self, url: str, response, mode: str, offset: int, total: int | None) -> None:
        received = offset
        show = self.progress and sys.stderr.isatty()
        try:
            with (
                open(self.partial, mode) as out,
                tqdm(
                    total=total,
                    initial=offset,
                    unit="B",
                    unit_scale=True,
                    unit_divisor=1024,
                    desc=self.label,
                    disable=not show,
                    file=sys.stderr,
                ) as bar,
            ):
                while chunk := response.read(CHUNK):
                    out.write(chunk)
                    received += len(chunk)
                    bar.update(len(chunk))
        except (HTTPException, OSError) as exc:  # IncompleteRead, a reset, a timeout
            raise DataValidationError(
                f"{url}: download interrupted after {received} of {total or '?'} bytes "
                f"({type(exc).__name__}); run again to resume from {self.partial}"
            ) from exc
        if total is not None and received != total:
            raise DataValidationError(
                f"{url}: download interrupted after {received} of {total} bytes; "
                f"run again to resume from {self.partial}"
            )


def _content_range(value: str) -> tuple[int | None, int | None]:
    """``bytes 100-199/200`` → (100, 200); anything unparseable → (None, None)."""
    match = _CONTENT_RANGE.fullmatch(value.strip())
    if not match:
        return None, None
    total = match.group(3)
    return int(match.group(1)), (None if total == "*" else int(total))


def _content_range_total(value: str) -> int | None:
    """The total of a 416 answer's ``bytes */200``."""
    match = re.fullmatch(r"bytes\s+\*/(\d+)", value.strip())
    return int(match.group(1)) if match else None


@contextlib.contextmanager
def _exclusive(lock_path: Path, url: str) -> Iterator[None]:
    """Refuse a second process appending to the same partial at the same time."""
    try:
        import fcntl
    except ImportError:  # Windows: no advisory locks; concurrent downloads are the user's call
        yield
        return
    with open(lock_path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            raise DataValidationError(
                f"{url}: another process is downloading it into {lock_path.parent}; "
                "wait for it to finish"
            ) from exc
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
