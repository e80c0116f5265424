"""Multi-label rows end to end: label sets, their cache column, subsample, the losses' two views
(padded lists for full losses, (row, positive) pairs with every label masked as a hit for sampled
ones) and the XC metrics of evaluate, each checked against an independent computation."""

from __future__ import annotations

import json
import math
import types
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp
import torch
from conftest import prepare_stages

from tailkit import hookimpl
from tailkit.components import RawData
from tailkit.errors import DataValidationError, InvalidParameterError
from tailkit.evaluation.metrics import inverse_propensity
from tailkit.labels import LabelSets
from tailkit.output.output_layer import OutputLayer
from tailkit.params import parse_params
from tailkit.paths import Layout
from tailkit.plugins.losses.decoupled import Decoupled
from tailkit.plugins.losses.softmax import SoftmaxCE
from tailkit.registry import make_registry
from tailkit.stages import download, evaluate, featurize, fit_sampler, subsample, train
from tailkit.storage import tensorfile
from tailkit.storage.feature_cache import read_features, write_features
from tailkit.storage.label_table import read_label_table
from tailkit.storage.splits import read_meta, read_split
from tailkit.testing.batches import full_batch
from tailkit.training.step_batch import sampled_input

SETS = [[2, 0], [], [1], [3, 1, 0], [4], [], [0, 4]]


def _brute_sets(sets: LabelSets) -> list[set[int]]:
    ptr, ids = sets.indptr.tolist(), sets.indices.tolist()
    return [set(ids[ptr[i] : ptr[i + 1]]) for i in range(len(sets))]


# ------------------------------------------------------------------ LabelSets


def test_label_sets_views_match_the_lists() -> None:
    sets = LabelSets.from_lists(SETS, 5)
    assert _brute_sets(sets) == [set(s) for s in SETS]
    assert sets.sizes.tolist() == [2, 0, 1, 3, 1, 0, 2]
    assert sets.counts().tolist() == [3, 2, 1, 1, 2]
    picked = sets.select(torch.tensor([3, 1, 6, 3]))
    assert _brute_sets(picked) == [{0, 1, 3}, set(), {0, 4}, {0, 1, 3}]
    padded = picked.padded()
    assert padded.tolist() == [[0, 1, 3], [-1, -1, -1], [0, 4, -1], [0, 1, 3]]
    rows, ids = picked.pairs()
    assert list(zip(rows.tolist(), ids.tolist(), strict=True)) == [
        (0, 0), (0, 1), (0, 3), (2, 0), (2, 4), (3, 0), (3, 1), (3, 3)
    ]  # fmt: skip
    csr = sp.csr_matrix(([1.0] * 5, ([0, 0, 2, 2, 2], [4, 1, 0, 4, 4])), shape=(3, 5))
    assert _brute_sets(LabelSets.from_csr(csr)) == [{1, 4}, set(), {0, 4}]


def test_contains_is_set_membership_for_per_row_and_shared_ids() -> None:
    sets = LabelSets.from_lists(SETS, 5)
    truth = _brute_sets(sets)
    g = torch.Generator().manual_seed(0)
    rows = torch.randint(0, len(SETS), (40,), generator=g)
    ids = torch.randint(0, 5, (40, 6), generator=g)
    got = sets.contains(rows, ids)
    want = [[int(v) in truth[int(r)] for v in row] for r, row in zip(rows, ids, strict=True)]
    assert got.tolist() == want
    shared = torch.tensor([4, 0, 4, 2, 0, 1])  # a draw with replacement repeats ids
    assert sets.contains(rows, shared).tolist() == [
        [int(v) in truth[int(r)] for v in shared] for r in rows
    ]
    empty = LabelSets.from_lists([[], []], 3)
    assert not empty.contains(torch.tensor([0, 1]), torch.tensor([[0, 2], [1, 1]])).any()


def test_label_sets_refuse_ids_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"\[0, 3\)"):
        LabelSets.from_lists([[0, 3]], 3)


# ------------------------------------------------------------------ cache


def test_multi_label_column_round_trips_through_the_cache(tmp_path: Path) -> None:
    sets = LabelSets.from_lists(SETS, 5)
    x = np.arange(len(SETS) * 2, dtype=np.float32).reshape(-1, 2)
    path = tmp_path / "f.parquet"
    write_features(path, x, sets, np.arange(len(SETS)), {"split": "train"})
    assert str(pq.read_schema(path).field("label").type) == "list<element: int32 not null>"
    table = read_features(path)
    assert isinstance(table.labels, LabelSets) and table.labels.num_classes == 5
    assert _brute_sets(table.labels) == [set(s) for s in SETS]
    assert table.metadata["multilabel"] is True
    assert read_features(path, columns=["label"]).x is None


