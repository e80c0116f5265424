"""Tests for LDAM(-DRW) and the class-balanced losses of Cui et al.

Each loss is checked against an independent float64 numpy implementation written as plain loops
from the formulas in algorithms.md (§7.2, §7.3, §8), against the cross-check vectors of §12, for
the reduction semantics of §11.1, and with torch.autograd.gradcheck.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from tailkit.errors import InvalidParameterError
from tailkit.output.output_layer import OutputLayer
from tailkit.plugins.losses.class_balanced import ClassBalancedLoss, class_balanced_weights
from tailkit.plugins.losses.ldam import LDAM, ldam_margins
from tailkit.plugins.losses.softmax import SoftmaxCE
from tailkit.testing import check_loss, check_options
from tailkit.testing.batches import full_batch
from tailkit.validation import validate_options

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DTYPES = [torch.float32, torch.float64]
SEEDS = [0, 1, 2]
SIZES = [(1, 2), (5, 7), (17, 30)]  # (B, C)
LOSS_TYPES = ["softmax", "sigmoid", "focal"]

CIFAR10_LT_IF100 = [5000, 2997, 1796, 1077, 645, 387, 232, 139, 83, 50]


# ---------------------------------------------------------------- numpy references (float64)


def np_margins(counts, max_m: float) -> list[float]:
    raw = [max(n, 1) ** -0.25 for n in counts]
    top = max(raw)
    return [max_m * m / top for m in raw]


def np_cb_weights(counts, beta: float) -> list[float]:
    raw = [(1.0 - beta) / (1.0 - beta ** max(n, 1)) for n in counts]
    total = sum(raw)
    return [len(counts) * w / total for w in raw]


def np_ce(row, y: int) -> float:
    top = max(row)
    return top + math.log(sum(math.exp(v - top) for v in row)) - row[y]


def np_ldam(scaled, labels, counts, *, max_m, s, beta, weighted, reduction) -> float:
    margins = np_margins(counts, max_m)
    weights = np_cb_weights(counts, beta) if weighted else [1.0] * len(counts)
    num = den = 0.0
    for row, y in zip(scaled, labels, strict=True):
        shifted = [float(v) for v in row]
        shifted[y] -= s * margins[y]
        num += weights[y] * np_ce(shifted, y)
        den += weights[y]
    return num if reduction == "sum" else num / den


def np_softplus(z: float) -> float:
    return max(z, 0.0) + math.log1p(math.exp(-abs(z)))


def np_sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-z)) if z >= 0 else math.exp(z) / (1.0 + math.exp(z))


def np_binary_term(z: float, t: int, gamma: float | None) -> float:
    """α-free BCE(z, t), times (1 − p_t)^γ when gamma is given (the focal loss)."""
    bce = np_softplus(z) - t * z
    if gamma is None:
        return bce
    p = np_sigmoid(z)
    p_t = p if t == 1 else 1.0 - p
    return (1.0 - p_t) ** gamma * bce


def np_cb(logits, labels, counts, *, loss_type, beta, gamma, reduction) -> float:
    weights = np_cb_weights(counts, beta)
    total = 0.0
    for row, y in zip(logits, labels, strict=True):
        if loss_type == "softmax":
            value = np_ce([float(v) for v in row], y)
        else:
            value = 0.0
            for c, z in enumerate(row):
                value += np_binary_term(
                    float(z), int(c == y), gamma if loss_type == "focal" else None
                )
        total += weights[y] * value
    return total if reduction == "sum" else total / len(labels)


# ---------------------------------------------------------------- helpers


def random_case(seed: int, b: int, c: int, *, cosine: bool = False) -> dict:
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 2000, c).astype(float)
    counts[rng.integers(0, c)] = 1.0  # a singleton class, the largest margin and weight
    logits = rng.uniform(-1.0, 1.0, (b, c)) if cosine else rng.normal(0.0, 3.0, (b, c))
    return {"counts": counts, "logits": logits, "labels": rng.integers(0, c, b)}


def make_batch(case: dict, *, dtype=torch.float64, device="cpu", scale=1.0, epoch=0, grad=False):
    logits = torch.tensor(case["logits"] * scale, dtype=dtype, device=device)
    return full_batch(
        labels=torch.tensor(case["labels"], device=device),
        logits=logits.requires_grad_(grad),
        epoch=epoch,
    )


def set_up(loss, counts, device="cpu"):
    loss = loss.to(device)
    loss.setup(torch.tensor(counts, dtype=torch.float64, device=device))
    return loss


def tol(dtype: torch.dtype) -> dict:
    return {"rel": 1e-10, "abs": 1e-10} if dtype == torch.float64 else {"rel": 2e-5, "abs": 2e-5}


# ---------------------------------------------------------------- per-class tables


def test_margins_match_section_12() -> None:
    expected = [0.1581, 0.1797, 0.2042, 0.2321, 0.2638, 0.2998, 0.3407, 0.3872, 0.4405, 0.5000]
    got = ldam_margins(torch.tensor(CIFAR10_LT_IF100, dtype=torch.float64), 0.5)
    assert got.dtype == torch.float64
    assert got.tolist() == pytest.approx(expected, abs=5e-5)
    assert got.tolist() == pytest.approx(np_margins(CIFAR10_LT_IF100, 0.5), rel=1e-14)
    assert got.max().item() == pytest.approx(0.5, rel=1e-15)


def test_weights_match_section_12() -> None:
    expected = [0.0506, 0.0769, 0.1211, 0.1950, 0.3188, 0.5246, 0.8683, 1.4426, 2.4092, 3.9927]
    got = class_balanced_weights(CIFAR10_LT_IF100, 0.9999)
    assert got.tolist() == pytest.approx(expected, abs=5e-5)
    assert got.tolist() == pytest.approx(np_cb_weights(CIFAR10_LT_IF100, 0.9999), rel=1e-10)
    assert got.sum().item() == pytest.approx(10.0, rel=1e-14)
    assert class_balanced_weights(CIFAR10_LT_IF100, 0.0).tolist() == [1.0] * 10


@pytest.mark.parametrize("beta", [0.0, 0.5, 0.9, 0.999, 0.999999])
def test_weights_match_numpy_for_any_beta(beta: float) -> None:
    counts = [1, 2, 7, 40, 300, 5000, 123456]
    got = class_balanced_weights(torch.tensor(counts, dtype=torch.float64), beta)
    assert got.tolist() == pytest.approx(np_cb_weights(counts, beta), rel=1e-9)


def test_zero_counts_are_treated_as_one() -> None:
    with_zero, with_one = [0, 10, 100, 0], [1, 10, 100, 1]
    for table in (lambda n: ldam_margins(n, 0.5), lambda n: class_balanced_weights(n, 0.9999)):
        got = table(torch.tensor(with_zero, dtype=torch.float64))
        assert bool(torch.isfinite(got).all())
        assert torch.equal(got, table(torch.tensor(with_one, dtype=torch.float64)))


@pytest.mark.parametrize("bad", [[-1.0, 3.0], [float("nan"), 2.0], [float("inf"), 1.0], []])
def test_bad_counts_raise(bad: list[float]) -> None:
    for loss in (LDAM(), ClassBalancedLoss()):
        with pytest.raises(ValueError, match="class_counts"):
            loss.setup(torch.tensor(bad, dtype=torch.float64))


# ---------------------------------------------------------------- LDAM


def test_ldam_toy_value_from_section_12() -> None:
    loss = set_up(LDAM(s=30.0, max_m=0.5), [100, 10, 1])
    assert loss.margins.tolist() == pytest.approx([0.158114, 0.281171, 0.5], abs=1e-6)
    z = torch.tensor([[0.2, 0.5, -0.1]], dtype=torch.float64)
    batch = full_batch(labels=torch.tensor([2]), logits=30.0 * z)
    assert loss(batch).item() == pytest.approx(33.000123, abs=1e-6)
    assert SoftmaxCE()(batch).item() == pytest.approx(18.000123, abs=1e-6)
    assert set_up(LDAM(max_m=0.0), [100, 10, 1])(batch).item() == pytest.approx(18.000123, abs=1e-6)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("drw_epoch", [None, 0, 3])
def test_ldam_matches_numpy(device: str, dtype: torch.dtype, reduction: str, drw_epoch) -> None:
    for seed, (b, c), epoch in itertools.product(SEEDS, SIZES, [0, 2, 3, 10]):
        case = random_case(seed, b, c, cosine=True)
        s, max_m, beta = (30.0, 0.5, 0.9999) if seed % 2 == 0 else (10.0, 0.3, 0.999)
        loss = LDAM(max_m=max_m, s=s, drw_epoch=drw_epoch, beta=beta, reduction=reduction)
        loss = set_up(loss, case["counts"], device)
        out = loss(make_batch(case, dtype=dtype, device=device, scale=s, epoch=epoch))
        weighted = drw_epoch is not None and epoch >= drw_epoch
        expected = np_ldam(
            case["logits"] * s,
            case["labels"],
            case["counts"],
            max_m=max_m,
            s=s,
            beta=beta,
            weighted=weighted,
            reduction=reduction,
        )
        assert out.dtype == dtype and out.shape == () and out.device.type == device
        assert out.item() == pytest.approx(expected, **tol(dtype)), (seed, b, c, epoch)


def test_ldam_equals_pytorch_weighted_cross_entropy() -> None:
    """The reference's F.cross_entropy(s·(z − m·onehot), y, weight=w), reduction included."""
    for seed, (b, c), reduction in itertools.product(SEEDS, SIZES, ["mean", "sum"]):
        case = random_case(seed, b, c, cosine=True)
        loss = set_up(LDAM(drw_epoch=1, reduction=reduction), case["counts"])
        z = torch.tensor(case["logits"])
        y = torch.tensor(case["labels"])
        m = torch.tensor(np_margins(case["counts"], 0.5))
        onehot = torch.nn.functional.one_hot(y, c).double()
        w = torch.tensor(np_cb_weights(case["counts"], 0.9999))
        ref = torch.nn.functional.cross_entropy(
            30.0 * (z - m[y].unsqueeze(1) * onehot), y, weight=w, reduction=reduction
        )
        got = loss(full_batch(labels=y, logits=30.0 * z, epoch=1))
        assert got.item() == pytest.approx(ref.item(), rel=1e-12)


