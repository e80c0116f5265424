"""ImageNet-LT, Places-LT and iNaturalist 2018 on tiny copies in the real formats.

Each fixture writes a few tiny images with Pillow and the split lists (``<relative/path>
<label>`` lines) or COCO-like JSON exactly as the published files look, and shrinks the
dataset's known statistics to match; the traps check that every kind of bad list fails with a
one-line error naming the file and line (or JSON element) and leaves nothing in ``dest``.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tailkit.errors import DataValidationError, InvalidParameterError
from tailkit.plugins.datasets import image_lists
from tailkit.plugins.datasets.image_lists import (
    INDEX,
    SOURCE,
    ImageNetLT,
    INaturalist2018,
    PlacesLT,
    Statistics,
)
from tailkit.plugins.featurizers.pixels import Pixels
from tailkit.testing import ContractError, check_dataset, check_options

WNIDS = ["n01440764", "n01443537", "n01484850"]
# ImageNet-LT layout: train images under train/<wnid>/, test images sorted into val/<wnid>/.
IMAGENET_LISTS = {
    "train": [
        ("train/n01440764/n01440764_10026.JPEG", 0),
        ("train/n01440764/n01440764_10027.JPEG", 0),
        ("train/n01440764/n01440764_10029.JPEG", 0),
        ("train/n01443537/n01443537_1000.JPEG", 1),
        ("train/n01443537/n01443537_10007.JPEG", 1),
        ("train/n01484850/n01484850_10036.JPEG", 2),
    ],
    "val": [
        ("train/n01440764/n01440764_10040.JPEG", 0),
        ("train/n01443537/n01443537_10014.JPEG", 1),
        ("train/n01484850/n01484850_10059.JPEG", 2),
    ],
    "test": [
        ("val/n01440764/ILSVRC2012_val_00000293.JPEG", 0),
        ("val/n01443537/ILSVRC2012_val_00000236.JPEG", 1),
        ("val/n01484850/ILSVRC2012_val_00002138.JPEG", 2),
    ],
}
PLACES_LISTS = {
    "train": [
        ("train/airfield/00004851.jpg", 0),
        ("train/airfield/00004596.jpg", 0),
        ("train/apartment_building/outdoor/00000012.jpg", 1),
    ],
    "val": [("train/airfield/00000001.jpg", 0), ("train/apartment_building/outdoor/0007.jpg", 1)],
    "test": [
        ("val/airfield/Places365_val_00003597.jpg", 0),
        ("val/apartment_building/outdoor/Places365_val_00000021.jpg", 1),
    ],
}


def _image(path: Path, seed: int) -> None:
    """A tiny image in the format its extension names (JPEG for .JPEG/.jpg, as the datasets)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    pixels = rng.integers(0, 256, size=(5 + seed % 3, 7, 3), dtype=np.uint8)
    fmt = "PNG" if path.suffix.lower() == ".png" else "JPEG"
    Image.fromarray(pixels).save(path, format=fmt)


def _write_lists(
    root: Path, lists_dir: Path, prefix: str, lists: dict[str, list[tuple[str, int]]]
) -> None:
    lists_dir.mkdir(parents=True, exist_ok=True)
    seed = 0
    for split, entries in lists.items():
        lines = []
        for rel, label in entries:
            _image(root / rel, seed)
            seed += 1
            lines.append(f"{rel} {label}\n")
        (lists_dir / f"{prefix}_{split}.txt").write_text("".join(lines))


def _set_line(path: Path, number: int, text: str) -> None:
    lines = path.read_text().split("\n")
    lines[number - 1] = text
    path.write_text("\n".join(lines))


def _fails(dataset, dest: Path, match: str) -> DataValidationError:
    """fetch raises a one-line DataValidationError matching ``match`` and leaves dest empty."""
    dest.mkdir(exist_ok=True)
    with pytest.raises(DataValidationError, match=match) as info:
        dataset.fetch(dest)
    assert "\n" not in str(info.value)
    assert list(dest.iterdir()) == []
    return info.value


