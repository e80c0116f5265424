"""Chunked prediction against a dense computation, and the metrics against independent ones."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch
from sklearn.metrics import balanced_accuracy_score

from tailkit.components import Loss, Sampler
from tailkit.evaluation.correction import OrderedCorrection, PredictionContext
from tailkit.evaluation.embeddings import class_diameters, diameter_summary, pick_rows
from tailkit.evaluation.metrics import (
    CDF_POINTS,
    classification_metrics,
    expected_calibration_error,
    margin_summary,
    shot_groups,
    topk_labels,
)
from tailkit.evaluation.per_class import group_of
from tailkit.evaluation.plots import margin_cdf_figure, read_cdf
from tailkit.evaluation.predict import (
    CPU_LABEL_CHUNK,
    CPU_TILE_SCORES,
    GPU_CHUNK_SCORES,
    device_label_chunk,
    predict,
    tile_bounds,
)
from tailkit.evaluation.results import write_margin_cdfs
from tailkit.evaluation.topk import chunk_topk, chunked_topk, merge_topk
from tailkit.groups import GroupThresholds
from tailkit.output.output_layer import OutputLayer
from tailkit.plugins.models.linear import Linear


class _Plain(Loss):
    pass


class _Shifted(Loss):
    """Adds a fixed per-label offset, to check that adjustments are applied chunk by chunk."""

    def __init__(self, offset):
        super().__init__()
        self.offset = offset

    def adjust_scores(self, scores, x, label_ids, ctx):
        return scores + self.offset[label_ids]


@pytest.mark.parametrize("chunk", [7, 64, 1000])
def test_chunked_predict_equals_dense(chunk):
    g = torch.Generator().manual_seed(0)
    c, d, n = 64, 6, 50
    layer = OutputLayer(c, d, generator=g)
    layer.bias.normal_(generator=g)
    x = torch.randn(n, d, generator=g)
    y = torch.randint(c, (n,), generator=g)
    offset = torch.randn(c, generator=g)
    ctx = PredictionContext(log_prior=torch.zeros(c))
    adjusted, raw = predict(
        Linear(d), layer, _Shifted(offset), ctx, x, y, k=5, batch_size=16, label_chunk=chunk
    )
    for preds, extra in ((raw, 0.0), (adjusted, offset)):
        scores = x @ layer.weight.T + layer.bias + extra
        torch.testing.assert_close(preds.topk, scores.topk(5, dim=1).indices)
        expected_ll = torch.log_softmax(scores, 1).gather(1, y[:, None]).squeeze(1)
        torch.testing.assert_close(preds.log_likelihood, expected_ll, rtol=1e-5, atol=1e-5)
    _, none = predict(Linear(d), layer, _Plain(), ctx, x, y, label_chunk=chunk)
    assert none is None


def test_a_gpu_widens_the_label_chunk_to_its_score_budget_and_a_cpu_tiles_for_cache(
    monkeypatch,
):
    cpu, gpu = torch.device("cpu"), torch.device("cuda")
    assert device_label_chunk(16_384, 2048, cpu) == CPU_LABEL_CHUNK == 4096
    assert device_label_chunk(1000, 2048, cpu) == 1000  # a narrower chunk stands
    monkeypatch.setattr(numba, "get_num_threads", lambda: 2)
    rows = 2 * CPU_TILE_SCORES // 4096  # 256: a tile's scores fill two threads' share
    assert tile_bounds(2048, 4096, cpu) == list(range(0, 2049, rows))
    assert tile_bounds(100, 4096, cpu) == [0, 100]  # never more rows than the block
    # near-equal tiles: no one-row tile (a matrix-vector product rounds otherwise)
    assert tile_bounds(513, 4096, cpu) == [0, 171, 342, 513]
    assert tile_bounds(40, 10**7, cpu) == [0, 13, 26, 40]  # a wide chunk: 16 rows at most, equal
    assert tile_bounds(1, 4096, cpu) == [0, 1]
    assert tile_bounds(0, 4096, cpu) == [0, 0]
    assert tile_bounds(2048, 16_384, gpu) == [0, 2048]  # a GPU scores the block at once
    # more threads, taller tiles: 16 threads' share is 2,048 rows of 4,096 labels
    monkeypatch.setattr(numba, "get_num_threads", lambda: 16)
    assert tile_bounds(4096, 4096, cpu) == [0, 2048, 4096]
    assert device_label_chunk(16_384, 2048, gpu) == GPU_CHUNK_SCORES // 2048 == 131_072
    assert device_label_chunk(10**7, 2048, gpu) == 10**7  # never narrower than asked
    assert device_label_chunk(16_384, 0, gpu) == GPU_CHUNK_SCORES  # an empty split


# sklearn warns that a predicted class (6) has no true rows; it ignores it, as we do.
@pytest.mark.filterwarnings("ignore:y_pred contains classes not in y_true")
def test_metrics_against_sklearn_and_hand_counts():
    rng = np.random.default_rng(0)
    train_counts = np.array([500, 150, 60, 20, 19, 3, 0, 101])
    labels = rng.integers(0, 8, size=400)
    labels = labels[labels != 6]  # class 6 never evaluated
    topk = rng.integers(0, 8, size=(labels.size, 5))
    topk[: labels.size // 2, 0] = labels[: labels.size // 2]
    ll = rng.normal(size=labels.size)
    m = classification_metrics(labels, topk, ll, train_counts)
    assert m["accuracy"] == pytest.approx((topk[:, 0] == labels).mean())
    assert m["balanced_accuracy"] == pytest.approx(balanced_accuracy_score(labels, topk[:, 0]))
    assert m["top5_accuracy"] == pytest.approx((topk == labels[:, None]).any(1).mean())
    assert m["log_likelihood"] == pytest.approx(ll.mean())

    def recall(c):
        sel = labels == c
        return (topk[sel, 0] == c).mean()

    assert m["many"] == pytest.approx(np.mean([recall(c) for c in (0, 1, 7)]))
    assert m["medium"] == pytest.approx(np.mean([recall(c) for c in (2, 3)]))
    assert m["few"] == pytest.approx(np.mean([recall(c) for c in (4, 5)]))  # 6: no test rows
    assert (m["many_classes"], m["medium_classes"], m["few_classes"]) == (3, 2, 2)


def test_empty_group_is_null():
    m = classification_metrics(
        np.array([0, 1]), np.array([[0], [0]]), np.zeros(2), np.array([200, 150])
    )
    assert m["medium"] is None and m["few"] is None and m["many"] == pytest.approx(0.5)


def test_group_boundaries_follow_classifier_balancing():
    groups = shot_groups(np.array([101, 100, 20, 19]))
    assert groups["many"].tolist() == [True, False, False, False]
    assert groups["medium"].tolist() == [False, True, True, False]
    assert groups["few"].tolist() == [False, False, False, True]


def test_group_thresholds_move_the_boundaries_and_every_group_summary_follows():
    """evaluate.groups (issue 17 item 2): each boundary value falls on the side the thresholds
    say, for the masks, the per-class metrics, margins, diameters and the per-class table."""
    counts = np.array([51, 50, 49, 6, 5, 4])
    custom = GroupThresholds(many_above=50, few_below=5)
    masks = shot_groups(counts, custom)
    assert masks["many"].tolist() == [True, False, False, False, False, False]
    assert masks["medium"].tolist() == [False, True, True, True, True, False]
    assert masks["few"].tolist() == [False, False, False, False, False, True]
    assert sum(m.astype(int) for m in masks.values()).tolist() == [1] * 6  # a partition
    default = shot_groups(counts)
    assert default["medium"].tolist() == [True] * 3 + [False] * 3
    assert default["few"].tolist() == [False] * 3 + [True] * 3 and not default["many"].any()
    # class c is right iff c is even: group means from the custom masks
    labels = np.arange(6)
    topk = np.stack([np.where(labels % 2 == 0, labels, (labels + 1) % 6)] * 5, axis=1)
    m = classification_metrics(labels, topk, None, counts, custom)
    assert m["many"] == 1.0 and m["medium"] == pytest.approx(2 / 4) and m["few"] == 0.0
    assert (m["many_classes"], m["medium_classes"], m["few_classes"]) == (1, 4, 1)
    summary, _ = margin_summary(np.array([1.0, -1, 1, -1, 1, -1]), labels, counts, custom)
    assert summary["many"]["rows"] == 1 and summary["medium"]["rows"] == 4
    diameters = diameter_summary(np.linspace(0.1, 0.6, 6), counts, custom)
    assert diameters["many"]["classes"] == 1 and diameters["few"]["classes"] == 1
    assert group_of(counts, custom).to_list() == ["many", *["medium"] * 4, "few"]
    assert custom.ranges() == {"many": "> 50", "medium": "5–50", "few": "< 5"}
    with pytest.raises(ValueError, match="both many and few"):
        GroupThresholds(many_above=10, few_below=12)
    GroupThresholds(many_above=10, few_below=11)  # no medium class at all, but a partition


# ---------------------------------------------------------------- margins, ECE, diameters


def test_margins_from_chunked_predictions_equal_the_dense_definition():
    g = torch.Generator().manual_seed(3)
    c, d, n = 40, 5, 60
    layer = OutputLayer(c, d, generator=g)
    x = torch.randn(n, d, generator=g)
    y = torch.randint(c, (n,), generator=g)
    ctx = PredictionContext(log_prior=torch.zeros(c))
    preds, _ = predict(Linear(d), layer, _Plain(), ctx, x, y, k=5, label_chunk=7)
    scores = (x @ layer.weight.T + layer.bias).double()
    expected = []
    for i in range(n):
        others = [scores[i, j].item() for j in range(c) if j != y[i]]
        expected.append(scores[i, y[i]].item() - max(others))
    assert preds.margins(y).double().numpy() == pytest.approx(np.array(expected), abs=1e-5)
    # A positive margin is exactly a correct top-1 prediction.
    assert ((preds.margins(y) > 0) == (preds.topk[:, 0] == y)).all()


def test_expected_calibration_error_against_a_loop():
    rng = np.random.default_rng(4)
    confidence = rng.uniform(0, 1, 500)
    confidence[:3] = [0.0, 1.0, 1 / 15]  # the edges
    correct = rng.uniform(0, 1, 500) < confidence**0.5
    total = 0.0
    for b in range(15):
        lo, hi = b / 15, (b + 1) / 15
        inside = [(c >= lo) and (c < hi or (b == 14 and c <= hi)) for c in confidence]
        inside = np.array(inside)
        if inside.any():
            total += inside.sum() / 500 * abs(correct[inside].mean() - confidence[inside].mean())
    assert expected_calibration_error(confidence, correct) == pytest.approx(total, abs=1e-12)
    # Perfectly calibrated in every bin gives 0; always-wrong certainty gives 1.
    assert expected_calibration_error(np.ones(10), np.zeros(10)) == pytest.approx(1.0)


def test_margin_summary_groups_rows_by_their_labels_training_count():
    train_counts = np.array([500, 50, 5])
    labels = np.array([0, 0, 1, 1, 1, 2])
    margins = np.array([2.0, -1.0, 0.5, 1.5, -0.5, -3.0])
    summary, cdfs = margin_summary(margins, labels, train_counts)
    assert summary["many"] == {"median": 0.5, "mean": 0.5, "negative_fraction": 0.5, "rows": 2}
    assert summary["medium"]["median"] == 0.5 and summary["few"]["negative_fraction"] == 1.0
    assert cdfs["medium"][0] == -0.5 and cdfs["medium"][-1] == 1.5
    assert np.all(np.diff(cdfs["many"]) >= 0)
    none, _ = margin_summary(margins[:2], labels[:2], train_counts)
    assert none["few"] is None


def test_class_diameters_against_brute_force():
    rng = np.random.default_rng(5)
    z = rng.normal(size=(40, 3))
    labels = rng.integers(0, 6, 40)
    labels[labels == 5] = 4  # class 5 absent
    labels[0] = 3
    labels[labels == 3] = 2
    labels[0] = 3  # class 3 has a single row
    got = class_diameters(torch.tensor(z), labels, 6)
    scale = np.linalg.norm(z, axis=1).max()
    for c in range(6):
        rows = z[labels == c]
        if len(rows) < 2:
            assert np.isnan(got[c])
            continue
        best = max(np.linalg.norm(a - b) for a in rows for b in rows)
        assert got[c] == pytest.approx(best / scale, rel=1e-12)
    summary = diameter_summary(got, np.array([500, 50, 50, 5, 5, 5]))
    medium = [got[c] for c in (1, 2) if not np.isnan(got[c])]
    assert summary["medium"]["classes"] == len(medium)
    assert summary["medium"]["mean"] == pytest.approx(np.mean(medium))
    assert summary["many"]["mean"] == pytest.approx(got[0])
    few = [got[c] for c in (3, 4, 5) if not np.isnan(got[c])]
    assert summary["few"]["classes"] == len(few) == 1  # class 3 has one row, class 5 none


def test_pick_rows_caps_each_class_and_is_seeded():
    labels = np.array([0] * 50 + [1] * 3 + [2] * 10)
    picked = pick_rows(labels, 8, seed=1)
    counts = np.bincount(labels[picked], minlength=3)
    assert counts.tolist() == [8, 3, 8]
    assert np.array_equal(picked, pick_rows(labels, 8, seed=1))
    assert not np.array_equal(picked, pick_rows(labels, 8, seed=2))


def test_margin_cdf_figure_reads_the_evaluate_files(tmp_path):
    for name, shift in (("a", 0.0), ("b", 1.0)):
        d = tmp_path / name
        d.mkdir()
        for group in ("many", "few"):
            rows = "".join(f"{q - 0.5 + shift:.3f}\t{q:.2f}\n" for q in np.linspace(0, 1, 101))
            (d / f"margins-{group}.tsv").write_text("margin\tcdf\n" + rows)
    out = margin_cdf_figure({"a": tmp_path / "a", "b": tmp_path / "b"}, tmp_path / "f.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    margins, cdf = read_cdf(tmp_path / "b" / "margins-few.tsv")
    assert margins[0] == pytest.approx(0.5) and cdf[-1] == 1.0
    (tmp_path / "bad.tsv").write_text("x\ty\n")
    with pytest.raises(ValueError, match=r"bad\.tsv"):
        read_cdf(tmp_path / "bad.tsv")


def test_every_group_has_a_margin_file_so_a_clone_keeps_the_plot_folder(tmp_path):
    # git keeps no empty folder: a model without margins (a peer tool) must still leave files
    write_margin_cdfs(tmp_path / "peer", {})
    assert sorted(p.name for p in (tmp_path / "peer").iterdir()) == [
        "margins-few.tsv",
        "margins-many.tsv",
        "margins-medium.tsv",
    ]
    assert read_cdf(tmp_path / "peer" / "margins-few.tsv") == ([], [])
    write_margin_cdfs(tmp_path / "model", {"many": np.linspace(-1.0, 2.0, len(CDF_POINTS))})
    margins, cdf = read_cdf(tmp_path / "model" / "margins-many.tsv")
    assert len(margins) == len(CDF_POINTS) and cdf == [float(f"{q:.2f}") for q in CDF_POINTS]
    assert read_cdf(tmp_path / "model" / "margins-medium.tsv") == ([], [])
    # the figure draws the model's curve and skips the empty files
    out = margin_cdf_figure(
        {"model": tmp_path / "model", "peer": tmp_path / "peer"}, tmp_path / "f.png"
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("chunk,block", [(7, 5), (64, 1000), (1000, 3)])
def test_chunked_topk_equals_a_dense_topk(chunk, block):
    g = torch.Generator().manual_seed(6)
    q, w, b = torch.randn(37, 8, generator=g), torch.randn(150, 8, generator=g), torch.randn(150)
    scores, ids = chunked_topk(q, w, 5, bias=b, label_chunk=chunk, query_block=block)
    dense = q @ w.T + b
    expected = dense.topk(5, dim=1)
    torch.testing.assert_close(ids, expected.indices)
    torch.testing.assert_close(scores, expected.values)
    _, no_bias = chunked_topk(q, w, 200, label_chunk=chunk)  # k > C: all labels, ranked
    assert no_bias.shape == (37, 150)
    torch.testing.assert_close(no_bias, (q @ w.T).argsort(dim=1, descending=True))


# ---------------------------------------------------------------- score ties (issue 19 item 10)


class _PermutedTable(OrderedCorrection, Sampler):
    """A conditional sampler whose log q is 0 everywhere (it moves no score) but whose table
    order is a permutation, so prediction scores the columns out of label order."""

    conditional = True

    def __init__(self, order: torch.Tensor) -> None:
        self.order = order

    def label_order(self) -> torch.Tensor:
        return self.order

    def log_prob(self, x, labels):
        return torch.zeros(x.shape[0], labels.shape[-1])


class _Corrected(Loss):
    def adjust_scores(self, scores, x, label_ids, ctx):
        return ctx.add_log_q(scores, x, label_ids)


def _tied_problem(dtype: torch.dtype):
    """Integer weights and inputs (exact dot products in any summation order) where label j
    repeats the weight row of label j mod 5: every score is tied with a dozen others, and the
    ties straddle every chunk boundary."""
    g = torch.Generator().manual_seed(11)
    c, d, n = 61, 4, 40
    layer = OutputLayer(c, d, generator=g)
    base = torch.randint(-2, 3, (5, d), generator=g).to(dtype)
    layer.weight, layer.bias = base[torch.arange(c) % 5], torch.zeros(c, dtype=dtype)
    x = torch.randint(-2, 3, (n, d), generator=g).to(dtype)
    y = torch.randint(c, (n,), generator=g)
    expected = topk_labels((x @ layer.weight.T).numpy(), 7)
    return layer, x, y, expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])  # the compiled kernel; torch
@pytest.mark.parametrize("chunk", [3, 7, 64])
@pytest.mark.parametrize("permuted", [False, True])
def test_predict_breaks_score_ties_by_the_lower_label_id(dtype, chunk, permuted):
    """One rule everywhere: the pipeline's top-k equals topk_labels (−score, then id), in
    label-id order and in a sampler's permuted column order, on either merge path."""
    layer, x, y, expected = _tied_problem(dtype)
    c = layer.num_classes
    if permuted:
        order = torch.randperm(c, generator=torch.Generator().manual_seed(2))
        loss, ctx = _Corrected(), PredictionContext(torch.zeros(c), _PermutedTable(order))
    else:
        loss, ctx = _Plain(), PredictionContext(log_prior=torch.zeros(c))
    preds, _ = predict(
        Linear(x.shape[1]), layer, loss, ctx, x, y, k=7, batch_size=16, label_chunk=chunk
    )
    np.testing.assert_array_equal(preds.topk.numpy(), expected)


