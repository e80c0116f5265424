"""Splits and long-tail profiles, with the LDAM-DRW CIFAR-LT counts as the reference; a
dataset's own splits."""

from __future__ import annotations

import numpy as np
import pytest

from tailkit.errors import DataValidationError
from tailkit.params import SubsampleParams
from tailkit.pipeline.subsampling import profile_quota, split_given, split_rows

CIFAR10_LT_100 = [5000, 2997, 1796, 1077, 645, 387, 232, 139, 83, 50]  # datasets-metrics §3.1


def _cifar_like(per_class: int, classes: int) -> np.ndarray:
    return np.repeat(np.arange(classes), per_class)


def test_exp_profile_reproduces_ldam_drw_counts():
    labels = _cifar_like(5000, 10)
    p = SubsampleParams(profile="exp", imbalance_ratio=100, val_fraction=0, test_fraction=0)
    rows = split_rows(labels, 10, p)
    counts = np.bincount(labels[rows["train"]], minlength=10)
    assert counts.tolist() == CIFAR10_LT_100
    assert counts.sum() == 12406
    # CIFAR-100-LT at ratio 100 sums to 10,847 (the logit-adjustment repository's num_train)
    labels = _cifar_like(500, 100)
    rows = split_rows(labels, 100, p)
    assert rows["train"].size == 10847


def test_step_profile():
    pool = np.full(10, 500)
    p = SubsampleParams(profile="step", imbalance_ratio=10)
    assert profile_quota(pool, p).tolist() == [500] * 5 + [50] * 5


def test_exp_profile_follows_pool_rank_on_natural_data():
    pool = np.array([10, 1000, 100, 400])
    quota = profile_quota(pool, SubsampleParams(profile="exp", imbalance_ratio=10))
    # ranks by pool: class 1 (r=0), 3 (r=1), 2 (r=2), 0 (r=3)
    expected = np.minimum(pool, np.floor(1000 * 10 ** (-np.array([3, 0, 2, 1]) / 3)))
    assert quota.tolist() == expected.astype(int).tolist()


def test_splits_are_disjoint_stratified_and_seeded():
    rng = np.random.default_rng(0)
    labels = rng.choice(20, size=5000, p=np.arange(20, 0, -1) / 210)
    p = SubsampleParams(val_fraction=0.1, test_fraction=0.2, seed=3)
    rows = split_rows(labels, 20, p)
    all_rows = np.concatenate(list(rows.values()))
    assert np.unique(all_rows).size == all_rows.size == labels.size  # natural keeps all
    counts = np.bincount(labels, minlength=20)
    test_counts = np.bincount(labels[rows["test"]], minlength=20)
    np.testing.assert_array_equal(test_counts, np.floor(counts * 0.2 + 0.5))
    again = split_rows(labels, 20, p)
    assert all(np.array_equal(rows[k], again[k]) for k in rows)
    other = split_rows(labels, 20, SubsampleParams(val_fraction=0.1, test_fraction=0.2, seed=4))
    assert not np.array_equal(rows["test"], other["test"])


def test_single_row_classes_stay_in_training():
    labels = np.array([0] * 50 + [1])
    rows = split_rows(labels, 2, SubsampleParams(val_fraction=0.2, test_fraction=0.2))
    assert 50 in rows["train"]


def test_balanced_test_takes_a_fixed_number_per_class():
    labels = np.repeat(np.arange(4), [100, 30, 6, 2])
    p = SubsampleParams(balanced_test=True, test_per_class=5, val_fraction=0)
    rows = split_rows(labels, 4, p)
    assert np.bincount(labels[rows["test"]], minlength=4).tolist() == [5, 5, 5, 1]


def test_a_vanishing_class_is_an_error_naming_the_params():
    labels = _cifar_like(50, 10)
    p = SubsampleParams(profile="exp", imbalance_ratio=1000, val_fraction=0, test_fraction=0)
    with pytest.raises(DataValidationError, match="imbalance_ratio=1000") as info:
        split_rows(labels, 10, p)
    assert "\n" not in str(info.value)


# --- a dataset's own splits -----------------------------------------------------------------


