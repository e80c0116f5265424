"""CIFAR-10 and CIFAR-100 (Krizhevsky, 2009): the images behind the CIFAR-LT benchmarks.

Source: the official "python version" archives, pinned by the md5s torchvision uses
(datasets-metrics.md §3.1)::

    cifar-10-python.tar.gz   c58f30108f718f92721af3b95e74349a   170,498,071 bytes
        cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta, readme.html}
    cifar-100-python.tar.gz  eb9058c3a382ffc7106e4002c42a8d85   169,001,437 bytes
        cifar-100-python/{train, test, meta, file.txt~}

The archive is downloaded once into the download cache (:func:`tailkit.storage.download.download_cache`,
so that ``dvc repro`` wiping ``data/raw`` does not download 170 MB again), or, on a machine
without internet, read from a local copy given as ``path`` and checked against the same md5.

Each batch is a Python 2 pickle of a dict with bytes keys: ``b"data"`` an (n, 3072) uint8 array,
each row the 1,024 red, then green, then blue values of a 32×32 image in row-major order;
``b"labels"`` (CIFAR-10) or ``b"fine_labels"`` and ``b"coarse_labels"`` (CIFAR-100), lists of
ints; ``b"filenames"`` and ``b"batch_label"``. The label names are ``b"label_names"`` in
``batches.meta`` (CIFAR-10) and ``b"fine_label_names"`` / ``b"coarse_label_names"`` in
``meta`` (CIFAR-100). Members are read from the archive in memory, never extracted to disk (so a
member name cannot write outside ``dest``); a member that is not a regular file under the
dataset folder, or that the archive is not known to hold, is refused. The pickles are read by an
unpickler that resolves only the three numpy globals an array needs.

``fetch`` writes, each file atomically, ``meta.json`` last::

    images.npy          (60000, 32, 32, 3) uint8, RGB, channels last; rows 0..49,999 are the
                        training batches in order, rows 50,000..59,999 the test batch
    labels.npy          (60000,) int64 (CIFAR-100: the 100 fine labels)
    coarse_labels.npy   CIFAR-100 only: (60000,) int64, the 20 superclasses
    meta.json           dataset, label names (CIFAR-100: also coarse_label_names), split
                        sizes, and the archive's name, md5 and origin

``load`` returns them with the official split: ``splits = {"train": 0..49,999, "test":
50,000..59,999}``.
"""

from __future__ import annotations

import json
import pickle
import tarfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, ClassVar, cast

import numpy as np

from tailkit.components import RawData
from tailkit.errors import DataValidationError, InvalidParameterError
from tailkit.progress import enabled as progress_enabled
from tailkit.storage.atomic import atomic_path, write_json
from tailkit.storage.download import download_cache, fetch_url, verify_file

IMAGES, LABELS, COARSE, META = "images.npy", "labels.npy", "coarse_labels.npy", "meta.json"
# Rows each split must have; the tests shrink them to feed a few-row archive in the real format.
EXPECTED_ROWS: dict[str, int] = {"train": 50_000, "test": 10_000}
SIDE, PIXELS = 32, 32 * 32 * 3
CHUNK = 1 << 20


@dataclass(frozen=True)
class Archive:
    """Where a CIFAR archive comes from and how it is laid out."""

    url: str
    md5: str
    folder: str
    train: tuple[str, ...]
    test: tuple[str, ...]
    meta: str
    label_key: bytes
    names_key: bytes
    num_classes: int
    extras: tuple[str, ...]  # members the real archive holds that we do not read
    coarse: bool = False  # CIFAR-100's 20 superclasses

    @property
    def filename(self) -> str:
        return self.url.rsplit("/", 1)[-1]

    def member(self, name: str) -> str:
        return f"{self.folder}/{name}"


ARCHIVES: dict[str, Archive] = {
    "cifar10": Archive(
        url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        md5="c58f30108f718f92721af3b95e74349a",
        folder="cifar-10-batches-py",
        train=tuple(f"data_batch_{i}" for i in range(1, 6)),
        test=("test_batch",),
        meta="batches.meta",
        label_key=b"labels",
        names_key=b"label_names",
        num_classes=10,
        extras=("readme.html",),
    ),
    "cifar100": Archive(
        url="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
        md5="eb9058c3a382ffc7106e4002c42a8d85",
        folder="cifar-100-python",
        train=("train",),
        test=("test",),
        meta="meta",
        label_key=b"fine_labels",
        names_key=b"fine_label_names",
        num_classes=100,
        extras=("file.txt~",),
        coarse=True,
    ),
}
NUM_COARSE = 20