@pytest.fixture
def imagenet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(image root, folder of the ImageNet_LT_*.txt lists), with matching statistics."""
    root, lists = tmp_path / "imagenet", tmp_path / "lists"
    _write_lists(root, lists, "ImageNet_LT", IMAGENET_LISTS)
    monkeypatch.setitem(
        image_lists.STATISTICS, "imagenet-lt", Statistics(3, {"train": 6, "val": 3, "test": 3})
    )
    return root, lists


@pytest.fixture
def places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An image root that also holds the Places_LT_*.txt lists (the default split_dir)."""
    root = tmp_path / "places"
    _write_lists(root, root, "Places_LT", PLACES_LISTS)
    monkeypatch.setitem(
        image_lists.STATISTICS, "places-lt", Statistics(2, {"train": 3, "val": 2, "test": 2})
    )
    return root


# --- ImageNet-LT and Places-LT ----------------------------------------------------------------


def test_imagenet_lt_fetch_records_the_lists_and_load_gives_paths(imagenet, tmp_path) -> None:
    root, lists = imagenet
    dest = tmp_path / "raw"
    dest.mkdir()
    dataset = ImageNetLT(root=str(root), split_dir=str(lists))
    dataset.fetch(dest)
    assert sorted(p.name for p in dest.iterdir()) == sorted([INDEX, SOURCE])

    source = json.loads((dest / SOURCE).read_text())
    assert source["dataset"] == "imagenet-lt"
    assert source["root"] == str(root.resolve())
    for split, entries in IMAGENET_LISTS.items():
        file = lists / f"ImageNet_LT_{split}.txt"
        assert source["lists"][split] == {
            "file": file.name,
            "sha256": hashlib.sha256(file.read_bytes()).hexdigest(),
            "images": len(entries),
        }

    raw = dataset.load(dest)
    entries = [e for split in ("train", "val", "test") for e in IMAGENET_LISTS[split]]
    assert raw.modality == "image"
    assert raw.inputs.dtype == object and raw.inputs.shape == (12,)
    assert raw.inputs.tolist() == [os.path.join(root.resolve(), rel) for rel, _ in entries]
    assert all(os.path.isabs(p) and os.path.isfile(p) for p in raw.inputs)
    assert raw.labels.dtype == np.int64
    assert raw.labels.tolist() == [label for _, label in entries]
    assert raw.label_names == WNIDS
    assert {k: v.tolist() for k, v in raw.splits.items()} == {
        "train": [0, 1, 2, 3, 4, 5],
        "val": [6, 7, 8],
        "test": [9, 10, 11],
    }
    assert all(v.dtype == np.int64 for v in raw.splits.values())

    # The paths decode: pixels brings every image to 8 × 8.
    pixels = Pixels(size=8).fit(raw.inputs[raw.splits["train"]]).transform(raw.inputs)
    assert pixels.shape == (12, 8, 8, 3) and pixels.dtype == np.uint8


def test_load_follows_the_root_option_when_images_move(imagenet, tmp_path) -> None:
    root, lists = imagenet
    dest = tmp_path / "raw"
    dest.mkdir()
    ImageNetLT(root=str(root), split_dir=str(lists)).fetch(dest)
    moved = tmp_path / "elsewhere"
    root.rename(moved)
    raw = ImageNetLT(root=str(moved)).load(dest)
    assert all(p.startswith(str(moved.resolve()) + os.sep) for p in raw.inputs)
    assert all(os.path.isfile(p) for p in raw.inputs)


def test_image_list_datasets_pass_the_dataset_contract(imagenet, places, tmp_path) -> None:
    root, lists = imagenet
    check_dataset(ImageNetLT, tmp_path / "c1", root=str(root), split_dir=str(lists))
    check_dataset(PlacesLT, tmp_path / "c2", root=str(places))


