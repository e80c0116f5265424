"""Tests for Su Jianlin's multilabel categorical CE (ZLPR) and the n-way m-class loss l₁.

Every form is checked against an independent float64 numpy implementation written as plain loops
from the formulas in algorithms.md §10, against the cross-check vectors of §12, and with
torch.autograd.gradcheck.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tailkit.errors import InvalidParameterError
from tailkit.plugins.losses.multilabel import MultilabelCE, NWayMClass
from tailkit.registry import batch_modes
from tailkit.testing import check_loss, check_options
from tailkit.testing.batches import full_batch
from tailkit.validation import validate_options

DTYPES = [torch.float32, torch.float64]
SHAPES = [(1, 2), (5, 4), (9, 7)]  # (B, C)
SEEDS = [0, 1, 2]
NEG_INF = float("-inf")


def tolerances(dtype: torch.dtype) -> dict[str, float]:
    return (
        {"rtol": 1e-10, "atol": 1e-12} if dtype == torch.float64 else {"rtol": 2e-5, "atol": 2e-5}
    )


# ---------------------------------------------------------------- numpy references (float64)


def np_zlpr_soft(scores: np.ndarray, targets: np.ndarray, *, threshold: bool) -> list[float]:
    """Per-row log(1 + Σ t e^{−s}) + log(1 + Σ (1 − t) e^{s}), or log(1 + product) without the
    threshold class; a score of −inf is skipped."""
    per = []
    for row, t_row in zip(scores, targets, strict=True):
        pos = neg = 0.0
        for s, t in zip(row, t_row, strict=True):
            if s == NEG_INF:
                continue
            pos += t * math.exp(-s)
            neg += (1.0 - t) * math.exp(s)
        per.append(math.log1p(neg) + math.log1p(pos) if threshold else math.log1p(neg * pos))
    return per


def np_zlpr_sets(scores: np.ndarray, positives: list[set[int]], *, threshold: bool) -> list[float]:
    """Per-row ZLPR from sets of positive ids; without the threshold, the double sum over
    (negative, positive) pairs of e^{s_i − s_j} as written in §10.1."""
    per = []
    for row, pos_ids in zip(scores, positives, strict=True):
        pos_ids = {j for j in pos_ids if row[j] != NEG_INF}
        neg_ids = [i for i in range(len(row)) if i not in pos_ids and row[i] != NEG_INF]
        if threshold:
            neg = sum(math.exp(row[i]) for i in neg_ids)
            pos = sum(math.exp(-row[j]) for j in pos_ids)
            per.append(math.log1p(neg) + math.log1p(pos))
        else:
            pairs = 0.0
            for i in neg_ids:
                for j in pos_ids:
                    pairs += math.exp(row[i] - row[j])
            per.append(math.log1p(pairs))
    return per


def np_nway(scores: np.ndarray, targets: np.ndarray) -> float:
    """l₁ = Σ_j log(1 + Σ_i Σ_{k≠j} t_ij e^{s_ik − s_ij})."""
    b, c = scores.shape
    total = 0.0
    for j in range(c):
        inner = 0.0
        for i in range(b):
            for k in range(c):
                if k != j:
                    inner += targets[i, j] * math.exp(scores[i, k] - scores[i, j])
        total += math.log1p(inner)
    return total


def reduce(per: list[float], reduction: str) -> float:
    return float(np.sum(per) if reduction == "sum" else np.mean(per))


# ---------------------------------------------------------------- random inputs


def random_scores(seed: int, b: int, c: int) -> np.ndarray:
    return np.random.default_rng(seed).normal(scale=2.0, size=(b, c))


def random_soft(seed: int, b: int, c: int) -> np.ndarray:
    """Soft targets in [0, 1] with some entries exactly 0 and exactly 1."""
    rng = np.random.default_rng(seed + 100)
    t = rng.uniform(size=(b, c))
    u = rng.uniform(size=(b, c))
    t[u < 0.2] = 0.0
    t[u > 0.8] = 1.0
    return t


def random_hard(seed: int, b: int, c: int) -> np.ndarray:
    return (np.random.default_rng(seed + 200).uniform(size=(b, c)) < 0.4).astype(np.float64)


def random_lists(seed: int, b: int, c: int) -> tuple[np.ndarray, list[set[int]]]:
    """(B, k) positive ids with −1 padding at random positions; row 0 has no positive and no
    row has every label positive (that case is tested on its own)."""
    rng = np.random.default_rng(seed + 300)
    sets = [set()] + [
        set(rng.choice(c, size=rng.integers(1, c), replace=False).tolist()) for _ in range(b - 1)
    ]
    width = max(1, *(len(p) for p in sets)) + 1
    ids = np.full((b, width), -1, dtype=np.int64)
    for i, pos in enumerate(sets):
        ids[i, : len(pos)] = sorted(pos)
        rng.shuffle(ids[i])
    return ids, sets


def apply(
    loss: torch.nn.Module,
    logits: torch.Tensor,
    labels: torch.Tensor | None = None,
    targets: torch.Tensor | None = None,
) -> torch.Tensor:
    """The loss on dense ``targets`` (its ``soft`` form) when given, else on label ids as the
    core hands them (a FullBatch; one label 0 per row when none are given)."""
    if targets is not None:
        return loss.soft(logits, targets)
    if labels is None:
        labels = torch.zeros(logits.shape[0], dtype=torch.int64)
    return loss(full_batch(labels=labels, logits=logits))


def value(loss: torch.nn.Module, logits, labels=None, targets=None) -> float:
    return apply(loss, logits, labels, targets).item()


# ---------------------------------------------------------------- multilabel CE vs references


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("threshold", [True, False])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_dense_targets_match_reference(dtype, seed, shape, threshold, reduction) -> None:
    s = random_scores(seed, *shape)
    loss = MultilabelCE(threshold=threshold, reduction=reduction)
    for t in (random_hard(seed, *shape), random_soft(seed, *shape)):
        got = value(loss, torch.tensor(s, dtype=dtype), targets=torch.tensor(t, dtype=dtype))
        want = reduce(np_zlpr_soft(s, t, threshold=threshold), reduction)
        np.testing.assert_allclose(got, want, **tolerances(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("threshold", [True, False])
def test_hard_targets_match_pairwise_double_sum(dtype, seed, shape, threshold) -> None:
    s, t = random_scores(seed, *shape), random_hard(seed, *shape)
    sets = [{j for j in range(shape[1]) if t[i, j] == 1} for i in range(shape[0])]
    got = value(
        MultilabelCE(threshold=threshold), torch.tensor(s, dtype=dtype), targets=torch.tensor(t)
    )
    np.testing.assert_allclose(got, np.mean(np_zlpr_sets(s, sets, threshold=threshold)), rtol=2e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("threshold", [True, False])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_sparse_lists_match_reference(dtype, seed, shape, threshold, reduction) -> None:
    s = random_scores(seed, *shape)
    ids, sets = random_lists(seed, *shape)
    loss = MultilabelCE(threshold=threshold, reduction=reduction)
    got = value(loss, torch.tensor(s, dtype=dtype), labels=torch.tensor(ids))
    want = reduce(np_zlpr_sets(s, sets, threshold=threshold), reduction)
    np.testing.assert_allclose(got, want, **tolerances(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("threshold", [True, False])
def test_single_labels_match_reference(dtype, seed, threshold) -> None:
    b, c = 8, 6
    s = random_scores(seed, b, c)
    y = np.random.default_rng(seed).integers(c, size=b)
    loss = MultilabelCE(threshold=threshold, reduction="sum")
    got = value(loss, torch.tensor(s, dtype=dtype), labels=torch.tensor(y))
    want = reduce(np_zlpr_sets(s, [{int(v)} for v in y], threshold=threshold), "sum")
    np.testing.assert_allclose(got, want, **tolerances(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
def test_pairwise_single_label_is_softmax_ce(dtype, seed) -> None:
    b, c = 10, 7
    gen = torch.Generator().manual_seed(seed)
    logits = 3.0 * torch.randn(b, c, generator=gen, dtype=dtype)
    y = torch.randint(c, (b,), generator=gen)
    want = F.cross_entropy(logits, y)
    loss = MultilabelCE(threshold=False)
    tol = tolerances(dtype)
    # (B,) ids, (B, 1) ids through the sparse mass subtraction, and one-hot dense targets.
    for got in (
        apply(loss, logits, labels=y),
        apply(loss, logits, labels=torch.stack([y, torch.full_like(y, -1)], dim=1)),
        apply(loss, logits, targets=F.one_hot(y, c).to(dtype)),
    ):
        torch.testing.assert_close(got, want, **tol)
    # And the gradients agree, not only the values.
    a = logits.clone().requires_grad_(True)
    b_ = logits.clone().requires_grad_(True)
    apply(loss, a, labels=y).backward()
    F.cross_entropy(b_, y).backward()
    torch.testing.assert_close(a.grad, b_.grad, **tol)


def test_threshold_true_differs_from_softmax_ce() -> None:
    """Guard against the threshold option being ignored: with s₀ the value changes."""
    logits = torch.tensor([[2.0, -1.0, 0.5]], dtype=torch.float64)
    y = torch.tensor([0])
    with_threshold = value(MultilabelCE(threshold=True), logits, labels=y)
    assert with_threshold == pytest.approx(
        math.log1p(math.exp(-1) + math.exp(0.5)) + math.log1p(math.exp(-2.0))
    )
    assert with_threshold != pytest.approx(float(F.cross_entropy(logits, y)))


# ---------------------------------------------------------------- §12 cross-check vectors


def test_section12_hard_labels() -> None:
    s = torch.tensor([[0.0, 1, 1, 0], [1, 0, 0, 1]], dtype=torch.float64)
    t = torch.tensor([[1.0, 1, 1, 1], [0, 0, 0, 1]], dtype=torch.float64)
    ids = torch.tensor([[0, 1, 2, 3], [-1, 3, -1, -1]])
    want_rows = [1.317951, 2.056930]
    for b, row in enumerate(want_rows):
        one = value(MultilabelCE(), s[b : b + 1], targets=t[b : b + 1])
        assert one == pytest.approx(row, abs=1e-6)
    assert value(MultilabelCE(), s, targets=t) == pytest.approx(1.687441, abs=1e-6)
    assert value(MultilabelCE(), s, labels=ids) == pytest.approx(1.687441, abs=1e-6)
    assert value(MultilabelCE(reduction="sum"), s, targets=t) == pytest.approx(
        sum(want_rows), abs=2e-6
    )


def test_section12_sparse_vs_dense() -> None:
    s = torch.tensor([[0.3, -1.2, 2.0, 0.7, -0.4]], dtype=torch.float64)
    dense = value(MultilabelCE(), s, targets=torch.tensor([[0.0, 0, 1, 0, 1]]))
    sparse = value(MultilabelCE(), s, labels=torch.tensor([[2, 4]]))
    padded = value(MultilabelCE(), s, labels=torch.tensor([[-1, 4, -1, 2]]))
    assert dense == pytest.approx(2.505950, abs=1e-6)
    assert abs(sparse - dense) < 1e-12
    assert abs(padded - dense) < 1e-12


@pytest.mark.parametrize("seed", SEEDS)
def test_sparse_and_dense_agree_in_float64(seed) -> None:
    b, c = 9, 7
    s = torch.tensor(random_scores(seed, b, c))
    ids, sets = random_lists(seed, b, c)
    t = torch.zeros(b, c, dtype=torch.float64)
    for i, pos in enumerate(sets):
        t[i, sorted(pos)] = 1.0
    for threshold in (True, False):
        loss = MultilabelCE(threshold=threshold)
        dense = value(loss, s, targets=t)
        assert abs(value(loss, s, labels=torch.tensor(ids)) - dense) < 1e-12


def test_all_positive_row_sparse_matches_dense() -> None:
    s = torch.tensor([[0.4, -1.0, 1.5, 0.2]], dtype=torch.float64)
    ids = torch.tensor([[3, 0, 2, 1]])
    dense = value(MultilabelCE(), s, targets=torch.ones(1, 4))
    assert dense == pytest.approx(np_zlpr_sets(s.numpy(), [{0, 1, 2, 3}], threshold=True)[0])
    assert abs(value(MultilabelCE(), s, labels=ids) - dense) < 1e-12


def test_section12_soft_label_optimum() -> None:
    t = torch.tensor([[0.2, 0.9, 0.5]], dtype=torch.float64)
    s_opt = 0.5 * torch.logit(t)
    torch.testing.assert_close(
        s_opt, torch.tensor([[-0.693147, 1.098612, 0.0]], dtype=torch.float64), atol=1e-6, rtol=0
    )
    s = s_opt.clone().requires_grad_(True)
    loss = apply(MultilabelCE(), s, targets=t)
    assert loss.item() == pytest.approx(1.576915, abs=1e-6)
    loss.backward()
    assert float(s.grad.abs().max()) < 1e-12
    # A step away in any coordinate raises the loss (the optimum is a minimum, not a saddle).
    for j in range(3):
        moved = s_opt.clone()
        moved[0, j] += 1e-3
        assert value(MultilabelCE(), moved, targets=t) > loss.item()
    # The calibrated probability at the optimum gives the targets back.
    torch.testing.assert_close(MultilabelCE().confidence(s_opt[0], torch.zeros(3)), t[0])


# ---------------------------------------------------------------- gradients


def gradcheck(loss, logits: torch.Tensor, **kwargs) -> bool:
    return torch.autograd.gradcheck(lambda z: apply(loss, z, **kwargs), (logits,))


@pytest.mark.parametrize("threshold", [True, False])
def test_gradcheck_multilabel_ce(threshold) -> None:
    b, c = 5, 6
    z = torch.tensor(random_scores(3, b, c), requires_grad=True)
    ids, _ = random_lists(3, b, c)
    loss = MultilabelCE(threshold=threshold)
    assert gradcheck(loss, z, targets=torch.tensor(random_hard(3, b, c)))
    assert gradcheck(loss, z, targets=torch.tensor(random_soft(3, b, c)))
    assert gradcheck(loss, z, labels=torch.tensor(ids))
    assert gradcheck(loss, z, labels=torch.tensor([0, 5, 2, 2, 1]))


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_gradcheck_nway(reduction) -> None:
    b, c = 7, 4
    z = torch.tensor(random_scores(4, b, c), requires_grad=True)
    loss = NWayMClass(reduction=reduction)
    assert gradcheck(loss, z, labels=torch.tensor([0, 3, 3, 1, 0, 3, 1]))
    t = random_soft(4, b, c) + 0.05
    assert gradcheck(loss, z, targets=torch.tensor(t / t.sum(1, keepdims=True)))


# ---------------------------------------------------------------- saturation and masking


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("threshold", [True, False])
@pytest.mark.parametrize("labels", [[[1, -1], [0, 2]], [1, 0]])
def test_sparse_is_finite_when_positives_hold_all_mass(dtype, threshold, labels) -> None:
    """bert4keras #436: 1 − e^{LSE(s_P) − LSE([s, 0])} rounds to 0, and log 0 gave NaN."""
    labels = torch.tensor(labels)
    positive = torch.zeros(2, 4, dtype=torch.bool)
    positive.scatter_(1, labels.view(2, -1).clamp(min=0), labels.view(2, -1) >= 0)
    logits = torch.where(positive, 50.0, -50.0).to(dtype).requires_grad_(True)
    loss = apply(MultilabelCE(threshold=threshold), logits, labels=labels)
    loss.backward()
    assert torch.isfinite(loss)
    assert torch.isfinite(logits.grad).all()


