"""The hand-written autograd functions the full-mode losses share, and the cast-once tables.

Each function is checked in float64 against the plain autograd formula it replaces (values and
gradients) and with torch.autograd.gradcheck, on logits wide enough to reach the stable and the
extreme branches of softplus and log-sum-exp.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from tailkit.plugins.losses.cast_tables import table_like
from tailkit.plugins.losses.fused_binary import binary_row_losses
from tailkit.plugins.losses.fused_softmax import adjusted_cross_entropy, compiled_path
from tailkit.plugins.losses.prototypes import BatchPrototypeDRO, dro_loss
from tailkit.plugins.losses.pull import BatchPull, MemoryPull, pull_terms, same_class_pairs


def random_case(seed: int, rows: int = 5, classes: int = 7, scale: float = 4.0):
    gen = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(rows, classes, generator=gen, dtype=torch.float64)
    labels = torch.randint(classes, (rows,), generator=gen)
    offsets = torch.randn(classes, generator=gen, dtype=torch.float64)
    shift = -torch.rand(rows, generator=gen, dtype=torch.float64)
    return logits.requires_grad_(), labels, offsets, shift


def reference_cross_entropy(logits, labels, offsets, shift):
    adjusted = logits if offsets is None else logits + offsets
    if shift is not None:
        adjusted = adjusted.scatter_add(1, labels.unsqueeze(1), shift.unsqueeze(1))
    return F.cross_entropy(adjusted, labels, reduction="none")


def reference_binary_stable(z, labels, gamma):
    """The same loss in log space, so that float64 autograd stays finite where σ rounds to 0 or
    1 (the plain formula's (1 − p_t)^γ has an infinite slope at 0 for γ < 1)."""
    t = F.one_hot(labels, z.shape[1]).to(z.dtype)
    log_modulator = torch.where(t == 1, -F.softplus(z), F.logsigmoid(z))
    bce = torch.where(t == 1, F.softplus(-z), F.softplus(z))
    return (torch.exp(gamma * log_modulator) * bce).sum(dim=1)


def reference_binary(z, labels, gamma):
    """The elementwise formula of the class-balanced loss, one-hot and all."""
    t = F.one_hot(labels, z.shape[1]).to(z.dtype)
    p_t = torch.where(t == 1, torch.sigmoid(z), 1 - torch.sigmoid(z))
    bce = F.softplus(z) - t * z
    return ((1 - p_t) ** gamma * bce).sum(dim=1)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("with_offsets", [False, True])
@pytest.mark.parametrize("with_shift", [False, True])
def test_adjusted_cross_entropy_matches_autograd(seed, with_offsets, with_shift) -> None:
    logits, labels, offsets, shift = random_case(seed)
    offsets = offsets if with_offsets else None
    shift = shift if with_shift else None
    weights = torch.rand(labels.shape, dtype=torch.float64)
    got = adjusted_cross_entropy(logits, labels, offsets=offsets, target_shift=shift)
    (got_grad,) = torch.autograd.grad((weights * got).sum(), logits)
    want = reference_cross_entropy(logits, labels, offsets, shift)
    (want_grad,) = torch.autograd.grad((weights * want).sum(), logits)
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-13, atol=1e-13)


@pytest.mark.parametrize("with_offsets", [False, True])
@pytest.mark.parametrize("with_shift", [False, True])
def test_adjusted_cross_entropy_gradcheck(with_offsets, with_shift) -> None:
    logits, labels, offsets, shift = random_case(3)
    offsets = offsets if with_offsets else None
    shift = shift if with_shift else None
    assert torch.autograd.gradcheck(
        lambda x: adjusted_cross_entropy(x, labels, offsets=offsets, target_shift=shift),
        (logits,),
    )


def test_adjusted_cross_entropy_leaves_the_logits_alone() -> None:
    logits, labels, _, shift = random_case(4)
    before = logits.detach().clone()
    adjusted_cross_entropy(logits, labels, target_shift=shift).sum().backward()
    assert torch.equal(logits.detach(), before)