def _broken(change):
    class Broken(ImageNetLT):
        """ImageNet-LT whose load breaks one RawData promise."""

        def load(self, raw_dir):
            raw = super().load(raw_dir)
            change(raw)
            return raw

    return Broken


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (lambda r: r.splits.update(val=np.array([5, 6, 7])), "split 'val' shares rows"),
        (lambda r: r.splits.update(test=np.array([11, 10, 9])), "not sorted and unique"),
        (lambda r: r.splits.update(test=np.array([9, 12])), r"outside \[0, 12\)"),
        (lambda r: r.splits.pop("train"), "splits must map 'train'"),
        (lambda r: r.inputs.__setitem__(3, "/nowhere.JPEG"), "1 of 12 image paths are not files"),
        (lambda r: setattr(r, "modality", "dense"), "inputs must be a 2-D float32 array"),
    ],
)
def test_the_dataset_contract_checks_image_rawdata(imagenet, tmp_path, change, match) -> None:
    root, lists = imagenet
    with pytest.raises(ContractError, match=match):
        check_dataset(_broken(change), tmp_path / "c", root=str(root), split_dir=str(lists))


def test_places_lt_names_nested_categories_and_reads_lists_from_root(places, tmp_path) -> None:
    dest = tmp_path / "raw"
    dest.mkdir()
    # CRLF line ends and a trailing blank line, as lists edited on Windows have.
    train = places / "Places_LT_train.txt"
    train.write_bytes(train.read_bytes().replace(b"\n", b"\r\n") + b"\r\n")
    dataset = PlacesLT(root=str(places))
    dataset.fetch(dest)
    raw = dataset.load(dest)
    assert raw.label_names == ["airfield", "apartment_building/outdoor"]
    assert raw.labels.tolist() == [0, 0, 1, 0, 1, 0, 1]
    assert [len(raw.splits[s]) for s in ("train", "val", "test")] == [3, 2, 2]


def test_label_names_fall_back_to_ids_without_one_folder_per_class(
    imagenet, tmp_path, monkeypatch
) -> None:
    root, lists = imagenet
    train = lists / "ImageNet_LT_train.txt"
    # One class's images spread over two folders: folder names no longer name classes.
    train.write_text(train.read_text().replace("n01443537/n01443537_1000.JPEG 1", "x/y.JPEG 1"))
    _image(root / "train/x/y.JPEG", 99)
    dest = tmp_path / "raw"
    dest.mkdir()
    dataset = ImageNetLT(root=str(root), split_dir=str(lists))
    dataset.fetch(dest)
    assert dataset.load(dest).label_names == ["0", "1", "2"]


@pytest.mark.parametrize(
    ("split", "line", "text", "match"),
    [
        pytest.param(
            "train",
            3,
            "train/n01440764/n01440764_10029.JPEG",
            r"ImageNet_LT_train\.txt:3: expected '<relative/path> <label>'",
            id="missing-label",
        ),
        pytest.param(
            "val",
            2,
            "train/n01443537/n01443537_10014.JPEG one",
            r"ImageNet_LT_val\.txt:2: expected '<relative/path> <label>'",
            id="label-not-an-integer",
        ),
        pytest.param(
            "test",
            1,
            "val/n01440764/ILSVRC2012_val_00000293.JPEG 0 extra",
            r"ImageNet_LT_test\.txt:1: expected",
            id="three-fields",
        ),
        pytest.param(
            "train",
            6,
            "train/n01484850/n01484850_10036.JPEG 3",
            r"ImageNet_LT_train\.txt:6: label 3 outside \[0, 3\)",
            id="label-too-large",
        ),
        pytest.param(
            "val",
            1,
            "train/n01440764/n01440764_10040.JPEG -1",
            r"ImageNet_LT_val\.txt:1: label -1 outside \[0, 3\)",
            id="label-negative",
        ),
        pytest.param(
            "train",
            2,
            "../outside.JPEG 0",
            r"ImageNet_LT_train\.txt:2: image path '\.\./outside\.JPEG' must be relative",
            id="path-escapes-root",
        ),
        pytest.param(
            "val",
            3,
            "train/n01440764/n01440764_10026.JPEG 0",
            r"ImageNet_LT_val\.txt:3: duplicate entry 'train/n01440764/n01440764_10026\.JPEG', "
            r"already listed at .*ImageNet_LT_train\.txt:1",
            id="duplicate-across-splits",
        ),
        pytest.param(
            "train",
            5,
            "train/n01443537/n01443537_1000.JPEG 1",
            r"ImageNet_LT_train\.txt:5: duplicate entry .* already listed at "
            r".*ImageNet_LT_train\.txt:4",
            id="duplicate-within-split",
        ),
        pytest.param(
            "test",
            2,
            "val/n01443537/ILSVRC2012_val_99999999.JPEG 1",
            r"ImageNet_LT_test\.txt:2: image 'val/n01443537/ILSVRC2012_val_99999999\.JPEG' "
            r"not found under .*imagenet$",
            id="missing-image",
        ),
    ],
)
def test_a_bad_list_entry_fails_naming_file_and_line(
    imagenet, tmp_path, split: str, line: int, text: str, match: str
) -> None:
    root, lists = imagenet
    _set_line(lists / f"ImageNet_LT_{split}.txt", line, text)
    _fails(ImageNetLT(root=str(root), split_dir=str(lists)), tmp_path / "raw", match)


