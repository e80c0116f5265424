"""Kang et al.'s row samplers (tailkit/training/row_sampling.py): each draws classes in its
proportions and rows of the drawn class, ``instance`` is the loop's old permutation, every
epoch's rows follow from (seed, epoch), and the setting is checked on one line."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from conftest import TINY_PARAMS
from scipy.stats import chisquare

from tailkit.components import FullBatch
from tailkit.errors import InvalidParameterError
from tailkit.labels import LabelSets
from tailkit.output.optim import RowSparseAdagrad
from tailkit.output.output_layer import OutputLayer
from tailkit.params import parse_params
from tailkit.pipeline.experiment import check_components, check_row_sampling
from tailkit.plugins.losses.softmax import SoftmaxCE
from tailkit.plugins.models.linear import Linear
from tailkit.registry import get_registry
from tailkit.training.checkpoint import Checkpointer
from tailkit.training.loop import LoopConfig, train
from tailkit.training.row_sampling import ROW_SAMPLINGS, RowSampler

# 12 classes of 1 to 2,000 rows and two with none (ids 5 and 11, the last).
COUNTS = torch.tensor([2000, 900, 400, 150, 60, 0, 25, 10, 4, 2, 1, 0])
C = len(COUNTS)


def _labels(counts: torch.Tensor = COUNTS, seed: int = 0) -> torch.Tensor:
    labels = torch.repeat_interleave(torch.arange(len(counts)), counts)
    return labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))]


def _drawn(mode: str, epochs: int) -> torch.Tensor:
    """How often each class is drawn by ``mode`` over its first ``epochs`` epochs."""
    labels = _labels()
    sampler = RowSampler(mode, labels, C, epochs)
    rows = torch.cat([sampler.epoch_rows(7, e) for e in range(epochs)])
    return torch.bincount(labels[rows], minlength=C)


def _fits(observed: torch.Tensor, weights: torch.Tensor) -> float:
    """Chi-square p of ``observed`` class counts against proportions ``weights`` (over the
    classes of non-zero weight; the others must never be drawn)."""
    keep = weights > 0
    assert observed[~keep].sum() == 0
    expected = weights[keep].double() / weights[keep].sum() * observed.sum()
    return float(chisquare(observed[keep].double().numpy(), expected.numpy()).pvalue)


def test_class_balanced_draws_every_class_with_rows_equally_often():
    observed = _drawn("class-balanced", 10)  # 35,520 draws: about 3,550 per class
    assert _fits(observed, (COUNTS > 0).double()) > 1e-3
    # the one-row class is drawn as often as the 2,000-row class, each time its one row
    assert observed[10] > 3000


def test_square_root_draws_classes_in_proportion_to_the_root_of_their_sizes():
    observed = _drawn("square-root", 10)
    assert _fits(observed, COUNTS.double().sqrt()) > 1e-3


def test_progressive_slides_from_instance_to_class_balanced():
    labels = _labels()
    sampler = RowSampler("progressive", labels, C, 100)
    instance = COUNTS.double() / COUNTS.sum()
    balanced = (COUNTS > 0).double() / (COUNTS > 0).sum()
    torch.testing.assert_close(sampler.class_probabilities(0), instance, rtol=0, atol=1e-15)
    torch.testing.assert_close(
        sampler.class_probabilities(30), 0.7 * instance + 0.3 * balanced, rtol=0, atol=1e-15
    )
    assert (sampler.class_probabilities(99) - balanced).abs().max() < 0.01
    first = torch.bincount(labels[sampler.epoch_rows(7, 0)], minlength=C)
    assert _fits(first, COUNTS.double()) > 1e-3
    # at t = 99 of T = 100 the draws are 1% instance-balanced, 99% class-balanced
    observed = torch.bincount(labels[sampler.epoch_rows(7, 99)], minlength=C)
    assert _fits(observed, sampler.class_probabilities(99)) > 1e-3
    assert (observed / observed.sum() - balanced).abs().max() < 0.02


def test_a_row_is_always_of_the_drawn_class_even_at_the_edges_of_u():
    labels = _labels()
    sampler = RowSampler("class-balanced", labels, C, 1)
    classes = torch.tensor([c for c in range(C) if COUNTS[c] > 0] * 4)
    # 1 − 2⁻⁵³ is the largest double below 1; 1 itself is no draw, but keeps to the class
    edges = torch.tensor([0.0, 0.5, 1 - 2**-53, 1.0], dtype=torch.float64)
    u = edges.repeat_interleave(len(classes) // 4)
    assert torch.equal(labels[sampler.row_of(classes, u)], classes)
    u = torch.rand(len(classes), dtype=torch.float64)
    assert torch.equal(labels[sampler.row_of(classes, u)], classes)
    # u = 0 is the class's first row, u → 1 its last
    ends = sampler.row_of(torch.tensor([0, 0]), torch.tensor([0.0, 1 - 2**-53]).double())
    assert ends.tolist() == (labels == 0).nonzero().flatten()[[0, -1]].tolist()


def test_rows_within_a_class_are_uniform():
    labels = _labels()
    sampler = RowSampler("class-balanced", labels, C, 1)
    rows = torch.cat([sampler.epoch_rows(3, e) for e in range(10)])
    of_class = rows[labels[rows] == 8]  # 4 rows, drawn about 900 times each
    _, hits = torch.unique(of_class, return_counts=True)
    assert len(hits) == 4
    assert chisquare(hits.double().numpy()).pvalue > 1e-3


def test_instance_is_the_loops_old_permutation_bit_for_bit():
    labels = _labels()
    sampler = RowSampler("instance", labels, C, 3)
    for seed, epoch in [(0, 0), (0, 2), (5, 1), (2**32 - 1, 3)]:
        old = torch.randperm(
            len(labels), generator=torch.Generator().manual_seed(seed * 1_000_003 + epoch)
        )
        assert torch.equal(sampler.epoch_rows(seed, epoch), old)


@pytest.mark.parametrize("mode", ROW_SAMPLINGS)
def test_an_epochs_rows_are_a_function_of_seed_and_epoch(mode):
    labels = _labels()
    a = RowSampler(mode, labels, C, 4).epoch_rows(1, 2)
    b = RowSampler(mode, labels.clone(), C, 4).epoch_rows(1, 2)
    assert torch.equal(a, b) and a.dtype == torch.int64 and len(a) == len(labels)
    assert not torch.equal(a, RowSampler(mode, labels, C, 4).epoch_rows(1, 3))
    assert not torch.equal(a, RowSampler(mode, labels, C, 4).epoch_rows(2, 2))


def test_a_million_classes_and_two_million_rows_draw_only_from_classes_with_rows():
    """At the million-labels study's size, half the classes empty: every drawn row belongs to
    a class that has rows. (How fast: benchmarks, not a timed test.)"""
    g = torch.Generator().manual_seed(0)
    classes, rows = 10**6, 2 * 10**6
    labels = torch.randint(classes // 2, (rows,), generator=g) * 2  # odd classes are empty
    drawn = RowSampler("square-root", labels, classes, 3).epoch_rows(0, 1)
    assert len(drawn) == rows and bool((labels[drawn] % 2 == 0).all())


def test_multi_label_rows_take_only_instance():
    sets = LabelSets(torch.tensor([0, 2, 3]), torch.tensor([0, 1, 3]), 4)
    assert len(RowSampler("instance", sets, 4, 1).epoch_rows(0, 0)) == 2
    with pytest.raises(TypeError, match="one label per row"):
        RowSampler("class-balanced", sets, 4, 1)


def _loop(tmp_path, mode, optimizer=None):
    g = torch.Generator().manual_seed(0)
    y = _labels(torch.tensor([300, 100, 30, 10, 3, 1]))
    x = torch.randn(len(y), 5, generator=g) + torch.nn.functional.one_hot(y, 5 + 1)[:, :5] * 3
    encoder, loss = Linear(5), SoftmaxCE()
    layer = OutputLayer.for_loss(loss, 6, 5, generator=torch.Generator().manual_seed(0))
    train(
        cfg=LoopConfig(
            "t", epochs=3, batch_size=64, eval_every=5, checkpoint_every=4, row_sampling=mode
        ),
        encoder=encoder,
        layer=layer,
        loss=loss,
        sampler=None,
        optimizer=optimizer or RowSparseAdagrad(lr=0.1),
        x_train=x,
        y_train=y,
        x_val=x[:50],
        y_val=y[:50],
        class_counts=torch.bincount(y, minlength=6).double(),
        checkpoint=Checkpointer(tmp_path / mode, key="k"),
    )
    return layer


class _Interrupt(Exception):
    pass


@pytest.mark.parametrize("mode", ["class-balanced", "progressive"])
def test_a_run_interrupted_mid_epoch_resumes_to_the_same_model(tmp_path, mode):
    reference = _loop(tmp_path / "ref", mode)

    class Crashing(RowSparseAdagrad):
        def step(self, rows, step):
            if step == 9:  # 7 steps an epoch: the checkpoint at step 8 is mid-epoch 2
                raise _Interrupt
            super().step(rows, step)

    with pytest.raises(_Interrupt):
        _loop(tmp_path, mode, Crashing(lr=0.1))
    assert Checkpointer(tmp_path / mode, key="k").load()["step"] == 8
    resumed = _loop(tmp_path, mode)
    torch.testing.assert_close(resumed.weight, reference.weight, rtol=0, atol=0)


def _params(**row_sampling):
    raw = copy.deepcopy(TINY_PARAMS)
    for where, value in row_sampling.items():
        section, _, key = where.partition("__")
        target = raw["train"] if section == "train" else raw["experiments"][section]
        target[key or "row_sampling"] = value
    return parse_params(raw, "params.yaml")


def test_the_setting_resolves_from_the_train_default():
    params = _params()
    assert params.resolved("softmax").row_sampling == "instance"
    params = _params(train="square-root", softmax="class-balanced")
    assert params.resolved("softmax").row_sampling == "class-balanced"
    assert params.resolved("sampled").row_sampling == "square-root"


@pytest.mark.parametrize(
    ("where", "key"),
    [("softmax", "experiments.softmax.row_sampling"), ("train", "train.row_sampling")],
)
def test_an_unknown_row_sampling_is_one_line_naming_the_key_and_the_choices(where, key):
    with pytest.raises(InvalidParameterError) as err:
        _params(**{where: "balanced"})
    message = str(err.value)
    assert message.startswith(f"params.yaml: {key}: got 'balanced'")
    assert all(repr(mode) in message for mode in ROW_SAMPLINGS) and "\n" not in message


def test_multi_label_data_refuses_class_aware_row_sampling_in_one_line():
    meta = {"multilabel": True}
    check_row_sampling(_params(), "softmax", meta)  # instance: fine
    check_row_sampling(_params(softmax="square-root"), "softmax", {})  # single-label: fine
    with pytest.raises(InvalidParameterError) as err:
        check_row_sampling(_params(softmax="square-root"), "softmax", meta)
    message = str(err.value)
    assert message.startswith("experiments.softmax.row_sampling: got 'square-root', but")
    assert "multi-label" in message and "\n" not in message
    with pytest.raises(InvalidParameterError, match=r"\(from train\.row_sampling\)"):
        check_row_sampling(_params(train="progressive"), "softmax", meta)


def test_a_model_that_trains_itself_refuses_class_aware_row_sampling():
    registry = get_registry()
    if "napkinxc-plt" not in [c.name for c in registry.components("models")]:
        pytest.skip("napkinxc-plt is not registered")
    raw = copy.deepcopy(TINY_PARAMS)
    raw["experiments"] = {"plt": {"model": {"name": "napkinxc-plt"}, "sampler": "none"}}
    raw["experiments"]["plt"]["features"] = "rff"
    check_components(parse_params(raw), "plt", registry)  # the default, instance: fine
    raw["experiments"]["plt"]["row_sampling"] = "class-balanced"
    with pytest.raises(InvalidParameterError, match=r"^experiments\.plt\.row_sampling: got"):
        check_components(parse_params(raw), "plt", registry)


def test_the_train_stage_trains_on_class_balanced_batches_and_records_it(tmp_path, monkeypatch):
    """train@ through the real stages: with class-balanced row sampling the labels the loss
    sees are about equally many per class; with the default, exactly the training counts
    (each row once an epoch)."""
    from tailkit.paths import Layout
    from tailkit.registry import make_registry
    from tailkit.stages import download, featurize, subsample
    from tailkit.stages import train as train_stage
    from tailkit.storage.splits import read_meta

    seen: list[torch.Tensor] = []
    forward = SoftmaxCE.forward

    def recording(self, batch: FullBatch) -> torch.Tensor:  # the registry reads the type
        seen.append(batch.labels.clone())
        return forward(self, batch)

    monkeypatch.setattr(SoftmaxCE, "forward", recording)
    raw = copy.deepcopy(TINY_PARAMS)
    raw["experiments"] = {
        "balanced": {**raw["experiments"]["softmax"], "row_sampling": "class-balanced"},
        "plain": raw["experiments"]["softmax"],
    }
    params = parse_params(raw, "test-params")
    registry, layout = make_registry(), Layout(tmp_path)
    download.run(params, layout, registry)
    subsample.run(params, layout, registry)
    featurize.run(params, layout, registry, "rff")
    counts = torch.tensor(read_meta(layout.feature_set("rff"))["train_counts"])
    histograms = {}
    for name in ("balanced", "plain"):
        seen.clear()
        train_stage.run(params, layout, registry, name)
        histograms[name] = torch.bincount(torch.cat(seen), minlength=len(counts))
        info = json.loads((layout.model(name) / "model.json").read_text())
        assert info["settings"]["row_sampling"] == raw["experiments"][name].get(
            "row_sampling", "instance"
        )
    epochs = raw["train"]["epochs"]
    assert torch.equal(histograms["plain"], epochs * counts)
    balanced = histograms["balanced"]
    assert balanced.sum() == epochs * counts.sum()
    assert _fits(balanced, (counts > 0).double()) > 1e-3
    assert counts.max() > 10 * counts[counts > 0].min()  # the data is long-tailed