# The only globals a pickled numpy array needs (Python 2 wrote numpy.core; numpy 2 has _core).
_RECONSTRUCT = np.empty(0).__reduce__()[0]
_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists, strings, numbers and numpy arrays; refuses any other global.

    A pickle can name any importable callable (``os.system``) and call it while loading. The
    archive's md5 is checked first, but the unpickler does not rely on it.
    """

    def __init__(self, file: BinaryIO, source: str) -> None:
        super().__init__(file, encoding="bytes")  # Python 2 str → bytes, as the keys are
        self.source = source

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise DataValidationError(
                f"{self.source}: refusing to unpickle global {module}.{name}; a CIFAR batch "
                "holds only numpy arrays, lists, bytes and numbers"
            ) from None


@dataclass
class Decoded:
    """What ``fetch`` writes: all rows, training batches first."""

    images: np.ndarray
    labels: np.ndarray
    coarse: np.ndarray | None
    label_names: list[str]
    coarse_names: list[str] | None
    rows: dict[str, int]


def decode_archive(archive: str | Path, spec: Archive) -> Decoded:
    """Read and check the members ``spec`` needs from ``archive`` (a verified .tar.gz)."""
    archive = Path(archive)
    meta_member = spec.member(spec.meta)
    wanted = [spec.member(n) for n in (*spec.train, *spec.test, spec.meta)]
    allowed = {spec.folder, *wanted, *(spec.member(n) for n in spec.extras)}
    parsed: dict[str, Any] = {}
    where = ""
    try:
        with tarfile.open(archive, "r:gz") as tar:
            for info in tar:
                _check_member(archive, info, spec.folder, allowed)
                if info.name not in wanted:
                    continue
                if info.name in parsed:
                    raise DataValidationError(f"{archive}: member {info.name} appears twice")
                where = f" in member {info.name}"
                # _check_member admitted only regular files, which always have a handle.
                handle = cast(BinaryIO, tar.extractfile(info))
                source = f"{archive}:{info.name}"
                obj = _unpickle(handle, source)
                # Decode a batch at once, so that only one raw batch is in memory at a time.
                parsed[info.name] = obj if info.name == meta_member else _batch(source, obj, spec)
                where = ""
            # Read to the end of the gzip stream, so that its CRC and length are checked too.
            while tar.fileobj is not None and tar.fileobj.read(CHUNK):
                pass
    except (tarfile.TarError, EOFError, zlib.error, OSError) as exc:
        raise DataValidationError(
            f"{archive}: not a readable .tar.gz archive{where} ({type(exc).__name__}: {exc})"
        ) from exc
    missing = [m for m in wanted if m not in parsed]
    if missing:
        raise DataValidationError(f"{archive}: member {missing[0]} is missing")

    names, coarse_names = _label_names(f"{archive}:{meta_member}", parsed.pop(meta_member), spec)
    parts = {
        split: [parsed.pop(spec.member(m)) for m in members]
        for split, members in (("train", spec.train), ("test", spec.test))
    }
    rows = {split: sum(p[0].shape[0] for p in batches) for split, batches in parts.items()}
    for split, n in rows.items():
        if n != EXPECTED_ROWS[split]:
            members = ", ".join(spec.train if split == "train" else spec.test)
            raise DataValidationError(
                f"{archive}: {split} members ({members}) hold {n} rows; expected "
                f"{EXPECTED_ROWS[split]}"
            )
    batches = parts["train"] + parts["test"]
    coarse = [b[2] for b in batches if b[2] is not None]
    return Decoded(
        images=np.concatenate([b[0] for b in batches]),
        labels=np.concatenate([b[1] for b in batches]),
        coarse=np.concatenate(coarse) if spec.coarse else None,
        label_names=names,
        coarse_names=coarse_names,
        rows=rows,
    )


def _check_member(archive: Path, info: tarfile.TarInfo, folder: str, allowed: set[str]) -> None:
    name = info.name
    parts = name.split("/")
    if name.startswith("/") or "\\" in name or ".." in parts or parts[0] != folder:
        raise DataValidationError(
            f"{archive}: refusing member {name!r}, which is not a path under {folder}/"
        )
    if name not in allowed:
        raise DataValidationError(f"{archive}: unexpected member {name!r} (not in a CIFAR archive)")
    if name == folder:
        if not info.isdir():
            raise DataValidationError(f"{archive}: member {name!r} should be a directory")
    elif not info.isfile():
        raise DataValidationError(
            f"{archive}: member {name!r} is a link or special file, not a regular file"
        )


def _unpickle(handle: BinaryIO, source: str) -> Any:
    try:
        return RestrictedUnpickler(handle, source).load()
    except DataValidationError:
        raise
    except (tarfile.TarError, EOFError, zlib.error, OSError):
        raise  # the archive itself is damaged: reported by decode_archive
    except Exception as exc:  # anything a malformed pickle raises (UnpicklingError, ValueError…)
        raise DataValidationError(
            f"{source}: not a readable pickle ({type(exc).__name__}: {exc})"
        ) from exc


def _get(obj: Any, key: bytes, source: str) -> Any:
    if not isinstance(obj, dict):
        raise DataValidationError(f"{source}: expected a pickled dict, got {type(obj).__name__}")
    if key not in obj:
        keys = ", ".join(repr(k) for k in obj)
        raise DataValidationError(f"{source}: missing key {key!r} (keys: {keys})")
    return obj[key]


def _names(value: Any, source: str, key: bytes, count: int) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, bytes | str) for v in value):
        raise DataValidationError(f"{source}: {key!r} is not a list of strings")
    names = [v.decode("utf-8") if isinstance(v, bytes) else v for v in value]
    if len(names) != count:
        raise DataValidationError(f"{source}: {key!r} has {len(names)} names; expected {count}")
    if len(set(names)) != count:
        raise DataValidationError(f"{source}: {key!r} repeats a name")
    return names


def _label_names(source: str, meta: Any, spec: Archive) -> tuple[list[str], list[str] | None]:
    names = _names(_get(meta, spec.names_key, source), source, spec.names_key, spec.num_classes)
    if not spec.coarse:
        return names, None
    key = b"coarse_label_names"
    return names, _names(_get(meta, key, source), source, key, NUM_COARSE)


def _batch(
    source: str, obj: Any, spec: Archive
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(images (n, 32, 32, 3) uint8, labels (n,) int64, coarse labels or None) of one batch."""
    data = _get(obj, b"data", source)
    if not (isinstance(data, np.ndarray) and data.dtype == np.uint8 and data.ndim == 2):
        raise DataValidationError(
            f"{source}: b'data' is {getattr(data, 'dtype', type(data).__name__)} of shape "
            f"{getattr(data, 'shape', None)}; expected an (n, {PIXELS}) uint8 array"
        )
    if data.shape[1] != PIXELS:
        raise DataValidationError(
            f"{source}: b'data' rows have {data.shape[1]} values; expected {PIXELS} (3×32×32)"
        )
    # Each row is the R plane, then G, then B, each 32×32 row-major: to (n, 32, 32, 3).
    images = np.ascontiguousarray(data.reshape(-1, 3, SIDE, SIDE).transpose(0, 2, 3, 1))
    labels = _labels(_get(obj, spec.label_key, source), source, spec.label_key, data.shape[0])
    _in_range(labels, spec.num_classes, source, spec.label_key)
    coarse = None
    if spec.coarse:
        coarse = _labels(_get(obj, b"coarse_labels", source), source, b"coarse_labels", len(data))
        _in_range(coarse, NUM_COARSE, source, b"coarse_labels")
    return images, labels, coarse


