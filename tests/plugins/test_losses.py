"""Tests for the built-in losses: softmax, sampled softmax and Bamler–Mandt negative sampling.

Every loss is checked against an independent float64 numpy implementation written as plain
loops from the formulas in algorithms.md (§1.5, §2.2, §3), against the cross-check vectors of
§12, and with torch.autograd.gradcheck.
"""

from __future__ import annotations

import inspect
import itertools
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from tailkit.components import Batch, FullBatch, Loss, SampledBatch, Sampler
from tailkit.errors import InvalidParameterError
from tailkit.evaluation.correction import PredictionContext
from tailkit.plugins.losses.negative_sampling import NegativeSampling
from tailkit.plugins.losses.sampled_softmax import SampledSoftmax
from tailkit.plugins.losses.softmax import SoftmaxCE
from tailkit.registry import batch_modes
from tailkit.testing.batches import full_batch, sampled_batch
from tailkit.validation import validate_options

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DTYPES = [torch.float32, torch.float64]
SHAPES = [(1, 1), (4, 3), (7, 16)]  # (B, m)
SEEDS = [0, 1, 2]


# ---------------------------------------------------------------- numpy references (float64)


def np_softplus(z: float) -> float:
    return float(np.logaddexp(0.0, z))


def np_softmax_ce(logits: np.ndarray, labels: np.ndarray, reduction: str) -> float:
    per = []
    for row, y in zip(logits, labels, strict=True):
        top = row.max()
        per.append(top + math.log(np.exp(row - top).sum()) - row[y])
    return float(np.sum(per) if reduction == "sum" else np.mean(per))


def np_sampled_softmax(
    pos, neg, pos_log_q, neg_log_q, hits, *, weighting, positive_correction, reduction
) -> float:
    b, m = neg.shape
    log_q = np.broadcast_to(neg_log_q, (b, m))
    per = []
    for i in range(b):
        f_y = pos[i] - (math.log(m * math.exp(pos_log_q[i])) if positive_correction else 0.0)
        total = 0.0
        for j in range(m):
            if hits[i, j]:
                continue
            w = 1.0 / (m * math.exp(log_q[i, j])) if weighting == "importance" else 1.0
            total += w * math.exp(neg[i, j] - f_y)
        per.append(math.log1p(total))
    return float(np.sum(per) if reduction == "sum" else np.mean(per))


def np_negative_sampling(
    pos, neg, pos_log_q, neg_log_q, hits, *, reg, conditional, mask_hits, reduction
) -> float:
    b, n = neg.shape
    log_q = np.broadcast_to(neg_log_q, (b, n))
    per = []
    for i in range(b):
        lp_pos = pos_log_q[i] if conditional else 0.0
        value = np_softplus(-pos[i]) + reg * (pos[i] + lp_pos) ** 2
        for j in range(n):
            if mask_hits and hits[i, j]:
                continue
            lp = log_q[i, j] if conditional else 0.0
            value += (np_softplus(neg[i, j]) + reg * (neg[i, j] + lp) ** 2) / n
        per.append(value)
    return float(np.sum(per) if reduction == "sum" else np.mean(per))


# ---------------------------------------------------------------- helpers


def random_sampled(seed: int, b: int, m: int, *, shared: bool, with_hits: bool) -> dict:
    rng = np.random.default_rng(seed)
    q_shape = (m,) if shared else (b, m)
    return {
        "pos": rng.normal(0.0, 2.0, b),
        "neg": rng.normal(0.0, 2.0, (b, m)),
        "pos_log_q": np.log(rng.uniform(1e-3, 0.5, b)),
        "neg_log_q": np.log(rng.uniform(1e-3, 0.5, q_shape)),
        "hits": rng.random((b, m)) < 0.3 if with_hits else np.zeros((b, m), dtype=bool),
    }


def to_input(
    arrays: dict,
    *,
    dtype: torch.dtype = torch.float64,
    device: str = "cpu",
    conditional: bool = False,
    requires_grad: bool = False,
) -> Batch:
    def t(a: np.ndarray) -> torch.Tensor:
        return torch.tensor(a, dtype=dtype, device=device)

    pos, neg = t(arrays["pos"]), t(arrays["neg"])
    pos.requires_grad_(requires_grad)
    neg.requires_grad_(requires_grad)
    return sampled_batch(
        labels=torch.zeros(len(arrays["pos"]), dtype=torch.long, device=device),
        pos_logits=pos,
        neg_logits=neg,
        pos_log_q=t(arrays["pos_log_q"]),
        neg_log_q=t(arrays["neg_log_q"]),
        hits=torch.tensor(arrays["hits"], device=device),
        sampler_conditional=conditional,
    )