def test_ldam_mean_is_the_weighted_mean() -> None:
    """Σ w_{y_i} ℓ_i / Σ w_{y_i}; with a head-heavy batch this is far from (1/B) Σ w_{y_i} ℓ_i."""
    counts = [1000, 10, 1]
    z = [[0.9, 0.1, -0.3], [0.2, 0.6, 0.1], [0.0, 0.3, 0.4], [0.5, 0.5, 0.2], [0.1, 0.8, 0.0]]
    logits = 30.0 * torch.tensor(z, dtype=torch.float64)
    labels = torch.tensor([0, 0, 0, 0, 2])
    per = torch.stack(
        [
            set_up(LDAM(reduction="sum"), counts)(
                full_batch(labels=labels[i : i + 1], logits=logits[i : i + 1])
            )
            for i in range(len(labels))
        ]
    )
    w = torch.tensor(np_cb_weights(counts, 0.9999), dtype=torch.float64)[labels]
    value = set_up(LDAM(drw_epoch=0), counts)(full_batch(labels=labels, logits=logits)).item()
    weighted_mean = ((w * per).sum() / w.sum()).item()
    batch_mean = (w * per).mean().item()
    assert value == pytest.approx(weighted_mean, rel=1e-12)
    assert abs(weighted_mean - batch_mean) > 1.0  # the two readings are far apart here
    total = set_up(LDAM(drw_epoch=0, reduction="sum"), counts)(
        full_batch(labels=labels, logits=logits)
    )
    assert total.item() == pytest.approx((w * per).sum().item(), rel=1e-12)
    # All-ones weights (β = 0) make DRW a no-op.
    same = set_up(LDAM(drw_epoch=0, beta=0.0), counts)(full_batch(labels=labels, logits=logits))
    plain = set_up(LDAM(), counts)(full_batch(labels=labels, logits=logits))
    assert same.item() == pytest.approx(plain.item(), rel=1e-12)
    assert plain.item() == pytest.approx(per.mean().item(), rel=1e-12)