def _labels(value: Any, source: str, key: bytes, rows: int) -> np.ndarray:
    if not isinstance(value, list | np.ndarray) or not all(
        isinstance(v, int | np.integer) and not isinstance(v, bool) for v in value
    ):
        raise DataValidationError(f"{source}: {key!r} is not a list of integers")
    labels = np.asarray(value, dtype=np.int64).reshape(-1)
    if labels.shape[0] != rows:
        raise DataValidationError(f"{source}: {key!r} has {labels.shape[0]} labels for {rows} rows")
    return labels


def _in_range(labels: np.ndarray, count: int, source: str, key: bytes) -> None:
    if labels.size and (labels.min() < 0 or labels.max() >= count):
        raise DataValidationError(
            f"{source}: {key!r} spans [{labels.min()}, {labels.max()}]; expected [0, {count})"
        )


def _save(path: Path, array: np.ndarray) -> None:
    with atomic_path(path) as tmp, open(tmp, "wb") as out:
        np.save(out, array, allow_pickle=False)


class _Cifar:
    name: ClassVar[str]

    def __init__(self, path: str | None = None, url: str | None = None) -> None:
        self.path = path
        self.url = url

    @property
    def spec(self) -> Archive:
        return ARCHIVES[self.name]

    def fetch(self, dest: Path) -> None:
        spec, dest = self.spec, Path(dest)
        known = f"md5:{spec.md5}"
        if self.path is not None:
            archive, origin = verify_file(Path(self.path).expanduser(), known), str(self.path)
        else:
            origin = self.url or spec.url
            if not origin.startswith(("https://", "http://")):
                raise InvalidParameterError(
                    f"dataset.url: got {origin!r}; expected an http:// or https:// URL"
                )
            archive = fetch_url(
                origin, known, download_cache(), spec.filename, progress=progress_enabled()
            )
        decoded = decode_archive(archive, spec)

        dest.mkdir(parents=True, exist_ok=True)
        _save(dest / IMAGES, decoded.images)
        _save(dest / LABELS, decoded.labels)
        meta: dict[str, Any] = {
            "dataset": self.name,
            "label_names": decoded.label_names,
            "rows": decoded.rows,
            "archive": {"file": spec.filename, "md5": spec.md5, "origin": origin},
        }
        if decoded.coarse is not None:
            _save(dest / COARSE, decoded.coarse)
            meta["coarse_label_names"] = decoded.coarse_names
        write_json(dest / META, meta)  # last: its presence means the fetch completed

    def load(self, raw_dir: Path) -> RawData:
        raw_dir = Path(raw_dir)
        meta_path = raw_dir / META
        try:
            meta = json.loads(meta_path.read_text())
            names = [str(n) for n in meta["label_names"]]
            n_train, n_test = int(meta["rows"]["train"]), int(meta["rows"]["test"])
            dataset = meta["dataset"]
        except FileNotFoundError as exc:
            raise DataValidationError(
                f"{meta_path}: not found; run `dvc repro download` first"
            ) from exc
        except (ValueError, KeyError, TypeError) as exc:
            raise DataValidationError(f"{meta_path}: malformed ({exc!r})") from exc
        if dataset != self.name:
            raise DataValidationError(f"{meta_path}: holds {dataset!r}, not {self.name!r}")
        n = n_train + n_test
        images = _load(raw_dir / IMAGES, np.uint8, (n, SIDE, SIDE, 3))
        labels = _load(raw_dir / LABELS, np.int64, (n,))
        _in_range(labels, len(names), str(raw_dir / LABELS), b"labels")
        return RawData(
            inputs=images,
            labels=labels,
            label_names=names,
            modality="image",
            splits={
                "train": np.arange(n_train, dtype=np.int64),
                "test": np.arange(n_train, n, dtype=np.int64),
            },
        )


