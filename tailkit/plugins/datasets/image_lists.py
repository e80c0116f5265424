"""ImageNet-LT, Places-LT (Liu et al., CVPR 2019) and iNaturalist 2018 from local image folders.

The images (ImageNet-2012, Places365, iNaturalist's 120 GB) are not something a pipeline stage
downloads, nor something to copy into DVC's cache: the user keeps them in ``root``. ``fetch``
reads the published split lists, checks every entry against ``root`` and the lists' sizes
against the statistics the papers report (:data:`STATISTICS`), and writes a compact index:
``index.parquet`` (relative path, label, split) and ``source.json`` (root, label names, and each
list's image count and SHA-256, so a different list is visible in ``dvc.lock``). ``load`` turns
the index into an (N,) array of absolute image paths, which the ``pixels`` featurizer decodes.

Formats (datasets-metrics.md §3.2, §3.3):

* ImageNet-LT / Places-LT: ``ImageNet_LT_{train,val,test}.txt`` / ``Places_LT_{...}.txt``, one
  ``<relative/path> <label>`` per line (zhmiao/OpenLongTailRecognition-OLTR; the files are in
  facebookresearch/classifier-balancing ``data/``). Paths are relative to ``root``.
* iNaturalist 2018: ``train2018.json`` / ``val2018.json`` (visipedia/inat_comp, COCO-like:
  ``images`` [{id, file_name}], ``annotations`` [{image_id, category_id}], ``categories``
  [{id, name}]); the label is ``category_id``. Long-tail papers report on val2018, so it is
  the ``test`` split here; the dataset defines no validation split.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

import numpy as np
import pyarrow as pa

from tailkit.components import RawData
from tailkit.errors import DataValidationError, InvalidParameterError
from tailkit.storage import parquet
from tailkit.storage.atomic import atomic_path, write_json

INDEX = "index.parquet"
SOURCE = "source.json"
SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class Statistics:
    """What a complete copy of a benchmark holds: classes, and images per split."""

    num_classes: int
    images: Mapping[str, int]


#: The published sizes each fetch is checked against (datasets-metrics.md §3.2 and §3.3;
#: ImageNet-LT train is the paper's reported 115,846). Tests replace entries.
STATISTICS: dict[str, Statistics] = {
    "imagenet-lt": Statistics(1000, {"train": 115_846, "val": 20_000, "test": 50_000}),
    "places-lt": Statistics(365, {"train": 62_500, "val": 7_300, "test": 36_500}),
    "inaturalist2018": Statistics(8142, {"train": 437_513, "test": 24_426}),
}

_INT = re.compile(r"[+-]?[0-9]+")
_SCHEMA = pa.schema(
    [
        pa.field("path", pa.string(), nullable=False),
        pa.field("label", pa.int64(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
    ]
)


@dataclass
class _Split:
    """One split as read from its source file, with enough to point at any entry."""

    name: str
    source: Path
    sha256: str
    paths: list[str]
    labels: list[int]
    positions: list[int]  # line numbers (text lists) or ``images`` indices (JSON)
    where: str  # formats a position: ":{}" or ": images[{}]"

    def at(self, i: int) -> str:
        return f"{self.source}{self.where.format(self.positions[i])}"


def _read(path: Path) -> tuple[bytes, str]:
    """The file's bytes and their SHA-256 (hashed from the very bytes that are parsed)."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise DataValidationError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    return data, hashlib.sha256(data).hexdigest()


def _check_relative(rel: str, where: str) -> None:
    parts = PurePosixPath(rel).parts
    if rel.startswith(("/", "\\")) or ".." in parts:
        raise DataValidationError(
            f"{where}: image path {rel!r} must be relative to root, without '..'"
        )