def test_ldam_drw_schedule_switches_at_drw_epoch() -> None:
    case = random_case(5, 9, 6, cosine=True)
    loss = set_up(LDAM(drw_epoch=4), case["counts"])
    plain = set_up(LDAM(), case["counts"])
    values = [loss(make_batch(case, scale=30.0, epoch=e)).item() for e in range(7)]
    unweighted = plain(make_batch(case, scale=30.0)).item()
    assert values[:4] == [unweighted] * 4
    assert values[4:] == [values[4]] * 3
    assert values[4] != pytest.approx(unweighted, rel=1e-3)


def test_ldam_asks_for_the_cosine_layer() -> None:
    loss = LDAM(s=12.5)
    assert loss.cosine_scale == 12.5
    assert OutputLayer.for_loss(loss, 5, 3).cosine_scale == 12.5
    assert LDAM().cosine_scale == 30.0
    assert ClassBalancedLoss().cosine_scale is None


def test_ldam_gradcheck_with_drw() -> None:
    case = random_case(3, 6, 5, cosine=True)
    loss = set_up(LDAM(drw_epoch=2, reduction="mean"), case["counts"])
    labels = torch.tensor(case["labels"])
    logits = torch.tensor(case["logits"] * 30.0, requires_grad=True)
    for epoch in (0, 2):
        assert torch.autograd.gradcheck(
            lambda x, e=epoch: loss(full_batch(labels=labels, logits=x, epoch=e)), (logits,)
        )


