"""CIFAR-10/100: few-row archives in the exact official format, and the traps around them.

The batches are written the way the real files were: Python 2 pickles (protocol 2) whose
strings are Python 2 ``str`` (``SHORT_BINSTRING``/``BINSTRING`` opcodes, read back as bytes
with ``encoding="bytes"``) and whose arrays name ``numpy.core.multiarray._reconstruct``, inside
a .tar.gz with the official folder and member names. Only the row counts are shrunk (by
patching ``EXPECTED_ROWS``) and the md5 pin is pointed at the test archive.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import json
import os
import pickle
import struct
import tarfile
import threading
from collections.abc import Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest

from tailkit.components import Dataset
from tailkit.errors import DataValidationError, InvalidParameterError
from tailkit.params import SubsampleParams
from tailkit.pipeline.subsampling import profile_quota
from tailkit.plugins.datasets import cifar
from tailkit.plugins.datasets.cifar import ARCHIVES, Cifar10, Cifar100
from tailkit.storage.download import CACHE_ENV
from tailkit.validation import option_signature, validate_options

_RECONSTRUCT = np.empty(0).__reduce__()[0]
TRAIN_PER_BATCH, TEST_ROWS = 2, 3  # CIFAR-10: 5 batches of 2 training rows, then 3 test rows


class Py2Pickler(pickle._Pickler):
    """Writes what Python 2's cPickle wrote: str/bytes as 8-bit strings, numpy.core globals."""

    dispatch: ClassVar[dict[type, Any]] = dict(pickle._Pickler.dispatch)

    def save_bytes(self, obj: bytes) -> None:
        n = len(obj)
        if n < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([n]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", n) + obj)
        self.memoize(obj)

    def save_str(self, obj: str) -> None:
        self.save_bytes(obj.encode("latin-1"))

    def save_global(self, obj: Any, name: str | None = None) -> None:
        if obj is _RECONSTRUCT:
            self.write(pickle.GLOBAL + b"numpy.core.multiarray\n_reconstruct\n")
            self.memoize(obj)
        else:
            super().save_global(obj, name)

    dispatch[bytes] = save_bytes
    dispatch[str] = save_str
    dispatch[type(_RECONSTRUCT)] = save_global


def py2_pickle(obj: Any) -> bytes:
    buffer = io.BytesIO()
    Py2Pickler(buffer, protocol=2).dump(obj)
    return buffer.getvalue()


def to_rows(images: np.ndarray) -> np.ndarray:
    """(n, 32, 32, 3) → CIFAR rows: the R plane, then G, then B, each 32×32 row-major."""
    return np.concatenate([images[..., c].reshape(len(images), -1) for c in range(3)], axis=1)


def make_images(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(n, 32, 32, 3), dtype=np.uint8)


def batch(images: np.ndarray, labels: dict[bytes, list[int]], name: str) -> bytes:
    return py2_pickle(
        {
            b"batch_label": f"{name} of 5".encode(),
            **labels,
            b"data": to_rows(images),
            b"filenames": [f"img_{i:05d}.png".encode() for i in range(len(images))],
        }
    )


def dir_member(name: str) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    return info, None


def file_member(name: str, data: bytes) -> tuple[tarfile.TarInfo, bytes | None]:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), 0o644
    return info, data


def write_tar(path: Path, members: list[tuple[tarfile.TarInfo, bytes | None]]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, None if data is None else io.BytesIO(data))
    return path


@dataclasses.dataclass
class Fixture:
    members: dict[str, bytes]  # member name → bytes, in archive order (after the folder)
    images: np.ndarray  # all rows, train then test, channels last
    labels: np.ndarray
    names: list[str]
    coarse: np.ndarray | None = None
    coarse_names: list[str] | None = None


CIFAR10_NAMES = [
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
]


