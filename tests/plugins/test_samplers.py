"""The built-in negative samplers: their draws follow the log q they report, exactly."""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

import tailkit.plugins.samplers as sampler_plugin
from tailkit.components import Sampler
from tailkit.errors import InvalidParameterError
from tailkit.plugins.samplers.in_batch import InBatchSampler
from tailkit.plugins.samplers.uniform import UniformSampler
from tailkit.plugins.samplers.unigram import UnigramSampler, build_alias_table
from tailkit.registry import make_registry

C = 50
ZERO = (7, 23, 41, 49)  # labels absent from the training split
N_DRAWS = 200_000
B = 100


def skewed_counts() -> np.ndarray:
    counts = np.floor(2000.0 / (1.0 + np.arange(C)) ** 1.1).astype(np.int64)
    counts[list(ZERO)] = 0
    return counts


def training_labels() -> torch.Tensor:
    counts = skewed_counts()
    labels = np.repeat(np.arange(C), counts)
    np.random.default_rng(0).shuffle(labels)
    return torch.from_numpy(labels)


def fitted(sampler: Sampler) -> Sampler:
    sampler.fit(None, training_labels(), C)
    return sampler


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def batch(b: int = B) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.zeros(b, 3)
    y = torch.randint(C, (b,), generator=gen(99))
    return x, y


def implied_alias_probs(prob: np.ndarray, alias: np.ndarray) -> np.ndarray:
    """Exact label probabilities of an alias table: p_i = (prob_i + Σ_{alias_j=i} 1−prob_j)/C."""
    prob = prob.astype(np.float64)
    return (prob + np.bincount(alias, weights=1.0 - prob, minlength=prob.size)) / prob.size


def assert_frequencies_match(ids: torch.Tensor, log_q: torch.Tensor) -> None:
    """Chi-square of the draws against exp(log q); zero-probability labels never drawn."""
    observed = np.bincount(ids.reshape(-1).numpy(), minlength=log_q.numel())
    q = np.exp(log_q.numpy().astype(np.float64))
    q /= q.sum()
    zero = q == 0
    assert observed[zero].sum() == 0, f"drew zero-probability labels {np.flatnonzero(zero)}"
    expected = q[~zero] * observed.sum()
    assert expected.min() > 5  # chi-square approximation holds
    pvalue = chisquare(observed[~zero], expected).pvalue
    assert pvalue > 1e-3, pvalue


def all_log_q(sampler: Sampler) -> torch.Tensor:
    return sampler.log_prob(None, torch.arange(C))


# --- frequencies ---------------------------------------------------------------------------


@pytest.mark.parametrize("shared", [True, False])
def test_uniform_draws_are_uniform(shared: bool) -> None:
    sampler = fitted(UniformSampler(shared=shared))
    x, y = batch()
    m = N_DRAWS if shared else N_DRAWS // B
    ids, _ = sampler.sample(x, y, m, gen(1))
    assert_frequencies_match(ids, all_log_q(sampler))


@pytest.mark.parametrize(
    ("alpha", "offset", "shared"),
    [(1.0, 0.0, True), (0.75, 0.0, False), (1.0, 1.0, True), (0.5, 2.5, False), (0.0, 0.0, True)],
)
def test_unigram_draws_follow_log_q(alpha: float, offset: float, shared: bool) -> None:
    sampler = fitted(UnigramSampler(alpha=alpha, offset=offset, shared=shared))
    x, y = batch()
    m = N_DRAWS if shared else N_DRAWS // B
    ids, _ = sampler.sample(x, y, m, gen(2))
    log_q = all_log_q(sampler)
    assert torch.isinf(log_q[list(ZERO)]).all() == (offset == 0)
    assert_frequencies_match(ids, log_q)