def _given_cifar(train_per_class: int = 5000, test_per_class: int = 1000, classes: int = 10):
    """Labels of CIFAR's layout: the training rows, then the test rows, each class-cyclic."""
    train = np.arange(classes * train_per_class) % classes
    test = np.arange(classes * test_per_class) % classes
    labels = np.concatenate([train, test])
    splits = {"train": np.arange(train.size), "test": np.arange(train.size, labels.size)}
    return labels, splits


def test_given_splits_keep_the_test_rows_and_profile_the_training_rows():
    labels, splits = _given_cifar()
    p = SubsampleParams(profile="exp", imbalance_ratio=100, val_fraction=0.1, seed=1)
    rows = split_given(labels, 10, splits, p)
    assert np.bincount(labels[rows["train"]], minlength=10).tolist() == CIFAR10_LT_100
    assert rows["train"].size == 12406
    np.testing.assert_array_equal(rows["test"], splits["test"])  # untouched: 1,000 per class
    # validation: 500 per class from the rows the profile left out; the head class has none
    val_counts = np.bincount(labels[rows["val"]], minlength=10)
    assert val_counts.tolist() == [0] + [500] * 9
    assert np.isin(rows["val"], splits["train"]).all()
    everything = np.concatenate(list(rows.values()))
    assert np.unique(everything).size == everything.size
    assert all(np.array_equal(v, np.sort(v)) for v in rows.values())
    again = split_given(labels, 10, splits, p)
    assert all(np.array_equal(rows[k], again[k]) for k in rows)


def test_given_val_split_is_kept_too():
    labels, splits = _given_cifar(50, 10, 4)
    splits["val"] = splits["train"][::10]
    splits["train"] = np.setdiff1d(splits["train"], splits["val"])
    rows = split_given(labels, 4, splits, SubsampleParams(profile="step", imbalance_ratio=5))
    np.testing.assert_array_equal(rows["val"], splits["val"])
    np.testing.assert_array_equal(rows["test"], splits["test"])
    # pools [40, 50, 40, 50] (val took classes 0 and 2): n_max = 50 for the larger half
    assert np.bincount(labels[rows["train"]], minlength=4).tolist() == [10, 50, 10, 50]


def test_natural_profile_carves_val_from_the_given_training_rows():
    labels, splits = _given_cifar(100, 20, 3)
    rows = split_given(labels, 3, splits, SubsampleParams(val_fraction=0.2))
    assert np.bincount(labels[rows["val"]]).tolist() == [20, 20, 20]
    assert np.bincount(labels[rows["train"]]).tolist() == [80, 80, 80]
    np.testing.assert_array_equal(rows["test"], splits["test"])


def test_missing_test_split_is_carved_from_the_training_rows():
    labels = np.repeat(np.arange(2), 100)
    given = {"train": np.arange(0, 200, 2)}  # rows outside every given split are left out
    p = SubsampleParams(val_fraction=0.1, test_fraction=0.2)
    rows = split_given(labels, 2, given, p)
    assert [np.bincount(labels[rows[k]]).tolist() for k in ("test", "val", "train")] == [
        [10, 10],
        [5, 5],
        [35, 35],
    ]
    assert np.isin(np.concatenate(list(rows.values())), given["train"]).all()


@pytest.mark.parametrize(
    ("given", "match"),
    [
        ({"test": np.arange(5)}, "expected 'train'"),
        ({"train": np.arange(5), "holdout": np.arange(5, 9)}, "holdout"),
        ({"train": np.arange(5), "test": np.arange(4, 9)}, r"splits\['test'\] repeats"),
        ({"train": np.array([0, 0, 1])}, r"splits\['train'\] repeats"),
        ({"train": np.arange(5), "test": np.array([10])}, "outside"),
        ({"train": np.arange(5.0)}, "integer"),
    ],
)
def test_bad_given_splits_are_one_line_errors(given, match):
    labels = np.arange(10) % 2
    with pytest.raises(DataValidationError, match=match) as info:
        split_given(labels, 2, given, SubsampleParams(), "dataset 'toy'")
    assert str(info.value).startswith("dataset 'toy': ") and "\n" not in str(info.value)