def cifar10_fixture() -> Fixture:
    folder = "cifar-10-batches-py"
    n_train = 5 * TRAIN_PER_BATCH
    images = make_images(n_train + TEST_ROWS, seed=0)
    labels = (np.arange(n_train + TEST_ROWS) * 3) % 10
    members = {f"{folder}/readme.html": b"<html>CIFAR-10</html>"}
    for b in range(5):
        rows = slice(b * TRAIN_PER_BATCH, (b + 1) * TRAIN_PER_BATCH)
        members[f"{folder}/data_batch_{b + 1}"] = batch(
            images[rows], {b"labels": labels[rows].tolist()}, f"training batch {b + 1}"
        )
    members[f"{folder}/test_batch"] = batch(
        images[n_train:], {b"labels": labels[n_train:].tolist()}, "testing batch 1"
    )
    members[f"{folder}/batches.meta"] = py2_pickle(
        {
            b"num_cases_per_batch": 10000,
            b"label_names": [n.encode() for n in CIFAR10_NAMES],
            b"num_vis": 3072,
        }
    )
    return Fixture(members, images, labels, CIFAR10_NAMES)


def cifar100_fixture() -> Fixture:
    folder = "cifar-100-python"
    n_train = 5 * TRAIN_PER_BATCH
    images = make_images(n_train + TEST_ROWS, seed=1)
    fine = (np.arange(n_train + TEST_ROWS) * 37) % 100
    coarse = fine % 20
    names = [f"fine_{i:02d}" for i in range(100)]
    coarse_names = [f"super_{i:02d}" for i in range(20)]
    members = {f"{folder}/file.txt~": b""}
    for split, rows in (("train", slice(0, n_train)), ("test", slice(n_train, None))):
        members[f"{folder}/{split}"] = batch(
            images[rows],
            {b"fine_labels": fine[rows].tolist(), b"coarse_labels": coarse[rows].tolist()},
            split,
        )
    members[f"{folder}/meta"] = py2_pickle(
        {
            b"fine_label_names": [n.encode() for n in names],
            b"coarse_label_names": [n.encode() for n in coarse_names],
        }
    )
    return Fixture(members, images, fine, names, coarse, coarse_names)


def build(path: Path, fixture: Fixture, folder: str) -> Path:
    return write_tar(
        path, [dir_member(folder)] + [file_member(n, d) for n, d in fixture.members.items()]
    )


def md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.fixture(autouse=True)
def few_rows(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(cifar, "EXPECTED_ROWS", {"train": 5 * TRAIN_PER_BATCH, "test": TEST_ROWS})
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "download-cache"))


def pin(monkeypatch: pytest.MonkeyPatch, name: str, archive: Path) -> None:
    """Point the dataset's md5 pin at ``archive`` (the real pin is for the real archive)."""
    monkeypatch.setitem(ARCHIVES, name, dataclasses.replace(ARCHIVES[name], md5=md5(archive)))


def fetch_fails(ds: Any, dest: Path, match: str) -> str:
    """``ds.fetch(dest)`` raises a one-line DataValidationError and writes nothing to dest."""
    dest.mkdir(exist_ok=True)
    with pytest.raises(DataValidationError, match=match) as info:
        ds.fetch(dest)
    assert "\n" not in str(info.value)
    assert list(dest.iterdir()) == []
    return str(info.value)


# --- the real format round-trips -------------------------------------------------------------


def test_cifar10_round_trip_to_the_exact_pixels(tmp_path: Path, monkeypatch) -> None:
    fixture = cifar10_fixture()
    archive = build(tmp_path / "cifar-10-python.tar.gz", fixture, "cifar-10-batches-py")
    pin(monkeypatch, "cifar10", archive)
    ds = Cifar10(path=str(archive))
    dest = tmp_path / "raw"
    ds.fetch(dest)
    assert sorted(p.name for p in dest.iterdir()) == ["images.npy", "labels.npy", "meta.json"]

    raw = ds.load(dest)
    assert raw.modality == "image" and not raw.multilabel
    assert raw.inputs.dtype == np.uint8 and raw.inputs.shape == (13, 32, 32, 3)
    np.testing.assert_array_equal(raw.inputs, fixture.images)
    # One pixel by hand: row value 1024·c + 32·y + x is channel c of pixel (y, x).
    row = to_rows(fixture.images[:1])[0]
    assert raw.inputs[0, 1, 2, 0] == row[32 + 2]
    assert raw.inputs[0, 1, 2, 1] == row[1024 + 32 + 2]
    assert raw.inputs[0, 31, 31, 2] == row[3071]
    assert raw.labels.dtype == np.int64
    np.testing.assert_array_equal(raw.labels, fixture.labels)
    assert raw.label_names == CIFAR10_NAMES
    assert raw.splits is not None and set(raw.splits) == {"train", "test"}
    assert raw.splits["train"].tolist() == list(range(10))
    assert raw.splits["test"].tolist() == [10, 11, 12]
    assert raw.splits["train"].dtype == np.int64

    meta = json.loads((dest / "meta.json").read_text())
    assert meta["rows"] == {"train": 10, "test": 3}
    assert meta["archive"] == {"file": archive.name, "md5": md5(archive), "origin": str(archive)}


