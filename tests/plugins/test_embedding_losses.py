"""Tests for the losses that use the embeddings Φ(x): ELM and one-stage CE + DRO-LT.

Both are checked against independent float64 numpy implementations written as plain loops from
the formulas in algorithms.md (§4 ELM, §5 the logit adjustment, §9 DRO-LT), against the
cross-check vectors of §4 and §12, and with torch.autograd.gradcheck; their state (the ELM
memory, the DRO-LT prototypes and ε) is checked step by step and through a state_dict round
trip into a fresh loss.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
import torch

from tailkit.components import Batch
from tailkit.errors import InvalidParameterError
from tailkit.plugins.losses.dro_lt import DROLT
from tailkit.plugins.losses.elm import ELM
from tailkit.plugins.losses.prototypes import dro_loss
from tailkit.plugins.losses.pull import pull_terms
from tailkit.testing import check_loss, check_options
from tailkit.testing.batches import full_batch
from tailkit.validation import validate_options

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DTYPES = [torch.float32, torch.float64]
SEEDS = [0, 1, 2]
# Small counts keep α_y = n_y-style margins comparable to the squared distances of unit-scale
# embeddings, so the pull term is far from 0 and the comparison means something.
COUNTS = np.array([1.0, 2.0, 3.0, 5.0, 8.0, 13.0, 0.0])


def tol(dtype: torch.dtype) -> dict[str, float]:
    return (
        {"rtol": 1e-10, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 2e-4, "atol": 2e-5}
    )


# ---------------------------------------------------------------- numpy references (float64)


def np_logsumexp(values: list[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def np_ce(logits: np.ndarray, labels: np.ndarray, weights: np.ndarray | None = None) -> float:
    total, norm = 0.0, 0.0
    for row, y in zip(logits, labels, strict=True):
        w = 1.0 if weights is None else weights[y]
        total += w * (np_logsumexp(list(row)) - row[y])
        norm += w
    return total / norm


def np_la_ce(logits: np.ndarray, labels: np.ndarray, counts: np.ndarray, tau: float) -> float:
    prior = counts / counts.sum()
    adjusted = np.array(
        [[f + math.log(p**tau + 1e-12) for f, p in zip(row, prior, strict=True)] for row in logits]
    )
    return np_ce(adjusted, labels)


def np_alpha(counts: np.ndarray, kind: str, power: float, scale: float) -> np.ndarray:
    total = counts.sum()
    return np.array([scale * ((n / total) if kind == "prior" else n) ** power for n in counts])


def np_sqdist(a: np.ndarray, b: np.ndarray) -> float:
    return float(sum((u - v) ** 2 for u, v in zip(a, b, strict=True)))


def np_pull(anchor: np.ndarray, positives: list[np.ndarray], alpha: float) -> float:
    """log[1 + Σ_{x⁺} exp(‖Φ(x) − Φ(x⁺)‖² − α)]; 0 without positives."""
    return np_logsumexp([0.0] + [np_sqdist(anchor, p) - alpha for p in positives])


def np_batch_pulls(z: np.ndarray, labels: np.ndarray, alpha: np.ndarray) -> list[float]:
    out = []
    for i in range(len(z)):
        partners = [z[j] for j in range(len(z)) if j != i and labels[j] == labels[i]]
        out.append(np_pull(z[i], partners, alpha[labels[i]]))
    return out


def np_dro(z, labels, protos, proto_labels, eps, temperature, per_class=False):
    """DRO-LT as implemented (§9): per prototype, softmax over the batch samples."""
    losses, present = [], 0
    for mu, c in zip(protos, proto_labels, strict=True):
        scores = []
        for zi, yi in zip(z, labels, strict=True):
            p = -math.sqrt(np_sqdist(mu, zi))
            if yi == c:
                p -= eps[yi]
            scores.append(p / temperature)
        norm = np_logsumexp(scores)
        members = [scores[i] - norm for i in range(len(z)) if labels[i] == c]
        losses.append(-sum(members) / len(members) if members else 0.0)
        present += bool(members)
    total = sum(losses) / present
    return (total, losses) if per_class else total


class NpMemory:
    """ELM's per-class memory as plain lists: every embedding written, in write order."""

    def __init__(self, num_classes: int, size: int) -> None:
        self.size = size
        self.written: list[list[np.ndarray]] = [[] for _ in range(num_classes)]

    def positives(self, c: int) -> list[np.ndarray]:
        return self.written[c][-self.size :]

    def write(self, z: np.ndarray, labels: np.ndarray) -> None:
        for zi, yi in zip(z, labels, strict=True):
            self.written[yi].append(zi.copy())

    def table(self, d: int) -> np.ndarray:
        """The ring buffer the loss should hold: the k-th write of class c sits in slot k mod M."""
        out = np.zeros((len(self.written), self.size, d))
        for c, rows in enumerate(self.written):
            for k in range(max(0, len(rows) - self.size), len(rows)):
                out[c, k % self.size] = rows[k]
        return out


