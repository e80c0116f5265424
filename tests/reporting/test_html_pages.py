"""The study and comparison pages: self-contained bytes, bands against a direct bootstrap, and
what a person sees in a real browser (tests/browser.py): no console error, no request, the
table's numbers those of the metrics files, sorting, searching and the per-label drill-down."""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest
from browser import check_study_page, open_page

from tailkit.evaluation import intervals
from tailkit.evaluation.per_class import frequency_bin
from tailkit.reporting.bands import bin_bands
from tailkit.reporting.compare import compare
from tailkit.reporting.html.comparison import comparison_page
from tailkit.reporting.html.page import packed, render
from tailkit.testing.comparisons import generated_comparison, label_name


def _data_block(page: str) -> dict:
    found = re.search(
        r'<script type="application/json" id="tailkit-data">(.*?)</script>', page, re.DOTALL
    )
    assert found
    return json.loads(found.group(1).replace("<\\/", "</"))


def _unpacked(value: dict) -> np.ndarray:
    kind = {"i32": "<i4", "f32": "<f4", "f64": "<f8"}[value["$array"]]
    return np.frombuffer(base64.b64decode(value["b64"]), dtype=kind)


def test_a_page_is_one_file_with_its_data_inline_and_no_address_to_fetch():
    values = np.array([3, -1, 2**31 - 1], dtype=np.int64)
    data = {
        "text": "a </script><script>alert(1)</script> b",
        "ids": packed(values, "i32"),
        "x": [0.5, float("nan"), np.float64(2.0)],
    }
    page = render("compare", "t", data)
    assert page == render("compare", "t", data)  # the same data, the same bytes
    back = _data_block(page)
    assert back["text"] == data["text"] and back["x"] == [0.5, None, 2.0]
    assert _unpacked(back["ids"]).tolist() == values.tolist()
    assert page.count("</script>") == 2  # the data block's and the scripts', nothing injected
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    # the only address in the page is SVG's namespace, which names and fetches nothing
    assert set(re.findall(r"https?://[^\s\"'<>]+", page)) == {"http://www.w3.org/2000/svg"}
    assert not re.search(r"\b(src|href)\s*=|@import|url\(|fetch\(|XMLHttpRequest", page)


def test_bin_bands_are_the_percentiles_of_the_label_held_linear_bootstrap():
    made = generated_comparison(labels=60, rows=3000, seed=4)
    first = made.outcomes[0]
    counts = made.sides[0].frame["train_count"].to_numpy()
    bands = bin_bands({"a": first}, counts, depth=1)["a"]
    # the same Poisson counts, each bin's value moved by the resample's mean of per-row
    # residuals built label by label here: hit − the label's rate, times √(n/(n − 1)), over
    # (labels in the bin × the label's rows); one-row labels against their common rate
    truth, hit = made.truth, (first.ranked[:, 0] == made.truth).astype(float)
    n = truth.shape[0]
    present = np.unique(truth)
    bins = frequency_bin(counts[present], 4)
    draws = np.concatenate(
        [sums.counts_t for sums in intervals.Resampler(n).blocks()], axis=1
    )  # (rows, resamples)
    assert set(bands) == {int(b) for b in np.unique(bins)}
    for b, (low, high) in bands.items():
        members = present[bins == b]
        single = [j for j in members if np.count_nonzero(truth == j) == 1]
        pooled = np.mean([hit[truth == j][0] for j in single]) if single else 0.0
        residual = np.zeros(n)
        for j in members:
            where = np.flatnonzero(truth == j)
            if where.size > 1:
                scale = np.sqrt(where.size / (where.size - 1))
                residual[where] = scale * (hit[where] - hit[where].mean())
            elif len(single) > 1:
                residual[where] = np.sqrt(len(single) / (len(single) - 1)) * (hit[where] - pooled)
            else:
                residual[where] = hit[where] - 0.5
            residual[where] /= members.size * where.size
        value = np.mean([hit[truth == j].mean() for j in members])
        moved = np.clip(value + n * (residual @ draws) / draws.sum(axis=0), 0.0, 1.0)
        np.testing.assert_allclose([low, high], np.quantile(moved, [0.025, 0.975]), rtol=1e-9)
        assert low <= value <= high