@pytest.mark.parametrize("chunk", [3, 7, 64])
def test_chunked_topk_breaks_ties_by_the_lower_label_id(chunk):
    layer, x, _, expected = _tied_problem(torch.float32)
    _, ids = chunked_topk(x, layer.weight, 7, label_chunk=chunk, query_block=9)
    np.testing.assert_array_equal(ids.numpy(), expected)


def test_chunk_topk_with_ties_straddling_the_cut_and_shuffled_columns():
    """torch.topk picks arbitrarily among scores equal to the k-th best; chunk_topk must pick
    the lowest label ids, also when column j is not label j."""
    g = torch.Generator().manual_seed(4)
    scores = torch.randint(0, 4, (30, 50), generator=g).float()
    labels = torch.randperm(50, generator=g) + 1000
    top, ids = chunk_topk(scores, labels, 6)
    by_label = torch.empty(30, 50)
    by_label[:, labels - 1000] = scores
    expected = topk_labels(by_label.numpy(), 6) + 1000
    np.testing.assert_array_equal(ids.numpy(), expected)
    torch.testing.assert_close(top, by_label.gather(1, ids - 1000))
    # merging keeps the rule: an empty slot (id −1) loses the tie with a real label
    empty_s = torch.full((30, 6), float("-inf"))
    empty_i = torch.full((30, 6), -1)
    _, merged = merge_topk(
        empty_s, empty_i, torch.full((30, 2), float("-inf")), torch.tensor([5, 3]), 3
    )
    assert merged[:, :2].tolist() == [[3, 5]] * 30 and (merged[:, 2] == -1).all()


def test_a_non_finite_metric_is_written_as_null_with_its_reason(tmp_path):
    """Issue 19 item 12: a −∞ mean log-likelihood (a true label the model or a proposal gives
    probability 0) once crashed the stage in json.dumps(allow_nan=False)."""
    import json

    from tailkit.storage.metrics_file import null_non_finite, write_metrics

    data = {
        "test": {"log_likelihood": float("-inf"), "accuracy": 0.5, "ece": float("nan")},
        "curve": [1.0, float("inf")],
        "group": None,
        "count": np.float64(np.inf),  # numpy scalars too (np.float64 is a float)
    }
    write_metrics(tmp_path / "m.json", data)
    back = json.loads((tmp_path / "m.json").read_text())
    assert back == {
        "test": {
            "log_likelihood": None,
            "log_likelihood_null_reason": "-inf",
            "accuracy": 0.5,
            "ece": None,
            "ece_null_reason": "nan",
        },
        "curve": [1.0, None],
        "group": None,
        "count": None,
        "count_null_reason": "inf",
    }
    assert null_non_finite({"a": 1, "b": [{"c": 2.5}]}) == {"a": 1, "b": [{"c": 2.5}]}