def read_split_list(path: Path, split: str, num_classes: int) -> _Split:
    """Parse one ``<relative/path> <label>`` list; a malformed line is an error naming it."""
    data, sha = _read(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataValidationError(f"{path}: not UTF-8 text (byte {exc.start})") from exc
    paths: list[str] = []
    labels: list[int] = []
    lines: list[int] = []
    # split("\n"), not splitlines(): line numbers must match what an editor and `wc -l` show.
    for number, line in enumerate(text.split("\n"), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2 or not _INT.fullmatch(fields[1]):
            raise DataValidationError(
                f"{path}:{number}: expected '<relative/path> <label>'; got {line.strip()!r}"
            )
        label = int(fields[1])
        if not 0 <= label < num_classes:
            raise DataValidationError(f"{path}:{number}: label {label} outside [0, {num_classes})")
        _check_relative(fields[0], f"{path}:{number}")
        paths.append(fields[0])
        labels.append(label)
        lines.append(number)
    if not paths:
        raise DataValidationError(f"{path}: no entries")
    return _Split(split, path, sha, paths, labels, lines, ":{}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _records(path: Path, doc: Mapping[str, Any], key: str) -> list[dict[str, Any]]:
    records = doc.get(key)
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise DataValidationError(f"{path}: '{key}' must be a list of JSON objects")
    return records


def _field(path: Path, key: str, i: int, record: Mapping[str, Any], name: str, kind: type) -> Any:
    value = record.get(name)
    ok = _is_int(value) if kind is int else isinstance(value, kind)
    if not ok:
        raise DataValidationError(
            f"{path}: {key}[{i}] has {name}={value!r}; expected a JSON {kind.__name__}"
        )
    return value


def read_coco(path: Path, split: str, num_classes: int) -> tuple[_Split, dict[int, str]]:
    """Parse one iNaturalist (COCO-like) annotation file: entries in ``images`` order, each
    labelled by its one annotation's ``category_id``; also the category names by id."""
    data, sha = _read(path)
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise DataValidationError(f"{path}: not valid JSON ({exc})") from exc
    if not isinstance(doc, dict):
        raise DataValidationError(f"{path}: expected a JSON object with images and annotations")
    names: dict[int, str] = {}
    for i, record in enumerate(_records(path, doc, "categories")):
        names[_field(path, "categories", i, record, "id", int)] = str(record.get("name", ""))

    images = _records(path, doc, "images")
    row_of: dict[int, int] = {}
    paths: list[str] = []
    for i, record in enumerate(images):
        image_id = _field(path, "images", i, record, "id", int)
        if image_id in row_of:
            raise DataValidationError(
                f"{path}: images[{i}]: duplicate image id {image_id} "
                f"(also images[{row_of[image_id]}])"
            )
        rel = _field(path, "images", i, record, "file_name", str)
        _check_relative(rel, f"{path}: images[{i}]")
        row_of[image_id] = i
        paths.append(rel)

    labels = [-1] * len(images)
    for j, record in enumerate(_records(path, doc, "annotations")):
        image_id = _field(path, "annotations", j, record, "image_id", int)
        category = _field(path, "annotations", j, record, "category_id", int)
        row = row_of.get(image_id)
        if row is None:
            raise DataValidationError(f"{path}: annotations[{j}]: unknown image_id {image_id}")
        if labels[row] != -1:
            raise DataValidationError(
                f"{path}: annotations[{j}]: a second annotation of image_id {image_id}"
            )
        if not 0 <= category < num_classes:
            raise DataValidationError(
                f"{path}: annotations[{j}]: category_id {category} outside [0, {num_classes})"
            )
        labels[row] = category
    if -1 in labels:
        i = labels.index(-1)
        raise DataValidationError(f"{path}: images[{i}] has no annotation")
    if not paths:
        raise DataValidationError(f"{path}: no images")
    return _Split(split, path, sha, paths, labels, list(range(len(paths))), ": images[{}]"), names


def _check_splits(dataset: str, root: Path, splits: Sequence[_Split]) -> None:
    """Across all splits: no entry twice, the published sizes, every image file present."""
    first: dict[str, tuple[int, int]] = {}
    for s, split in enumerate(splits):
        for i, rel in enumerate(split.paths):
            seen = first.setdefault(rel, (s, i))
            if seen != (s, i):
                raise DataValidationError(
                    f"{split.at(i)}: duplicate entry {rel!r}, already listed at "
                    f"{splits[seen[0]].at(seen[1])}"
                )

    stats = STATISTICS[dataset]
    for split in splits:
        expected = stats.images.get(split.name)
        if expected is not None and len(split.paths) != expected:
            raise DataValidationError(
                f"{split.source}: {len(split.paths):,} images; the {split.name} split of "
                f"{dataset} has {expected:,} (is this the published list?)"
            )
    train = next(s for s in splits if s.name == "train")
    present = len(set(train.labels))
    if present != stats.num_classes:
        raise DataValidationError(
            f"{train.source}: {present:,} of the {stats.num_classes:,} classes of {dataset} "
            "have training images; expected all"
        )

    # A stat per file (no read): a missing image fails here, not hours into training.
    missing = [
        (split, i)
        for split in splits
        for i, rel in enumerate(split.paths)
        if not os.path.isfile(os.path.join(root, rel))
    ]
    if missing:
        split, i = missing[0]
        more = f" (and {len(missing) - 1:,} more)" if len(missing) > 1 else ""
        raise DataValidationError(
            f"{split.at(i)}: image {split.paths[i]!r} not found under {root}{more}"
        )


def _write(
    dest: Path, dataset: str, root: Path, splits: Sequence[_Split], label_names: list[str]
) -> None:
    """index.parquet, then source.json (``load`` needs both), each written atomically."""
    table = pa.table(
        {
            "path": [p for s in splits for p in s.paths],
            "label": np.concatenate([np.asarray(s.labels, dtype=np.int64) for s in splits]),
            "split": [s.name for s in splits for _ in s.paths],
        },
        schema=_SCHEMA,
    )
    dest.mkdir(parents=True, exist_ok=True)
    with atomic_path(dest / INDEX) as tmp:
        parquet.write_table(table, tmp, compression="zstd")  # with page checksums
    write_json(
        dest / SOURCE,
        {
            "dataset": dataset,
            "root": str(root),
            "num_classes": len(label_names),
            "lists": {
                s.name: {"file": s.source.name, "sha256": s.sha256, "images": len(s.paths)}
                for s in splits
            },
            "label_names": label_names,
        },
    )


def _names_from_folders(train: _Split, num_classes: int) -> list[str]:
    """Class names from the training paths' folders (``train/n01440764/x.JPEG`` ->
    ``n01440764``, ``train/apartment_building/outdoor/x.jpg`` -> ``apartment_building/outdoor``)
    when each label has one folder of its own; otherwise the label ids as strings."""
    folders: dict[int, set[str]] = {}
    for rel, label in zip(train.paths, train.labels, strict=True):
        folders.setdefault(label, set()).add("/".join(PurePosixPath(rel).parts[1:-1]))
    names = [next(iter(folders.get(k, {""}))) for k in range(num_classes)]
    own = all(len(folders.get(k, ())) == 1 for k in range(num_classes))
    if own and all(names) and len(set(names)) == num_classes:
        return names
    return [str(k) for k in range(num_classes)]


def _root(dataset: str, root: str | None, what: str) -> Path:
    if root is None:
        raise InvalidParameterError(
            f"dataset {dataset!r}: option 'root' is required to fetch: the folder holding {what}"
        )
    path = Path(root).expanduser().resolve()
    if not path.is_dir():
        raise DataValidationError(f"{path}: image root of dataset {dataset!r} is not a folder")
    return path


def load_index(dataset: str, raw_dir: Path, root: str | None) -> RawData:
    """The RawData of an index written by ``fetch``: absolute paths under ``root`` (the option
    when given, else the folder recorded at fetch time), labels, and the dataset's splits."""
    raw_dir = Path(raw_dir)
    source, index = raw_dir / SOURCE, raw_dir / INDEX
    try:
        meta = json.loads(source.read_text())
        # a page failing its checksum: one line naming the file and `dvc repro download`
        table = parquet.read_table(index, str(index), "download")
    except FileNotFoundError as exc:
        raise DataValidationError(
            f"{exc.filename}: not found; run `dvc repro download` first"
        ) from exc
    except DataValidationError:  # already one line naming the index (a ValueError too)
        raise
    except (ValueError, pa.ArrowException, OSError) as exc:
        raise DataValidationError(f"{raw_dir}: unreadable index ({exc})") from exc
    if not isinstance(meta, dict) or meta.get("dataset") != dataset:
        got = meta.get("dataset") if isinstance(meta, dict) else None
        raise DataValidationError(f"{source}: written for dataset {got!r}, not {dataset!r}")
    if table.schema != _SCHEMA:
        raise DataValidationError(f"{index}: unexpected columns {table.schema.names}")
    if not isinstance(meta.get("root"), str) or not isinstance(meta.get("label_names"), list):
        raise DataValidationError(
            f"{source}: no root or label_names; run `dvc repro download` again"
        )

    base = os.fspath(Path(root).expanduser().resolve() if root is not None else meta["root"])
    rel = table.column("path").to_pylist()
    inputs = np.empty(len(rel), dtype=object)
    inputs[:] = [os.path.join(base, r) for r in rel]
    split = np.asarray(table.column("split").to_pylist(), dtype=object)
    splits = {name: np.flatnonzero(split == name).astype(np.int64) for name in SPLITS}
    return RawData(
        inputs=inputs,
        labels=table.column("label").to_numpy().astype(np.int64),
        label_names=[str(n) for n in meta["label_names"]],
        modality="image",
        splits={name: rows for name, rows in splits.items() if rows.size},
    )


class _SplitListDataset:
    """A benchmark published as ``<prefix>_{train,val,test}.txt`` lists over an image root."""

    name: ClassVar[str]
    prefix: ClassVar[str]
    images: ClassVar[str]  # what root must hold, for the error message

    def __init__(self, root: str | None = None, split_dir: str | None = None) -> None:
        self.root = root
        self.split_dir = split_dir

    def fetch(self, dest: Path) -> None:
        root = _root(self.name, self.root, self.images)
        lists = Path(self.split_dir).expanduser() if self.split_dir is not None else root
        num_classes = STATISTICS[self.name].num_classes
        splits = [
            read_split_list(lists / f"{self.prefix}_{split}.txt", split, num_classes)
            for split in SPLITS
        ]
        _check_splits(self.name, root, splits)
        _write(Path(dest), self.name, root, splits, _names_from_folders(splits[0], num_classes))

    def load(self, raw_dir: Path) -> RawData:
        return load_index(self.name, raw_dir, self.root)


class ImageNetLT(_SplitListDataset):
    """ImageNet-LT (Liu et al., 2019): 1,000 classes, 115,846 train images, local ImageNet.

    ``root`` holds ImageNet-2012 as the lists name it (``train/<wnid>/*.JPEG``, and the
    validation images sorted into ``val/<wnid>/``); ``split_dir`` holds
    ``ImageNet_LT_{train,val,test}.txt`` (default: ``root``). Label names are the WordNet ids.
    """

    name = "imagenet-lt"
    prefix = "ImageNet_LT"
    images = "ImageNet-2012 (train/<wnid>/*.JPEG, val/<wnid>/*.JPEG)"


class PlacesLT(_SplitListDataset):
    """Places-LT (Liu et al., 2019): 365 scene classes, 62,500 train images, local Places365.

    ``root`` holds Places365-Standard as the lists name it (``train/<category>/*.jpg``,
    ``val/<category>/*.jpg``); ``split_dir`` holds ``Places_LT_{train,val,test}.txt``
    (default: ``root``). Label names are the category folders.
    """

    name = "places-lt"
    prefix = "Places_LT"
    images = "Places365 (train/<category>/*.jpg, val/<category>/*.jpg)"


class INaturalist2018:
    """iNaturalist 2018: 8,142 species, 437,513 train and 24,426 test (val2018) images, local.

    ``root`` holds the extracted ``train_val2018/`` tree; ``annotations`` holds
    ``train2018.json`` and ``val2018.json`` (default: ``root``). val2018 (3 images per class)
    is the ``test`` split, as in the long-tail literature (Kang et al. 2020, Cui et al. 2019).
    """

    name: ClassVar[str] = "inaturalist2018"
    files: ClassVar[dict[str, str]] = {"train": "train2018.json", "test": "val2018.json"}

    def __init__(self, root: str | None = None, annotations: str | None = None) -> None:
        self.root = root
        self.annotations = annotations

    def fetch(self, dest: Path) -> None:
        root = _root(self.name, self.root, "train_val2018/<super category>/<category>/*.jpg")
        folder = Path(self.annotations).expanduser() if self.annotations is not None else root
        num_classes = STATISTICS[self.name].num_classes
        splits: list[_Split] = []
        names: dict[int, str] = {}
        for split, file in self.files.items():
            entries, categories = read_coco(folder / file, split, num_classes)
            splits.append(entries)
            names = {**categories, **names}  # the train file's names win
        _check_splits(self.name, root, splits)
        label_names = [names.get(k) or str(k) for k in range(num_classes)]
        _write(Path(dest), self.name, root, splits, label_names)

    def load(self, raw_dir: Path) -> RawData:
        return load_index(self.name, raw_dir, self.root)
