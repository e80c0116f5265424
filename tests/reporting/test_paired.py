"""Paired tests behind the table's ≈ marks: each test row's outcomes on disk, Holm's
correction, the paired bootstrap's p-value against closed forms, its size on A/A pairs and its
power on a planted gap, and the marks the table prints from them."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import TINY_PARAMS
from scipy import stats

from tailkit.errors import DataValidationError
from tailkit.evaluation.intervals import RESAMPLES
from tailkit.evaluation.outcomes import Outcomes, read_outcomes, write_outcomes
from tailkit.params import parse_params
from tailkit.reporting.paired import (
    Pairing,
    adjusted_p_values,
    bootstrap_p,
    holm,
    resampled_values,
)
from tailkit.reporting.runs import Run
from tailkit.reporting.tables import Column, comparison_table

META = {"train_rows": 1000}


def single_label(correct: np.ndarray, labels: np.ndarray, k: int = 3) -> Outcomes:
    """Outcomes whose top label is the true one where ``correct``, another label otherwise."""
    n = labels.shape[0]
    num_labels = int(labels.max()) + 2
    top = np.where(correct, labels, (labels + 1) % num_labels)
    ranked = np.stack([top] + [(top + j) % num_labels for j in range(1, k)], axis=1)
    return Outcomes("x", "key", np.arange(n), (np.arange(n + 1), labels), True, ranked, None, None)


def test_outcomes_round_trip_single_and_multi_label_with_optional_columns(tmp_path):
    rng = np.random.default_rng(0)
    ranked = rng.integers(-1, 9, size=(6, 3))
    single = Outcomes(
        "a", "k1", np.arange(10, 16), (np.arange(7), rng.integers(0, 9, 6)), True, ranked,
        rng.normal(size=6), rng.random((6, 3)),
    )  # fmt: skip
    indptr = np.array([0, 1, 3, 3, 4, 6, 7])
    multi = Outcomes(
        "b", "k2", np.arange(6), (indptr, rng.integers(0, 9, 7)), False, ranked, None, None
    )
    for outcomes in (single, multi):
        path = tmp_path / f"{outcomes.experiment}.parquet"
        write_outcomes(path, outcomes)
        back = read_outcomes(path, "evaluate@x")
        assert (back.experiment, back.data_key, back.single) == (
            outcomes.experiment,
            outcomes.data_key,
            outcomes.single,
        )
        for got, want in (
            (back.rows, outcomes.rows),
            (back.truth[0], outcomes.truth[0]),
            (back.truth[1], outcomes.truth[1]),
            (back.ranked, outcomes.ranked),
        ):
            np.testing.assert_array_equal(got, want)
        for got_opt, want_opt in (
            (back.log_likelihood, outcomes.log_likelihood),
            (back.probabilities, outcomes.probabilities),
        ):
            assert (got_opt is None) == (want_opt is None)
            if want_opt is not None:
                np.testing.assert_array_equal(got_opt, want_opt)


def test_a_file_that_is_not_outcomes_is_one_line_naming_it_and_the_stage(tmp_path):
    import pyarrow as pa

    from tailkit.storage.parquet import write_table

    path = tmp_path / "rows.parquet"
    write_table(pa.table({"row": [1, 2]}), path)
    with pytest.raises(DataValidationError, match=r"rows.parquet: not a file .*evaluate@soft"):
        read_outcomes(path, "evaluate@soft")


def test_holm_matches_the_step_down_definition():
    # sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 → 0.02, 0.03, 0.06, 0.04; running max
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
    np.testing.assert_allclose(holm([0.5, 0.9]), [1.0, 1.0])
    rng = np.random.default_rng(1)
    p = rng.random(7)
    order = np.argsort(p)
    m = len(p)
    want = np.empty(m)
    for i, index in enumerate(order):  # the textbook loop: max over j ≤ i of (m − j) p_(j)
        want[index] = min(1.0, max((m - j) * p[order[j]] for j in range(i + 1)))
    np.testing.assert_allclose(holm(p), want)


def test_bootstrap_p_is_one_for_no_difference_and_smallest_for_a_clear_one():
    assert bootstrap_p(np.zeros(RESAMPLES)) == 1.0
    assert bootstrap_p(np.full(RESAMPLES, 0.1)) == pytest.approx(2 / (RESAMPLES + 1))
    assert np.isnan(bootstrap_p(np.full(5, np.nan)))
    # a quarter of the resamples below zero: p = 2 · (250 + 1) / 1001
    d = np.r_[np.full(250, -1.0), np.full(750, 1.0)]
    assert bootstrap_p(d) == pytest.approx(2 * 251 / 1001)


def test_the_paired_spread_of_an_accuracy_gap_is_mcnemar_s_closed_form():
    """Var(acc_A − acc_B) over resampled rows is ((b + c)/n − ((b − c)/n)²)/n, b and c the
    rows only A or only B gets right; the bootstrap's differences match it within 10 %."""
    rng = np.random.default_rng(2)
    n = 3000
    labels = rng.integers(0, 50, n)
    a = rng.random(n) < 0.7
    b = np.where(rng.random(n) < 0.8, a, rng.random(n) < 0.6)  # correlated with A
    counts = np.bincount(labels, minlength=52) * 10
    values = [
        resampled_values(single_label(c, labels), ["accuracy"], counts, META, {})["accuracy"]
        for c in (a, b)
    ]
    only_a, only_b = int((a & ~b).sum()), int((~a & b).sum())
    closed = np.sqrt(((only_a + only_b) / n - ((only_a - only_b) / n) ** 2) / n)
    assert np.std(values[0] - values[1]) == pytest.approx(closed, rel=0.1)
    # and the observed gap is the resamples' centre
    assert np.mean(values[0] - values[1]) == pytest.approx((a.mean() - b.mean()), abs=closed / 3)