def test_a_profile_that_leaves_no_validation_rows_is_an_error():
    labels, splits = _given_cifar(20, 5, 4)
    p = SubsampleParams(profile="step", imbalance_ratio=1)
    with pytest.raises(DataValidationError, match="no validation rows"):
        split_given(labels, 4, splits, p)


def test_a_class_without_given_training_rows_is_an_error():
    labels = np.array([0, 0, 0, 1, 1])
    splits = {"train": np.arange(3), "test": np.arange(3, 5)}
    with pytest.raises(DataValidationError, match="min_class_count"):
        split_given(labels, 2, splits, SubsampleParams())


# ---------------------------------------------------------------- bad labels, empty splits
# Through the stage itself (a stand-in registry hands it the dataset), so the tests also see
# that nothing is left on disk.


def _stage(tmp_path, raw, **subsample):
    import copy

    from conftest import TINY_PARAMS, StandInRegistry

    from tailkit.params import parse_params
    from tailkit.paths import Layout
    from tailkit.stages import subsample as stage

    params = copy.deepcopy(TINY_PARAMS)
    params["subsample"] = {"profile": "natural", **subsample}
    layout = Layout(tmp_path)
    try:
        return stage.run(parse_params(params), layout, StandInRegistry(raw))
    finally:
        data = tmp_path / "data"
        leftovers = sorted(p.name for p in data.iterdir()) if data.exists() else []
        assert leftovers in ([], ["split"]), leftovers  # no temporary directory stays behind


def _raw(labels, names=("a", "b", "c"), splits=None):
    from tailkit.components import RawData

    n = labels.shape[0]
    return RawData(np.zeros((n, 2), np.float32), labels, list(names), splits=splits)


def test_a_label_id_out_of_range_is_refused_naming_its_row(tmp_path):
    labels = np.tile(np.arange(3), 20)
    labels[37] = 3  # one past the three label names
    with pytest.raises(DataValidationError) as info:
        _stage(tmp_path, _raw(labels))
    assert str(info.value) == (
        "dataset 'synthetic': row 37 has label id 3; label ids must lie in [0, 3) "
        "(one per label name)"
    )
    labels[37], labels[5] = 0, -1
    with pytest.raises(DataValidationError, match=r"row 5 has label id -1"):
        _stage(tmp_path, _raw(labels))
    assert not (tmp_path / "data" / "split").exists()


def test_rows_of_one_class_are_refused_before_any_split(tmp_path):
    with pytest.raises(DataValidationError) as info:
        _stage(tmp_path, _raw(np.full(60, 1)))
    assert str(info.value) == (
        "dataset 'synthetic': every row has the label 'b'; a classification needs rows of at "
        "least two classes"
    )
    assert not (tmp_path / "data" / "split").exists()


def test_a_multilabel_id_out_of_range_is_refused_naming_its_row(tmp_path):
    import scipy.sparse as sp

    # rows: {0}, {1, 2}, {} (label-less, as XC allows), {0, 4}: id 4 past the three names
    indicator = sp.csr_matrix(
        (np.ones(5), np.array([0, 1, 2, 0, 4]), np.array([0, 1, 3, 3, 5])), shape=(4, 5)
    )
    with pytest.raises(DataValidationError, match=r"^dataset 'synthetic': row 3 has label id 4;"):
        _stage(tmp_path, _raw(indicator))


@pytest.mark.parametrize(
    ("labels", "subsample", "splits", "empty", "hint"),
    [
        # three rows, one per class: nothing can be held out without emptying a class
        (np.arange(3), {}, None, "val and test", "test_fraction"),
        # validation rounds to nothing for every class
        (
            np.repeat(np.arange(3), 4),
            {"val_fraction": 0.05, "test_fraction": 0.25},
            None,
            "val",
            "val_fraction",
        ),
        # the dataset's own splits: an empty given test split
        (
            np.tile(np.arange(3), 10),
            {},
            {"train": np.arange(30), "test": np.zeros(0, int)},
            "test",
            "the dataset's own 'test' split is empty",
        ),
    ],
)
def test_an_empty_split_is_refused_with_the_counts_and_the_setting(
    tmp_path, labels, subsample, splits, empty, hint
):
    with pytest.raises(DataValidationError) as info:
        _stage(tmp_path, _raw(labels, splits=splits), **subsample)
    message = str(info.value)
    assert f"the {empty} split{'s' if ' and ' in empty else ''} would be empty (train " in message
    assert hint in message and "\n" not in message
    assert not (tmp_path / "data" / "split").exists()