def exact_zlpr(row: list[float], positives: set[int], *, threshold: bool) -> float:
    """§10.1 in exact rational-free float arithmetic: math.fsum of the exponentials and log1p,
    so nothing cancels (the negatives' sum never involves the positives)."""
    neg = math.fsum(math.exp(v) for i, v in enumerate(row) if i not in positives)
    pos = math.fsum(math.exp(-row[j]) for j in positives)
    return math.log1p(neg) + math.log1p(pos) if threshold else math.log1p(neg * pos)


@pytest.mark.parametrize("threshold", [True, False])
def test_label_lists_are_exact_for_scores_from_minus_50_to_50(threshold) -> None:
    """Issue 19 item 11: the label-list path once took the negatives' mass as the total minus
    the positives' and clamped the difference at ε = 1e-7, so a confidently right positive
    (score > 16) got a loss of up to 33.9 and a gradient of +1. Over a grid of scores it must
    match the dense-target path and the formula of algorithms.md §10.1, value and gradient."""
    grid = torch.linspace(-50.0, 50.0, 41, dtype=torch.float64)
    rows = []
    for pos_score in grid:  # one or two positives at pos_score, negatives spread over the grid
        rows.append([pos_score.item(), -50.0, -3.0, pos_score.item() - 60.0])
        rows.append([pos_score.item(), pos_score.item() / 2, -50.0, 10.0 - pos_score.item()])
    scores = torch.tensor(rows, dtype=torch.float64)
    ids = torch.tensor([[0, -1], [0, 1]] * len(grid))
    dense = torch.zeros_like(scores)
    dense[:, 0] = 1.0
    dense[1::2, 1] = 1.0
    loss = MultilabelCE(threshold=threshold, reduction="sum")
    lists = scores.clone().requires_grad_(True)
    targets = scores.clone().requires_grad_(True)
    per_list = [apply(loss, lists[i : i + 1], labels=ids[i : i + 1]) for i in range(len(rows))]
    per_dense = [
        apply(loss, targets[i : i + 1], targets=dense[i : i + 1]) for i in range(len(rows))
    ]
    torch.stack(per_list).sum().backward()
    torch.stack(per_dense).sum().backward()
    for i, row in enumerate(rows):
        expected = exact_zlpr(row, {0} if i % 2 == 0 else {0, 1}, threshold=threshold)
        assert per_list[i].item() == pytest.approx(expected, rel=1e-12, abs=1e-300), row
        assert per_dense[i].item() == pytest.approx(expected, rel=1e-12, abs=1e-300), row
    torch.testing.assert_close(lists.grad, targets.grad, rtol=1e-12, atol=1e-300)
    # The confident end: the clamped form gave 33.9 and a gradient of +1 on the positive;
    # what is left is the negatives' honest log(1 + e^{-3}) ≈ 0.049 and a positive's ≈ e^{-25}.
    confident = scores[:, 0] == 50.0
    assert max(p.item() for p, c in zip(per_list, confident, strict=True) if c) < 0.05
    assert lists.grad[confident, 0].abs().max().item() < 1e-10