def _aa_rejections(replicates: int, gap: float, n: int = 400) -> int:
    """How often two runs of accuracy 0.6 and 0.6 + ``gap`` (independent errors) are told
    apart at α = 0.05 on balanced accuracy and accuracy (either)."""
    rng = np.random.default_rng(3)
    rejected = 0
    for _ in range(replicates):
        labels = rng.integers(0, 20, n)
        counts = np.bincount(labels, minlength=22) * 10
        runs = {
            name: resampled_values(
                single_label(rng.random(n) < p, labels), ["accuracy"], counts, META, {}
            )
            for name, p in (("a", 0.6), ("b", 0.6 + gap))
        }
        p_value = adjusted_p_values(runs, "accuracy", "a", ["b"])["b"]
        rejected += p_value < 0.05
    return rejected


def test_an_a_a_pair_is_told_apart_about_as_often_as_alpha_and_a_real_gap_almost_always():
    replicates = 100
    false = _aa_rejections(replicates, 0.0)
    # α = 0.05: 6 expected; 14 or more has probability < 0.5 % under a correct test
    assert false <= stats.binom.ppf(0.995, replicates, 0.05)
    assert _aa_rejections(30, 0.15) >= 29  # a 15-point gap on 400 rows: power ≈ 1


def _run(name: str, acc: float) -> Run:
    test = {"accuracy": acc, "balanced_accuracy": acc}
    return Run(name, "", parse_params(TINY_PARAMS), {"test": test, "train": {"seconds": 1.0}})


def test_the_table_marks_rows_not_told_apart_from_the_best_and_daggers_unpaired_ones():
    rng = np.random.default_rng(4)
    n = 2000
    labels = rng.integers(0, 30, n)
    counts = np.bincount(labels, minlength=32) * 10
    best = rng.random(n) < 0.75
    close = best.copy()  # right on 8 rows the best gets wrong, wrong on 12 it gets right
    close[np.flatnonzero(~best)[:8]] = True
    close[np.flatnonzero(best)[:12]] = False
    far = rng.random(n) < 0.55
    columns = (Column("accuracy", ("test", "accuracy"), True),)
    values, runs = {}, []
    for name, correct in (("softmax", best), ("sampled", close), ("adversarial", far)):
        values[name] = resampled_values(
            single_label(correct, labels), ["accuracy"], counts, META, {}
        )
        runs.append(_run(name, float(correct.mean())))
    runs.append(_run("ldam", 0.70))
    table = comparison_table(runs, columns, Pairing(values, unpaired={"ldam"}))
    cells = {
        line.split("|")[1].strip(): line.split("|")[3].strip() for line in table.splitlines()[2:]
    }
    assert cells["softmax"].startswith("**")
    assert cells["sampled"].endswith(" ≈")
    assert not cells["adversarial"].endswith("≈")
    assert "ldam †" in cells and not cells["ldam †"].endswith("≈")


def test_a_row_of_several_seeds_is_paired_on_the_mean_of_its_seeds_values(tmp_path):
    """softmax and sampled each with seeds 0 and 1: every resample's value of a row is the
    mean of its seeds' values on that resample, its ± the half-width of their interval."""
    from test_report import params_with

    from tailkit.paths import Layout
    from tailkit.reporting.paired import study_pairing

    rng = np.random.default_rng(5)
    n = 1500
    labels = rng.integers(0, 30, n)
    counts = np.bincount(labels, minlength=32) * 10
    base = parse_params(params_with(base__extra_seeds=[1]))
    layout = Layout(tmp_path)
    runs, expected = [], {}
    for name, rate in (("softmax", 0.8), ("sampled", 0.7)):
        seeds = []
        for seed in (0, 1):
            params, output = (base, name) if seed == 0 else base.seed_run(name, seed)
            outcomes = single_label(rng.random(n) < rate, labels)
            layout.outcomes(output).parent.mkdir(parents=True)
            write_outcomes(layout.outcomes(output), outcomes)
            test = {"accuracy": float((outcomes.ranked[:, 0] == labels).mean())}
            runs.append(Run(name, "", params, {"test": test, "train": {"seconds": 1.0}}))
            seeds.append(resampled_values(outcomes, ["accuracy"], counts, META, {}))
        expected[name] = (seeds[0]["accuracy"] + seeds[1]["accuracy"]) / 2
    pairing = study_pairing(runs, ["accuracy"], layout, {"train_counts": counts, **META})
    assert not pairing.unpaired
    for name, want in expected.items():
        np.testing.assert_allclose(pairing.values[name]["accuracy"], want, rtol=1e-12)
        low, high = np.quantile(want, [0.025, 0.975])
        assert pairing.halves[name]["accuracy"] == pytest.approx((high - low) / 2)
    columns = (Column("accuracy", ("test", "accuracy"), True),)
    table = comparison_table(runs, columns, pairing)
    cells = {
        line.split("|")[1].strip(): line.split("|")[4].strip() for line in table.splitlines()[2:]
    }
    half = 100 * pairing.halves["sampled"]["accuracy"]
    mean = np.mean([r.metrics["test"]["accuracy"] for r in runs if r.experiment == "sampled"])
    assert cells["sampled"] == f"{100 * mean:.2f} ±{half:.2f}"  # 10 points below: no ≈
    assert cells["softmax"].startswith("**") and "± " not in cells["softmax"]