def test_cifar100_round_trip_keeps_fine_and_coarse_labels(tmp_path: Path, monkeypatch) -> None:
    fixture = cifar100_fixture()
    archive = build(tmp_path / "c100.tar.gz", fixture, "cifar-100-python")
    pin(monkeypatch, "cifar100", archive)
    ds = Cifar100(path=str(archive))
    ds.fetch(tmp_path / "raw")
    raw = ds.load(tmp_path / "raw")
    np.testing.assert_array_equal(raw.inputs, fixture.images)
    np.testing.assert_array_equal(raw.labels, fixture.labels)  # fine labels
    assert raw.label_names == fixture.names and raw.num_classes == 100
    assert raw.splits["test"].tolist() == [10, 11, 12]
    np.testing.assert_array_equal(np.load(tmp_path / "raw" / "coarse_labels.npy"), fixture.coarse)
    meta = json.loads((tmp_path / "raw" / "meta.json").read_text())
    assert meta["coarse_label_names"] == fixture.coarse_names and meta["dataset"] == "cifar100"
    # A CIFAR-100 directory is not CIFAR-10.
    with pytest.raises(DataValidationError, match="holds 'cifar100', not 'cifar10'"):
        Cifar10().load(tmp_path / "raw")


def test_fetch_downloads_the_archive_once(tmp_path: Path, monkeypatch) -> None:
    """Without ``path``, the archive comes over HTTP (a mirror ``url``) into the download cache."""
    served = tmp_path / "served"
    served.mkdir()
    archive = build(served / "cifar-10-python.tar.gz", cifar10_fixture(), "cifar-10-batches-py")
    pin(monkeypatch, "cifar10", archive)
    handler = functools.partial(SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *args: None  # type: ignore[attr-defined]
    with _serving(handler) as port:
        url = f"http://127.0.0.1:{port}/cifar-10-python.tar.gz"
        ds = Cifar10(url=url)
        ds.fetch(tmp_path / "raw")
    cached = tmp_path / "download-cache" / "cifar-10-python.tar.gz"
    assert cached.read_bytes() == archive.read_bytes()
    assert json.loads((tmp_path / "raw" / "meta.json").read_text())["archive"]["origin"] == url
    # The server is gone: a second fetch (dvc repro wiped data/raw) uses the verified cache.
    ds.fetch(tmp_path / "raw2")
    np.testing.assert_array_equal(
        ds.load(tmp_path / "raw2").inputs, ds.load(tmp_path / "raw").inputs
    )


class _Quiet(ThreadingHTTPServer):
    daemon_threads = True


@contextlib.contextmanager
def _serving(handler: Any) -> Iterator[int]:
    """A local HTTP server in a thread for the duration of the block; yields its port."""
    server = _Quiet(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


# --- checksum and archive damage -------------------------------------------------------------


def test_md5_mismatch_leaves_nothing(tmp_path: Path) -> None:
    """The real pin against a test archive: refused before anything is read or written."""
    archive = build(tmp_path / "cifar-10-python.tar.gz", cifar10_fixture(), "cifar-10-batches-py")
    message = fetch_fails(Cifar10(path=str(archive)), tmp_path / "raw", "MD5 mismatch")
    assert (
        str(archive) in message and ARCHIVES["cifar10"].md5 in message and md5(archive) in message
    )
    assert not (tmp_path / "download-cache").exists()


def test_missing_local_archive(tmp_path: Path) -> None:
    fetch_fails(Cifar10(path=str(tmp_path / "absent.tar.gz")), tmp_path / "raw", "not found")


@pytest.mark.parametrize("damage", ["truncated", "flipped", "not-gzip"])
def test_damaged_archive(tmp_path: Path, monkeypatch, damage: str) -> None:
    archive = build(tmp_path / "a.tar.gz", cifar10_fixture(), "cifar-10-batches-py")
    data = bytearray(archive.read_bytes())
    if damage == "truncated":
        data = data[: len(data) // 2]
    elif damage == "flipped":  # decodes to wrong bytes: only the gzip CRC at the end tells
        for i in range(len(data) // 2, len(data) // 2 + 16):
            data[i] ^= 0x5A
    else:
        data[:2] = b"PK"
    archive.write_bytes(bytes(data))
    pin(monkeypatch, "cifar10", archive)  # the pin matches: only the decoder stands guard
    message = fetch_fails(Cifar10(path=str(archive)), tmp_path / "raw", "not a readable .tar.gz")
    assert str(archive) in message
    assert {"truncated": "EOFError", "flipped": "CRC check failed", "not-gzip": "not a gzip"}[
        damage
    ] in message


# --- members -------------------------------------------------------------------------------


def _with_extra(tmp_path: Path, extra: tuple[tarfile.TarInfo, bytes | None]) -> Path:
    fixture = cifar10_fixture()
    members = [dir_member("cifar-10-batches-py"), extra]
    members += [file_member(n, d) for n, d in fixture.members.items()]
    return write_tar(tmp_path / "evil.tar.gz", members)


@pytest.mark.parametrize(
    "name",
    [
        "../evil",
        "cifar-10-batches-py/../../evil",
        "/tmp/evil",
        "other-folder/data_batch_1",
        "cifar-10-batches-py/sub/../../../evil",
    ],
)
def test_path_traversal_member_is_refused(tmp_path: Path, monkeypatch, name: str) -> None:
    archive = _with_extra(tmp_path, file_member(name, b"pwned"))
    pin(monkeypatch, "cifar10", archive)
    message = fetch_fails(Cifar10(path=str(archive)), tmp_path / "raw", "refusing member")
    assert repr(name) in message
    assert not any(p.name == "evil" for p in tmp_path.rglob("*"))


def test_unexpected_member_is_refused(tmp_path: Path, monkeypatch) -> None:
    archive = _with_extra(tmp_path, file_member("cifar-10-batches-py/run_me.py", b"print()"))
    pin(monkeypatch, "cifar10", archive)
    fetch_fails(Cifar10(path=str(archive)), tmp_path / "raw", "unexpected member")


@pytest.mark.parametrize("kind", [tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE])
def test_link_or_special_member_is_refused(tmp_path: Path, monkeypatch, kind: bytes) -> None:
    info = tarfile.TarInfo("cifar-10-batches-py/readme.html")
    info.type, info.linkname = kind, "/etc/passwd"
    archive = _with_extra(tmp_path, (info, None))
    pin(monkeypatch, "cifar10", archive)
    fetch_fails(Cifar10(path=str(archive)), tmp_path / "raw", "link or special file")


def test_duplicate_member_is_refused(tmp_path: Path, monkeypatch) -> None:
    fixture = cifar10_fixture()
    name = "cifar-10-batches-py/test_batch"
    archive = _with_extra(tmp_path, file_member(name, fixture.members[name]))
    pin(monkeypatch, "cifar10", archive)
    fetch_fails(Cifar10(path=str(archive)), tmp_path / "raw", "appears twice")


# --- the restricted unpickler ---------------------------------------------------------------


class _Payload:
    def __init__(self, func: Any, arg: str) -> None:
        self.func, self.arg = func, arg

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return self.func, (self.arg,)


@pytest.mark.parametrize("func", [os.system, eval, pickle.loads])
def test_pickle_with_a_disallowed_global_is_refused(tmp_path: Path, monkeypatch, func) -> None:
    marker = tmp_path / "pwned"
    if func is os.system:
        arg = f"touch {marker}"
    elif func is eval:
        arg = f"open({str(marker)!r}, 'w').close()"
    else:
        arg = b"garbage"
    fixture = cifar10_fixture()
    fixture.members["cifar-10-batches-py/data_batch_2"] = py2_pickle(
        {b"data": _Payload(func, arg), b"labels": [0, 1]}
    )
    archive = build(tmp_path / "evil.tar.gz", fixture, "cifar-10-batches-py")
    pin(monkeypatch, "cifar10", archive)
    message = fetch_fails(
        Cifar10(path=str(archive)), tmp_path / "raw", "refusing to unpickle global"
    )
    assert "data_batch_2" in message and func.__name__ in message
    assert not marker.exists()


# --- layout checks ------------------------------------------------------------------------


def _mutate(fixture: Fixture, member: str, change: Any) -> None:
    name = f"cifar-10-batches-py/{member}"
    obj = pickle.loads(fixture.members[name], encoding="bytes")
    change(obj)
    fixture.members[name] = py2_pickle(obj)


def _replace(key: bytes, value: Any):
    return lambda obj: obj.__setitem__(key, value)


@pytest.mark.parametrize(
    ("member", "change", "match"),
    [
        ("data_batch_3", lambda o: o.pop(b"labels"), r"data_batch_3: missing key b'labels'"),
        ("data_batch_3", _replace(b"data", np.zeros((2, 3000), np.uint8)), "3000 values"),
        ("data_batch_3", _replace(b"data", np.zeros((2, 3072), np.int32)), "uint8 array"),
        ("data_batch_1", _replace(b"labels", [0, 10]), r"data_batch_1: b'labels' spans \[0, 10\]"),
        ("data_batch_1", _replace(b"labels", [0]), "1 labels for 2 rows"),
        ("data_batch_1", _replace(b"labels", [b"0", b"1"]), "not a list of integers"),
        ("test_batch", _replace(b"data", [1, 2, 3]), "test_batch: b'data' is list"),
        ("batches.meta", _replace(b"label_names", [b"cat"] * 9), "has 9 names; expected 10"),
        ("batches.meta", _replace(b"label_names", [b"cat"] * 10), "repeats a name"),
        ("batches.meta", lambda o: o.pop(b"label_names"), r"batches\.meta: missing key"),
    ],
)
def test_layout_mismatch_names_the_member(
    tmp_path: Path, monkeypatch, member: str, change: Any, match: str
) -> None:
    fixture = cifar10_fixture()
    _mutate(fixture, member, change)
    archive = build(tmp_path / "bad.tar.gz", fixture, "cifar-10-batches-py")
    pin(monkeypatch, "cifar10", archive)
    fetch_fails(Cifar10(path=str(archive)), tmp_path / "raw", match)


def test_not_a_dict_and_not_a_pickle(tmp_path: Path, monkeypatch) -> None:
    fixture = cifar10_fixture()
    fixture.members["cifar-10-batches-py/data_batch_4"] = py2_pickle([1, 2, 3])
    archive = build(tmp_path / "a.tar.gz", fixture, "cifar-10-batches-py")
    pin(monkeypatch, "cifar10", archive)
    fetch_fails(
        Cifar10(path=str(archive)), tmp_path / "raw", "data_batch_4: expected a pickled dict"
    )
    fixture.members["cifar-10-batches-py/data_batch_4"] = b"<html>not a pickle</html>"
    archive = build(tmp_path / "b.tar.gz", fixture, "cifar-10-batches-py")
    pin(monkeypatch, "cifar10", archive)
    fetch_fails(Cifar10(path=str(archive)), tmp_path / "raw", "data_batch_4: not a readable pickle")


def test_missing_member_and_wrong_counts(tmp_path: Path, monkeypatch) -> None:
    fixture = cifar10_fixture()
    del fixture.members["cifar-10-batches-py/test_batch"]
    archive = build(tmp_path / "a.tar.gz", fixture, "cifar-10-batches-py")
    pin(monkeypatch, "cifar10", archive)
    fetch_fails(
        Cifar10(path=str(archive)),
        tmp_path / "raw",
        "member cifar-10-batches-py/test_batch is missing",
    )

    archive = build(tmp_path / "b.tar.gz", cifar10_fixture(), "cifar-10-batches-py")
    pin(monkeypatch, "cifar10", archive)
    monkeypatch.setattr(cifar, "EXPECTED_ROWS", {"train": 50_000, "test": 10_000})
    fetch_fails(
        Cifar10(path=str(archive)),
        tmp_path / "raw",
        r"train members \(data_batch_1, .*data_batch_5\) hold 10 rows; expected 50000",
    )


# --- load, options, and the CIFAR-LT counts -------------------------------------------------


def test_load_without_fetch_and_damaged_outputs(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(
        DataValidationError, match=r"meta\.json: not found; run `dvc repro download`"
    ):
        Cifar10().load(tmp_path)
    archive = build(tmp_path / "a.tar.gz", cifar10_fixture(), "cifar-10-batches-py")
    pin(monkeypatch, "cifar10", archive)
    Cifar10(path=str(archive)).fetch(tmp_path / "raw")
    np.save(tmp_path / "raw" / "labels.npy", np.zeros(12, dtype=np.int64))
    with pytest.raises(DataValidationError, match=r"labels\.npy: int64 of shape \(12,\)"):
        Cifar10().load(tmp_path / "raw")


def test_options() -> None:
    for factory in (Cifar10, Cifar100):
        assert set(option_signature(factory)) == {"path", "url"}
        assert isinstance(factory(), Dataset)
    with pytest.raises(InvalidParameterError, match=r"dataset\.path"):
        validate_options("dataset", Cifar10, {"path": 3})


def test_non_http_url_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidParameterError, match=r"dataset\.url: got 'ftp://x/y\.tar\.gz'"):
        Cifar10(url="ftp://x/y.tar.gz").fetch(tmp_path)


def test_the_pins_are_the_official_ones() -> None:
    """datasets-metrics.md §3.1 (torchvision's pins)."""
    assert ARCHIVES["cifar10"].md5 == "c58f30108f718f92721af3b95e74349a"
    assert ARCHIVES["cifar100"].md5 == "eb9058c3a382ffc7106e4002c42a8d85"
    assert ARCHIVES["cifar10"].url == "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    assert ARCHIVES["cifar100"].filename == "cifar-100-python.tar.gz"


@pytest.mark.parametrize(
    ("per_class", "classes", "profile", "ratio", "total"),
    [
        (5000, 10, "exp", 100, 12_406),
        (5000, 10, "exp", 50, 13_996),
        (5000, 10, "exp", 10, 20_431),
        (5000, 10, "step", 100, 5 * 5000 + 5 * 50),
        (500, 100, "exp", 100, 10_847),
        (500, 100, "exp", 50, 12_608),
        (500, 100, "exp", 10, 19_573),
    ],
)
def test_cifar_lt_train_sizes(per_class, classes, profile, ratio, total) -> None:
    """The LDAM-DRW CIFAR-LT training sizes of datasets-metrics.md §3.1."""
    pool = np.full(classes, per_class)
    quota = profile_quota(pool, SubsampleParams(profile=profile, imbalance_ratio=ratio))
    assert int(quota.sum()) == total
    assert quota[0] == per_class and quota[-1] == per_class // ratio


def test_real_archive_when_available(tmp_path: Path, monkeypatch) -> None:
    """Set TAILKIT_CIFAR10_ARCHIVE to the official tarball to check the real thing."""
    path = os.environ.get("TAILKIT_CIFAR10_ARCHIVE")
    if not path:
        pytest.skip("TAILKIT_CIFAR10_ARCHIVE is not set")
    monkeypatch.setattr(cifar, "EXPECTED_ROWS", {"train": 50_000, "test": 10_000})
    ds = Cifar10(path=path)
    ds.fetch(tmp_path / "raw")
    raw = ds.load(tmp_path / "raw")
    assert raw.inputs.shape == (60_000, 32, 32, 3) and raw.label_names[0] == "airplane"
    assert np.bincount(raw.labels[raw.splits["train"]]).tolist() == [5000] * 10
    assert np.bincount(raw.labels[raw.splits["test"]]).tolist() == [1000] * 10