class _FullWidthAllocations(TorchDispatchMode):
    """Counts the ops that return a new tensor of ``numel`` elements: not in place, not a view
    of an input (detach, expand)."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel, self.count = numel, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.numel() == self.numel:
            inputs = [a for a in tree_flatten((args, kwargs))[0] if isinstance(a, torch.Tensor)]
            storage = out.untyped_storage().data_ptr()
            self.count += all(a.untyped_storage().data_ptr() != storage for a in inputs)
        return out


@pytest.mark.parametrize("with_offsets", [False, True])
@pytest.mark.parametrize("with_shift", [False, True])
def test_adjusted_cross_entropy_makes_one_full_width_tensor_each_way(with_offsets, with_shift):
    """The torch path (float64 here; CUDA) keeps the logits for the backward, allocates one
    (B, C) tensor in the forward (a transient) and one in the backward (the gradient): two at
    any time, as `tailkit plan` counts. torch's log-softmax + NLL made three and kept the
    log-softmax, and held four at the peak on an H200."""
    logits, labels, offsets, shift = random_case(6, rows=9, classes=11)
    offsets = offsets if with_offsets else None
    shift = shift if with_shift else None
    assert not compiled_path(logits)
    forward = _FullWidthAllocations(logits.numel())
    saved: list[torch.Tensor] = []
    with (
        forward,
        torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t),
    ):
        loss = adjusted_cross_entropy(logits, labels, offsets=offsets, target_shift=shift).sum()
    # kept for the backward: the logits themselves and (B,)/(C,) vectors, no (B, C) copy
    wide = [t for t in saved if t.numel() == logits.numel()]
    assert [t.untyped_storage().data_ptr() for t in wide] == [logits.untyped_storage().data_ptr()]
    backward = _FullWidthAllocations(logits.numel())
    with backward:
        loss.backward()
    assert (forward.count, backward.count) == (1, 1)
    plain = _FullWidthAllocations(logits.numel())
    with plain:
        F.cross_entropy(logits, labels, reduction="sum").backward()
    assert plain.count == 3  # what the count would say of torch's


@pytest.mark.parametrize("shift", [100.0, 1e4])
def test_the_torch_path_keeps_float32_precision_at_large_logits(shift) -> None:
    """CUDA's float32 path (called directly: float32 on the CPU takes the compiled kernels),
    with offsets and target shifts, at logits far from 0, against float64 cross-entropy of the
    same float32 adjusted logits (forming f + o in float32 rounds at the size of f, for any
    implementation): as close as float32 log-softmax itself, since a − max − log Σ rounds at
    the size of a − max (the first version rounded at max: 4.7e-4 off at 10^4)."""
    from tailkit.plugins.losses.fused_softmax import _AdjustedCrossEntropy

    gen = torch.Generator().manual_seed(9)
    logits = (shift + 3 * torch.randn(8, 1000, generator=gen, dtype=torch.float64)).float()
    labels = torch.randint(1000, (8,), generator=gen)
    offsets = torch.randn(1000, generator=gen).float()
    target_shift = -torch.rand(8, generator=gen).float()
    x = logits.clone().requires_grad_()
    got = _AdjustedCrossEntropy.apply(x, labels, offsets, target_shift)
    got.sum().backward()
    adjusted = (logits + offsets).scatter_add(1, labels[:, None], target_shift[:, None])
    a64 = adjusted.double().requires_grad_()
    want = F.cross_entropy(a64, labels, reduction="none")
    want.sum().backward()
    assert x.grad is not None and a64.grad is not None
    torch.testing.assert_close(got.double(), want.detach(), rtol=0, atol=2e-6)
    torch.testing.assert_close(x.grad.double(), a64.grad, rtol=0, atol=2e-7)
    assert x.grad.double().sum(dim=1).abs().max() < 1e-6  # softmax − one-hot sums to 0


def test_adjusted_cross_entropy_takes_minus_infinity_offsets() -> None:
    """Balanced softmax gives a label with no training row log 0 = −inf."""
    logits, labels, offsets, _ = random_case(5)
    labels = labels.clamp(max=5)
    offsets[6] = float("-inf")
    got = adjusted_cross_entropy(logits, labels, offsets=offsets)
    got.sum().backward()
    assert torch.isfinite(got).all()
    assert logits.grad is not None
    assert torch.isfinite(logits.grad).all()
    assert torch.equal(logits.grad[:, 6], torch.zeros(labels.numel(), dtype=torch.float64))


@pytest.mark.parametrize(("rows", "classes"), [(1, 1), (7, 5), (64, 3001)])
@pytest.mark.parametrize("with_offsets", [False, True])
@pytest.mark.parametrize("with_shift", [False, True])
def test_compiled_cross_entropy_float32_against_float64(rows, classes, with_offsets, with_shift):
    """float32 CPU logits take the compiled kernels (softmax_kernels.py): loss and gradient
    within a few float32 ulps of the float64 formula on the same float32 inputs, on rows wider
    than the kernels' 1,024-column blocks, labels in the first and the last column and on both
    sides of a block boundary (only the label's block masks it), −inf offsets, logits up to
    ±120 and target shifts down to −5."""
    logits, labels, offsets, shift = random_case(rows + classes, rows, classes, scale=30.0)
    labels[0] = classes - 1
    labels[-1] = 0
    if classes > 2048:
        labels[1:5] = torch.tensor([1023, 1024, 2047, 2048])
    offsets = offsets.float() if with_offsets else None
    if offsets is not None and classes > 2:
        offsets[1] = float("-inf")  # balanced softmax's unseen class
        labels = torch.where(labels == 1, 0, labels)
    shift = (5.0 * shift).float() if with_shift else None
    # seeded: from the global generator, the weights (and so the worst error) depended on
    # which tests ran before
    weights = torch.rand(rows, dtype=torch.float64, generator=torch.Generator().manual_seed(rows))
    x = logits.detach().float().requires_grad_()
    assert compiled_path(x)
    got = adjusted_cross_entropy(x, labels, offsets=offsets, target_shift=shift)
    (weights.float() * got).sum().backward()
    x64 = x.detach().double().requires_grad_()
    want = reference_cross_entropy(
        x64,
        labels,
        None if offsets is None else offsets.double(),
        None if shift is None else shift.double(),
    )
    (weights * want).sum().backward()
    assert got.dtype == torch.float32 and x.grad is not None and x64.grad is not None
    torch.testing.assert_close(got.double(), want.detach(), rtol=4e-7, atol=1e-6)
    # 2e-6: a probability carries the relative error of the float32 lane sums behind its
    # log-sum-exp (up to ~4e-6 at 3,001 columns of logits out to ±120; 1.06e-6 seen here
    # with a weight near 1, when the weights came from the global generator)
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=0, atol=2e-6)
    if offsets is not None and classes > 2:
        assert (x.grad[:, 1] == 0).all()  # exactly, as e^(−inf) is


@pytest.mark.parametrize("loss", ["cross-entropy", "focal"])
def test_compiled_losses_do_not_depend_on_the_thread_count(loss) -> None:
    """The compiled cross-entropy and focal kernels give the same bits at 1 and 2 threads."""
    import numba

    logits, labels, offsets, shift = random_case(11, rows=33, classes=2500, scale=10.0)
    x = logits.detach().float()

    def run() -> tuple[torch.Tensor, torch.Tensor]:
        leaf = x.clone().requires_grad_()
        if loss == "focal":
            rows = binary_row_losses(leaf, labels, 1.0)
        else:
            rows = adjusted_cross_entropy(
                leaf, labels, offsets=offsets.float(), target_shift=shift.float()
            )
        rows.sum().backward()
        assert leaf.grad is not None
        return rows.detach(), leaf.grad

    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        one = run()
        numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
        many = run()
    finally:
        numba.set_num_threads(before)
    assert torch.equal(one[0], many[0]) and torch.equal(one[1], many[1])


def test_compiled_losses_keep_a_nan_row_nan() -> None:
    """A diverged row must read as diverged: NaN or +inf in float32 logits gives a NaN loss, as
    torch's functions give, and the other rows are untouched."""
    x = torch.randn(3, 40, generator=torch.Generator().manual_seed(0))
    x[1, 7], x[2, 3] = float("nan"), float("inf")
    labels = torch.tensor([0, 0, 0])
    got = adjusted_cross_entropy(x, labels)
    want = F.cross_entropy(x, labels, reduction="none")
    assert torch.isnan(got[1:]).all() and torch.isnan(want[1:]).all()
    torch.testing.assert_close(got[0], want[0])
    assert torch.isnan(binary_row_losses(x, labels, 1.0)[1])


@pytest.mark.parametrize("bad", [4, -1])
def test_compiled_kernels_refuse_a_label_out_of_range(bad) -> None:
    x = torch.zeros(2, 4)
    with pytest.raises(IndexError, match=r"^cross-entropy: a label is outside \[0, 4\)$"):
        adjusted_cross_entropy(x, torch.tensor([0, bad]))
    with pytest.raises(IndexError, match=r"^one-vs-all loss: a label is outside \[0, 4\)$"):
        binary_row_losses(x, torch.tensor([bad, 0]), 1.0)


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("seed", [0, 1])
def test_binary_row_losses_match_the_elementwise_formula(gamma, seed) -> None:
    logits, labels, _, _ = random_case(seed, scale=6.0)
    weights = torch.rand(labels.shape, dtype=torch.float64)
    got = binary_row_losses(logits, labels, gamma)
    (got_grad,) = torch.autograd.grad((weights * got).sum(), logits)
    want = reference_binary(logits, labels, gamma)
    (want_grad,) = torch.autograd.grad((weights * want).sum(), logits)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0, 2.0])