def np_elm_memory_step(memory, logits, z, labels, counts, alpha, tau, lam) -> float:
    pulls = [np_pull(z[i], memory.positives(labels[i]), alpha[labels[i]]) for i in range(len(z))]
    value = np_la_ce(logits, labels, counts, tau) + lam * float(np.mean(pulls))
    memory.write(z, labels)
    return value


# ---------------------------------------------------------------- helpers


def random_batch(seed: int, b: int = 12, c: int = 7, d: int = 5, offset: float = 3.0):
    """Labels drawn from a few classes (so there are partners), one singleton class, and
    embeddings with a common offset, as ReLU features have."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, size=b)
    labels[-1] = 5  # a class with a single row in the batch: no partner
    z = rng.normal(size=(b, d)) * 0.8 + offset
    logits = rng.normal(size=(b, c)) * 2.0
    return logits, z, labels


def make_batch(logits, z, labels, dtype, device="cpu", grad=False) -> Batch:
    lg = torch.tensor(logits, dtype=dtype, device=device).requires_grad_(grad)
    em = torch.tensor(z, dtype=dtype, device=device).requires_grad_(grad)
    return full_batch(labels=torch.tensor(labels, device=device), logits=lg, embeddings=em)


def rounded(x: np.ndarray, dtype: torch.dtype) -> np.ndarray:
    """What the loss actually sees: the inputs rounded to ``dtype``, as float64."""
    return torch.tensor(x, dtype=dtype).double().numpy()


def counts_tensor(device="cpu") -> torch.Tensor:
    return torch.tensor(COUNTS, dtype=torch.float64, device=device)


def built_elm(device="cpu", **options) -> ELM:
    loss = ELM(**validate_options("elm", ELM, options)).to(device)
    loss.setup(counts_tensor(device))
    return loss


def built_drolt(device="cpu", **options) -> DROLT:
    loss = DROLT(**validate_options("dro-lt", DROLT, options)).to(device)
    loss.setup(counts_tensor(device))
    return loss


# ---------------------------------------------------------------- ELM: cross-check vectors


@pytest.mark.parametrize("dtype", DTYPES)
def test_elm_pull_worked_example(dtype):
    """§4: Φ = [(0,0), (0.3,0.4), (1,1), (0,0.2)], labels [0,0,1,0], α = 0.5."""
    z = torch.tensor([[0.0, 0.0], [0.3, 0.4], [1.0, 1.0], [0.0, 0.2]], dtype=dtype)
    labels = torch.tensor([0, 0, 1, 0])
    valid = (labels[:, None] == labels[None, :]) & ~torch.eye(4, dtype=torch.bool)
    pulls = pull_terms(z, z, valid, torch.full((4,), 0.5, dtype=dtype))
    expected = [0.879662, 0.904030, 0.0, 0.842437]
    np.testing.assert_allclose(pulls.double().numpy(), expected, atol=1e-6)
    assert pulls[2].item() == 0.0  # no positive: exactly zero, not a tiny log1p(0)

    # The same through the loss: α_y = 0.5 for both classes is "prior" with equal counts,
    # a = 1, c = 1; λ = 1 so total − CE is the mean pull.
    loss = ELM(lam=1.0, alpha="prior")
    loss.setup(torch.tensor([5.0, 5.0], dtype=torch.float64))
    logits = torch.zeros(4, 2, dtype=dtype)
    batch = full_batch(labels=labels, logits=logits, embeddings=z)
    ce = torch.nn.functional.cross_entropy(logits + math.log(0.5 + 1e-12), labels)
    assert (loss(batch) - ce).item() == pytest.approx(0.656532, abs=1e-6)


# ---------------------------------------------------------------- ELM: numpy references


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_pull_terms_batch_matches_numpy(seed, dtype, device):
    _, z, labels = random_batch(seed)
    alpha = np_alpha(COUNTS, "count", 1.0, 1.0)
    zt = torch.tensor(z, dtype=dtype, device=device)
    lt = torch.tensor(labels, device=device)
    valid = (lt[:, None] == lt[None, :]) & ~torch.eye(len(labels), dtype=torch.bool, device=device)
    got = pull_terms(zt, zt, valid, torch.tensor(alpha, dtype=dtype, device=device)[lt])
    expected = np_batch_pulls(rounded(z, dtype), labels, alpha)
    np.testing.assert_allclose(got.double().cpu().numpy(), expected, **tol(dtype))
    assert got[-1].item() == 0.0  # the singleton class


ELM_VARIANTS = [
    {},
    {"lam": 1.0, "alpha": "count", "alpha_power": 0.5, "alpha_scale": 4.0},
    {"lam": 0.3, "alpha": "prior", "alpha_power": 1.0, "alpha_scale": 20.0, "tau": 0.5},
    {"lam": 2.0, "alpha": "prior", "alpha_power": 0.5, "alpha_scale": 10.0, "tau": 2.0},
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("options", ELM_VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_elm_batch_matches_numpy(seed, dtype, options, device):
    logits, z, labels = random_batch(seed)
    full = {"lam": 0.01, "tau": 1.0, "alpha": "count", "alpha_power": 1.0, "alpha_scale": 1.0}
    full.update(options)
    loss = built_elm(device, **options)
    got = loss(make_batch(logits, z, labels, dtype, device)).item()
    alpha = np_alpha(COUNTS, full["alpha"], full["alpha_power"], full["alpha_scale"])
    pulls = np_batch_pulls(rounded(z, dtype), labels, alpha)
    expected = np_la_ce(rounded(logits, dtype), labels, COUNTS, full["tau"]) + full["lam"] * float(
        np.mean(pulls)
    )
    assert got == pytest.approx(expected, rel=tol(dtype)["rtol"], abs=tol(dtype)["atol"])


@pytest.mark.parametrize("tau", [0.0, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("dtype", DTYPES)
def test_elm_without_pull_is_logit_adjusted_ce(tau, dtype):
    """λ = 0 leaves ℓ_mar: CE on logits + log(π^τ + 1e-12), with ε added after the power (an
    empty class gets log 1e-12, a finite −27.6, not −inf; τ = 0 gives π^0 = 1 everywhere)."""
    logits, z, labels = random_batch(7)
    loss = built_elm(lam=0.0, tau=tau)
    got = loss(make_batch(logits, z, labels, dtype)).item()
    expected = np_la_ce(rounded(logits, dtype), labels, COUNTS, tau)
    assert got == pytest.approx(expected, rel=tol(dtype)["rtol"])
    if tau > 0:
        assert loss.log_adjustment[-1].item() == pytest.approx(math.log(1e-12))
    else:  # π^0 = 1: plain CE up to the 1e-12
        plain = torch.nn.functional.cross_entropy(
            torch.tensor(logits, dtype=torch.float64), torch.tensor(labels)
        )
        assert got == pytest.approx(plain.item(), rel=1e-6)


def test_elm_uses_training_counts_not_batch_log_prior():
    """The adjustment comes from the counts given to setup; a log prior in the batch is ignored."""
    logits, z, labels = random_batch(3)
    loss = built_elm(lam=0.0)
    batch = make_batch(logits, z, labels, torch.float64)
    value = loss(batch).item()
    batch = replace(batch, log_prior=torch.zeros(len(COUNTS), dtype=torch.float64))
    assert loss(batch).item() == value


# ---------------------------------------------------------------- ELM: margins α_y


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, COUNTS),  # the paper's default α_y = n_y
        ({"alpha": "prior"}, COUNTS / COUNTS.sum()),  # CIFAR10-LT α_y = P(y)
        ({"alpha": "count", "alpha_power": 0.5}, np.sqrt(COUNTS)),  # CIFAR100-LT, iNat
        (
            {"alpha": "prior", "alpha_power": 0.5, "alpha_scale": 10.0},
            10.0 * np.sqrt(COUNTS / COUNTS.sum()),  # ImageNet-LT
        ),
        ({"alpha": "count", "alpha_power": 2.0, "alpha_scale": 0.5}, 0.5 * COUNTS**2),
        ({"alpha": "prior", "alpha_power": 0.0}, np.ones_like(COUNTS)),
    ],
)
def test_elm_margins(options, expected):
    loss = built_elm(**options)
    np.testing.assert_allclose(loss.margins.cpu().numpy(), expected, rtol=1e-14)


def test_elm_margins_enter_the_pull_per_anchor_class():
    """Raising one class's α lowers only that class's anchors' pull terms."""
    logits, z, labels = random_batch(4)
    base = built_elm(lam=1.0, alpha="count", alpha_power=0.5)
    batch = make_batch(logits, z, labels, torch.float64)
    before = base(batch).item()
    base.margins[labels[0]] += 5.0
    after = base(batch).item()
    alpha = np_alpha(COUNTS, "count", 0.5, 1.0)
    alpha[labels[0]] += 5.0
    expected = np_la_ce(logits, labels, COUNTS, 1.0) + float(
        np.mean(np_batch_pulls(z, labels, alpha))
    )
    assert after < before
    assert after == pytest.approx(expected, rel=1e-10)