def test_every_missing_image_is_counted(imagenet, tmp_path) -> None:
    root, lists = imagenet
    for rel, _ in IMAGENET_LISTS["test"]:
        (root / rel).unlink()
    _fails(
        ImageNetLT(root=str(root), split_dir=str(lists)),
        tmp_path / "raw",
        r"ImageNet_LT_test\.txt:1: image .* not found under .* \(and 2 more\)",
    )


def test_counts_are_checked_against_the_published_statistics(
    imagenet, tmp_path, monkeypatch
) -> None:
    root, lists = imagenet
    dataset = ImageNetLT(root=str(root), split_dir=str(lists))
    stats = image_lists.STATISTICS
    monkeypatch.setitem(stats, "imagenet-lt", Statistics(3, {"train": 7, "val": 3, "test": 3}))
    _fails(
        dataset,
        tmp_path / "raw",
        r"ImageNet_LT_train\.txt: 6 images; the train split of imagenet-lt has 7 "
        r"\(is this the published list\?\)",
    )
    # A class without training images.
    monkeypatch.setitem(stats, "imagenet-lt", Statistics(4, {"train": 6, "val": 3, "test": 3}))
    _fails(dataset, tmp_path / "raw", r"3 of the 4 classes of imagenet-lt have training images")


def test_the_real_statistics_reject_a_tiny_list(tmp_path) -> None:
    """Unpatched, the constants are the papers' numbers (datasets-metrics.md §3.2–3.3)."""
    assert image_lists.STATISTICS["imagenet-lt"] == Statistics(
        1000, {"train": 115_846, "val": 20_000, "test": 50_000}
    )
    assert image_lists.STATISTICS["places-lt"] == Statistics(
        365, {"train": 62_500, "val": 7_300, "test": 36_500}
    )
    assert image_lists.STATISTICS["inaturalist2018"] == Statistics(
        8142, {"train": 437_513, "test": 24_426}
    )
    root = tmp_path / "imagenet"
    _write_lists(root, root, "ImageNet_LT", IMAGENET_LISTS)
    _fails(ImageNetLT(root=str(root)), tmp_path / "raw", "6 images; the train split of")


def test_missing_list_file_and_missing_root(imagenet, tmp_path) -> None:
    root, lists = imagenet
    (lists / "ImageNet_LT_val.txt").unlink()
    _fails(
        ImageNetLT(root=str(root), split_dir=str(lists)),
        tmp_path / "raw",
        r"ImageNet_LT_val\.txt: cannot read",
    )
    _fails(ImageNetLT(root=str(tmp_path / "nowhere")), tmp_path / "raw", "is not a folder")