def test_label_lists_agree_with_dense_targets_in_float32_when_confident() -> None:
    """The float32 case the clamp hit hardest: positives at +20, negatives at −20."""
    ids = torch.tensor([[1, 3, -1], [2, -1, -1]])
    dense = torch.zeros(2, 5)
    dense[0, [1, 3]] = 1.0
    dense[1, 2] = 1.0
    scores = torch.where(dense > 0, 20.0, -20.0)
    for threshold in (True, False):
        loss = MultilabelCE(threshold=threshold)
        lists = scores.clone().requires_grad_(True)
        apply(loss, lists, labels=ids).backward()
        value_dense = value(loss, scores, targets=dense)
        assert value(loss, scores, labels=ids) == pytest.approx(value_dense, rel=1e-5, abs=1e-12)
        assert value(loss, scores, labels=ids) < 1e-7
        assert lists.grad.abs().max().item() < 1e-7


@pytest.mark.parametrize("dtype", DTYPES)
def test_exact_zero_one_targets_equal_hard_form(dtype) -> None:
    b, c = 6, 5
    s = random_scores(7, b, c)
    t = random_hard(7, b, c)
    sets = [{j for j in range(c) if t[i, j]} for i in range(b)]
    for threshold in (True, False):
        got = value(
            MultilabelCE(threshold=threshold),
            torch.tensor(s, dtype=dtype),
            targets=torch.tensor(t, dtype=dtype),
        )
        want = np.mean(np_zlpr_sets(s, sets, threshold=threshold))
        np.testing.assert_allclose(got, want, **tolerances(dtype))


