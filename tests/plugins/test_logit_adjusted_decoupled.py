"""Logit adjustment, balanced softmax, decoupled losses, the weighting schemes and the limits
their implicit losses predict (algorithms.md §2.2, §5, §6, §12), the model-based sampler, the
cosine output layer and the mlp encoder.

References are independent float64 numpy loops written from the formulas.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch
from scipy import stats

from tailkit.components import Batch
from tailkit.evaluation.correction import PredictionContext
from tailkit.output.output_layer import OutputLayer
from tailkit.plugins.losses.decoupled import Decoupled, SampledDecoupled
from tailkit.plugins.losses.logit_adjusted import BalancedSoftmax, LogitAdjusted
from tailkit.plugins.losses.sampled_softmax import SampledSoftmax
from tailkit.plugins.losses.softmax import SoftmaxCE
from tailkit.plugins.models.mlp import MLP
from tailkit.plugins.samplers.in_batch import InBatchSampler
from tailkit.plugins.samplers.model_based import ModelBasedSampler
from tailkit.testing.batches import full_batch, sampled_batch

SEEDS = [0, 1, 2]
DTYPES = [torch.float32, torch.float64]


def tol(dtype: torch.dtype) -> dict:
    return {"rel": 1e-12, "abs": 1e-12} if dtype == torch.float64 else {"rel": 3e-5, "abs": 3e-5}


def np_ce_row(row: np.ndarray, y: int) -> float:
    top = row.max()
    return float(top + math.log(np.exp(row - top).sum()) - row[y])


def np_la(logits, labels, counts, tau) -> float:
    pi = counts / counts.sum()
    off = np.log(pi**tau + 1e-12)
    return float(np.mean([np_ce_row(r + off, y) for r, y in zip(logits, labels, strict=True)]))


def np_balanced(logits, labels, counts) -> float:
    off = np.log(counts)
    return float(np.mean([np_ce_row(r + off, y) for r, y in zip(logits, labels, strict=True)]))


def np_decoupled(logits, labels, margin_loss) -> float:
    def phi(v):  # positive side φ(v)
        return math.log1p(math.exp(-v)) if margin_loss == "logistic" else max(0.0, 1 - v)

    per = []
    for row, y in zip(logits, labels, strict=True):
        value = phi(row[y])
        for j, f in enumerate(row):
            if j != y:
                value += phi(-f)  # ϕ(−f_{y'}) with ϕ = φ
        per.append(value)
    return float(np.mean(per))


def counts_for(c: int, rng: np.random.Generator) -> np.ndarray:
    return np.sort(rng.integers(1, 500, c))[::-1].astype(np.float64)


def full_input(logits: np.ndarray, labels: np.ndarray, dtype, grad=False) -> Batch:
    t = torch.tensor(logits, dtype=dtype, requires_grad=grad)
    return full_batch(labels=torch.tensor(labels), logits=t)


# ---------------------------------------------------------------- logit adjustment, BS


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tau", [0.0, 0.5, 1.0, 2.0])
def test_logit_adjusted_matches_numpy(dtype, tau) -> None:
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        b, c = 9, 17
        logits, labels = rng.normal(0, 3, (b, c)), rng.integers(0, c, b)
        counts = counts_for(c, rng)
        loss = LogitAdjusted(tau=tau)
        loss.setup(torch.tensor(counts))
        got = loss(full_input(logits, labels, dtype)).item()
        assert got == pytest.approx(np_la(logits, labels, counts, tau), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_balanced_softmax_matches_numpy(dtype) -> None:
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        logits, labels = rng.normal(0, 3, (9, 17)), rng.integers(0, 17, 9)
        counts = counts_for(17, rng)
        loss = BalancedSoftmax()
        loss.setup(torch.tensor(counts))
        got = loss(full_input(logits, labels, dtype)).item()
        assert got == pytest.approx(np_balanced(logits, labels, counts), **tol(dtype))


def test_section_12_toy_vector() -> None:
    counts = torch.tensor([100.0, 10.0, 1.0], dtype=torch.float64)
    batch = full_input(np.array([[1.0, 0.0, -0.5]]), np.array([2]), torch.float64)
    la, bs = LogitAdjusted(), BalancedSoftmax()
    la.setup(counts)
    bs.setup(counts)
    assert la(batch).item() == pytest.approx(6.143447, abs=1e-6)
    assert bs(batch).item() == pytest.approx(6.143447, abs=1e-6)
    posthoc = LogitAdjusted(adjustment="posthoc")
    posthoc.setup(counts)
    ctx = PredictionContext(log_prior=torch.zeros(3))
    adjusted = posthoc.adjust_scores(batch.logits, torch.zeros(1, 1), torch.arange(3), ctx)
    assert adjusted[0].tolist() == pytest.approx([1.104360, 2.406945, 4.209530], abs=1e-6)
    # Post-hoc trains with plain CE; the loss mode predicts with the raw scores.
    assert posthoc(batch).item() == pytest.approx(SoftmaxCE()(batch).item(), abs=1e-12)
    assert posthoc.adjusts_scores and not la.adjusts_scores


def test_posthoc_adjusts_a_label_chunk_by_its_own_ids() -> None:
    counts = torch.tensor([50.0, 20.0, 10.0, 5.0, 1.0], dtype=torch.float64)
    loss = LogitAdjusted(adjustment="posthoc", tau=1.5)
    loss.setup(counts)
    scores = torch.zeros(2, 2)
    out = loss.adjust_scores(
        scores, torch.zeros(2, 1), torch.tensor([3, 4]), PredictionContext(log_prior=torch.zeros(5))
    )
    pi = (counts / counts.sum()).numpy()
    expected = -np.log(pi[[3, 4]] ** 1.5 + 1e-12)
    assert out[0].tolist() == pytest.approx(expected.tolist(), rel=1e-6)


def test_balanced_softmax_with_an_unseen_class_stays_finite() -> None:
    loss = BalancedSoftmax()
    loss.setup(torch.tensor([10.0, 0.0, 3.0], dtype=torch.float64))
    batch = full_input(np.array([[0.5, 9.0, -1.0]]), np.array([0]), torch.float64, grad=True)
    value = loss(batch)
    value.backward()
    assert math.isfinite(value.item()) and torch.isfinite(batch.logits.grad).all()
    assert batch.logits.grad[0, 1].item() == 0.0  # the −inf column takes no part
    # And it equals the CE over the seen classes only, shifted by their log counts.
    assert value.item() == pytest.approx(
        np_ce_row(np.array([0.5 + math.log(10), -1 + math.log(3)]), 0)
    )


def test_setup_is_required() -> None:
    with pytest.raises(RuntimeError, match="setup"):
        LogitAdjusted()(full_input(np.zeros((1, 3)), np.array([0]), torch.float32))


@pytest.mark.parametrize("loss", [LogitAdjusted(tau=0.7), BalancedSoftmax()], ids=["la", "bs"])
def test_gradcheck_prior_losses(loss) -> None:
    rng = np.random.default_rng(3)
    loss.setup(torch.tensor(counts_for(6, rng)))
    logits = torch.tensor(rng.normal(0, 2, (4, 6)), requires_grad=True)
    labels = torch.tensor(rng.integers(0, 6, 4))
    assert torch.autograd.gradcheck(lambda f: loss(full_batch(labels=labels, logits=f)), (logits,))


# ---------------------------------------------------------------- decoupled


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("margin_loss", ["logistic", "hinge"])
def test_decoupled_matches_numpy(dtype, margin_loss) -> None:
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        logits, labels = rng.normal(0, 2, (7, 11)), rng.integers(0, 11, 7)
        got = Decoupled(margin_loss=margin_loss)(full_input(logits, labels, dtype)).item()
        assert got == pytest.approx(np_decoupled(logits, labels, margin_loss), **tol(dtype))


def sampled_input(rng, b, m, c, *, dtype=torch.float64, shared=False):
    logits = rng.normal(0, 2, (b, c))
    labels = rng.integers(0, c, b)
    ids = rng.integers(0, c, (m,) if shared else (b, m))
    neg = logits[:, ids] if shared else np.take_along_axis(logits, ids, 1)
    table = np.log(rng.dirichlet(np.ones(c)))
    hits = (ids[None, :] if shared else ids) == labels[:, None]
    counts = counts_for(c, rng)
    log_prior = np.log(counts / counts.sum())
    batch = sampled_batch(
        labels=torch.tensor(labels),
        pos_logits=torch.tensor(logits[np.arange(b), labels], dtype=dtype, requires_grad=True),
        neg_logits=torch.tensor(neg, dtype=dtype, requires_grad=True),
        pos_log_q=torch.tensor(table[labels], dtype=dtype),
        neg_log_q=torch.tensor(table[ids], dtype=dtype),
        hits=torch.tensor(hits),
        neg_ids=torch.tensor(ids),
        log_prior=torch.tensor(log_prior, dtype=dtype),
    )
    return batch, {
        "logits": logits,
        "labels": labels,
        "ids": np.broadcast_to(ids, (b, m)),
        "log_q": table,
        "hits": np.broadcast_to(hits, (b, m)),
        "log_prior": log_prior,
    }


def np_weight(kind, ref, i, j, m, tau) -> float:
    y, yp = ref["labels"][i], ref["ids"][i, j]
    q = math.exp(ref["log_q"][yp])
    if kind == "constant":
        return 1.0
    if kind == "importance":
        return 1.0 / (m * q)
    if kind == "relative":
        return math.exp(tau * (ref["log_prior"][yp] - ref["log_prior"][y])) / (m * q)
    norm = sum(
        1.0 / math.exp(ref["log_q"][ref["ids"][i, k]]) for k in range(m) if not ref["hits"][i, k]
    )
    return (1.0 / q) / norm


WEIGHTINGS = ["importance", "constant", "relative", "self-normalized"]


@pytest.mark.parametrize("weighting", WEIGHTINGS)
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sampled_softmax_weightings_match_numpy(weighting, shared, dtype) -> None:
    tau = 0.8
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        b, m, c = 6, 5, 4  # few labels: plenty of accidental hits
        batch, ref = sampled_input(rng, b, m, c, dtype=dtype, shared=shared)
        per = []
        for i in range(b):
            f_y = ref["logits"][i, ref["labels"][i]]
            total = sum(
                np_weight(weighting, ref, i, j, m, tau)
                * math.exp(ref["logits"][i, ref["ids"][i, j]] - f_y)
                for j in range(m)
                if not ref["hits"][i, j]
            )
            per.append(math.log1p(total))
        got = SampledSoftmax(weighting=weighting, tau=tau)(batch).item()
        assert got == pytest.approx(np.mean(per), **tol(dtype))


@pytest.mark.parametrize("weighting", WEIGHTINGS)
@pytest.mark.parametrize("margin_loss", ["logistic", "hinge"])
def test_sampled_decoupled_matches_numpy(weighting, margin_loss) -> None:
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        b, m, c = 6, 5, 4
        batch, ref = sampled_input(rng, b, m, c, shared=seed == 1)

        def phi(v):
            return math.log1p(math.exp(-v)) if margin_loss == "logistic" else max(0.0, 1 - v)

        per = []
        for i in range(b):
            value = phi(ref["logits"][i, ref["labels"][i]])
            for j in range(m):
                if not ref["hits"][i, j]:
                    f = ref["logits"][i, ref["ids"][i, j]]
                    value += np_weight(weighting, ref, i, j, m, 1.0) * phi(-f)
            per.append(value)
        loss = SampledDecoupled(margin_loss=margin_loss, weighting=weighting)
        assert loss(batch).item() == pytest.approx(np.mean(per), rel=1e-12, abs=1e-12)


@pytest.mark.parametrize("weighting", WEIGHTINGS)
def test_gradcheck_sampled_losses(weighting) -> None:
    rng = np.random.default_rng(5)
    batch, _ = sampled_input(rng, 4, 6, 5)
    for loss in (SampledSoftmax(weighting=weighting), SampledDecoupled(weighting=weighting)):

        def f(pos, neg, loss=loss):
            return loss(replace(batch, pos_logits=pos, neg_logits=neg))

        assert torch.autograd.gradcheck(f, (batch.pos_logits, batch.neg_logits))


def test_gradcheck_decoupled() -> None:
    rng = np.random.default_rng(6)
    logits = torch.tensor(rng.normal(0, 2, (4, 6)), requires_grad=True)
    labels = torch.tensor(rng.integers(0, 6, 4))
    for margin_loss in ("logistic", "hinge"):
        loss = Decoupled(margin_loss=margin_loss)
        assert torch.autograd.gradcheck(
            lambda f, loss=loss: loss(full_batch(labels=labels, logits=f)), (logits,)
        )


def test_sampled_hits_get_zero_gradient() -> None:
    rng = np.random.default_rng(7)
    batch, ref = sampled_input(rng, 8, 6, 3)
    assert ref["hits"].any()
    for loss in (
        SampledDecoupled(weighting="relative"),
        SampledSoftmax(weighting="self-normalized"),
    ):
        batch.neg_logits.grad = None
        loss(batch).backward()
        assert (batch.neg_logits.grad[batch.hits] == 0).all()


def test_decoupled_initial_bias_and_confidence() -> None:
    assert Decoupled().initial_bias(101) == pytest.approx(-math.log(100))
    assert Decoupled(margin_loss="hinge").initial_bias(101) == 0.0
    top = torch.tensor([0.3, -2.0])
    assert torch.allclose(Decoupled().confidence(top, torch.zeros(2)), torch.sigmoid(top))
    assert Decoupled(margin_loss="hinge").confidence(top, torch.zeros(2)) is None


# ---------------------------------------------------------------- implicit losses (§2.2)


def _sampled_rows(logits, labels, ids, log_q, log_prior, loss):
    b = logits.shape[0]
    rows = torch.arange(b)
    return loss(
        sampled_batch(
            labels=labels,
            pos_logits=logits[rows, labels],
            neg_logits=logits.gather(1, ids),
            neg_log_q=log_q,
            hits=ids == labels[:, None],
            neg_ids=ids,
            log_prior=log_prior,
        )
    )


def test_relative_weighting_tends_to_the_logit_adjusted_loss() -> None:
    """Importance × (π_{y'}/π_y)^τ: the sampled loss tends to the LA loss as m grows, whatever
    q is (here a skewed q unrelated to π), and the error shrinks with m."""
    g = torch.Generator().manual_seed(1)
    c, b, draws, tau = 150, 32, 40, 1.0
    logits = torch.randn(b, c, generator=g, dtype=torch.float64) * 1.5
    counts = torch.randint(1, 400, (c,), generator=g).double()
    log_prior = (counts / counts.sum()).log()
    labels = torch.multinomial(counts, b, replacement=True, generator=g)
    la = LogitAdjusted(tau=tau)
    la.setup(counts)
    target = la(full_batch(labels=labels, logits=logits)).item()
    q = torch.rand(c, generator=g, dtype=torch.float64) + 0.2
    log_q_table = (q / q.sum()).log()
    loss = SampledSoftmax(weighting="relative", tau=tau)

    def error(m: int) -> float:
        values = []
        for _ in range(draws):
            ids = torch.multinomial(q.expand(b, c), m, replacement=True, generator=g)
            values.append(_sampled_rows(logits, labels, ids, log_q_table[ids], log_prior, loss))
        return (torch.stack(values) - target).abs().mean().item()

    errors = [error(m) for m in (8, 64, 512)]
    assert errors[0] > 2 * errors[1] > 4 * errors[2]
    assert errors[2] < 0.03


def test_in_batch_constant_weights_are_logit_adjustment_on_the_negative_side() -> None:
    """In-batch negatives are the labels of B i.i.d. rows (q = π), weights 1: the expected
    partition sum Σ_{j∈N} e^{f_j − f_y} is Σ_{y'≠y} B·π_{y'}·e^{f_{y'} − f_y}, i.e. the LA
    adjustment + log(B π_{y'}) on the negative logits only (the positive is not adjusted).
    Checked through the sampler itself, over many batches, within CLT error bars."""
    g = torch.Generator().manual_seed(2)
    c, b, batches = 12, 64, 3000
    counts = torch.tensor([400, 200, 120, 80, 50, 30, 20, 12, 8, 5, 3, 2], dtype=torch.float64)
    pi = counts / counts.sum()
    train_labels = torch.repeat_interleave(torch.arange(c), counts.long())
    sampler = InBatchSampler()
    sampler.fit(None, train_labels, c)
    f = torch.randn(c, generator=g, dtype=torch.float64)  # one anchor's scores
    anchor = 3
    loss = SampledSoftmax(weighting="constant")
    partition = []
    for _ in range(batches):
        y = torch.multinomial(pi, b, replacement=True, generator=g)
        ids, log_q = sampler.sample(None, y, 0, g)
        batch = sampled_batch(
            labels=torch.tensor([anchor]),
            pos_logits=f[anchor : anchor + 1],
            neg_logits=f[ids].unsqueeze(0),
            neg_log_q=log_q,
            hits=(ids == anchor).unsqueeze(0),
            neg_ids=ids,
        )
        partition.append(math.expm1(loss(batch).item()))
    partition = np.array(partition)
    others = torch.arange(c) != anchor
    implicit = (b * pi[others] * torch.exp(f[others] - f[anchor])).sum().item()
    # = exp(LA-adjusted negative logits f + log π + log B) summed: logit adjustment, τ = 1.
    la_negative = torch.exp(f[others] + pi[others].log() + math.log(b) - f[anchor]).sum().item()
    assert implicit == pytest.approx(la_negative, rel=1e-12)
    stderr = partition.std(ddof=1) / math.sqrt(batches)
    assert abs(partition.mean() - implicit) < 4 * stderr
    # …and not the unadjusted (uniform-weight) partition sum of the full softmax.
    unadjusted = b / (c - 1) * torch.exp(f[others] - f[anchor]).sum().item()
    assert abs(partition.mean() - unadjusted) > 10 * stderr


# ---------------------------------------------------------------- model-based sampler


def test_model_based_sampler_draws_from_the_softmax_of_the_scores() -> None:
    g = torch.Generator().manual_seed(3)
    c, draws = 9, 60000
    scores = torch.randn(2, c, generator=g) * 1.5
    sampler = ModelBasedSampler(temperature=1.0)
    sampler.fit(None, torch.arange(c), c)
    ids, log_q = sampler.sample(scores, torch.tensor([0, 1]), draws, g)
    assert ids.shape == (2, draws)
    expected = torch.softmax(scores.double(), 1)
    assert torch.allclose(log_q.double(), expected.log().gather(1, ids), atol=1e-5)
    for row in range(2):
        observed = torch.bincount(ids[row], minlength=c).numpy()
        _, p = stats.chisquare(observed, expected[row].numpy() * draws)
        assert p > 1e-4
    hot = ModelBasedSampler(temperature=4.0)
    hot.fit(None, torch.arange(c), c)
    assert torch.allclose(
        hot.log_prob(scores, torch.arange(c)), torch.log_softmax(scores / 4.0, 1), atol=1e-6
    )


def test_model_based_sampler_needs_the_scores() -> None:
    sampler = ModelBasedSampler()
    sampler.fit(None, torch.arange(5), 5)
    with pytest.raises(ValueError, match=r"scores \(B, 5\)"):
        sampler.sample(torch.zeros(3, 7), torch.zeros(3, dtype=torch.long), 2, torch.Generator())


def test_model_based_importance_tends_to_the_full_softmax() -> None:
    """q ∝ e^f with importance weights: (1/m) Σ e^{f_j}/q_j = Z exactly for every draw, so
    the sampled loss is log(1 + (Z − hits)/…) ≈ the full CE already at small m."""
    g = torch.Generator().manual_seed(4)
    c, b, m = 300, 16, 32
    logits = torch.randn(b, c, generator=g, dtype=torch.float64) * 2
    labels = torch.randint(c, (b,), generator=g)
    full = SoftmaxCE()(full_batch(labels=labels, logits=logits)).item()
    sampler = ModelBasedSampler()
    sampler.fit(None, torch.arange(c), c)
    values = []
    for _ in range(30):
        ids, log_q = sampler.sample(logits, labels, m, g)
        values.append(
            _sampled_rows(logits, labels, ids, log_q.double(), None, SampledSoftmax()).item()
        )
    uniform = []
    for _ in range(30):
        ids = torch.randint(c, (b, m), generator=g)
        log_q = torch.full((b, m), -math.log(c), dtype=torch.float64)
        uniform.append(_sampled_rows(logits, labels, ids, log_q, None, SampledSoftmax()).item())
    err_model = np.abs(np.array(values) - full).mean()
    err_uniform = np.abs(np.array(uniform) - full).mean()
    assert err_model < 0.5 * err_uniform


# ---------------------------------------------------------------- cosine layer and mlp


def test_cosine_output_layer_scores_are_scaled_cosines_and_update_rows_only() -> None:
    g = torch.Generator().manual_seed(5)
    c, d, b = 11, 4, 6
    layer = OutputLayer(c, d, generator=g, cosine_scale=30.0)
    z = torch.randn(b, d, generator=g)
    logits, rows = layer.full(z)
    expected = (
        30.0
        * torch.nn.functional.normalize(z, dim=1)
        @ torch.nn.functional.normalize(layer.weight, dim=1).T
    )
    assert torch.allclose(logits, expected, atol=1e-5)
    assert torch.allclose(layer.scores(z, 2, 7), expected[:, 2:7], atol=1e-5)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    neg = torch.tensor([3, 4, 5])
    scored = layer.sampled(z, labels, neg)
    assert torch.allclose(scored.pos, expected[torch.arange(b), labels], atol=1e-5)
    assert torch.allclose(scored.neg, expected[:, neg], atol=1e-5)
    # The bias takes no part: it gets no gradient and the optimiser leaves it alone.
    logits.sum().backward()
    assert rows.bias.grad is None and rows.weight.grad is not None
    from tailkit.output.optim import RowSparseAdagrad

    opt = RowSparseAdagrad(lr=0.1)
    opt.attach(layer, [])
    before = layer.bias.clone()
    opt.step(rows, 0)
    assert torch.equal(layer.bias, before)


def test_initial_bias_from_the_loss() -> None:
    layer = OutputLayer.for_loss(Decoupled(), 51, 3)
    assert torch.allclose(layer.bias, torch.full((51,), -math.log(50)))
    assert OutputLayer.for_loss(SoftmaxCE(), 51, 3).bias.abs().max() == 0


def test_mlp_shapes_and_embedding() -> None:
    torch.manual_seed(0)
    model = MLP(7, hidden=[16, 8], dim=5)
    out = model(torch.randn(3, 7))
    assert out.shape == (3, 5) and model.out_dim == 5 and (out >= 0).all()
    linear_end = MLP(7, hidden=[], dim=5, final_relu=False)
    assert (linear_end(torch.randn(50, 7)) < 0).any()
    with pytest.raises(ValueError, match="hidden"):
        MLP(7, hidden=[0])