@pytest.mark.parametrize("factory", [ImageNetLT, PlacesLT, INaturalist2018])
def test_builds_without_options_but_fetch_needs_root(factory, tmp_path) -> None:
    check_options(factory)
    check_dataset(factory, None)
    with pytest.raises(InvalidParameterError, match=r"option 'root' is required to fetch"):
        factory().fetch(tmp_path)
    with pytest.raises(DataValidationError, match=r"not found; run `dvc repro download` first"):
        factory().load(tmp_path)


def test_load_refuses_another_datasets_index(imagenet, tmp_path) -> None:
    root, lists = imagenet
    dest = tmp_path / "raw"
    dest.mkdir()
    ImageNetLT(root=str(root), split_dir=str(lists)).fetch(dest)
    with pytest.raises(DataValidationError, match="written for dataset 'imagenet-lt'"):
        PlacesLT().load(dest)


# --- iNaturalist 2018 -------------------------------------------------------------------------

INAT_CATEGORIES = [
    {"id": k, "name": f"species {k}", "supercategory": s, "kingdom": s, "phylum": "p"}
    for k, s in enumerate(["Plantae", "Plantae", "Aves"])
]


def _coco(images: list[tuple[int, str, int]]) -> dict:
    """A train2018.json / val2018.json document as visipedia/inat_comp 2018 describes it."""
    return {
        "info": {
            "year": 2018,
            "version": "1.0",
            "description": "iNaturalist 2018",
            "contributor": "iNaturalist",
            "url": "https://github.com/visipedia/inat_comp",
            "date_created": "2018-02-05 12:00:00",
        },
        "images": [
            {
                "id": image_id,
                "width": 7,
                "height": 5,
                "file_name": file_name,
                "license": 1,
                "rights_holder": "someone",
            }
            for image_id, file_name, _ in images
        ],
        "categories": INAT_CATEGORIES,
        "annotations": [
            {"id": image_id, "image_id": image_id, "category_id": category}
            for image_id, _, category in images
        ],
        "licenses": [{"id": 1, "name": "CC BY 4.0", "url": "https://creativecommons.org/"}],
    }


INAT_TRAIN = [
    (0, "train_val2018/Plantae/0/3b60c9486db1d2ee875f11a669fbde4a.jpg", 0),
    (1, "train_val2018/Plantae/0/5e1b4e5d1ad3a0e8b8a0a8a6a3f0e6b1.jpg", 0),
    (2, "train_val2018/Plantae/1/0a1f2c8de2b3b9c3b1e2f3a4b5c6d7e8.jpg", 1),
    (3, "train_val2018/Aves/2/9f8e7d6c5b4a39281706f5e4d3c2b1a0.jpg", 2),
]
INAT_VAL = [
    (437513, "train_val2018/Plantae/0/aa01.jpg", 0),
    (437514, "train_val2018/Plantae/1/aa02.jpg", 1),
    (437515, "train_val2018/Aves/2/aa03.jpg", 2),
]