def test_in_batch_negatives_follow_the_training_prior() -> None:
    labels = training_labels()
    sampler = fitted(InBatchSampler())
    g = gen(3)
    drawn = []
    for _ in range(N_DRAWS // 250):
        y = labels[torch.randint(labels.numel(), (250,), generator=g)]
        ids, _ = sampler.sample(torch.zeros(250, 3), y, 17, g)
        assert torch.equal(ids, y)
        drawn.append(ids)
    assert_frequencies_match(torch.cat(drawn), all_log_q(sampler))


# --- log q, shapes, dtypes -------------------------------------------------------------------


@pytest.mark.parametrize("make", [UniformSampler, UnigramSampler])
@pytest.mark.parametrize("shared", [True, False])
def test_sample_log_q_equals_log_prob_and_shapes(make: type[Sampler], shared: bool) -> None:
    sampler = fitted(make(shared=shared))
    x, y = batch(8)
    ids, log_q = sampler.sample(x, y, 32, gen())
    assert ids.shape == log_q.shape == ((32,) if shared else (8, 32))
    assert ids.dtype == torch.int64
    assert log_q.dtype == torch.float32
    assert ids.min() >= 0 and ids.max() < C
    assert torch.equal(log_q, sampler.log_prob(x, ids))
    assert sampler.log_prob(x, ids.reshape(-1, 4)).shape == ids.reshape(-1, 4).shape


def test_in_batch_returns_the_batch_labels_and_their_prior() -> None:
    sampler = fitted(InBatchSampler())
    assert sampler.shared and not sampler.conditional
    x, y = batch(16)
    ids, log_q = sampler.sample(x, y, 5, gen())
    assert torch.equal(ids, y)
    assert ids.dtype == torch.int64 and log_q.dtype == torch.float32
    assert log_q.shape == (16,)
    assert torch.equal(log_q, sampler.log_prob(x, y))
    counts = skewed_counts()
    with np.errstate(divide="ignore"):
        expected = np.log(counts / counts.sum())  # −inf for the unseen labels
    np.testing.assert_allclose(all_log_q(sampler).numpy(), expected, rtol=1e-6)


@pytest.mark.parametrize(
    "sampler",
    [UniformSampler(), UnigramSampler(), UnigramSampler(alpha=0.75), UnigramSampler(offset=1.0)],
    ids=["uniform", "unigram", "unigram-0.75", "unigram-offset1"],
)
def test_probabilities_sum_to_one(sampler: Sampler) -> None:
    fitted(sampler)
    total = torch.exp(all_log_q(sampler).double()).sum().item()
    assert total == pytest.approx(1.0, abs=1e-6)


@pytest.mark.parametrize(("alpha", "offset"), [(1.0, 0.0), (0.75, 0.0), (1.0, 1.0), (0.3, 0.5)])
def test_unigram_formula_matches_numpy(alpha: float, offset: float) -> None:
    sampler = fitted(UnigramSampler(alpha=alpha, offset=offset))
    base = skewed_counts().astype(np.float64) + offset
    weights = np.where(base > 0, base, 1.0) ** alpha * (base > 0)
    with np.errstate(divide="ignore"):
        expected = np.log(weights / weights.sum())
    np.testing.assert_allclose(all_log_q(sampler).numpy(), expected, rtol=1e-6, atol=1e-6)
    state = sampler.state_dict()
    implied = implied_alias_probs(state["prob"].numpy(), state["alias"].numpy())
    np.testing.assert_allclose(implied, weights / weights.sum(), rtol=1e-6, atol=1e-12)


def test_unigram_alpha_zero_is_uniform_over_seen_labels() -> None:
    sampler = fitted(UnigramSampler(alpha=0.0))
    q = torch.exp(all_log_q(sampler))
    seen = torch.ones(C, dtype=torch.bool)
    seen[list(ZERO)] = False
    assert torch.all(q[~seen] == 0)
    np.testing.assert_allclose(q[seen].numpy(), 1 / (C - len(ZERO)), rtol=1e-6)


# --- determinism and state -------------------------------------------------------------------


SAMPLERS = {
    "uniform": lambda: UniformSampler(),
    "uniform-per-example": lambda: UniformSampler(shared=False),
    "unigram": lambda: UnigramSampler(alpha=0.75, offset=1.0),
    "unigram-per-example": lambda: UnigramSampler(shared=False),
    "in-batch": lambda: InBatchSampler(),
}


@pytest.mark.parametrize("name", SAMPLERS)
def test_same_seed_same_draws(name: str) -> None:
    sampler = fitted(SAMPLERS[name]())
    x, y = batch()
    a = sampler.sample(x, y, 64, gen(5))
    b = sampler.sample(x, y, 64, gen(5))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    if name != "in-batch":
        c = sampler.sample(x, y, 64, gen(6))
        assert not torch.equal(a[0], c[0])


@pytest.mark.parametrize("name", SAMPLERS)
def test_state_dict_round_trip(name: str) -> None:
    original = fitted(SAMPLERS[name]())
    buf = io.BytesIO()
    torch.save(original.state_dict(), buf)
    buf.seek(0)
    restored = SAMPLERS[name]()
    restored.load_state_dict(torch.load(buf, weights_only=True))
    x, y = batch()
    a = original.sample(x, y, 64, gen(7))
    b = restored.sample(x, y, 64, gen(7))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    labels = torch.arange(C)
    assert torch.equal(original.log_prob(x, labels), restored.log_prob(x, labels))
    assert restored.to(torch.device("cpu")) is restored


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", SAMPLERS)
def test_draws_stay_on_the_device(name: str) -> None:
    device = torch.device("cuda")
    sampler = fitted(SAMPLERS[name]()).to(device)
    x, y = (t.to(device) for t in batch())
    ids, log_q = sampler.sample(x, y, 64, torch.Generator(device).manual_seed(0))
    assert ids.device.type == log_q.device.type == "cuda"
    assert torch.equal(log_q, sampler.log_prob(x, ids))


# --- the alias table -------------------------------------------------------------------------


def test_alias_table_at_a_million_labels() -> None:
    rng = np.random.default_rng(0)
    n = 1_000_000
    counts = rng.geometric(0.4, size=n) - 1  # 40 % zeros
    counts[rng.choice(n, 200, replace=False)] += rng.integers(1_000, 50_000, size=200)
    weights = counts.astype(np.float64)
    sampler = UnigramSampler()
    sampler.fit(None, torch.from_numpy(np.repeat(np.arange(n), counts)), n)
    state = sampler.state_dict()
    prob, alias = state["prob"].numpy(), state["alias"].numpy()
    assert np.all((prob >= 0) & (prob <= 1))
    implied = implied_alias_probs(prob, alias)
    expected = weights / weights.sum()
    np.testing.assert_allclose(implied, expected, rtol=1e-6, atol=0)
    assert np.all(implied[weights == 0] == 0)
    ids, _ = sampler.sample(torch.zeros(1, 1), torch.zeros(1, dtype=torch.int64), 50_000, gen())
    assert np.all(weights[ids.numpy()] > 0)


@pytest.mark.parametrize(
    "weights",
    [
        [0.0, 1.0, 3.0],
        [0.1] * 7,
        [5.0],
        [0.0, 0.0, 2.0, 0.0],
        [100.0, 1, 1, 1, 50, 0, 0.5],
        [1e-15, 1.0, 1e9, 3.0],  # far below the 2^-k fixed-point unit of the bookkeeping
    ],
)
def test_alias_table_is_exact_on_small_cases(weights: list[float]) -> None:
    w = np.asarray(weights)
    prob, alias = build_alias_table(w)
    np.testing.assert_allclose(implied_alias_probs(prob, alias), w / w.sum(), rtol=1e-9, atol=0)
    assert np.all(prob[w == 0] == 0) and not np.isin(alias[prob < 1], np.flatnonzero(w == 0)).any()


# --- errors and registration -----------------------------------------------------------------


@pytest.mark.parametrize("make", [UniformSampler, UnigramSampler, InBatchSampler])
def test_sampling_before_fit_is_an_error(make: type[Sampler]) -> None:
    x, y = batch(4)
    with pytest.raises(RuntimeError, match="fit"):
        make().sample(x, y, 3, gen())


def test_bad_training_labels_are_rejected() -> None:
    with pytest.raises(ValueError, match="labels must lie"):
        UnigramSampler().fit(None, torch.tensor([0, 5]), 5)
    with pytest.raises(ValueError, match="labels must lie"):
        InBatchSampler().fit(None, torch.tensor([-1, 2]), 5)
    with pytest.raises(ValueError, match="zero weight"):
        UnigramSampler().fit(None, torch.empty(0, dtype=torch.int64), 5)
    with pytest.raises(ValueError, match="weights"):
        build_alias_table(np.array([1.0, -1.0]))


def test_registered_with_options_validated() -> None:
    registry = make_registry(load_entrypoints=False, extra_plugins=[("samplers", sampler_plugin)])
    assert registry.names("samplers") == ["in-batch", "model-based", "tree", "uniform", "unigram"]
    descriptions = {c.name: c.description for c in registry.components("samplers")}
    assert descriptions["uniform"] == "Uniform proposal q(y) = 1/C."
    unigram = registry.build(
        "samplers", {"name": "unigram", "alpha": 1, "shared": False}, "samplers.u"
    )
    assert isinstance(unigram, UnigramSampler) and unigram.alpha == 1.0 and not unigram.shared
    assert UnigramSampler.shared  # the option does not leak into the class default
    with pytest.raises(InvalidParameterError, match=r"samplers\.u\.alpha"):
        registry.build("samplers", {"name": "unigram", "alpha": -0.5}, "samplers.u")
    with pytest.raises(InvalidParameterError, match=r"samplers\.u\.offset"):
        registry.build("samplers", {"name": "unigram", "offset": -1}, "samplers.u")
    with pytest.raises(InvalidParameterError, match="unknown key 'shared'"):
        registry.build("samplers", {"name": "in-batch", "shared": False}, "samplers.b")


def test_fit_sampler_reports_labels_the_proposal_cannot_draw() -> None:
    """A unigram proposal without smoothing gives q = 0 to a label unseen in training; the
    mean log q of rows with it is −∞, which metrics/sampler/<key>.json reports as None with their count
    (JSON has no −∞: the stage used to fail writing it)."""
    from tailkit.plugins.samplers.unigram import UnigramSampler
    from tailkit.stages.fit_sampler import mean_log_prob

    sampler = UnigramSampler(alpha=1.0, offset=0.0)
    sampler.fit(None, torch.tensor([0, 0, 1, 2]), 4)
    assert mean_log_prob(sampler, torch.zeros(3, 1), torch.tensor([0, 3, 3])) == (None, 2)
    mean, impossible = mean_log_prob(sampler, torch.zeros(2, 1), torch.tensor([0, 1]))
    assert impossible == 0 and mean == pytest.approx((math.log(0.5) + math.log(0.25)) / 2)


# ---------------------------------------------------------------- q = 0 (issue 19 item 12)


def test_a_zero_probability_label_is_refused_for_losses_that_divide_by_q() -> None:
    """Unigram with offset 0 gives a label without training rows q = 0: importance weights,
    NCE and Bamler–Mandt's correction divide by it, so training refuses it in one line naming
    the setting; a loss that needs no q, or an offset above 0, trains."""
    from types import SimpleNamespace

    from tailkit.pipeline.experiment import check_support
    from tailkit.plugins.losses.negative_sampling import NegativeSampling
    from tailkit.plugins.losses.sampled_softmax import SampledSoftmax

    params = SimpleNamespace(samplers={"freq": {"name": "unigram"}})  # what it reads
    labels = torch.tensor([0, 0, 1, 3, 3, 3])  # label 2 has no training row
    bare, smoothed = UnigramSampler(), UnigramSampler(offset=1.0)
    bare.fit(None, labels, 4)
    smoothed.fit(None, labels, 4)
    cpu = torch.device("cpu")
    for loss in (SampledSoftmax(weighting="importance"), NegativeSampling()):
        with pytest.raises(InvalidParameterError) as info:
            check_support(loss, bare, params, "freq", "x", 4, cpu)
        assert str(info.value) == (
            "experiments.x: sampler 'freq' gives 1 of 4 labels probability 0 (e.g. label 2), "
            f"but loss {type(loss).__name__} divides by q; set samplers.freq.offset above 0 "
            "(1 is Bamler–Mandt's frequency baseline), or use a loss that needs no q "
            "(weighting: constant)"
        )
        check_support(loss, smoothed, params, "freq", "x", 4, cpu)
    check_support(SampledSoftmax(weighting="constant"), bare, params, "freq", "x", 4, cpu)


def test_which_losses_divide_by_q() -> None:
    """Loss.uses_log_q, per built-in loss at its defaults (and the constant weighting)."""
    registry = make_registry()
    uses = {c.name for c in registry.components("losses") if c.factory().uses_log_q}
    assert uses == {"nce", "negative-sampling", "sampled-decoupled", "sampled-softmax"}
    for name in ("sampled-softmax", "sampled-decoupled"):
        spec = {"name": name, "weighting": "constant"}
        assert not registry.build("losses", spec, "x").uses_log_q
