"""The tests behind `tailkit compare`: McNemar per label and Benjamini–Hochberg against
independent formulas, paired-bootstrap intervals per bin and group, false discoveries on an
A/A pair and the power to find a planted gain, and the columns every format carries."""

from __future__ import annotations

import json

import numpy as np
import polars as pl
import pytest
from scipy import stats

from tailkit.evaluation.outcomes import Outcomes
from tailkit.evaluation.per_class import per_class_frame, per_label_results
from tailkit.reporting.compare import Side, Source, compare, render
from tailkit.reporting.compare_tests import MIN_DISCORDANT, label_tests, pair_hits

LABELS = 120


def _study(seed: int, planted: np.ndarray | None = None, rows: int = 12000):
    """Test rows of a Zipf-ish label distribution, two runs whose top-1 is right with
    probability 0.6 independently (plus ``planted``'s labels 0.25 more often for B)."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, LABELS + 1) ** 0.7
    truth = rng.choice(LABELS, size=rows, p=weights / weights.sum())
    counts = np.round(2000 * weights / weights[0]).astype(np.int64)

    def run(boost: np.ndarray | None) -> np.ndarray:
        p = np.full(rows, 0.6)
        if boost is not None:
            p[np.isin(truth, boost)] += 0.25
        right = rng.random(rows) < p
        top = np.where(right, truth, (truth + 1 + rng.integers(0, LABELS - 1, rows)) % LABELS)
        ranked = np.stack([(top + j) % LABELS for j in range(5)], axis=1)
        return ranked

    ranked_a, ranked_b = run(None), run(planted)
    names = pl.DataFrame(
        {
            "label": np.arange(LABELS, dtype=np.int64),
            "name": [f"l{j}" for j in range(LABELS)],
            "train_count": counts,
            "val_count": counts // 8,
            "test_count": np.bincount(truth, minlength=LABELS),
        }
    )
    truth_pair = (np.arange(rows + 1), truth)
    sides, outcomes = [], []
    for name, ranked in (("a", ranked_a), ("b", ranked_b)):
        frame = per_class_frame(names, per_label_results(ranked, truth_pair, LABELS), 5)
        meta = {"tailkit.data_key": "k", "tailkit.k": "5", "tailkit.multilabel": "false"}
        sides.append(Side(Source(name, name, None), frame, meta))
        outcomes.append(Outcomes(name, "k", np.arange(rows), truth_pair, True, ranked, None, None))
    return sides, outcomes, truth, ranked_a, ranked_b


def test_each_label_s_p_is_scipy_s_exact_binomial_test_and_q_is_bh():
    _, (a, b), truth, ranked_a, ranked_b = _study(0)
    tests = label_tests(pair_hits(a, b, 1))
    right_a, right_b = ranked_a[:, 0] == truth, ranked_b[:, 0] == truth
    tested = tests.filter(pl.col("p").is_not_null())
    assert len(tested) > 50
    for row in tested.head(40).iter_rows(named=True):
        rows = truth == row["label"]
        only_a = int((right_a & ~right_b & rows).sum())
        only_b = int((right_b & ~right_a & rows).sum())
        assert (row["a_only"], row["b_only"]) == (only_a, only_b)
        assert only_a + only_b >= MIN_DISCORDANT
        want = stats.binomtest(only_a, only_a + only_b, 0.5).pvalue
        assert row["p"] == pytest.approx(want, rel=1e-9)
    untested = tests.filter(pl.col("p").is_null())
    assert ((untested["a_only"] + untested["b_only"]) < MIN_DISCORDANT).all()
    # Benjamini–Hochberg by its definition: q_(i) = min over j ≥ i of m p_(j) / j
    p = tested["p"].to_numpy()
    order = np.argsort(p)
    m = len(p)
    want_q = np.empty(m)
    for i, index in enumerate(order):
        want_q[index] = min(1.0, min(m * p[order[j]] / (j + 1) for j in range(i, m)))
    np.testing.assert_allclose(tested["q"].to_numpy(), want_q, rtol=1e-12)


def test_an_a_a_pair_shows_few_false_discoveries_and_a_planted_gain_is_found():
    """Labels 10..29 (a frequency band) get +25 points of recall for B: most of them are
    significant gains and nothing else is; without the plant, hardly any label is listed."""
    planted = np.arange(10, 30)
    (a, b), outcomes, *_ = _study(1, planted)
    found = compare(a, b, outcomes=tuple(outcomes), top=LABELS)
    assert found.untested == "" and found.testable > 60
    gains = set(found.significant_gains["label"].to_list())
    assert len(gains & set(planted.tolist())) >= 14  # power on ~100 rows a label
    assert len(gains - set(planted.tolist())) <= 2  # FDR 5 %: about one false gain
    assert len(found.significant_losses) <= 2
    (a, b), outcomes, *_ = _study(2)
    null = compare(a, b, outcomes=tuple(outcomes), top=LABELS)
    assert len(null.significant_gains) + len(null.significant_losses) <= 2


def test_bin_and_group_intervals_hold_the_change_and_the_planted_band_is_beyond_chance():
    planted = np.arange(10, 30)
    (a, b), outcomes, *_ = _study(3, planted)
    found = compare(a, b, outcomes=tuple(outcomes))
    for frame in (found.bins, found.groups):
        for row in frame.iter_rows(named=True):
            assert row["change_low"] <= row["change"] <= row["change_high"]
            assert 0 < row["q"] <= 1
    all_row = found.groups.filter(pl.col("group") == "all").row(0, named=True)
    assert all_row["change"] > 0 and all_row["q"] < 0.05


def test_without_outcomes_the_changes_say_why_they_are_untested_and_formats_carry_tests():
    (a, b), outcomes, *_ = _study(4)
    plain = compare(a, b, outcomes=("a has no rows.parquet (evaluated before)", outcomes[1]))
    assert "No test of these changes: a has no rows.parquet" in render(plain, "md")
    assert "change_low" not in render(plain, "csv")
    tested = compare(a, b, outcomes=tuple(outcomes))
    text = render(tested, "md")
    assert "## Labels changed beyond chance" in text and "95 % interval" in text
    assert render(tested, "md") == text  # deterministic
    body = json.loads(render(tested, "json"))
    assert body["testable"] == tested.testable and "change_low" in body["bins"][0]
    assert "significant_gains" in body
    csv = render(tested, "csv")
    assert isinstance(csv, str) and "change_low" in csv.splitlines()[0]
    not_recall = compare(a, b, metric="precision@1", outcomes=tuple(outcomes))
    assert "not precision@1" in not_recall.untested


def test_the_figure_draws_each_octave_s_interval_and_the_same_data_gives_the_same_bytes(
    tmp_path,
):
    from tailkit.reporting.compare import draw

    (a, b), outcomes, *_ = _study(5, np.arange(10, 30))
    tested = compare(a, b, outcomes=tuple(outcomes))
    first, second = draw(tested, tmp_path / "a.png"), draw(tested, tmp_path / "b.png")
    assert first.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert first.read_bytes() == second.read_bytes()
    plain = compare(a, b, outcomes=("no outcomes", outcomes[1]))
    assert draw(plain, tmp_path / "c.png").read_bytes() != first.read_bytes()


def test_a_bin_of_one_label_is_tested_on_its_rows_not_given_a_zero_width_interval():
    """Resampling labels alone gave a one-label bin (the head's octaves) no variance, and an
    A/A pair's every such bin looked changed; its rows are resampled too."""
    from tailkit.reporting.compare_tests import PairHits, key_tests

    rows = 200
    rng = np.random.default_rng(0)
    a = rng.random(rows) < 0.8
    b = a.copy()
    # 12 rows where exactly one run is right, 6 each way: no change on balance
    right, wrong = np.flatnonzero(a), np.flatnonzero(~a)
    b[rng.choice(right, 6, replace=False)] = False
    b[rng.choice(wrong, 6, replace=False)] = True
    pairs = PairHits(np.zeros(rows, dtype=np.int64), np.arange(rows), a, b, rows)
    found = key_tests(pairs, {"one": np.array([True])}).row(0, named=True)
    assert found["change_low"] <= 0 <= found["change_high"]
    assert found["change_high"] - found["change_low"] > 0.02 and found["p"] > 0.05


def test_a_label_whose_every_row_changed_one_way_is_a_certain_change_within_bounds():
    """Every row of the label right for A only: the change is −1, every resample's too (its
    rows' changes all equal their mean), and the clipped resampled values stay within ±1."""
    from tailkit.reporting.compare_tests import PairHits, key_tests

    rows = 40
    labels = np.repeat(np.arange(4), 10)
    a = np.ones(rows, dtype=bool)
    b = labels >= 1  # label 0: lost on every row; labels 1–3: right for both
    pairs = PairHits(labels, np.arange(rows), a, b, rows)
    found = key_tests(pairs, {"lost": np.arange(4) == 0, "all": np.ones(4, dtype=bool)})
    lost, every = found.row(0, named=True), found.row(1, named=True)
    assert lost["change_low"] == lost["change_high"] == -1.0 and lost["p"] < 0.01
    assert every["change_low"] == every["change_high"] == -0.25