@pytest.fixture
def inat(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """(image root, annotations folder) of a tiny iNaturalist 2018 copy."""
    root, annotations = tmp_path / "inat", tmp_path / "annotations"
    annotations.mkdir()
    for seed, (_, file_name, _) in enumerate(INAT_TRAIN + INAT_VAL):
        _image(root / file_name, seed)
    (annotations / "train2018.json").write_text(json.dumps(_coco(INAT_TRAIN)))
    (annotations / "val2018.json").write_text(json.dumps(_coco(INAT_VAL)))
    monkeypatch.setitem(
        image_lists.STATISTICS, "inaturalist2018", Statistics(3, {"train": 4, "test": 3})
    )
    return root, annotations


def test_inaturalist_fetch_and_load(inat, tmp_path) -> None:
    root, annotations = inat
    dest = tmp_path / "raw"
    dest.mkdir()
    dataset = INaturalist2018(root=str(root), annotations=str(annotations))
    dataset.fetch(dest)
    source = json.loads((dest / SOURCE).read_text())
    for split, file in (("train", "train2018.json"), ("test", "val2018.json")):
        assert source["lists"][split] == {
            "file": file,
            "sha256": hashlib.sha256((annotations / file).read_bytes()).hexdigest(),
            "images": 4 if split == "train" else 3,
        }
    raw = dataset.load(dest)
    assert raw.modality == "image"
    assert raw.inputs.tolist() == [
        os.path.join(root.resolve(), name) for _, name, _ in INAT_TRAIN + INAT_VAL
    ]
    assert raw.labels.tolist() == [0, 0, 1, 2, 0, 1, 2]
    assert raw.label_names == ["species 0", "species 1", "species 2"]
    assert {k: v.tolist() for k, v in raw.splits.items()} == {
        "train": [0, 1, 2, 3],
        "test": [4, 5, 6],
    }
    check_dataset(
        INaturalist2018, tmp_path / "contract", root=str(root), annotations=str(annotations)
    )


def _edit(path: Path, change) -> None:
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(
    ("file", "change", "match"),
    [
        pytest.param(
            "val2018.json",
            lambda d: d["annotations"][1].update(category_id=3),
            r"val2018\.json: annotations\[1\]: category_id 3 outside \[0, 3\)",
            id="category-out-of-range",
        ),
        pytest.param(
            "train2018.json",
            lambda d: d["annotations"].pop(2),
            r"train2018\.json: images\[2\] has no annotation",
            id="image-without-annotation",
        ),
        pytest.param(
            "train2018.json",
            lambda d: d["annotations"].append(dict(d["annotations"][0], id=99)),
            r"train2018\.json: annotations\[4\]: a second annotation of image_id 0",
            id="two-annotations",
        ),
        pytest.param(
            "train2018.json",
            lambda d: d["images"][3].update(id=1),
            r"train2018\.json: images\[3\]: duplicate image id 1 \(also images\[1\]\)",
            id="duplicate-image-id",
        ),
        pytest.param(
            "val2018.json",
            lambda d: d["images"][0].update(file_name=INAT_TRAIN[1][1]),
            r"val2018\.json: images\[0\]: duplicate entry .* already listed at "
            r".*train2018\.json: images\[1\]",
            id="duplicate-file-across-splits",
        ),
        pytest.param(
            "val2018.json",
            lambda d: d["images"][2].update(file_name="train_val2018/Aves/2/gone.jpg"),
            r"val2018\.json: images\[2\]: image 'train_val2018/Aves/2/gone\.jpg' not found",
            id="missing-image",
        ),
        pytest.param(
            "train2018.json",
            lambda d: d["images"][0].update(file_name=7),
            r"train2018\.json: images\[0\] has file_name=7; expected a JSON str",
            id="file-name-not-a-string",
        ),
        pytest.param(
            "train2018.json",
            lambda d: d.pop("annotations"),
            r"train2018\.json: 'annotations' must be a list of JSON objects",
            id="no-annotations",
        ),
    ],
)
def test_a_bad_annotation_fails_naming_file_and_element(
    inat, tmp_path, file: str, change, match: str
) -> None:
    root, annotations = inat
    _edit(annotations / file, change)
    _fails(INaturalist2018(root=str(root), annotations=str(annotations)), tmp_path / "raw", match)


def test_inaturalist_malformed_json_and_counts(inat, tmp_path, monkeypatch) -> None:
    root, annotations = inat
    dataset = INaturalist2018(root=str(root), annotations=str(annotations))
    stats = Statistics(3, {"train": 4, "test": 4})
    monkeypatch.setitem(image_lists.STATISTICS, "inaturalist2018", stats)
    _fails(dataset, tmp_path / "raw", r"val2018\.json: 3 images; the test split of")
    (annotations / "train2018.json").write_text('{"images": [')
    _fails(dataset, tmp_path / "raw", r"train2018\.json: not valid JSON")