# ------------------------------------------------------------------ a multi-label dataset


class TopicXC:
    """Bag-of-words rows over 60 words; 12 labels with Zipf-like frequencies, each owning 5
    words; a row draws 0-3 labels and words from them plus noise. The XC repository's given
    trn/tst split (the last quarter is the test split)."""

    def __init__(self, *, rows: int = 800) -> None:
        self.rows = rows

    def fetch(self, dest: Path) -> None:
        (dest / "fake.txt").write_text("fake\n")

    def load(self, raw_dir: Path) -> RawData:
        rng = np.random.default_rng(3)
        n, labels, words = self.rows, 12, 60
        p = 1.0 / np.arange(1, labels + 1)
        p /= p.sum()
        sets = []
        for _ in range(n):
            size = rng.choice([0, 1, 2, 3], p=[0.05, 0.45, 0.3, 0.2])
            sets.append(sorted(rng.choice(labels, size=size, replace=False, p=p).tolist()))
        counts = rng.poisson(0.15, size=(n, words)).astype(np.float32)
        for i, s in enumerate(sets):
            for label in s:
                counts[i, label * 5 + rng.integers(0, 5, size=3)] += 1.0
        indicator = LabelSets.from_lists(sets, labels).to_csr()
        splits = {"train": np.arange(n * 3 // 4), "test": np.arange(n * 3 // 4, n)}
        names = [f"topic{i}" for i in range(labels)]
        return RawData(sp.csr_matrix(counts), indicator, names, modality="sparse", splits=splits)


def _plugin():
    mod = types.SimpleNamespace()

    @hookimpl
    def register_datasets(register):
        register("topic-xc", TopicXC)

    mod.register_datasets = register_datasets
    return mod


REGISTRY = make_registry(extra_plugins=[("test-multilabel", _plugin())])
ADAGRAD = {"name": "adagrad", "lr": 0.3}
EXPERIMENTS = {
    "zlpr": {
        "loss": {"name": "multilabel-ce"},
        "sampler": "none",
        "features": "tfidf-svd",
        "optimizer": ADAGRAD,
    },
    "pal": {
        "loss": {"name": "softmax"},
        "sampler": "none",
        "features": "tfidf-svd",
        "optimizer": ADAGRAD,
    },
    "bce": {
        "loss": {"name": "decoupled"},
        "sampler": "none",
        "features": "tfidf-svd",
        "optimizer": ADAGRAD,
    },
    "sampled": {
        "loss": {"name": "sampled-softmax"},
        "sampler": "unigram",
        "features": "tfidf-svd",
        "negatives": 4,
        "optimizer": ADAGRAD,
    },
    "tree-ns": {
        "loss": {"name": "negative-sampling"},
        "sampler": "tree",
        "features": "tfidf-svd",
        "negatives": 3,
        "optimizer": ADAGRAD,
    },
    "ldam": {
        "loss": {"name": "ldam"},
        "sampler": "none",
        "features": "tfidf-svd",
        "optimizer": ADAGRAD,
    },
}


def _raw_params(**subsample) -> dict:
    return {
        "base": {"device": "cpu"},
        "dataset": {"name": "topic-xc"},
        "subsample": {"val_fraction": 0.2, **subsample},
        "featurize": {"tfidf-svd": {"name": "tfidf-svd", "dim": 24}},
        "samplers": {"unigram": {"name": "unigram"}, "tree": {"name": "tree", "k": 3}},
        "train": {"epochs": 12, "batch_size": 32, "eval_every": 20, "val_rows": 100},
        "evaluate": {"batch_size": 64, "label_chunk": 5},
        "experiments": EXPERIMENTS,
    }


def _params(**subsample):
    return parse_params(_raw_params(**subsample), "test-params")


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[object, Layout]:
    params = _params()
    layout = Layout(tmp_path_factory.mktemp("multilabel"))
    prepare_stages(params, layout, REGISTRY, "tfidf-svd")
    return params, layout


def test_subsample_keeps_the_given_test_split_and_draws_val_at_random(prepared) -> None:
    _, layout = prepared
    raw = TopicXC().load(layout.root)
    truth = _brute_sets(LabelSets.from_csr(raw.labels))
    meta = read_meta(layout.split)
    rows = {}
    for name in ("train", "val", "test"):
        rows[name], labels = read_split(layout.split, name)
        assert isinstance(labels, LabelSets)
        assert _brute_sets(labels) == [truth[r] for r in rows[name]]
        assert meta[f"{name}_rows"] == rows[name].size
        want = np.bincount([label for r in rows[name] for label in truth[r]], minlength=12)
        assert meta[f"{name}_counts"].tolist() == want.tolist()
    assert rows["test"].tolist() == list(range(600, 800))
    assert rows["val"].size == 120 and rows["train"].size == 480  # 20 % of the 600 given
    assert sorted([*rows["train"], *rows["val"]]) == list(range(600))
    assert meta["multilabel"] is True


@pytest.mark.parametrize("setting", [{"profile": "exp"}, {"balanced_test": True}])
def test_a_per_class_profile_is_refused_for_multi_label_rows(setting, tmp_path: Path) -> None:
    params = _params(**setting)
    layout = Layout(tmp_path)
    download.run(params, layout, REGISTRY)
    with pytest.raises(DataValidationError) as info:
        subsample.run(params, layout, REGISTRY)
    message = str(info.value)
    assert message.startswith("dataset 'topic-xc': multi-label rows have no single class")
    assert "natural" in message and "single_label: true" in message and "\n" not in message
    assert not layout.split.exists()


def test_a_single_label_full_loss_is_refused_naming_the_multi_label_losses(prepared) -> None:
    params, layout = prepared
    with pytest.raises(InvalidParameterError) as info:
        train.run(params, layout, REGISTRY, "ldam")
    message = str(info.value)
    assert message.startswith("experiments.ldam.loss: loss 'ldam' takes one label per row")
    for loss in ("multilabel-ce", "softmax", "logit-adjusted", "balanced-softmax", "decoupled",
                 "cb-focal", "distribution-balanced"):  # fmt: skip
        assert loss in message
    assert not layout.model("ldam").exists()


def _dense_scores(params, layout: Layout, experiment: str) -> np.ndarray:
    """Test scores f(x) = W x + b of a trained linear model, all labels at once."""
    state = tensorfile.load(layout.model(experiment) / "model.safetensors")
    x = read_features(layout.feature_set("tfidf-svd") / "test.parquet").x
    w, b = state["layer"]["weight"], state["layer"]["bias"]
    return (x @ w.t() + b).numpy()


def _independent_xc_metrics(scores: np.ndarray, truth: list[set[int]], q: np.ndarray, k: int):
    """P@k and PSP@k straight from the definitions (datasets-metrics.md §2), row by row."""
    ranked = [sorted(range(scores.shape[1]), key=lambda j: (-row[j], j))[:k] for row in scores]
    p_at = sum(len(set(r) & t) for r, t in zip(ranked, truth, strict=True)) / (k * len(truth))
    gain = sum(q[j] for r, t in zip(ranked, truth, strict=True) for j in r if j in t)
    best = sum(sum(sorted((q[j] for j in t), reverse=True)[:k]) for t in truth)
    return p_at, gain / best


@pytest.mark.parametrize("experiment", ["zlpr", "pal", "bce", "sampled", "tree-ns"])
def test_train_and_evaluate_report_the_xc_metrics_of_the_trained_scores(prepared, experiment):
    params, layout = prepared
    summary = train.run(params, layout, REGISTRY, experiment)
    assert summary["steps"] == 12 * math.ceil(480 / 32)
    metrics = evaluate.run(params, layout, REGISTRY, experiment)
    test = read_features(layout.feature_set("tfidf-svd") / "test.parquet").labels
    truth = _brute_sets(test)
    meta = read_meta(layout.feature_set("tfidf-svd"))
    q = inverse_propensity(np.asarray(meta["train_counts"]), meta["train_rows"])
    scores = _dense_scores(params, layout, experiment)
    # Negative sampling from the tree adds log p_n(y|x) at prediction (Bamler-Mandt); the raw
    # scores are then the "uncorrected" block's.
    plain = metrics.get("uncorrected", metrics["test"])
    assert ("uncorrected" in metrics) == (experiment == "tree-ns")
    for k in (1, 3, 5):
        p_at, psp_at = _independent_xc_metrics(scores, truth, q, k)
        assert plain[f"P@{k}"] == pytest.approx(p_at, abs=1e-9)
        assert plain[f"PSP@{k}"] == pytest.approx(psp_at, abs=1e-9)
        assert metrics["ranking"][f"P@{k}"] == metrics["test"][f"P@{k}"]
    # Macro recall@5 per label, and the groups, from the same ranking.
    top5 = np.argsort(-scores, axis=1, kind="stable")[:, :5]
    support = np.bincount([j for t in truth for j in t], minlength=12)
    found = np.bincount(
        [j for r, t in zip(top5, truth, strict=True) for j in t if j in r], minlength=12
    )
    present = support > 0
    assert plain["macro_recall@5"] == pytest.approx((found[present] / support[present]).mean())
    assert "accuracy" not in metrics["test"] and "margins" not in metrics
    if "uncorrected" not in metrics:  # F1 of the top 5 with p ≥ 0.5, from the definitions
        probability = {  # each loss's own probability map (Loss.confidence)
            "zlpr": 1 / (1 + np.exp(-2 * scores)),
            "bce": 1 / (1 + np.exp(-scores)),
        }.get(experiment, np.exp(scores - np.logaddexp.reduce(scores, axis=1, keepdims=True)))
        picked = [{j for j in r if probability[i, j] >= 0.5} for i, r in enumerate(top5)]
        pairs = list(zip(picked, truth, strict=True))
        tp = np.array([sum(j in p and j in t for p, t in pairs) for j in range(12)])
        fp = np.array([sum(j in p and j not in t for p, t in pairs) for j in range(12)])
        fn = np.array([sum(j in t and j not in p for p, t in pairs) for j in range(12)])
        used = (tp + fp + fn) > 0
        f1 = metrics["test"]
        assert metrics["f1_thresholds"]["threshold"] == 0.5
        assert metrics["f1_thresholds"]["predicted"] == "top-5"
        micro = 2 * tp.sum() / (2 * tp.sum() + fp.sum() + fn.sum())
        assert f1["micro_f1"] == pytest.approx(micro)
        assert f1["macro_f1"] == pytest.approx((2 * tp / (2 * tp + fp + fn))[used].mean())
        assert {"micro_f1_tuned", "macro_f1_tuned"} <= set(f1)
        hits = [len(set(r) & t) / max(min(5, len(t)), 1) for r, t in zip(top5, truth, strict=True)]
        assert metrics["ranking"]["RP@5"] == pytest.approx(np.mean(hits))
    # The per-label table holds the same recall@5, and the propensities of the XC model.
    table = read_label_table(layout.per_class(experiment), "per-class", "evaluate")
    recall = table["recall@5"].to_numpy()
    assert recall[present].mean() == pytest.approx(metrics["test"]["macro_recall@5"])
    if "uncorrected" not in metrics:  # else the table ranks by the corrected scores
        np.testing.assert_allclose(recall[present], found[present] / support[present])
    assert table["recall@5"].null_count() == int((~present).sum())
    np.testing.assert_allclose(table["propensity"].to_numpy(), 1.0 / q)
    # The data is learnable: well above ranking the labels by training frequency.
    frequent_first = np.argsort(-np.asarray(meta["train_counts"]), kind="stable")[0]
    baseline = np.mean([frequent_first in t for t in truth])
    assert metrics["test"]["P@1"] > baseline + 0.2, (metrics["test"]["P@1"], baseline)
    curve = layout.curve(experiment).read_text().splitlines()
    assert curve[0].split("\t")[3:] == ["val_accuracy", "val_balanced_accuracy"]
    assert 0.0 <= float(curve[-1].split("\t")[3]) <= 1.0


# ------------------------------------------------------------------ the two views of a batch


def test_softmax_on_label_lists_is_pal_n() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(4, 6, generator=g, dtype=torch.float64, requires_grad=True)
    lists = [[0, 3], [], [5], [1, 2, 4]]
    padded = LabelSets.from_lists(lists, 6).padded()
    got = SoftmaxCE()(full_batch(labels=padded, logits=logits))
    log_p = torch.log_softmax(logits, 1)
    want = sum(-sum(log_p[i, j] for j in s) / len(s) for i, s in enumerate(lists) if s) / 4
    assert torch.allclose(got, want)
    # One label per row: exactly the single-label cross-entropy.
    single = torch.tensor([[2], [0], [5], [1]])
    flat = SoftmaxCE()(full_batch(labels=single.squeeze(1), logits=logits))
    assert torch.allclose(SoftmaxCE()(full_batch(labels=single, logits=logits)), flat)
    assert torch.autograd.gradcheck(
        lambda s: SoftmaxCE()(full_batch(labels=padded, logits=s)), (logits,)
    )


@pytest.mark.parametrize("margin_loss", ["logistic", "hinge"])
def test_decoupled_on_label_lists_is_one_vs_all_over_the_row_s_labels(margin_loss: str) -> None:
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(4, 6, generator=g, dtype=torch.float64, requires_grad=True)
    lists = [[0, 3], [], [5], [1, 2, 4]]
    padded = LabelSets.from_lists(lists, 6).padded()
    loss = Decoupled(margin_loss=margin_loss)
    got = loss(full_batch(labels=padded, logits=logits))
    f = logits.detach().numpy()
    if margin_loss == "logistic":
        pos, neg = (lambda v: np.log1p(np.exp(-v))), (lambda v: np.log1p(np.exp(v)))
    else:
        pos, neg = (lambda v: max(0.0, 1 - v)), (lambda v: max(0.0, 1 + v))
    per_row = [
        sum(pos(f[i, j]) if j in s else neg(f[i, j]) for j in range(6)) for i, s in enumerate(lists)
    ]
    assert got.item() == pytest.approx(np.mean(per_row), rel=1e-12)
    single = torch.tensor([2, 0, 5, 1])
    assert torch.allclose(
        loss(full_batch(labels=single.unsqueeze(1), logits=logits)),
        loss(full_batch(labels=single, logits=logits)),
    )
    assert torch.autograd.gradcheck(lambda s: loss(full_batch(labels=padded, logits=s)), (logits,))


class _FixedNegatives:
    """A shared or per-example draw fixed in advance, log q = −log C."""

    conditions_on, conditional = "input", False

    def __init__(self, neg: torch.Tensor) -> None:
        self.neg = neg

    def sample(self, x, y, m, generator):
        neg = self.neg if self.neg.ndim == 1 else self.neg[: y.shape[0]]
        return neg, torch.full(neg.shape, -math.log(6.0))

    def log_prob(self, x, labels):
        return torch.full(labels.shape, -math.log(6.0))


@pytest.mark.parametrize("shared", [True, False])
def test_sampled_view_scores_every_positive_and_masks_every_own_label(shared: bool) -> None:
    lists = [[0, 3], [], [5], [1, 2, 4]]
    y = LabelSets.from_lists(lists, 6)
    layer = OutputLayer(6, 3, generator=torch.Generator().manual_seed(0))
    z = torch.randn(4, 3, generator=torch.Generator().manual_seed(1))
    neg = torch.tensor([3, 5, 1]) if shared else torch.randint(0, 6, (6, 3))
    log_prior = torch.full((6,), -math.log(6))
    batch, rows = sampled_input(layer, _FixedNegatives(neg), z, z, y, 3, None, log_prior=log_prior)
    pair_rows, pos, got_neg = y.pairs()[0], batch.labels, batch.neg_ids
    assert rows.ids.tolist() == sorted({*pos.tolist(), *got_neg.reshape(-1).tolist()})
    assert pair_rows.tolist() == [0, 0, 2, 3, 3, 3] and pos.tolist() == [0, 3, 5, 1, 2, 4]
    w, b = layer.weight.detach(), layer.bias.detach()
    want_pos = (z[pair_rows] * w[pos]).sum(1) + b[pos]
    assert torch.allclose(batch.pos_logits, want_pos, atol=1e-6)
    per_pair = got_neg.expand(6, -1) if shared else got_neg
    want_neg = torch.einsum("pd,pmd->pm", z[pair_rows], w[per_pair]) + b[per_pair]
    assert torch.allclose(batch.neg_logits, want_neg, atol=1e-6)
    hits = batch.hits
    want_hits = [[int(v) in lists[int(r)] for v in per_pair[i]] for i, r in enumerate(pair_rows)]
    assert hits.tolist() == want_hits
    assert torch.equal(batch.embeddings, z[pair_rows])


# ------------------------------------------------------------------ the real XC reader


def _legacy_file(x: sp.csr_matrix, sets: LabelSets) -> str:
    """Rows as the XC repository writes them: header "N D L", then "l1,l2 f:v ..."; a row
    without labels starts with a space, as EURLex-4K's 28 such rows do."""
    lines = [f"{x.shape[0]} {x.shape[1]} {sets.num_classes}"]
    for i, labels in enumerate(_brute_sets(sets)):
        row = x.getrow(i)
        feats = " ".join(f"{j}:{v:g}" for j, v in zip(row.indices, row.data, strict=True))
        lines.append(",".join(str(label) for label in sorted(labels)) + " " + feats)
    return "\n".join(lines) + "\n"


def test_the_xc_plugin_on_legacy_files_trains_what_the_in_memory_rows_train(prepared, tmp_path):
    """The same rows written in the repository's legacy format and read by the ``xc`` plugin
    give the same splits and the same trained metrics as the in-memory dataset."""
    params, layout = prepared
    raw = TopicXC().load(layout.root)
    sets = LabelSets.from_csr(raw.labels)
    folder = tmp_path / "TopicXC"
    folder.mkdir()
    for name, rows in (("train", raw.splits["train"]), ("test", raw.splits["test"])):
        text = _legacy_file(raw.inputs[rows], sets.select(rows))
        (folder / f"topic_{name}.txt").write_text(text)
    xc_params = parse_params(
        {**_raw_params(), "dataset": {"name": "xc", "path": str(folder)}}, "test-params"
    )
    xc_layout = Layout(tmp_path / "project")
    registry = make_registry()
    for stage in (download, subsample):
        stage.run(xc_params, xc_layout, registry)
    featurize.run(xc_params, xc_layout, registry, "tfidf-svd")
    fit_sampler.run(xc_params, xc_layout, registry)
    for name in ("train", "val", "test"):
        ours, theirs = read_split(layout.split, name), read_split(xc_layout.split, name)
        assert np.array_equal(ours[0], theirs[0])
        assert _brute_sets(ours[1]) == _brute_sets(theirs[1])
    train.run(xc_params, xc_layout, registry, "zlpr")
    got = evaluate.run(xc_params, xc_layout, registry, "zlpr")
    if not layout.metrics("zlpr").exists():
        train.run(params, layout, REGISTRY, "zlpr")
        evaluate.run(params, layout, REGISTRY, "zlpr")
    want = json.loads(layout.metrics("zlpr").read_text())
    for key in ("P@1", "P@5", "PSP@1", "PSP@5", "macro_recall@5"):
        assert got["test"][key] == pytest.approx(want["test"][key], abs=1e-6)


def test_the_report_of_a_multi_label_study(prepared) -> None:
    """summary.md gets the XC columns, the multi-label legend, figure captions and a header
    counting rows and labels per row; the figures are drawn."""
    from tailkit.stages import report

    params, layout = prepared
    names = ["zlpr", "pal", "sampled"]
    for name in names:
        if not layout.metrics(name).exists():
            train.run(params, layout, REGISTRY, name)
            evaluate.run(params, layout, REGISTRY, name)
    raw = _raw_params()
    raw["experiments"] = {name: EXPERIMENTS[name] for name in names}
    result = report.run(parse_params(raw, "test-params"), layout)
    text = result.text
    assert "12 labels, 480 training rows (" in text and "labels per row)." in text
    header = next(line for line in text.splitlines() if line.startswith("| experiment |"))
    assert "| P@1 | P@3 | P@5 | PSP@1 | PSP@3 | PSP@5 | macro R@5 |" in header
    assert "Per-label recall@5 per many/medium/few group" in text
    for name in names:
        p_at_1 = json.loads(layout.metrics(name).read_text())["test"]["P@1"]
        assert f"{100 * p_at_1:.2f}" in next(
            line for line in text.splitlines() if line.startswith(f"| {name} |")
        )
    for figure in ("learning-curves.png", "groups.png", "per-class.png"):
        assert (layout.figures / figure).read_bytes()[:4] == b"\x89PNG"


def test_label_recall_is_per_class_recall_for_one_label_per_row() -> None:
    from tailkit.evaluation.metrics import label_recall, per_class_recall

    rng = np.random.default_rng(4)
    y, top1 = rng.integers(0, 7, 200), rng.integers(0, 7, 200)
    got = label_recall(top1[:, None], (np.arange(201), y), 8)
    want = per_class_recall(y, top1, 8)
    np.testing.assert_array_equal(got[1], want[1])
    np.testing.assert_allclose(got[0], want[0], equal_nan=True)