def test_zero_target_masks_exactly_rather_than_clipping() -> None:
    """§10.2: with log t clipped at log ε ≈ −16, a negative whose score is −1e7 would put
    −s + log t ≈ 1e7 into the positive sum; log 0 = −∞ keeps it out."""
    s = torch.tensor([[1.0, -1e7, -0.5]], dtype=torch.float64)
    t = torch.tensor([[1.0, 0.0, 0.3]], dtype=torch.float64)
    got = value(MultilabelCE(), s, targets=t)
    want = value(MultilabelCE(), s[:, [0, 2]], targets=t[:, [0, 2]])
    assert got == pytest.approx(want, abs=1e-12)
    # Likewise t = 1 keeps a score of +1e7 out of the negative sum.
    s2 = torch.tensor([[1e7, 0.2]], dtype=torch.float64)
    assert value(MultilabelCE(), s2, targets=torch.tensor([[1.0, 0.0]])) == pytest.approx(
        math.log1p(math.exp(0.2)), abs=1e-12
    )


@pytest.mark.parametrize("threshold", [True, False])
def test_minus_inf_scores_are_masked(threshold) -> None:
    s = torch.tensor([[0.3, NEG_INF, 2.0, -0.7], [NEG_INF, 1.0, -0.4, 0.5]], dtype=torch.float64)
    keep = [[0, 2, 3], [1, 2, 3]]
    # Positives on a masked score drop out too: row 0 lists id 1, row 1 has t = 1 at column 0.
    t = torch.tensor([[1.0, 1.0, 0.4, 0.0], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    ids = torch.tensor([[1, 2, -1], [0, 1, 3]])
    loss = MultilabelCE(threshold=threshold, reduction="sum")
    z = s.clone().requires_grad_(True)
    for kwargs in ({"targets": t}, {"labels": ids}):
        out = apply(loss, z, **kwargs)
        want = 0.0
        for i, cols in enumerate(keep):
            sub = {"targets": t[i : i + 1, cols]} if "targets" in kwargs else None
            if sub is None:
                remap = {c: n for n, c in enumerate(cols)}
                row = [remap[int(v)] for v in ids[i] if int(v) >= 0 and int(v) in remap]
                row += [-1] * (3 - len(row))
                sub = {"labels": torch.tensor([row])}
            want += float(apply(loss, s[i : i + 1, cols], **sub))
        assert out.item() == pytest.approx(want, abs=1e-12)
        (grad,) = torch.autograd.grad(out, z)
        assert torch.isfinite(grad).all()
        assert grad[0, 1] == 0 and grad[1, 0] == 0


def test_row_without_positives() -> None:
    s = torch.tensor([[0.5, -1.0, 2.0]], dtype=torch.float64, requires_grad=True)
    ids = torch.tensor([[-1, -1]])
    out = apply(MultilabelCE(), s, labels=ids)
    assert out.item() == pytest.approx(math.log1p(math.exp(0.5) + math.exp(-1) + math.exp(2)))
    assert apply(MultilabelCE(threshold=False), s, labels=ids).item() == 0.0
    out.backward()
    assert torch.isfinite(s.grad).all()


# ---------------------------------------------------------------- confidence and reduction


def test_confidence() -> None:
    top = torch.tensor([-2.0, 0.0, 0.7, 5.0])
    log_z = torch.tensor([1.0, 0.5, 2.0, 5.5])
    torch.testing.assert_close(MultilabelCE().confidence(top, log_z), torch.sigmoid(2 * top))
    torch.testing.assert_close(
        MultilabelCE(threshold=False).confidence(top, log_z), torch.exp(top - log_z)
    )
    torch.testing.assert_close(NWayMClass().confidence(top, log_z), torch.exp(top - log_z))


def test_mean_is_sum_over_rows() -> None:
    s = torch.tensor(random_scores(5, 6, 4))
    t = torch.tensor(random_soft(5, 6, 4))
    total = value(MultilabelCE(reduction="sum"), s, targets=t)
    assert value(MultilabelCE(), s, targets=t) == pytest.approx(total / 6, rel=1e-12)
    y = torch.tensor([0, 1, 1, 3, 0, 0])
    total = value(NWayMClass(reduction="sum"), s, labels=y)
    assert value(NWayMClass(), s, labels=y) == pytest.approx(total / 6, rel=1e-12)


# ---------------------------------------------------------------- n-way m-class


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_nway_matches_reference(dtype, seed, shape, reduction) -> None:
    b, c = shape
    s = random_scores(seed, b, c)
    rng = np.random.default_rng(seed + 400)
    y = rng.integers(c, size=b)
    soft = rng.dirichlet(np.ones(c), size=b)
    soft[0] = np.eye(c)[0]  # an exact one-hot row among soft ones
    loss = NWayMClass(reduction=reduction)
    scale = 1.0 if reduction == "sum" else 1.0 / b
    hard = value(loss, torch.tensor(s, dtype=dtype), labels=torch.tensor(y))
    np.testing.assert_allclose(hard, scale * np_nway(s, np.eye(c)[y]), **tolerances(dtype))
    got = value(loss, torch.tensor(s, dtype=dtype), targets=torch.tensor(soft, dtype=dtype))
    np.testing.assert_allclose(got, scale * np_nway(s, soft), **tolerances(dtype))
    one_hot = value(
        loss, torch.tensor(s, dtype=dtype), targets=torch.tensor(np.eye(c)[y], dtype=dtype)
    )
    np.testing.assert_allclose(one_hot, hard, **tolerances(dtype))


def test_nway_hard_is_grouped_softplus_of_row_margins() -> None:
    """The (B,) form: Σ over present classes of softplus(LSE_{i: y_i = j} r_i)."""
    s = random_scores(11, 8, 5)
    y = np.array([4, 4, 0, 2, 4, 0, 2, 2])
    want = 0.0
    for j in sorted(set(y.tolist())):
        rows = [i for i in range(8) if y[i] == j]
        inner = 0.0
        for i in rows:
            inner += sum(math.exp(s[i, k] - s[i, j]) for k in range(5) if k != j)
        want += math.log1p(inner)
    got = value(NWayMClass(reduction="sum"), torch.tensor(s), labels=torch.tensor(y))
    assert got == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("seed", SEEDS)
def test_nway_two_classes_is_multilabel_ce_of_score_differences(seed) -> None:
    """m = 2: l₁ = log(1 + Σ_i τ_i e^{−d_i}) + log(1 + Σ_i (1 − τ_i) e^{d_i}) with
    d_i = s_i1 − s_i0 and τ_i = t_i1, i.e. ZLPR of one example whose B labels score d (no
    rescaling; the half-scaled differences belong to the post's l₃)."""
    b = 7
    s = torch.tensor(random_scores(seed, b, 2))
    d = (s[:, 1] - s[:, 0]).unsqueeze(0)
    rng = np.random.default_rng(seed)
    tau = torch.tensor(rng.uniform(size=b))
    tau[0], tau[1] = 0.0, 1.0
    soft = torch.stack([1 - tau, tau], dim=1)
    nway = value(NWayMClass(reduction="sum"), s, targets=soft)
    zlpr = value(MultilabelCE(reduction="sum"), d, targets=tau.unsqueeze(0))
    assert nway == pytest.approx(zlpr, rel=1e-12)
    assert nway != pytest.approx(value(MultilabelCE(reduction="sum"), d / 2, targets=tau[None]))
    y = torch.tensor(rng.integers(2, size=b))
    ones = torch.nonzero(y == 1).flatten()
    ids = torch.cat([ones, torch.tensor([-1])]).unsqueeze(0)
    hard = value(NWayMClass(reduction="sum"), s, labels=y)
    assert hard == pytest.approx(value(MultilabelCE(reduction="sum"), d, labels=ids), rel=1e-12)


def test_nway_class_term_grows_like_log_of_its_count() -> None:
    row = np.array([5.0, 0.0, 0.0])  # label 1, so r = log(e^5 + 1) − 0 ≈ 5.0067
    r = math.log(math.exp(5.0) + 1.0)
    loss = NWayMClass(reduction="sum")
    values = []
    for k in range(1, 6):
        s = torch.tensor(np.tile(row, (k, 1)))
        values.append(value(loss, s, labels=torch.ones(k, dtype=torch.int64)))
        assert values[-1] == pytest.approx(np.logaddexp(0.0, r + math.log(k)), rel=1e-12)
    # Doubling the class adds about log 2, where the summed softmax CE would double.
    assert values[1] - values[0] == pytest.approx(math.log(2.0), abs=0.01)
    assert values[3] - values[1] == pytest.approx(math.log(2.0), abs=0.01)
    # Another class in the batch leaves this class's term alone.
    mixed = torch.tensor(np.vstack([np.tile(row, (2, 1)), [[0.0, 0.0, 3.0]]]))
    other = value(loss, mixed[2:], labels=torch.tensor([0]))
    both = value(loss, mixed, labels=torch.tensor([1, 1, 0]))
    assert both == pytest.approx(values[1] + other, rel=1e-12)


def test_nway_is_finite_for_confident_rows() -> None:
    """r_ij = LSE_{k≠j} s_ik − s_ij must not come from subtracting e^{s_ij} from the row total,
    which cancels to log 0 when row i is sure of j."""
    rows = [[60.0, -60.0, -60.0], [-60.0, 60.0, -60.0]]
    soft = [[1.0, 0.0, 0.0], [0.1, 0.9, 0.0]]
    # Class 0 gets row 0 (t = 1) and row 1 (t = 0.1); class 1 row 1; class 2 nothing.
    want = math.log1p(2 * math.exp(-120) + 0.1 * (math.exp(120) + 1))
    want += math.log1p(0.9 * 2 * math.exp(-120))
    for dtype in DTYPES:
        s = torch.tensor(rows, dtype=dtype, requires_grad=True)
        t = torch.tensor(soft, dtype=dtype)
        for kwargs in ({"targets": t}, {"labels": torch.tensor([0, 1])}):
            out = apply(NWayMClass(reduction="sum"), s, **kwargs)
            (grad,) = torch.autograd.grad(out, s)
            assert torch.isfinite(out) and torch.isfinite(grad).all()
        got = value(NWayMClass(reduction="sum"), s.detach(), targets=t)
        assert got == pytest.approx(want, rel=1e-12 if dtype == torch.float64 else 1e-6)


# ---------------------------------------------------------------- errors and options


def test_bad_inputs_raise_clear_errors() -> None:
    s = torch.zeros(2, 3)
    for loss in (MultilabelCE(), NWayMClass()):
        with pytest.raises(ValueError, match=r"\[0, 1\]"):
            apply(loss, s, targets=torch.tensor([[0.0, 1.5, 0.0], [0, 0, 1]]))
        with pytest.raises(ValueError, match=r"\[0, 1\]"):
            apply(loss, s, targets=torch.tensor([[0.0, math.nan, 0.0], [0, 0, 1]]))
        with pytest.raises(ValueError, match="shape"):
            apply(loss, s, targets=torch.zeros(2, 4))
        with pytest.raises(ValueError, match=r"label ids must lie in \[0, 3\)"):
            apply(loss, s, labels=torch.tensor([0, 3]))
        with pytest.raises(ValueError, match="integer"):
            apply(loss, s, labels=torch.tensor([0.0, 1.0]))
        with pytest.raises(ValueError, match="shape"):
            apply(loss, s, labels=torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="-1 \\(padding\\); got -2"):
        apply(MultilabelCE(), s, labels=torch.tensor([[0, -2], [1, -1]]))
    with pytest.raises(ValueError, match="repeats"):
        apply(MultilabelCE(), s, labels=torch.tensor([[2, -1, 2], [1, -1, -1]]))
    apply(MultilabelCE(), s, labels=torch.tensor([[2, -1, -1], [1, -1, -1]]))  # padding repeats
    with pytest.raises(ValueError, match=r"\(B,\)"):
        apply(NWayMClass(), s, labels=torch.tensor([[0, 1], [1, 2]]))
    with pytest.raises(ValueError, match=r"got -1"):
        apply(NWayMClass(), s, labels=torch.tensor([0, -1]))


def test_options_are_validated() -> None:
    owner = "experiments.x.loss"
    # The ε of the old clamped label-list form is gone: the exact form needs none.
    with pytest.raises(InvalidParameterError, match=r"unknown key"):
        validate_options(owner, MultilabelCE, {"eps": 1e-6})
    with pytest.raises(InvalidParameterError, match=r"experiments\.x\.loss\.threshold"):
        validate_options(owner, MultilabelCE, {"threshold": "yes"})
    with pytest.raises(InvalidParameterError, match="reduction"):
        validate_options(owner, MultilabelCE, {"reduction": "none"})
    with pytest.raises(InvalidParameterError, match="reduction"):
        validate_options(owner, NWayMClass, {"reduction": "max"})
    with pytest.raises(InvalidParameterError, match="unknown key"):
        validate_options(owner, NWayMClass, {"threshold": True})
    loss = MultilabelCE(**validate_options(owner, MultilabelCE, {"threshold": False}))
    assert not loss.threshold
    assert "threshold=False" in repr(loss) and "reduction='mean'" in repr(loss)
    assert "reduction='sum'" in repr(NWayMClass(reduction="sum"))


@pytest.mark.parametrize("factory", [MultilabelCE, NWayMClass])
def test_contract(factory) -> None:
    assert batch_modes(factory) == ("full",)
    check_options(factory)
    check_loss(factory)
    check_loss(factory, reduction="sum")


def test_contract_without_threshold() -> None:
    check_loss(MultilabelCE, threshold=False)
