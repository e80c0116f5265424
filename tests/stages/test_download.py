"""Verified, resumable downloads (tailkit.storage.download) against a local HTTP server in a thread.

The server speaks the parts of HTTP the downloader relies on: ``Range: bytes=N-`` answered with
``206`` and ``Content-Range`` (or ignored, answering ``200``), ``416`` past the end, and a
transfer cut short after a given number of bytes, as a dropped connection does.

The ``download`` stage's own concurrency (two ``tailkit download`` runs in one project) is tested
at the end with a dataset that writes files locally.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import re
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import SimpleNamespace

import pytest

from tailkit.errors import DataValidationError
from tailkit.paths import Layout
from tailkit.stages import download as download_stage
from tailkit.storage.download import CACHE_ENV, download_cache, fetch_url, parse_hash, verify_file

PAYLOAD = bytes(range(256)) * 40 + b"tail"  # 10,244 bytes, so cuts land mid-file
SHA = "sha256:" + hashlib.sha256(PAYLOAD).hexdigest()
MD5 = "md5:" + hashlib.md5(PAYLOAD).hexdigest()


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.payload = PAYLOAD
        self.ignore_range = False
        self.cut: int | None = None  # send only this many body bytes, once
        self.ranges: list[str | None] = []  # the Range header of every request, in order

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/files/blob.bin"


class Handler(BaseHTTPRequestHandler):
    server: Server

    def do_GET(self) -> None:
        srv = self.server
        asked = self.headers.get("Range")
        srv.ranges.append(asked)
        if self.path != "/files/blob.bin":
            self.send_error(404)
            return
        data, start = srv.payload, 0
        if asked and not srv.ignore_range:
            start = int(re.fullmatch(r"bytes=(\d+)-", asked).group(1))
            if start >= len(data):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(data)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            self.send_response(200)
        body = data[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if srv.cut is not None:
            body, srv.cut = body[: srv.cut], None
            self.close_connection = True
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:  # keep the test output quiet
        pass


@pytest.fixture
def server() -> Iterator[Server]:
    srv = Server()
    thread = threading.Thread(target=srv.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        thread.join()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cache"
    monkeypatch.setenv(CACHE_ENV, str(path))
    return path


def _partial(cache: Path, known_hash: str = SHA) -> Path:
    alg, hexdigest = parse_hash(known_hash)
    return cache / f"{alg}-{hexdigest}.part"


def test_full_download_is_verified_and_cached(server: Server, cache: Path, tmp_path: Path):
    dest = tmp_path / "dest"
    path = fetch_url(server.url, SHA, dest)
    assert path == dest / "blob.bin" and path.read_bytes() == PAYLOAD
    assert server.ranges == [None]
    assert sorted(p.name for p in dest.iterdir()) == ["blob.bin"]  # no temporary left behind
    assert not _partial(cache).exists()
    # A verified file in place is not downloaded again; md5 pins work the same way.
    assert fetch_url(server.url, MD5, dest) == path
    assert server.ranges == [None]


def test_cache_location_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "x"))
    assert download_cache() == tmp_path / "x"
    monkeypatch.delenv(CACHE_ENV)
    assert download_cache().parts[-2:] == ("tailkit", "downloads")


def test_interrupted_download_resumes_with_a_range_request(
    server: Server, cache: Path, tmp_path: Path
):
    dest = tmp_path / "dest"
    server.cut = 3000
    with pytest.raises(DataValidationError) as info:
        fetch_url(server.url, SHA, dest, "blob.bin")
    message = str(info.value)
    assert server.url in message and f"after 3000 of {len(PAYLOAD)} bytes" in message
    assert "resume" in message and "\n" not in message
    # Nothing unverified at the destination; the bytes received wait in the cache.
    assert not dest.exists() or list(dest.iterdir()) == []
    assert _partial(cache).read_bytes() == PAYLOAD[:3000]

    path = fetch_url(server.url, SHA, dest, "blob.bin")
    assert server.ranges == [None, "bytes=3000-"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == parse_hash(SHA)[1]
    assert not _partial(cache).exists()


def test_server_ignoring_range_restarts_from_zero(server: Server, cache: Path, tmp_path: Path):
    cache.mkdir()
    stale = b"stale bytes that a 200 answer must overwrite"
    _partial(cache).write_bytes(stale)
    server.ignore_range = True
    path = fetch_url(server.url, SHA, tmp_path / "dest")
    assert server.ranges == [f"bytes={len(stale)}-"]
    assert path.read_bytes() == PAYLOAD


def test_complete_partial_is_finished_without_a_body(server: Server, cache: Path, tmp_path: Path):
    """A crash between the last byte and the hand-over leaves a whole partial: 416 says so."""
    cache.mkdir()
    _partial(cache).write_bytes(PAYLOAD)
    path = fetch_url(server.url, SHA, tmp_path / "dest")
    assert server.ranges == [f"bytes={len(PAYLOAD)}-"]
    assert path.read_bytes() == PAYLOAD


def test_overlong_partial_restarts(server: Server, cache: Path, tmp_path: Path):
    cache.mkdir()
    _partial(cache).write_bytes(PAYLOAD + b"garbage")
    path = fetch_url(server.url, SHA, tmp_path / "dest")
    assert server.ranges == [f"bytes={len(PAYLOAD) + 7}-", None]
    assert path.read_bytes() == PAYLOAD


def test_wrong_hash_leaves_no_file(server: Server, cache: Path, tmp_path: Path):
    dest = tmp_path / "dest"
    wrong = "sha256:" + "0" * 64
    with pytest.raises(DataValidationError) as info:
        fetch_url(server.url, wrong, dest, "blob.bin")
    message = str(info.value)
    assert server.url in message and "blob.bin" in message
    assert "0" * 64 in message and parse_hash(SHA)[1] in message
    assert "\n" not in message
    assert not (dest / "blob.bin").exists() and list(dest.iterdir()) == []
    # A wrong download is not kept for a resume: it cannot be repaired by appending.
    assert not _partial(cache, wrong).exists()


def test_wrong_hash_after_resume_discards_the_partial(server: Server, cache: Path, tmp_path: Path):
    """A corrupted partial (here: its first bytes) is found at the end and thrown away."""
    cache.mkdir()
    _partial(cache).write_bytes(b"X" * 100)
    with pytest.raises(DataValidationError, match="mismatch"):
        fetch_url(server.url, SHA, tmp_path / "dest")
    assert server.ranges == ["bytes=100-"]
    assert not _partial(cache).exists() and not (tmp_path / "dest" / "blob.bin").exists()
    assert fetch_url(server.url, SHA, tmp_path / "dest").read_bytes() == PAYLOAD


def test_stale_file_at_destination_is_replaced(server: Server, cache: Path, tmp_path: Path):
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "blob.bin").write_bytes(b"tampered")
    assert fetch_url(server.url, SHA, dest).read_bytes() == PAYLOAD
    (dest / "blob.bin").write_bytes(b"tampered")
    server.cut = 10
    with pytest.raises(DataValidationError, match="interrupted"):
        fetch_url(server.url, SHA, dest)
    assert not (dest / "blob.bin").exists()  # the unverified file did not survive


def test_http_error_names_the_url(server: Server, cache: Path, tmp_path: Path):
    url = server.url.replace("blob.bin", "missing.bin")
    with pytest.raises(DataValidationError, match=r"missing\.bin: HTTP 404"):
        fetch_url(url, SHA, tmp_path / "dest")
    assert not (tmp_path / "dest" / "missing.bin").exists()


def test_unreachable_server(cache: Path, tmp_path: Path):
    srv = Server()  # bound, never serving, then closed: the port refuses connections
    url = srv.url
    srv.server_close()
    with pytest.raises(DataValidationError, match="cannot download"):
        fetch_url(url, SHA, tmp_path / "dest", timeout=5)


def test_concurrent_download_is_refused(server: Server, cache: Path, tmp_path: Path):
    fcntl = pytest.importorskip("fcntl")
    cache.mkdir()
    lock = _partial(cache).with_name(_partial(cache).name + ".lock")
    with open(lock, "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        with pytest.raises(DataValidationError, match="another process"):
            fetch_url(server.url, SHA, tmp_path / "dest")
    assert fetch_url(server.url, SHA, tmp_path / "dest").read_bytes() == PAYLOAD


def test_progress_bar_only_on_a_terminal(
    server: Server, cache: Path, tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch
):
    bar = re.compile(r"blob\.bin: +\d+%\|")  # tqdm's "desc: NN%|####|"
    fetch_url(server.url, SHA, tmp_path / "a", progress=True)
    assert not bar.search(capsys.readouterr().err)  # captured stderr is not a TTY
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    fetch_url(server.url, SHA, tmp_path / "b", progress=False)
    assert not bar.search(capsys.readouterr().err)
    fetch_url(server.url, SHA, tmp_path / "c", progress=True)
    assert bar.search(capsys.readouterr().err)


def test_verify_file(tmp_path: Path):
    path = tmp_path / "archive.tar.gz"
    path.write_bytes(PAYLOAD)
    assert verify_file(path, MD5) == path
    assert verify_file(path, SHA.upper().replace("SHA256", "sha256")) == path
    wrong = "md5:" + "f" * 32
    with pytest.raises(DataValidationError) as info:
        verify_file(path, wrong)
    message = str(info.value)
    assert str(path) in message and "f" * 32 in message and MD5[4:] in message
    assert "\n" not in message
    with pytest.raises(DataValidationError, match="not found"):
        verify_file(tmp_path / "absent.tar.gz", MD5)
    with pytest.raises(DataValidationError, match="not found"):
        verify_file(tmp_path, MD5)  # a directory


@pytest.mark.parametrize("pin", ["abc", "md5:xyz", "sha1:" + "0" * 40, "md5:" + "0" * 64])
def test_malformed_pins_are_refused(pin: str, tmp_path: Path):
    with pytest.raises(ValueError, match="expected 'md5"):
        verify_file(tmp_path, pin)


FILES = 200  # per fetch: enough that replacing data/raw takes a while


class _SlowDataset:
    """Writes FILES files, then waits (up to a second) for a second fetch to start.

    Two fetches at once is what the stage's lock must prevent; without it both runs get here
    together, then replace data/raw at the same moment, as two racing downloads did (issue 19).
    """

    def __init__(self, shared) -> None:
        self.shared = shared

    def fetch(self, dest: Path) -> None:
        active, peak, calls = self.shared
        with calls.get_lock():
            calls.value += 1
            active.value += 1
            peak.value = max(peak.value, active.value)
        for i in range(FILES):
            (dest / f"{i}.txt").write_text(str(os.getpid()))
        deadline = time.monotonic() + 1.0
        while calls.value < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        with calls.get_lock():
            active.value -= 1


class _Registry:
    def __init__(self, shared) -> None:
        self.shared = shared

    def build(self, kind: str, spec: dict, key: str) -> _SlowDataset:
        return _SlowDataset(self.shared)


def _download(root: Path, spec: dict, shared) -> None:
    download_stage.run(SimpleNamespace(dataset=spec), Layout(root), _Registry(shared))


def _shared(context):
    return tuple(context.Value("i", 0) for _ in range(3))  # active, peak, calls


@pytest.mark.skipif(os.name == "nt", reason="fork")
def test_concurrent_download_stages_take_turns_and_reuse_the_result(tmp_path: Path, capfd):
    context = multiprocessing.get_context("fork")
    spec = {"name": "slow", "version": 2}
    # An earlier download (other params) with many files: replacing it is what used to race.
    old = tmp_path / "data" / "raw" / "slow"
    old.mkdir(parents=True)
    for i in range(2000):
        (old / f"old-{i}.txt").write_text("old")
    shared = _shared(context)
    runs = [context.Process(target=_download, args=(tmp_path, spec, shared)) for _ in range(2)]
    for p in runs:
        p.start()
    for p in runs:
        p.join(60)
    _active, peak, calls = shared
    assert [p.exitcode for p in runs] == [0, 0]
    assert peak.value == 1  # never two fetches at once
    assert calls.value == 1  # the second run kept what the first published while it waited
    raw = tmp_path / "data" / "raw"
    assert sorted(p.name for p in raw.iterdir()) == ["dataset.json", "slow"]
    assert len(list((raw / "slow").iterdir())) == FILES
    assert json.loads((raw / "dataset.json").read_text()) == spec
    # Beside data/raw, not in it (data/ is git-ignored); no temporary left behind.
    assert sorted(p.name for p in raw.parent.iterdir()) == [".raw.lock", "raw"]
    assert "another process is writing" in capfd.readouterr().err


def test_download_stage_fetches_again_when_nobody_else_is_writing(tmp_path: Path):
    """An existing data/raw with the same params is not reused: DVC re-runs the stage when the
    dataset's code changed, and only a fetch brings that change in."""
    context = multiprocessing.get_context()
    shared = _shared(context)
    spec = {"name": "slow", "version": 1}
    _download(tmp_path, spec, shared)
    _download(tmp_path, spec, shared)
    assert shared[2].value == 2