def tol(dtype: torch.dtype) -> dict:
    return {"rel": 1e-12, "abs": 1e-12} if dtype == torch.float64 else {"rel": 2e-5, "abs": 2e-5}


class TableSampler(Sampler):
    """A tiny unconditional sampler: log q is a fixed (C,) table."""

    def __init__(self, log_q: torch.Tensor) -> None:
        self.table = log_q

    def log_prob(self, x: torch.Tensor | None, labels: torch.Tensor) -> torch.Tensor:
        return self.table[labels]


class ConditionalSampler(Sampler):
    """A tiny conditional sampler: log q(y|x) = log_softmax(x @ A)[y]."""

    conditional = True

    def __init__(self, a: torch.Tensor) -> None:
        self.a = a

    def log_prob(self, x: torch.Tensor | None, labels: torch.Tensor) -> torch.Tensor:
        assert x is not None
        return torch.log_softmax(x @ self.a, dim=1)[:, labels]


# ---------------------------------------------------------------- full softmax


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_softmax_matches_numpy(device: str, dtype: torch.dtype, reduction: str) -> None:
    for seed, (b, c) in itertools.product(SEEDS, [(1, 2), (5, 7), (16, 50)]):
        rng = np.random.default_rng(seed)
        logits = rng.normal(0.0, 3.0, (b, c))
        labels = rng.integers(0, c, b)
        batch = full_batch(
            labels=torch.tensor(labels, device=device),
            logits=torch.tensor(logits, dtype=dtype, device=device),
        )
        out = SoftmaxCE(reduction=reduction)(batch)
        assert out.dtype == dtype and out.shape == ()
        assert out.item() == pytest.approx(np_softmax_ce(logits, labels, reduction), **tol(dtype))


def test_softmax_is_stable_for_huge_logits() -> None:
    logits = torch.tensor([[1000.0, 0.0, -1000.0]], dtype=torch.float32)
    out = SoftmaxCE()(full_batch(labels=torch.tensor([1]), logits=logits))
    assert out.item() == pytest.approx(1000.0)


# ---------------------------------------------------------------- sampled softmax vs numpy