def test_binary_row_losses_gradcheck(gamma) -> None:
    logits, labels, _, _ = random_case(7, scale=6.0)
    assert torch.autograd.gradcheck(lambda x: binary_row_losses(x, labels, gamma), (logits,))


@pytest.mark.parametrize("gamma", [0.0, 1.0, 2.0])
def test_binary_row_losses_stay_finite_for_extreme_float32_logits(gamma) -> None:
    z = torch.tensor([[-200.0, 200.0, 0.0], [200.0, -200.0, 90.0]], requires_grad=True)
    labels = torch.tensor([0, 0])
    rows = binary_row_losses(z, labels, gamma)
    rows.sum().backward()
    assert torch.isfinite(rows).all()
    assert z.grad is not None
    assert torch.isfinite(z.grad).all()


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0, 2.0])
@pytest.mark.parametrize(("rows", "classes"), [(1, 1), (6, 9), (40, 2100)])
def test_compiled_binary_row_losses_float32_against_float64(gamma, rows, classes) -> None:
    """float32 CPU logits take the compiled kernels (binary_kernels.py): row sums within a few
    float32 ulps of the float64 elementwise formula on the same inputs, gradients within 3e-6
    of them (|gradient| ≤ γ + 1), across 1,024-column blocks, with logits out to ±60, labels in
    the first and last columns and on both sides of a block boundary (the kernel sums the
    label's block as the two slices beside it), and a second backward through the same graph
    (which recomputes the spent slope table) equal to the first."""
    logits, labels, _, _ = random_case(rows * classes, rows, classes, scale=20.0)
    labels[0], labels[-1] = classes - 1, 0
    if classes > 2048:
        labels[1:5] = torch.tensor([1023, 1024, 2047, 2048])
    x = logits.detach().float().requires_grad_()
    weights = torch.rand(rows, dtype=torch.float64, generator=torch.Generator().manual_seed(rows))
    got = binary_row_losses(x, labels, gamma)
    (first,) = torch.autograd.grad((weights.float() * got).sum(), x, retain_graph=True)
    (second,) = torch.autograd.grad((weights.float() * got).sum(), x)
    x64 = x.detach().double().requires_grad_()
    want = reference_binary_stable(x64, labels, gamma)
    (want_grad,) = torch.autograd.grad((weights * want).sum(), x64)
    torch.testing.assert_close(got.double(), want.detach(), rtol=5e-7, atol=1e-6)
    torch.testing.assert_close(first.double(), want_grad, rtol=0, atol=3e-6)
    torch.testing.assert_close(second, first, rtol=0, atol=2e-7)