def test_a_tail_of_one_row_labels_keeps_its_value_inside_its_interval():
    """Resampled by rows, a mean over one-row labels lost a third of them each time and the
    rest pulled it up, past its own value; holding each label's rows it stays inside."""
    # both runs miss every label but B the 60 most frequent: the change lives in the head
    made = generated_comparison(
        labels=3000, rows=4000, seed=6, planted=np.arange(60), hit=0.0, boost=0.9
    )
    result = compare(*made.sides, outcomes=made.outcomes)
    for frame in (result.bins, result.groups):
        for row in frame.iter_rows(named=True):
            assert row["change_low"] <= row["change"] <= row["change_high"], row


def test_the_comparison_page_holds_every_label_and_both_runs_rankings():
    made = generated_comparison(labels=300, rows=6000, seed=1, planted=np.arange(3))
    result = compare(*made.sides, outcomes=made.outcomes)
    data = _data_block(comparison_page(result, made.outcomes))
    assert result.labels is not None
    ids = _unpacked(data["labels"]["id"])
    assert ids.tolist() == result.labels["label"].to_list()
    np.testing.assert_array_equal(
        _unpacked(data["labels"]["change"]), result.labels["change"].to_numpy().astype(np.float32)
    )
    q = _unpacked(data["labels"]["q"])
    assert np.array_equal(np.isnan(q), result.labels["q"].is_null().to_numpy())
    ranked = _unpacked(data["rows"]["b"]).reshape(-1, data["rows"]["k"])
    assert np.array_equal(ranked, made.outcomes[1].ranked)
    names = data["names"]["text"].split("\n")
    assert names[17] == label_name(int(_unpacked(data["names"]["ids"])[17]))
    unnamed = generated_comparison(labels=50, rows=500, named=False)
    result = compare(*unnamed.sides, outcomes=unnamed.outcomes)
    assert _data_block(comparison_page(result, unnamed.outcomes))["names"] is None


@pytest.mark.slow
def test_the_study_page_shows_the_metrics_files_numbers_and_sorts(tiny_project):
    check_study_page(tiny_project)


@pytest.mark.slow
def test_the_comparison_page_finds_a_label_by_name_and_shows_its_rows(tmp_path):
    made = generated_comparison(labels=400, rows=8000, seed=2, planted=np.arange(4))
    result = compare(*made.sides, outcomes=made.outcomes)
    assert result.labels is not None
    out = tmp_path / "compare.html"
    out.write_text(comparison_page(result, made.outcomes))
    with open_page(out) as visit:
        assert visit.problems == [] and visit.outside_requests() == []
        p = visit.page
        search = p.locator("#label-table input[type=search]")
        search.fill("glacier")
        expected = sum("glacier" in label_name(j) for j in result.labels["label"].to_list())
        assert p.locator("#label-table .vcount").inner_text().startswith(f"{expected:,} of")
        search.fill(label_name(17))
        first = p.locator("#label-table tbody tr").first
        assert first.locator("td").first.inner_text() == "17"
        first.click()
        assert label_name(17) in p.locator("#drill h3").inner_text()
        test_rows = int(np.count_nonzero(made.truth == 17))
        assert p.locator("#drill-rows tbody tr").count() == min(test_rows, 200)
        assert p.locator("#drill-rows .hit").count() > 0  # the label, marked in the top-k
        search.fill("")
        p.locator("#label-table th", has_text="change").click()
        changes = [
            float(t) for t in p.locator("#label-table tbody td:nth-child(7)").all_inner_texts()
        ]
        top = np.sort(100 * result.labels["change"].to_numpy())[::-1][: len(changes)]
        np.testing.assert_allclose(changes, np.round(top, 2), atol=0.006)
        assert p.locator("#volcano canvas").count() == 1
        visit.screenshot("compare.png")