def test_ldam_tables_are_not_saved() -> None:
    loss = set_up(LDAM(drw_epoch=0), [50, 5, 1])
    assert loss.state_dict() == {}
    margins = loss.margins.clone()
    loss.load_state_dict({})
    assert torch.equal(loss.margins, margins)


# ---------------------------------------------------------------- class-balanced


def test_cb_focal_terms_from_section_12() -> None:
    """γ = 1, α = 1 (β = 0), z = [2, −1, 0.5], t = [0, 0, 1]: terms [1.873392, 0.084249,
    0.178983]. A logit of −1e4 with t = 0 contributes exactly 0, which isolates each term."""
    loss = set_up(
        ClassBalancedLoss(loss_type="focal", beta=0.0, gamma=1.0, reduction="sum"), [1] * 3
    )

    def value(row: list[float]) -> float:
        logits = torch.tensor([row], dtype=torch.float64)
        return loss(full_batch(labels=torch.tensor([2]), logits=logits)).item()

    last = value([-1e4, -1e4, 0.5])
    terms = [value([2.0, -1e4, 0.5]) - last, value([-1e4, -1.0, 0.5]) - last, last]
    assert terms == pytest.approx([1.873392, 0.084249, 0.178983], abs=1e-6)
    assert value([2.0, -1.0, 0.5]) == pytest.approx(2.136624, abs=1e-6)
    for z, t, term in zip([2.0, -1.0, 0.5], [0, 0, 1], terms, strict=True):
        assert np_binary_term(z, t, 1.0) == pytest.approx(term, abs=1e-12)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize(
    ("loss_type", "gamma"),
    [("softmax", 1.0), ("sigmoid", 1.0), ("focal", 0.0), ("focal", 0.5), ("focal", 1.0),
     ("focal", 2.0)],
)  # fmt: skip
def test_cb_matches_numpy(
    device: str, dtype: torch.dtype, reduction: str, loss_type: str, gamma: float
) -> None:
    for seed, (b, c) in itertools.product(SEEDS, SIZES):
        case = random_case(seed, b, c)
        beta = 0.9999 if seed != 1 else 0.99
        loss = ClassBalancedLoss(loss_type=loss_type, beta=beta, gamma=gamma, reduction=reduction)
        loss = set_up(loss, case["counts"], device)
        out = loss(make_batch(case, dtype=dtype, device=device))
        expected = np_cb(
            case["logits"],
            case["labels"],
            case["counts"],
            loss_type=loss_type,
            beta=beta,
            gamma=gamma,
            reduction=reduction,
        )
        assert out.dtype == dtype and out.shape == () and out.device.type == device
        assert out.item() == pytest.approx(expected, **tol(dtype)), (seed, b, c)


def test_cb_softmax_mean_is_the_batch_mean() -> None:
    """(1/B) Σ α_i CE_i (TensorFlow's reduction), not Σ α_i CE_i / Σ α_i."""
    counts = [1000, 10, 1]
    z = [[3.0, 0.1, -0.3], [0.2, 1.6, 0.1], [0.0, 0.3, 0.4], [1.0, 0.0, 2.0], [0.0, 0.0, 0.0]]
    logits = torch.tensor(z, dtype=torch.float64)
    labels = torch.tensor([0, 0, 0, 0, 2])
    per = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    w = torch.tensor(np_cb_weights(counts, 0.9999), dtype=torch.float64)[labels]
    value = set_up(ClassBalancedLoss(loss_type="softmax"), counts)(
        full_batch(labels=labels, logits=logits)
    )
    assert value.item() == pytest.approx((w * per).sum().item() / len(labels), rel=1e-12)
    assert abs(value.item() - ((w * per).sum() / w.sum()).item()) > 0.1