def test_an_empty_multilabel_train_split_is_refused(tmp_path):
    import scipy.sparse as sp

    indicator = sp.csr_matrix(np.eye(3))
    given = {"train": np.zeros(0, int), "val": np.array([0]), "test": np.array([1, 2])}
    with pytest.raises(DataValidationError, match=r"the train split would be empty \(train 0, "):
        _stage(tmp_path, _raw(indicator, splits=given))


def test_small_but_complete_splits_are_written(tmp_path):
    meta = _stage(tmp_path, _raw(np.repeat(np.arange(3), 5)), val_fraction=0.2, test_fraction=0.2)
    assert [int(meta[f"{s}_counts"].sum()) for s in ("train", "val", "test")] == [9, 3, 3]


def _flip_bit_in_last_page(path, column):
    """Flip one bit in the last byte of ``column``'s chunk in row group 0: the end of its last
    data page's body, past the page header (which the page checksum does not cover)."""
    import pyarrow.parquet as pq

    meta = pq.ParquetFile(path).metadata.row_group(0)
    chunk = meta.column([meta.column(i).path_in_schema for i in range(2)].index(column))
    start = chunk.dictionary_page_offset if chunk.has_dictionary_page else chunk.data_page_offset
    end = start + chunk.total_compressed_size
    assert end - 1 > chunk.data_page_offset
    data = bytearray(path.read_bytes())
    data[end - 1] ^= 0x08
    path.write_bytes(bytes(data))


# row_id: random ids are incompressible, so zstd stores the page as a raw block and the flip
# decodes to a wrong id with no error at all: only the page checksum catches it. label
# compresses: there the flip would also break zstd, but the checksum is checked first.
@pytest.mark.parametrize("column", ["row_id", "label"])
def test_a_flipped_bit_in_a_split_file_names_it_and_the_subsample_stage(tmp_path, column):
    import pyarrow.parquet as pq

    from tailkit.storage.splits import read_split, write_split

    rng = np.random.default_rng(0)
    rows, labels = rng.integers(0, 2**62, 2000), rng.integers(0, 10, 2000)
    split_dir = tmp_path / "data" / "split"
    split_dir.mkdir(parents=True)
    path = split_dir / "train.parquet"
    write_split(path, rows, labels)
    _flip_bit_in_last_page(path, column)
    if column == "row_id":  # without verification the damage goes unnoticed
        assert (pq.read_table(path)["row_id"].to_numpy() != rows).sum() == 1
    with pytest.raises(DataValidationError) as caught:
        read_split(split_dir, "train")
    assert str(caught.value) == (
        f"{path}: not a readable Parquet file (could not verify page integrity, CRC checksum "
        "verification failed for page_ordinal 0); rebuild it with `dvc repro subsample`"
    )


def test_the_datasets_propensity_constants_travel_with_the_split(tmp_path, monkeypatch):
    """Issue 15 item 3: PSP@k's (A, B) are the dataset plugin's fact (``propensity``), recorded
    in the split's meta for evaluation, not a table keyed by dataset name in the metrics."""
    from conftest import _GivenDataset

    from tailkit.evaluation.results import _inverse_propensity

    labels = np.repeat(np.arange(3), 20)
    meta = _stage(tmp_path / "a", _raw(labels))
    assert meta["propensity"] == [0.55, 1.5]  # declared by none: the repository's default
    monkeypatch.setattr(_GivenDataset, "propensity", (0.5, 0.4), raising=False)
    meta = _stage(tmp_path / "b", _raw(labels))
    assert meta["propensity"] == [0.5, 0.4]
    counts = np.array([40, 5, 1])
    q = _inverse_propensity(labels, counts, {"propensity": [0.5, 0.4]})
    c = (np.log(46) - 1.0) * 1.4**0.5  # Jain et al.: q = 1 + C (N_l + B)^(-A), N = 46 rows
    np.testing.assert_allclose(q, 1.0 + c * (counts + 0.4) ** -0.5)