class _FullWidthOps(TorchDispatchMode):
    """Counts the ops that write ``numel`` elements, in place or not (views excluded)."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel, self.count = numel, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        viewed = func._schema.name in {"aten::detach", "aten::alias", "aten::view"}
        if isinstance(out, torch.Tensor) and out.numel() == self.numel and not viewed:
            self.count += 1
        return out


@pytest.mark.parametrize(("loss_type", "gamma"), [("sigmoid", 0.0), ("focal", 1.0), ("focal", 2.0)])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_class_balanced_row_weights_are_written_in_the_forward(loss_type, gamma, reduction):
    """The class-balanced sigmoid/focal loss tells the kernels the gradient its reduction sends
    each row (α_i / B): the backward then touches no (B, C) tensor, and the logits' gradient
    has the bits of the unfused composition (row sums, then α-weighted mean by autograd)."""
    from tailkit.plugins.losses.class_balanced import ClassBalancedLoss
    from tailkit.testing.batches import full_batch

    gen = torch.Generator().manual_seed(3)
    rows, classes = 37, 1500
    counts = torch.randint(1, 500, (classes,), generator=gen).double()
    labels = torch.randint(classes, (rows,), generator=gen)
    logits = 4 * torch.randn(rows, classes, generator=gen)
    loss = ClassBalancedLoss(loss_type=loss_type, gamma=gamma, beta=0.999, reduction=reduction)
    loss.setup(counts)

    x = logits.clone().requires_grad_()
    value = loss(full_batch(logits=x, labels=labels))
    ops = _FullWidthOps(x.numel())
    with ops:
        value.backward()
    assert ops.count == 0

    y = logits.clone().requires_grad_()
    alpha = loss.class_weights.float()[labels]
    total = (alpha * binary_row_losses(y, labels, gamma)).sum()
    want = total if reduction == "sum" else total / rows
    want.backward()
    assert torch.equal(value, want)
    assert torch.equal(x.grad, y.grad)


def test_an_unexpected_gradient_is_still_exact() -> None:
    """A row weight announced in the forward but not sent (here doubled) recomputes the slopes
    from the logits: the same bits as a forward that announced nothing."""
    gen = torch.Generator().manual_seed(5)
    logits = 5 * torch.randn(9, 300, generator=gen)
    labels = torch.randint(300, (9,), generator=gen)
    weights = torch.rand(9, generator=gen)
    grads = []
    for expected in (weights, None):
        x = logits.clone().requires_grad_()
        rows = binary_row_losses(x, labels, 1.0, expected_grad=expected)
        (2 * weights * rows).sum().backward()
        grads.append(x.grad)
    assert torch.equal(grads[0], grads[1])


def test_table_like_casts_once_and_again_after_a_change() -> None:
    module = torch.nn.Module()
    module.register_buffer("table", torch.tensor([1.0, 2.0], dtype=torch.float64))
    like = torch.zeros(1, dtype=torch.float32)
    first = table_like(module, "table", like)
    assert first.dtype == torch.float32
    assert table_like(module, "table", like) is first
    module.table.mul_(2.0)  # an in-place edit bumps the version counter
    assert table_like(module, "table", like).tolist() == [2.0, 4.0]
    module.table = torch.tensor([5.0], dtype=torch.float64)  # a new table (a new setup)
    assert table_like(module, "table", like).tolist() == [5.0]
    assert table_like(module, "table", like.double()).dtype == torch.float64


def memory_case(seed: int, rows: int = 6, slots: int = 4, dim: int = 3):
    gen = torch.Generator().manual_seed(seed)
    z = torch.randn(rows, dim, generator=gen, dtype=torch.float64) + 0.5
    positives = torch.randn(rows, slots, dim, generator=gen, dtype=torch.float64)
    valid = torch.rand(rows, slots, generator=gen) < 0.6
    valid[0] = False  # an anchor whose class has nothing stored yet
    alpha = torch.rand(rows, generator=gen, dtype=torch.float64) * 3
    return z.requires_grad_(), positives, valid, alpha


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_memory_pull_matches_pull_terms(seed) -> None:
    z, positives, valid, alpha = memory_case(seed)
    weights = torch.rand(z.shape[0], dtype=torch.float64)
    got = MemoryPull.apply(z, positives.clone(), valid, alpha)
    (got_grad,) = torch.autograd.grad((weights * got).sum(), z)
    want = pull_terms(z, positives, valid, alpha)
    (want_grad,) = torch.autograd.grad((weights * want).sum(), z)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-12, atol=1e-12)
    assert got[0].item() == 0.0


def test_memory_pull_gradcheck() -> None:
    z, positives, valid, alpha = memory_case(3)
    assert torch.autograd.gradcheck(
        lambda x: MemoryPull.apply(x, positives.clone(), valid, alpha), (z,)
    )


@pytest.mark.parametrize("labels", [[3, 1, 3, 3, 0, 1, 2], [5], [2, 2], [0, 1, 2], [4, 4, 4, 4]])
def test_same_class_pairs_are_the_off_diagonal_of_the_label_mask(labels) -> None:
    y = torch.tensor(labels)
    rows, cols, swap = same_class_pairs(y)
    mask = (y.unsqueeze(0) == y.unsqueeze(1)) & ~torch.eye(y.numel(), dtype=torch.bool)
    want = set(zip(*(t.tolist() for t in mask.nonzero(as_tuple=True)), strict=True))
    got = list(zip(rows.tolist(), cols.tolist(), strict=True))
    assert len(got) == len(set(got)) and set(got) == want
    assert torch.equal(rows[swap], cols) and torch.equal(cols[swap], rows)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batch_pull_matches_pull_terms(seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    z = (torch.randn(9, 3, generator=gen, dtype=torch.float64) + 0.5).requires_grad_()
    labels = torch.tensor([0, 1, 0, 2, 1, 0, 3, 1, 0])
    alpha = torch.rand(9, generator=gen, dtype=torch.float64) * 3
    weights = torch.rand(9, dtype=torch.float64)
    got = BatchPull.apply(z, same_class_pairs(labels), alpha)
    (got_grad,) = torch.autograd.grad((weights * got).sum(), z)
    valid = (labels.unsqueeze(0) == labels.unsqueeze(1)) & ~torch.eye(9, dtype=torch.bool)
    want = pull_terms(z, z, valid, alpha)
    (want_grad,) = torch.autograd.grad((weights * want).sum(), z)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got_grad, want_grad, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(
        lambda x: BatchPull.apply(x, same_class_pairs(labels), alpha), (z,)
    )


def dro_case(seed: int, coincide: bool = False):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.tensor([4, 1, 4, 0, 1, 4, 2])
    classes, owner = torch.unique(labels, return_inverse=True)
    z = torch.randn(7, 3, generator=gen, dtype=torch.float64) + 2.0
    prototypes = torch.randn(classes.numel(), 3, generator=gen, dtype=torch.float64) * 0.5 + 2.0
    if coincide:  # a class seen once whose prototype is its feature
        prototypes[owner[3]] = z[3]
    epsilon = torch.rand(6, generator=gen, dtype=torch.float64) * 2 - 0.5
    return z.requires_grad_(), labels, classes, owner, prototypes, epsilon.requires_grad_()


@pytest.mark.parametrize("temperature", [1.0, 0.3])
@pytest.mark.parametrize("coincide", [False, True])
def test_batch_prototype_dro_matches_dro_loss(temperature, coincide) -> None:
    z, labels, classes, owner, prototypes, epsilon = dro_case(0, coincide)
    got = BatchPrototypeDRO.apply(z, labels, prototypes, owner, epsilon, temperature)
    got_grads = torch.autograd.grad(got, (z, epsilon))
    want = dro_loss(z, labels, prototypes, classes, epsilon, temperature)
    want_grads = torch.autograd.grad(want, (z, epsilon))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    for g, w in zip(got_grads, want_grads, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12)


def test_batch_prototype_dro_gradcheck() -> None:
    z, labels, _, owner, prototypes, epsilon = dro_case(1)
    assert torch.autograd.gradcheck(
        lambda x, e: BatchPrototypeDRO.apply(x, labels, prototypes, owner, e, 0.5), (z, epsilon)
    )