def _load(path: Path, dtype: type, shape: tuple[int, ...]) -> np.ndarray:
    try:
        array = np.load(path, allow_pickle=False)
    except FileNotFoundError as exc:
        raise DataValidationError(f"{path}: not found; run `dvc repro download` first") from exc
    except (ValueError, OSError) as exc:
        raise DataValidationError(f"{path}: unreadable ({exc})") from exc
    if array.dtype != dtype or array.shape != shape:
        raise DataValidationError(
            f"{path}: {array.dtype} of shape {array.shape}; expected {np.dtype(dtype)} of "
            f"shape {shape} (per meta.json)"
        )
    return array


class Cifar10(_Cifar):
    """CIFAR-10: 60,000 32×32 RGB images in 10 classes, 50,000 train / 10,000 test (md5-pinned).

    ``path``: a local copy of ``cifar-10-python.tar.gz`` (for machines without internet),
    checked against the same md5. ``url``: a mirror of the official archive.
    """

    name = "cifar10"


class Cifar100(_Cifar):
    """CIFAR-100: 60,000 32×32 RGB images in 100 classes, 50,000 train / 10,000 test (md5-pinned).

    Labels are the 100 fine classes; ``coarse_labels.npy`` keeps the 20 superclasses.
    ``path``: a local copy of ``cifar-100-python.tar.gz``, checked against the same md5.
    ``url``: a mirror of the official archive.
    """

    name = "cifar100"