# ---------------------------------------------------------------- ELM: gradients


def test_elm_batch_gradcheck():
    logits, z, labels = random_batch(5, b=8, d=3, offset=0.5)
    loss = built_elm(lam=1.0, alpha="count", alpha_power=0.5)
    lab = torch.tensor(labels)

    def fn(lg, em):
        return loss(full_batch(labels=lab, logits=lg, embeddings=em))

    lg = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    em = torch.tensor(z, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(fn, (lg, em))


def test_elm_memory_gradcheck():
    """Through the anchors only: the stored positives are constants."""
    loss = built_elm(lam=1.0, alpha="count", alpha_power=0.5, positives="memory", memory_size=4)
    for seed in range(3):
        logits, z, labels = random_batch(seed, c=7, d=3, offset=0.5)
        loss(make_batch(logits, z, labels, torch.float64))
    loss.eval()  # no writes, so every gradcheck evaluation sees the same memory
    logits, z, labels = random_batch(9, b=6, c=7, d=3, offset=0.5)
    lab = torch.tensor(labels)

    def fn(lg, em):
        return loss(full_batch(labels=lab, logits=lg, embeddings=em))

    lg = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    em = torch.tensor(z, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(fn, (lg, em))


def test_elm_gradient_is_finite_for_coincident_embeddings():
    """Two identical same-class embeddings (distance 0, where the clamp sits) and a class
    without partner give finite gradients."""
    z = torch.tensor([[1.0, 2.0], [1.0, 2.0], [0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    logits = torch.zeros(3, 7, dtype=torch.float64, requires_grad=True)
    loss = built_elm(lam=1.0)
    loss(full_batch(labels=torch.tensor([1, 1, 2]), logits=logits, embeddings=z)).backward()
    assert torch.isfinite(z.grad).all() and torch.isfinite(logits.grad).all()


# ---------------------------------------------------------------- ELM: memory


def memory_run(dtype, steps=5, size=3, seed=0, lam=0.5, device="cpu"):
    loss = built_elm(
        device, lam=lam, alpha="count", alpha_power=0.5, positives="memory", memory_size=size
    )
    ref = NpMemory(len(COUNTS), size)
    alpha = np_alpha(COUNTS, "count", 0.5, 1.0)
    got, expected = [], []
    for step in range(steps):
        logits, z, labels = random_batch(seed * 100 + step, b=10, d=4)
        got.append(loss(make_batch(logits, z, labels, dtype, device)).item())
        expected.append(
            np_elm_memory_step(
                ref, rounded(logits, dtype), rounded(z, dtype), labels, COUNTS, alpha, 1.0, lam
            )
        )
    return loss, ref, got, expected


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_elm_memory_matches_numpy(seed, dtype, device):
    """Each step's loss uses the last memory_size embeddings of the anchor's class written by
    earlier steps; afterwards the ring buffer holds exactly those, slot k mod M."""
    loss, ref, got, expected = memory_run(dtype, seed=seed, device=device)
    np.testing.assert_allclose(got, expected, **tol(dtype))
    assert got[0] == pytest.approx(np_la_ce(*_first_step(seed, dtype), COUNTS, 1.0), rel=1e-5)
    np.testing.assert_allclose(loss.memory.double().cpu().numpy(), ref.table(4), **tol(dtype))
    written = [len(rows) for rows in ref.written]
    assert loss.memory_written.tolist() == written
    assert loss.memory.dtype == dtype


def _first_step(seed, dtype):
    logits, _, labels = random_batch(seed * 100, b=10, d=4)
    return rounded(logits, dtype), labels


def test_memory_keeps_only_the_last_rows_of_a_crowded_class():
    """More rows of one class in a batch than memory slots: the last M rows survive, in order."""
    loss = built_elm(positives="memory", memory_size=3)
    z = torch.arange(14, dtype=torch.float64).reshape(7, 2)
    labels = torch.tensor([2, 2, 0, 2, 2, 2, 0])
    loss(full_batch(labels=labels, logits=torch.zeros(7, 7, dtype=torch.float64), embeddings=z))
    # Class 2 rows 0, 1, 3, 4, 5 are writes 0..4: writes 2, 3, 4 (rows 3, 4, 5) sit in slots
    # 2, 0, 1.
    assert loss.memory[2].tolist() == [z[4].tolist(), z[5].tolist(), z[3].tolist()]
    assert loss.memory[0, :2].tolist() == [z[2].tolist(), z[6].tolist()]
    assert loss.memory_written.tolist() == [2, 0, 5, 0, 0, 0, 0]


def test_memory_carries_no_gradient_and_eval_does_not_write():
    loss = built_elm(lam=1.0, positives="memory", memory_size=4)
    logits, z, labels = random_batch(1)
    batch = make_batch(logits, z, labels, torch.float64, grad=True)
    loss(batch).backward()
    assert not loss.memory.requires_grad and loss.memory.grad_fn is None
    assert loss.memory.abs().sum() > 0
    # The second step's gradient reaches only this step's embeddings.
    logits2, z2, labels2 = random_batch(2)
    batch2 = make_batch(logits2, z2, labels2, torch.float64, grad=True)
    grad_before = batch.embeddings.grad.clone()
    loss(batch2).backward()
    assert torch.equal(batch.embeddings.grad, grad_before)
    assert batch2.embeddings.grad.abs().sum() > 0
    snapshot = loss.memory.clone(), loss.memory_written.clone()
    loss.eval()
    loss(make_batch(*random_batch(3), torch.float64))
    assert torch.equal(loss.memory, snapshot[0]) and torch.equal(loss.memory_written, snapshot[1])


def test_memory_first_step_has_no_positives():
    loss = built_elm(lam=1.0, positives="memory")
    logits, z, labels = random_batch(0)
    got = loss(make_batch(logits, z, labels, torch.float64)).item()
    assert got == pytest.approx(np_la_ce(logits, labels, COUNTS, 1.0), rel=1e-12)


@pytest.mark.parametrize("steps_before_save", [0, 3])
def test_elm_memory_state_dict_round_trip(steps_before_save):
    """A fresh loss, set up as the core does (setup, then load_state_dict), continues exactly;
    a checkpoint taken before any step (memory still without its d) loads too."""
    loss = built_elm(lam=0.5, alpha="count", alpha_power=0.5, positives="memory", memory_size=3)
    for step in range(steps_before_save):
        loss(make_batch(*random_batch(step), torch.float64))
    state = {k: v.clone() for k, v in loss.state_dict().items()}
    assert set(state) == {"memory", "memory_written"}
    fresh = built_elm(lam=0.5, alpha="count", alpha_power=0.5, positives="memory", memory_size=3)
    fresh.load_state_dict(state)
    for step in range(10, 13):
        batch = random_batch(step)
        a = loss(make_batch(*batch, torch.float64)).item()
        b = fresh(make_batch(*batch, torch.float64)).item()
        assert a == b
    assert torch.equal(loss.memory, fresh.memory)
    assert torch.equal(loss.memory_written, fresh.memory_written)


def test_elm_batch_mode_has_no_state():
    loss = built_elm()
    assert dict(loss.state_dict()) == {}
    assert list(loss.parameters()) == []


def test_memory_rejects_a_different_embedding_dimension():
    loss = built_elm(positives="memory")
    loss(make_batch(*random_batch(0, d=5), torch.float64))
    with pytest.raises(ValueError, match="dimension 5"):
        loss(make_batch(*random_batch(1, d=4), torch.float64))


# ---------------------------------------------------------------- DRO-LT: dro_loss


@pytest.mark.parametrize("dtype", DTYPES)
def test_dro_loss_cross_check_vector(dtype):
    """§12: μ0 = (0,0), μ1 = (1,0); z = [(0.1,0), (0.9,0), (1.2,0)], labels [0,1,1]; ε = 1, T = 1."""
    z = torch.tensor([[0.1, 0.0], [0.9, 0.0], [1.2, 0.0]], dtype=dtype)
    protos = torch.tensor([[0.0, 0.0], [1.0, 0.0]], dtype=dtype)
    total, per_class = dro_loss(
        z, torch.tensor([0, 1, 1]), protos, torch.tensor([0, 1]), torch.ones(2), 1.0, per_class=True
    )
    np.testing.assert_allclose(per_class.double().numpy(), [1.139831, 1.189831], atol=1e-6)
    assert total.item() == pytest.approx(1.164831, abs=1e-6)
    # The numpy reference agrees on the same vector.
    ref = np_dro(z.double().numpy(), [0, 1, 1], protos.double().numpy(), [0, 1], [1.0, 1.0], 1.0)
    assert ref == pytest.approx(1.164831, abs=1e-6)
    # ε as one number for every class.
    scalar = dro_loss(z, torch.tensor([0, 1, 1]), protos, torch.tensor([0, 1]), 1.0, 1.0)
    assert scalar.item() == pytest.approx(total.item(), rel=1e-6)


def random_dro(seed, b=10, d=4, c=6, offset=2.0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 4, size=b)
    labels[-1] = 4
    z = rng.normal(size=(b, d)) + offset
    protos = rng.normal(size=(c, d)) * 0.5 + offset
    eps = rng.uniform(-0.5, 2.0, size=c)
    return z, labels, protos, eps


@pytest.mark.parametrize("temperature", [1.0, 0.07, 3.0])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_dro_loss_matches_numpy(seed, dtype, temperature):
    z, labels, protos, eps = random_dro(seed)
    present = np.unique(labels)
    got, per_class = dro_loss(
        torch.tensor(z, dtype=dtype),
        torch.tensor(labels),
        torch.tensor(protos[present], dtype=dtype),
        torch.tensor(present),
        torch.tensor(eps, dtype=dtype),
        temperature,
        per_class=True,
    )
    ref, ref_per_class = np_dro(
        rounded(z, dtype),
        labels,
        rounded(protos[present], dtype),
        present,
        rounded(eps, dtype),
        temperature,
        per_class=True,
    )
    t = tol(dtype)
    if dtype == torch.float32 and temperature < 1:
        t = {"rtol": 1e-3, "atol": 1e-4}  # scores of magnitude d/T amplify float32 rounding
    assert got.item() == pytest.approx(ref, rel=t["rtol"], abs=t["atol"])
    np.testing.assert_allclose(per_class.double().numpy(), ref_per_class, **t)


def test_dro_loss_ignores_prototypes_of_absent_classes():
    """A prototype whose class is not in the batch neither changes the value nor the count of
    classes in the mean (each prototype's softmax is over the batch samples on its own)."""
    z, labels, protos, eps = random_dro(0)
    args = (torch.tensor(eps), 1.0)
    present = np.unique(labels)
    only = dro_loss(
        torch.tensor(z),
        torch.tensor(labels),
        torch.tensor(protos[present]),
        torch.tensor(present),
        *args,
    )
    everything = dro_loss(
        torch.tensor(z), torch.tensor(labels), torch.tensor(protos), torch.arange(6), *args
    )
    assert everything.item() == pytest.approx(only.item(), rel=1e-12)


def test_dro_loss_is_stable_where_the_reference_overflows():
    """Distances of 10 and more at T = 0.01: exp(−1000) underflows to 0 in an unstabilised
    normaliser (log 0 = −inf); the max-subtracted form stays finite and matches the stable
    reference."""
    z = torch.tensor([[0.0, 0.0], [50.0, 0.0], [0.0, 60.0]], dtype=torch.float64)
    protos = torch.tensor([[50.0, 10.0], [10.0, 60.0]], dtype=torch.float64)
    labels, proto_labels = torch.tensor([0, 0, 1]), torch.tensor([0, 1])
    got = dro_loss(z, labels, protos, proto_labels, torch.ones(2), 0.01)
    naive = torch.log(torch.exp(-torch.cdist(protos, z) / 0.01).sum(1))
    assert torch.isinf(naive).any()
    ref = np_dro(z.numpy(), [0, 0, 1], protos.numpy(), [0, 1], [1.0, 1.0], 0.01)
    assert torch.isfinite(got) and got.item() == pytest.approx(ref, rel=1e-12)


def test_dro_loss_gradcheck():
    z, labels, protos, eps = random_dro(1, b=7, d=3)
    present = np.unique(labels)
    lab, pl = torch.tensor(labels), torch.tensor(present)

    def fn(zt, et, pt):
        return dro_loss(zt, lab, pt, pl, et, 0.5)

    zt = torch.tensor(z, requires_grad=True)
    et = torch.tensor(eps, requires_grad=True)
    pt = torch.tensor(protos[present], requires_grad=True)
    assert torch.autograd.gradcheck(fn, (zt, et, pt))


def test_dro_loss_gradient_is_finite_when_a_feature_is_its_prototype():
    z = torch.tensor([[1.0, 2.0], [3.0, 0.0]], dtype=torch.float64, requires_grad=True)
    loss = dro_loss(z, torch.tensor([0, 1]), z.detach().clone(), torch.tensor([0, 1]), 1.0, 1.0)
    loss.backward()
    assert torch.isfinite(z.grad).all()


# ---------------------------------------------------------------- DRO-LT: the loss


class NpDROLT:
    """One-stage CE + DRO-LT with EMA prototypes, as plain loops."""

    def __init__(self, counts, lam, temperature, eps, momentum, weighting):
        self.counts, self.lam, self.t, self.eps, self.m = counts, lam, temperature, eps, momentum
        self.weights = counts / counts.max() if weighting == "head-up" else None
        self.protos: dict[int, np.ndarray] = {}

    def step(self, logits, z, labels) -> float:
        classes = sorted({int(y) for y in labels})
        means = {
            c: np.mean([z[i] for i in range(len(z)) if labels[i] == c], axis=0) for c in classes
        }
        current = [self.protos.get(c, means[c]) for c in classes]
        value = np_ce(logits, labels, self.weights) + self.lam * np_dro(
            z, labels, current, classes, self.eps, self.t
        )
        for c in classes:
            old = self.protos.get(c)
            self.protos[c] = means[c] if old is None else self.m * old + (1 - self.m) * means[c]
        return value


DROLT_VARIANTS = [
    {},
    {"lam": 0.5, "temperature": 0.5, "prototype_momentum": 0.5, "ce_weighting": "head-up"},
    {"lam": 2.0, "temperature": 2.0, "prototype_momentum": 0.0, "epsilon_init": 0.3},
    {"prototype_momentum": 1.0, "learn_epsilon": False},
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("options", DROLT_VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_drolt_matches_numpy_over_steps(seed, dtype, options, device):
    """Loss values over several steps and the EMA prototypes and seen mask afterwards."""
    full = {"lam": 1.0, "temperature": 1.0, "epsilon_init": 1.0, "prototype_momentum": 0.9}
    full.update(options)
    loss = built_drolt(device, **options)
    ref = NpDROLT(
        COUNTS,
        full["lam"],
        full["temperature"],
        # ε is a float32 parameter, like the encoder's weights.
        [float(np.float32(full["epsilon_init"]))] * len(COUNTS),
        full["prototype_momentum"],
        options.get("ce_weighting", "none"),
    )
    for step in range(4):
        logits, z, labels = random_batch(seed * 10 + step, b=9, d=4)
        got = loss(make_batch(logits, z, labels, dtype, device)).item()
        expected = ref.step(rounded(logits, dtype), rounded(z, dtype), labels)
        assert got == pytest.approx(expected, rel=tol(dtype)["rtol"], abs=tol(dtype)["atol"])
    seen = sorted(ref.protos)
    assert loss.seen.nonzero().flatten().tolist() == seen
    np.testing.assert_allclose(
        loss.prototypes[seen].double().cpu().numpy(), [ref.protos[c] for c in seen], **tol(dtype)
    )
    assert (loss.prototypes[~loss.seen] == 0).all()


def test_drolt_ema_update_formula():
    """First sight takes the batch mean; then μ ← m·μ + (1 − m)·batch mean, per class."""
    loss = built_drolt(prototype_momentum=0.75)
    z1 = torch.tensor([[1.0, 0.0], [3.0, 2.0], [5.0, 5.0]], dtype=torch.float64)
    y1 = torch.tensor([0, 0, 2])
    loss(full_batch(labels=y1, logits=torch.zeros(3, 7, dtype=torch.float64), embeddings=z1))
    assert loss.prototypes[0].tolist() == [2.0, 1.0]
    assert loss.prototypes[2].tolist() == [5.0, 5.0]
    z2 = torch.tensor([[6.0, 4.0], [1.0, 1.0]], dtype=torch.float64)
    y2 = torch.tensor([0, 1])
    loss(full_batch(labels=y2, logits=torch.zeros(2, 7, dtype=torch.float64), embeddings=z2))
    assert loss.prototypes[0].tolist() == [0.75 * 2.0 + 0.25 * 6.0, 0.75 * 1.0 + 0.25 * 4.0]
    assert loss.prototypes[1].tolist() == [1.0, 1.0]
    assert loss.prototypes[2].tolist() == [5.0, 5.0]  # absent from the batch: unchanged
    assert loss.seen.tolist() == [True, True, True, False, False, False, False]


def test_drolt_unseen_class_uses_its_batch_mean_this_step():
    """The DRO term of a step with a never-seen class equals dro_loss with that class's batch
    mean as its prototype, and the stored prototype of a seen class for the others."""
    loss = built_drolt(lam=1.0, prototype_momentum=0.5)
    logits, z, labels = random_batch(0, b=8, d=3)
    labels = np.array([0, 0, 1, 1, 0, 1, 1, 0])
    loss(make_batch(logits, z, labels, torch.float64))
    stored = loss.prototypes.clone()
    logits2, z2, _ = random_batch(1, b=8, d=3)
    labels2 = np.array([0, 3, 3, 1, 0, 3, 1, 1])
    got = loss(make_batch(logits2, z2, labels2, torch.float64)).item()
    protos = np.stack([stored[0].numpy(), stored[1].numpy(), z2[labels2 == 3].mean(axis=0)])
    expected = np_ce(logits2, labels2) + np_dro(z2, labels2, protos, [0, 1, 3], [1.0] * 7, 1.0)
    assert got == pytest.approx(expected, rel=1e-12)


def test_drolt_epsilon_is_a_trained_parameter():
    loss = built_drolt(epsilon_init=0.5)
    assert isinstance(loss.epsilon, torch.nn.Parameter)
    assert loss.epsilon.shape == (len(COUNTS),) and (loss.epsilon == 0.5).all()
    assert [p for p in loss.parameters() if p.requires_grad] == [loss.epsilon]
    logits, z, labels = random_batch(2)
    loss(make_batch(logits, z, labels, torch.float32, grad=True)).backward()
    grad = loss.epsilon.grad
    assert grad is not None and torch.isfinite(grad).all()
    present = np.unique(labels)
    assert (grad[present] != 0).all()
    absent = np.setdiff1d(np.arange(len(COUNTS)), present)
    assert (grad[absent] == 0).all()
    # A larger radius makes positives look farther, so the loss grows with ε: positive gradient.
    assert (grad[present] > 0).all()

    frozen = built_drolt(learn_epsilon=False)
    assert [p for p in frozen.parameters() if p.requires_grad] == []
    assert "epsilon" in frozen.state_dict()


def test_drolt_gradcheck_through_embeddings_logits_and_epsilon():
    """Every class has a stored prototype first: a never-seen class's prototype is its batch
    mean, deliberately detached, which finite differences would see but autograd must not."""
    loss = built_drolt(lam=1.0, temperature=0.5, ce_weighting="head-up")
    warm_logits, warm_z, _ = random_batch(0, b=14, d=3, offset=0.5)
    loss(make_batch(warm_logits, warm_z, np.arange(14) % 7, torch.float64))
    loss.eval()  # prototypes fixed across the gradcheck evaluations
    logits, z, labels = random_batch(1, b=7, d=3, offset=0.5)
    lab = torch.tensor(labels)

    def fn(lg, em, eps):
        batch = full_batch(labels=lab, logits=lg, embeddings=em)
        return torch.func.functional_call(loss, {"epsilon": eps}, (batch,))

    lg = torch.tensor(logits, dtype=torch.float64, requires_grad=True)
    em = torch.tensor(z, dtype=torch.float64, requires_grad=True)
    eps = torch.rand(len(COUNTS), dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(fn, (lg, em, eps))


@pytest.mark.parametrize("steps_before_save", [0, 3])
def test_drolt_state_dict_round_trip(steps_before_save):
    options = {"lam": 1.0, "prototype_momentum": 0.6}
    loss = built_drolt(**options)
    for step in range(steps_before_save):
        loss(make_batch(*random_batch(step, d=4), torch.float64))
    with torch.no_grad():
        loss.epsilon.add_(torch.linspace(-0.2, 0.3, len(COUNTS)))  # as if trained
    state = {k: v.clone() for k, v in loss.state_dict().items()}
    assert set(state) == {"epsilon", "prototypes", "seen"}
    fresh = built_drolt(**options)
    fresh.load_state_dict(state)
    for step in range(10, 13):
        batch = random_batch(step, d=4)
        assert (
            loss(make_batch(*batch, torch.float64)).item()
            == fresh(make_batch(*batch, torch.float64)).item()
        )
    for name in ("epsilon", "prototypes", "seen"):
        assert torch.equal(getattr(loss, name), getattr(fresh, name))


# ---------------------------------------------------------------- errors, options, contract


@pytest.mark.parametrize(("factory", "name"), [(ELM, "elm"), (DROLT, "dro-lt")])
def test_missing_setup_is_a_clear_error(factory, name):
    logits, z, labels = random_batch(0)
    batch = make_batch(logits, z, labels, torch.float32)
    with pytest.raises(RuntimeError, match=r"setup\(class_counts\)"):
        factory()(batch)


@pytest.mark.parametrize(
    ("factory", "options", "bad"),
    [
        (ELM, {"lam": -0.1}, "lam"),
        (ELM, {"tau": -1.0}, "tau"),
        (ELM, {"alpha": "sqrt"}, "alpha"),
        (ELM, {"alpha_power": -0.5}, "alpha_power"),
        (ELM, {"alpha_scale": float("nan")}, "alpha_scale"),
        (ELM, {"positives": "queue"}, "positives"),
        (ELM, {"memory_size": 0}, "memory_size"),
        (ELM, {"memory_size": 2.5}, "memory_size"),
        (DROLT, {"lam": -1.0}, "lam"),
        (DROLT, {"temperature": 0.0}, "temperature"),
        (DROLT, {"epsilon_init": float("nan")}, "epsilon_init"),
        (DROLT, {"learn_epsilon": "yes"}, "learn_epsilon"),
        (DROLT, {"prototype_momentum": 1.5}, "prototype_momentum"),
        (DROLT, {"ce_weighting": "cb"}, "ce_weighting"),
    ],
)
def test_bad_options_are_rejected(factory, options, bad):
    with pytest.raises(InvalidParameterError, match=rf"loss\.{bad}:"):
        validate_options("loss", factory, options)


def test_options_contract():
    check_options(ELM)
    check_options(DROLT)


@pytest.mark.parametrize(
    ("factory", "options"),
    [
        (ELM, {}),
        (ELM, {"lam": 1.0, "alpha": "prior", "alpha_power": 0.5, "alpha_scale": 10.0}),
        (ELM, {"lam": 1.0, "positives": "memory", "memory_size": 2}),
        (DROLT, {}),
        (DROLT, {"temperature": 0.07, "ce_weighting": "head-up"}),
        (DROLT, {"learn_epsilon": False}),
    ],
)
def test_loss_contract(factory, options):
    """check_loss calls setup(class_counts) first, as the core does, then runs float32 and
    float64 batches with embeddings through the same loss."""
    check_loss(factory, **options)


@pytest.mark.parametrize("factory", [ELM, DROLT])
def test_prediction_uses_raw_logits(factory):
    loss = factory()
    loss.setup(counts_tensor())
    assert not loss.adjusts_scores
    top, log_z = torch.tensor([1.0, -0.5]), torch.tensor([1.5, 2.0])
    assert torch.equal(loss.confidence(top, log_z), torch.exp(top - log_z))
    assert "lam=" in repr(loss)


@pytest.mark.parametrize(
    ("factory", "options", "lazy"),
    [(ELM, {"positives": "memory"}, "memory"), (DROLT, {}, "prototypes")],
)
def test_lazy_buffers_load_inside_a_parent_module(factory, options, lazy):
    """The buffer whose d is learnt at the first forward grows on load under a key prefix too
    (a loss held by a parent module), and takes the checkpoint's dtype."""
    loss = factory(**options)
    loss.setup(counts_tensor())
    loss(make_batch(*random_batch(0, d=6), torch.float64))
    state = torch.nn.ModuleDict({"loss": loss}).state_dict()
    fresh = factory(**options)
    fresh.setup(counts_tensor())
    assert getattr(fresh, lazy).shape[-1] == 0
    torch.nn.ModuleDict({"loss": fresh}).load_state_dict(state)
    assert getattr(fresh, lazy).shape[-1] == 6 and getattr(fresh, lazy).dtype == torch.float64
    assert torch.equal(getattr(fresh, lazy), getattr(loss, lazy))