def test_focal_with_gamma_zero_is_exactly_sigmoid() -> None:
    case = random_case(4, 8, 11)
    sigmoid = set_up(ClassBalancedLoss(loss_type="sigmoid"), case["counts"])
    focal = set_up(ClassBalancedLoss(loss_type="focal", gamma=0.0), case["counts"])
    for dtype in DTYPES:
        assert torch.equal(
            focal(make_batch(case, dtype=dtype)), sigmoid(make_batch(case, dtype=dtype))
        )


@pytest.mark.parametrize("gamma", [0.5, 1.0, 2.0])
def test_focal_is_stable_for_extreme_logits_in_float32(gamma: float) -> None:
    """t = 1 at z = −100 (and t = 0 at z = +100): the reference's modulator
    exp(−γtz − γ log1p(e^{−z})) gives 0 there in float32; (1 − p_t)^γ is ≈ 1."""
    rows = [[-100.0, 100.0, 0.3, -7.0], [100.0, -100.0, 40.0, -40.0]]
    labels = [0, 0]
    loss = set_up(
        ClassBalancedLoss(loss_type="focal", beta=0.0, gamma=gamma, reduction="sum"), [1] * 4
    )
    logits = torch.tensor(rows, dtype=torch.float32, requires_grad=True)
    out = loss(full_batch(labels=torch.tensor(labels), logits=logits))
    expected = np_cb(
        rows, labels, [1] * 4, loss_type="focal", beta=0.0, gamma=gamma, reduction="sum"
    )
    assert out.item() == pytest.approx(expected, rel=1e-6)
    assert out.item() > 199.0  # two terms of ≈ 100 each, not dropped to 0
    out.backward()
    assert bool(torch.isfinite(logits.grad).all())
    # The reference form does lose the t = 1 term here, so the check above is not vacuous.
    z = torch.tensor(-100.0)
    tf_modulator = torch.exp(-gamma * z - gamma * torch.log1p(torch.exp(-z)))
    assert tf_modulator.item() == 0.0


@pytest.mark.parametrize(
    ("loss_type", "gamma"), [("softmax", 1.0), ("sigmoid", 1.0), ("focal", 0.5), ("focal", 2.0)]
)
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cb_gradcheck(loss_type: str, gamma: float, reduction: str) -> None:
    case = random_case(7, 5, 6)
    loss = set_up(
        ClassBalancedLoss(loss_type=loss_type, gamma=gamma, reduction=reduction), case["counts"]
    )
    labels = torch.tensor(case["labels"])
    logits = torch.tensor(case["logits"], requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: loss(full_batch(labels=labels, logits=x)), (logits,))


def test_cb_initial_bias_and_confidence() -> None:
    scores = torch.tensor([-2.0, 0.0, 3.5])
    log_partition = torch.tensor([1.0, 2.0, 4.0])
    for loss_type in ("sigmoid", "focal"):
        loss = ClassBalancedLoss(loss_type=loss_type)
        assert loss.initial_bias(10) == pytest.approx(-math.log(9))
        assert 1.0 / (1.0 + math.exp(-loss.initial_bias(1000))) == pytest.approx(1 / 1000)
        assert loss.initial_bias(2) == 0.0
        assert loss.initial_bias(1) == 0.0
        assert torch.equal(loss.confidence(scores, log_partition), torch.sigmoid(scores))
    softmax = ClassBalancedLoss(loss_type="softmax")
    assert softmax.initial_bias(10) == 0.0
    assert torch.allclose(softmax.confidence(scores, log_partition), (scores - log_partition).exp())
    assert LDAM().initial_bias(10) == 0.0


def test_cb_tables_are_not_saved() -> None:
    loss = set_up(ClassBalancedLoss(), [50, 5, 1])
    assert loss.state_dict() == {}
    assert loss.class_weights.sum().item() == pytest.approx(3.0)


# ---------------------------------------------------------------- errors and contracts


