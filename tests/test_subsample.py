"""Splits and long-tail profiles, with the LDAM-DRW CIFAR-LT counts as the reference."""

from __future__ import annotations

import numpy as np
import pytest

from tailkit.errors import DataValidationError
from tailkit.params import SubsampleParams
from tailkit.stages.subsample import profile_quota, split_rows

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