@pytest.mark.parametrize("weighting", ["importance", "constant"])
@pytest.mark.parametrize("positive_correction", [False, True])
@pytest.mark.parametrize("with_hits", [False, True])
@pytest.mark.parametrize("shared", [True, False])
def test_sampled_softmax_matches_numpy(
    weighting: str, positive_correction: bool, with_hits: bool, shared: bool
) -> None:
    for seed, (b, m), reduction in itertools.product(SEEDS, SHAPES, ["mean", "sum"]):
        arrays = random_sampled(seed, b, m, shared=shared, with_hits=with_hits)
        loss = SampledSoftmax(
            weighting=weighting, positive_correction=positive_correction, reduction=reduction
        )
        expected = np_sampled_softmax(
            **arrays,
            weighting=weighting,
            positive_correction=positive_correction,
            reduction=reduction,
        )
        assert loss(to_input(arrays)).item() == pytest.approx(expected, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_sampled_softmax_dtypes_and_devices(device: str, dtype: torch.dtype) -> None:
    arrays = random_sampled(3, 6, 9, shared=True, with_hits=True)
    out = SampledSoftmax(positive_correction=True)(to_input(arrays, dtype=dtype, device=device))
    assert out.dtype == dtype and out.device.type == device
    expected = np_sampled_softmax(
        **arrays, weighting="importance", positive_correction=True, reduction="mean"
    )
    assert out.item() == pytest.approx(expected, **tol(dtype))


def test_sampled_softmax_log_q_in_another_dtype() -> None:
    """A sampler may hand float32 log q to a float64 model: the loss keeps the logits' dtype."""
    arrays = random_sampled(4, 3, 5, shared=False, with_hits=False)
    batch = to_input(arrays)
    batch = replace(batch, neg_log_q=batch.neg_log_q.float())
    assert SampledSoftmax()(batch).dtype == torch.float64


# ---------------------------------------------------------------- §12 vectors


def tf_row(hit_second: bool) -> Batch:
    m = 2  # expected count = m * q, so q = expected_count / m
    return sampled_batch(
        labels=torch.tensor([0]),
        pos_logits=torch.tensor([1.0], dtype=torch.float64),
        neg_logits=torch.tensor([[0.5, 2.0]], dtype=torch.float64),
        pos_log_q=torch.log(torch.tensor([0.5], dtype=torch.float64) / m),
        neg_log_q=torch.log(torch.tensor([0.5, 0.25], dtype=torch.float64) / m),
        hits=torch.tensor([[False, hit_second]]),
    )


def test_tf_sampled_softmax_vector() -> None:
    loss = SampledSoftmax(positive_correction=True)
    logits = loss.adjusted_logits(tf_row(False))
    torch.testing.assert_close(
        logits,
        torch.tensor([[1.693147, 1.193147, 3.386294]], dtype=torch.float64),
        atol=1e-6,
        rtol=0,
    )
    assert loss(tf_row(False)).item() == pytest.approx(1.952048, abs=1e-6)


def test_tf_sampled_softmax_vector_with_accidental_hit() -> None:
    loss = SampledSoftmax(positive_correction=True)
    assert loss(tf_row(True)).item() == pytest.approx(0.474077, abs=1e-6)


def bm_row(reg_hits: bool = False) -> Batch:
    return sampled_batch(
        labels=torch.tensor([0]),
        pos_logits=torch.tensor([1.2], dtype=torch.float64),
        neg_logits=torch.tensor([[-0.3, 0.8]], dtype=torch.float64),
        pos_log_q=torch.tensor([-2.0], dtype=torch.float64),
        neg_log_q=torch.tensor([[-1.0, -3.0]], dtype=torch.float64),
        hits=torch.tensor([[False, reg_hits]]),
        sampler_conditional=True,
    )


def test_bamler_mandt_vector() -> None:
    nll = NegativeSampling(reg=0.0)(bm_row()).item()
    total = NegativeSampling(reg=0.001)(bm_row()).item()
    assert nll == pytest.approx(1.126010, abs=1e-6)
    assert total - nll == pytest.approx(0.003905, abs=1e-9)
    assert total == pytest.approx(1.129915, abs=1e-6)


def test_bamler_mandt_unconditional_uses_zero_log_q() -> None:
    batch = replace(bm_row(), sampler_conditional=False)
    reg = NegativeSampling(reg=1.0)(batch).item() - NegativeSampling(reg=0.0)(batch).item()
    assert reg == pytest.approx(1.2**2 + (0.3**2 + 0.8**2) / 2, abs=1e-12)


# ---------------------------------------------------------------- negative sampling vs numpy


@pytest.mark.parametrize("conditional", [False, True])
@pytest.mark.parametrize("mask_hits", [False, True])
@pytest.mark.parametrize("with_hits", [False, True])
@pytest.mark.parametrize("shared", [True, False])
def test_negative_sampling_matches_numpy(
    conditional: bool, mask_hits: bool, with_hits: bool, shared: bool
) -> None:
    for seed, (b, m), reduction, reg in itertools.product(
        SEEDS, SHAPES, ["sum", "mean"], [0.0, 1e-3, 0.5]
    ):
        arrays = random_sampled(seed, b, m, shared=shared, with_hits=with_hits)
        loss = NegativeSampling(reg=reg, reduction=reduction, mask_hits=mask_hits)
        expected = np_negative_sampling(
            **arrays, reg=reg, conditional=conditional, mask_hits=mask_hits, reduction=reduction
        )
        got = loss(to_input(arrays, conditional=conditional)).item()
        assert got == pytest.approx(expected, rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_negative_sampling_dtypes_and_devices(device: str, dtype: torch.dtype) -> None:
    arrays = random_sampled(5, 6, 9, shared=False, with_hits=True)
    batch = to_input(arrays, dtype=dtype, device=device, conditional=True)
    out = NegativeSampling(reg=0.1)(batch)
    assert out.dtype == dtype and out.device.type == device
    expected = np_negative_sampling(
        **arrays, reg=0.1, conditional=True, mask_hits=True, reduction="sum"
    )
    assert out.item() == pytest.approx(expected, **tol(dtype))


# ---------------------------------------------------------------- gradients


def test_gradcheck_softmax() -> None:
    rng = np.random.default_rng(0)
    logits = torch.tensor(rng.normal(size=(4, 6)), requires_grad=True)
    labels = torch.tensor([0, 5, 2, 2])
    for reduction in ("mean", "sum"):
        loss = SoftmaxCE(reduction=reduction)
        assert torch.autograd.gradcheck(
            lambda z, loss=loss: loss(full_batch(labels=labels, logits=z)), (logits,)
        )


@pytest.mark.parametrize("weighting", ["importance", "constant"])
@pytest.mark.parametrize("positive_correction", [False, True])
def test_gradcheck_sampled_softmax(weighting: str, positive_correction: bool) -> None:
    arrays = random_sampled(1, 4, 5, shared=False, with_hits=True)
    batch = to_input(arrays, requires_grad=True)
    loss = SampledSoftmax(weighting=weighting, positive_correction=positive_correction)

    def f(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
        return loss(replace(batch, pos_logits=pos, neg_logits=neg))

    assert torch.autograd.gradcheck(f, (batch.pos_logits, batch.neg_logits))


@pytest.mark.parametrize("conditional", [False, True])
def test_gradcheck_negative_sampling(conditional: bool) -> None:
    arrays = random_sampled(2, 4, 5, shared=True, with_hits=True)
    batch = to_input(arrays, conditional=conditional, requires_grad=True)
    loss = NegativeSampling(reg=0.3)

    def f(pos: torch.Tensor, neg: torch.Tensor) -> torch.Tensor:
        return loss(replace(batch, pos_logits=pos, neg_logits=neg))

    assert torch.autograd.gradcheck(f, (batch.pos_logits, batch.neg_logits))


# ---------------------------------------------------------------- accidental hits


@pytest.mark.parametrize("dtype", DTYPES)
def test_sampled_softmax_hit_gets_exactly_zero_probability_and_gradient(dtype) -> None:
    arrays = random_sampled(7, 3, 4, shared=True, with_hits=False)
    arrays["hits"][0, 1] = arrays["hits"][2, 3] = True
    batch = to_input(arrays, dtype=dtype, requires_grad=True)
    loss = SampledSoftmax(positive_correction=True)

    probs = torch.softmax(loss.adjusted_logits(batch), dim=1)
    assert probs[0, 2].item() == 0.0 and probs[2, 4].item() == 0.0  # column 0 is the positive
    assert (probs[~torch.cat([torch.zeros(3, 1, dtype=torch.bool), batch.hits], 1)] > 0).all()

    value = loss(batch)
    value.backward()
    assert batch.neg_logits.grad[0, 1].item() == 0.0
    assert batch.neg_logits.grad[2, 3].item() == 0.0
    assert (batch.neg_logits.grad[~batch.hits] != 0).all()

    # The pitfall of keras-rs #206: an additive 1e-40 is a no-op in float32. With a real mask a
    # hit's logit can be anything, even one whose exp overflows, and the loss does not move.
    huge = batch.neg_logits.detach().clone()
    huge[0, 1] = huge[2, 3] = 1e4
    moved = loss(replace(batch, neg_logits=huge))
    assert torch.isfinite(moved)
    assert moved.item() == value.item()


def test_sampled_softmax_all_hits_row_has_zero_loss() -> None:
    arrays = random_sampled(8, 2, 3, shared=True, with_hits=False)
    arrays["hits"][1, :] = True
    batch = to_input(arrays, requires_grad=True)
    value = SampledSoftmax(reduction="sum")(batch)
    value.backward()
    only_first = np_sampled_softmax(
        **{k: v[:1] if k != "neg_log_q" else v for k, v in arrays.items()},
        weighting="importance",
        positive_correction=False,
        reduction="sum",
    )
    assert value.item() == pytest.approx(only_first, rel=1e-12)
    assert torch.isfinite(batch.neg_logits.grad).all() and batch.pos_logits.grad[1] == 0


def test_negative_sampling_hit_gets_zero_gradient_and_still_divides_by_n() -> None:
    batch = bm_row(reg_hits=True)
    batch.neg_logits.requires_grad_(True)
    value = NegativeSampling(reg=0.001)(batch)
    value.backward()
    assert batch.neg_logits.grad[0, 1].item() == 0.0
    assert batch.neg_logits.grad[0, 0].item() != 0.0
    sp = np_softplus
    expected = sp(-1.2) + sp(-0.3) / 2 + 0.001 * ((1.2 - 2.0) ** 2 + (-0.3 - 1.0) ** 2 / 2)
    assert value.item() == pytest.approx(expected, rel=1e-12)
    unmasked = NegativeSampling(reg=0.001, mask_hits=False)(batch).item()
    assert unmasked == pytest.approx(1.129915, abs=1e-6)


# ---------------------------------------------------------------- reductions


def test_sum_is_batch_size_times_mean() -> None:
    arrays = random_sampled(9, 6, 5, shared=False, with_hits=True)
    batch = to_input(arrays, conditional=True)
    logits = torch.tensor(np.random.default_rng(9).normal(size=(6, 11)))
    full = full_batch(labels=torch.arange(6), logits=logits)
    pairs = [
        (SoftmaxCE(reduction="sum")(full), SoftmaxCE(reduction="mean")(full)),
        (SampledSoftmax(reduction="sum")(batch), SampledSoftmax(reduction="mean")(batch)),
        (NegativeSampling(reduction="sum")(batch), NegativeSampling(reduction="mean")(batch)),
    ]
    for total, mean in pairs:
        assert total.item() == pytest.approx(6 * mean.item(), rel=1e-12)


def test_default_reductions_follow_the_references() -> None:
    assert SoftmaxCE().reduction == "mean"
    assert SampledSoftmax().reduction == "mean"
    assert NegativeSampling().reduction == "sum"  # Bamler–Mandt sum over the batch


# ---------------------------------------------------------------- consistency (§2.2)


def test_importance_sampled_softmax_converges_to_full_softmax() -> None:
    g = torch.Generator().manual_seed(0)
    c, b, draws = 200, 32, 60
    logits = torch.randn(b, c, generator=g, dtype=torch.float64) * 1.5
    labels = torch.randint(c, (b,), generator=g)
    full = SoftmaxCE()(full_batch(labels=labels, logits=logits)).item()
    rows = torch.arange(b)

    def draw(loss: SampledSoftmax, m: int) -> torch.Tensor:
        out = []
        for _ in range(draws):
            ids = torch.randint(c, (b, m), generator=g)  # uniform, with replacement
            batch = sampled_batch(
                labels=labels,
                pos_logits=logits[rows, labels],
                neg_logits=logits.gather(1, ids),
                neg_log_q=torch.full((m,), -math.log(c), dtype=torch.float64),
                hits=ids == labels[:, None],
            )
            out.append(loss(batch))
        return torch.stack(out)

    importance = SampledSoftmax(weighting="importance")
    errors = [(draw(importance, m) - full).abs().mean().item() for m in (8, 64, 512)]
    assert errors[0] > 2 * errors[1] > 4 * errors[2]
    assert errors[2] < 0.03

    # Constant weights with uniform q converge to another loss: the softmax CE on negatives
    # shifted by log(m/C) (the implicit loss of §2.2), not the full softmax CE.
    m = 512
    constant = draw(SampledSoftmax(weighting="constant"), m)
    others = logits.masked_fill(torch.nn.functional.one_hot(labels, c).bool(), float("-inf"))
    implicit = torch.log1p(
        (m / c) * torch.exp(others - logits[rows, labels][:, None]).sum(1)
    ).mean()
    assert (constant - full).abs().mean().item() > 20 * errors[2]
    assert constant.mean().item() == pytest.approx(implicit.item(), abs=0.03)


# ---------------------------------------------------------------- prediction-time adjustment


def test_negative_sampling_adjust_scores_adds_log_prob() -> None:
    loss = NegativeSampling()
    assert loss.adjusts_scores
    scores = torch.randn(3, 4, dtype=torch.float64)
    x = torch.randn(3, 2, dtype=torch.float64)
    label_ids = torch.tensor([5, 0, 2, 7])
    table = torch.log_softmax(torch.randn(8, dtype=torch.float64), 0)

    ctx = PredictionContext(log_prior=table, sampler=TableSampler(table))
    torch.testing.assert_close(
        loss.adjust_scores(scores, x, label_ids, ctx), scores + table[label_ids]
    )

    a = torch.randn(2, 8, dtype=torch.float64)
    ctx = PredictionContext(log_prior=table, sampler=ConditionalSampler(a))
    expected = scores + torch.log_softmax(x @ a, 1)[:, label_ids]
    torch.testing.assert_close(loss.adjust_scores(scores, x, label_ids, ctx), expected)

    ctx = PredictionContext(log_prior=table, sampler=None)
    assert loss.adjust_scores(scores, x, label_ids, ctx) is scores


def test_adjust_scores_keeps_the_scores_dtype() -> None:
    scores = torch.zeros(2, 3, dtype=torch.float32)
    table = torch.log(torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64))
    ctx = PredictionContext(log_prior=table, sampler=TableSampler(table))
    out = NegativeSampling().adjust_scores(scores, torch.zeros(2, 1), torch.arange(3), ctx)
    assert out.dtype == torch.float32


def test_sampled_softmax_adjust_scores_only_when_asked() -> None:
    scores = torch.randn(2, 3, dtype=torch.float64)
    x = torch.randn(2, 2, dtype=torch.float64)
    label_ids = torch.tensor([2, 0, 1])
    table = torch.log(torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64))
    ctx = PredictionContext(log_prior=table, sampler=TableSampler(table))

    plain = SampledSoftmax()
    assert not plain.adjusts_scores
    assert plain.adjust_scores(scores, x, label_ids, ctx) is scores

    corrected = SampledSoftmax(weighting="constant", correct_at_prediction=True)
    assert corrected.adjusts_scores
    out = corrected.adjust_scores(scores, x, label_ids, ctx)
    torch.testing.assert_close(out, scores + table[label_ids])
    no_sampler = PredictionContext(log_prior=table, sampler=None)
    assert corrected.adjust_scores(scores, x, label_ids, no_sampler) is scores

    assert not SoftmaxCE().adjusts_scores


# ---------------------------------------------------------------- options and metadata


def test_modes_and_descriptions() -> None:
    """A loss's modes are the batch types its forward takes, read from the annotation."""
    assert batch_modes(SoftmaxCE) == ("full",)
    assert batch_modes(SampledSoftmax()) == ("sampled",)
    assert batch_modes(NegativeSampling) == ("sampled",)

    class Either(Loss):
        def forward(self, batch: FullBatch | SampledBatch) -> torch.Tensor:
            return batch.labels.sum()

    class Untyped(Loss):
        def forward(self, batch) -> torch.Tensor:
            return batch.labels.sum()

    assert batch_modes(Either) == ("full", "sampled")
    assert batch_modes(Untyped) == ()
    assert batch_modes(Loss) == ()
    first = inspect.getdoc(SoftmaxCE).splitlines()[0]
    assert first == "Full softmax cross-entropy over all C labels."
    for cls in (SampledSoftmax, NegativeSampling):
        assert inspect.getdoc(cls).splitlines()[0]


def test_options_are_validated() -> None:
    owner = "experiments.x.loss"
    assert validate_options(owner, NegativeSampling, {"reg": 0}) == {"reg": 0.0}
    with pytest.raises(InvalidParameterError, match=r"experiments\.x\.loss\.reg"):
        validate_options(owner, NegativeSampling, {"reg": -1e-3})
    with pytest.raises(InvalidParameterError, match="weighting"):
        validate_options(owner, SampledSoftmax, {"weighting": "inverse"})
    with pytest.raises(InvalidParameterError, match="reduction"):
        validate_options(owner, SoftmaxCE, {"reduction": "none"})
    with pytest.raises(InvalidParameterError, match="unknown key"):
        validate_options(owner, SampledSoftmax, {"subtract_log_q": True})
    options = {"positive_correction": True, "correct_at_prediction": True, "reduction": "sum"}
    loss = SampledSoftmax(**validate_options(owner, SampledSoftmax, options))
    assert loss.positive_correction and loss.correct_at_prediction


def test_batches_are_typed_and_frozen() -> None:
    """Each mode's batch has exactly its fields, all required, and cannot be changed in a step."""
    import dataclasses

    full = {f.name for f in dataclasses.fields(FullBatch)}
    sampled = {f.name for f in dataclasses.fields(SampledBatch)}
    shared = {"labels", "log_prior", "embeddings", "epoch", "step"}
    assert full - shared == {"logits", "num_classes", "label_start", "world"}
    assert sampled - shared == {
        "pos_logits", "neg_logits", "neg_ids", "pos_log_q", "neg_log_q", "hits",
        "sampler_conditional",
    }  # fmt: skip
    with pytest.raises(TypeError, match="logits"):
        FullBatch(labels=torch.tensor([0]), log_prior=torch.zeros(3), embeddings=torch.zeros(1, 2))
    batch = to_input(random_sampled(0, 2, 3, shared=True, with_hits=False))
    with pytest.raises(dataclasses.FrozenInstanceError):
        batch.neg_log_q = None
    assert batch.num_negatives == 3
    whole = full_batch(labels=torch.tensor([0]), logits=torch.zeros(1, 5))
    assert whole.whole and (whole.label_start, whole.label_stop) == (0, 5)
    shard = replace(whole, logits=torch.zeros(1, 2), label_start=3)
    assert not shard.whole and shard.label_stop == 5