@pytest.mark.parametrize("factory", [LDAM, lambda: ClassBalancedLoss(loss_type="sigmoid")])
def test_forward_before_setup_raises(factory) -> None:
    batch = full_batch(labels=torch.tensor([0]), logits=torch.zeros(1, 3))
    with pytest.raises(RuntimeError, match=r"setup\(class_counts\)"):
        factory()(batch)


@pytest.mark.parametrize("factory", [LDAM, ClassBalancedLoss])
def test_wrong_number_of_classes_raises(factory) -> None:
    loss = set_up(factory(), [10, 5, 1])
    with pytest.raises(ValueError, match="4 classes"):
        loss(full_batch(labels=torch.tensor([0]), logits=torch.zeros(1, 4)))


@pytest.mark.parametrize(
    ("factory", "name", "value"),
    [
        (LDAM, "max_m", -0.1),
        (LDAM, "s", 0.0),
        (LDAM, "s", float("nan")),
        (LDAM, "drw_epoch", -1),
        (LDAM, "drw_epoch", 1.5),
        (LDAM, "beta", 1.0),
        (LDAM, "beta", -0.5),
        (LDAM, "reduction", "none"),
        (ClassBalancedLoss, "loss_type", "hinge"),
        (ClassBalancedLoss, "beta", 1.0),
        (ClassBalancedLoss, "gamma", -1.0),
        (ClassBalancedLoss, "reduction", "weighted"),
    ],
)
def test_bad_options_are_rejected(factory, name: str, value) -> None:
    with pytest.raises(InvalidParameterError, match=name):
        validate_options("experiments.x.loss", factory, {name: value})


def test_good_options_pass() -> None:
    assert validate_options("l", LDAM, {"drw_epoch": 160, "s": 10, "beta": 0})["s"] == 10.0
    assert validate_options("l", LDAM, {"drw_epoch": None}) == {"drw_epoch": None}
    out = validate_options("l", ClassBalancedLoss, {"loss_type": "softmax", "gamma": 0})
    assert out == {"loss_type": "softmax", "gamma": 0.0}


def test_contracts() -> None:
    check_options(LDAM)
    check_loss(LDAM)
    check_loss(LDAM, drw_epoch=0)  # the contract's batches are at epoch 0, so DRW is on
    check_options(ClassBalancedLoss)
    for loss_type in LOSS_TYPES:
        check_loss(ClassBalancedLoss, loss_type=loss_type)
    check_loss(ClassBalancedLoss, loss_type="focal", gamma=0.5, reduction="sum")


# ---------------------------------------------------------------- multi-label rows


def np_cb_label_sets(logits, label_sets, counts, *, loss_type, beta, gamma, reduction) -> float:
    """Wu et al.'s class-balanced baseline for label lists (CB_mode 'by_class'): every entry of
    column c weighted by w_c."""
    weights = np_cb_weights(counts, beta)
    total = 0.0
    for row, positives in zip(logits, label_sets, strict=True):
        for c, z in enumerate(row):
            term = np_binary_term(
                float(z), int(c in positives), gamma if loss_type == "focal" else None
            )
            total += weights[c] * term
    return total if reduction == "sum" else total / len(label_sets)


@pytest.mark.parametrize("loss_type", ["sigmoid", "focal"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cb_takes_label_lists_per_label(loss_type, reduction) -> None:
    case = random_case(7, 6, 9)
    sets = [[0, 3], [], [8], [1, 2, 5], [4], [3, 8]]
    width = max(len(s) for s in sets)
    padded = torch.tensor([s + [-1] * (width - len(s)) for s in sets])
    loss = set_up(
        ClassBalancedLoss(loss_type=loss_type, beta=0.999, gamma=1.5, reduction=reduction),
        case["counts"],
    )
    assert loss.multilabel
    logits = torch.tensor(case["logits"], dtype=torch.float64, requires_grad=True)
    got = loss(full_batch(labels=padded, logits=logits))
    want = np_cb_label_sets(case["logits"], sets, case["counts"], loss_type=loss_type,
                            beta=0.999, gamma=1.5, reduction=reduction)  # fmt: skip
    assert got.item() == pytest.approx(want, rel=1e-10)
    assert torch.autograd.gradcheck(lambda z: loss(full_batch(labels=padded, logits=z)), (logits,))


def test_cb_softmax_still_takes_one_label_a_row() -> None:
    assert not ClassBalancedLoss(loss_type="softmax").multilabel
