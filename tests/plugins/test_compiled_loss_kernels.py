"""The compiled float32 CPU paths of ELM's pull (batch and memory), DRO-LT's prototype term and
the multilabel cross-entropy against the torch paths they replace (run in float64), and their
independence of the thread count. The losses' own
references (numpy loops, worked vectors) are in test_embedding_losses.py and
test_multilabel_losses.py, which run each loss in float32 (these kernels) and float64."""

from __future__ import annotations

import numba
import numpy as np
import pytest
import torch

from tailkit.plugins.losses import dro_lt, elm
from tailkit.plugins.losses.multilabel import compiled_masked_lse
from tailkit.plugins.losses.prototypes import dro_loss
from tailkit.plugins.losses.pull import BatchPull, CompiledBatchPull, batch_pull, same_class_pairs
from tailkit.plugins.losses.pull_kernels import class_runs
from tailkit.registry import make_registry
from tailkit.testing.batches import full_batch


def zipf_labels(rows: int, classes: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    weights = torch.arange(1, classes + 1, dtype=torch.float64) ** -1.1
    return torch.multinomial(weights, rows, replacement=True, generator=gen)


def runs_of(labels: torch.Tensor) -> tuple:
    flat = labels.numpy()
    order = np.argsort(flat, kind="stable")
    return (order, *class_runs(flat[order]))


@pytest.mark.parametrize(("rows", "classes"), [(1, 1), (9, 3), (300, 40)])
def test_compiled_batch_pull_equals_the_torch_path(rows, classes) -> None:
    labels = zipf_labels(rows, classes, rows)
    gen = torch.Generator().manual_seed(1)
    z = torch.randn(rows, 24, generator=gen).relu()
    alpha = 3 * torch.rand(rows, generator=gen)
    weights = torch.rand(rows, generator=gen, dtype=torch.float64)
    x = z.clone().requires_grad_()
    got = CompiledBatchPull.apply(x, runs_of(labels), alpha)
    (weights.float() * got).sum().backward()
    x64 = z.double().requires_grad_()
    want = BatchPull.apply(x64, same_class_pairs(labels), alpha.double())
    (weights * want).sum().backward()
    assert x.grad is not None and x64.grad is not None
    torch.testing.assert_close(got.double(), want.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-5)


def test_a_pair_with_a_subnormal_weight_is_skipped_without_changing_the_gradient() -> None:
    """The pull's softmax puts nearly all of a row's weight on its farthest partner, so a close
    pair beside a far one gets a float32 gradient weight below the normal range (2^−126): the
    backward skips it (a subnormal operand stalls an FMA) and the gradient still equals the
    float64 reference. Class 0: rows 0 and 1 close, row 2 at squared distance ~95 from both
    (the pair (0, 1) weighs about 4e^−95); class 1: rows 3 and 4."""
    z = torch.zeros(5, 4)
    z[1] = torch.tensor([0.3, -0.2, 0.1, 0.0])
    z[2] = torch.full((4,), 4.87)
    z[3] = torch.tensor([-1.0, 0.5, 0.0, 0.2])
    z[4] = torch.tensor([-1.2, 0.4, 0.1, 0.2])
    labels = torch.tensor([0, 0, 0, 1, 1])
    alpha = torch.full((5,), 0.5)
    x = z.clone().requires_grad_()
    CompiledBatchPull.apply(x, runs_of(labels), alpha).sum().backward()
    x64 = z.double().requires_grad_()
    BatchPull.apply(x64, same_class_pairs(labels), alpha.double()).sum().backward()
    assert x.grad is not None and x64.grad is not None
    a = z.double() - z.double().mean(dim=0)
    v = (a[:3, None] - a[None, :3]).square().sum(dim=2) - 0.5
    v.fill_diagonal_(float("-inf"))
    omega = torch.logsumexp(torch.cat([torch.zeros(3, 1, dtype=v.dtype), v], dim=1), dim=1)
    p = torch.exp(v - omega[:, None])
    weight = torch.tensor(2 * (p[0, 1] + p[1, 0]).item(), dtype=torch.float32)
    assert 0 < weight < torch.finfo(torch.float32).tiny  # the pair the backward skips
    torch.testing.assert_close(x.grad.double(), x64.grad, rtol=1e-5, atol=1e-7)


def test_class_runs_count_the_same_pairs_as_the_pair_lists() -> None:
    labels = zipf_labels(200, 30, 0)
    order, run_start, run_size, _, total = runs_of(labels)
    rows, _, _ = same_class_pairs(labels)
    assert total - labels.numel() == rows.numel()  # Σ n² blocks less the diagonal = Σ n(n − 1)
    sorted_labels = labels.numpy()[order]
    for p in range(labels.numel()):
        run = sorted_labels[run_start[p] : run_start[p] + run_size[p]]
        assert (run == sorted_labels[p]).all()


def test_a_crowded_batch_takes_the_gemm_path_with_the_same_values() -> None:
    """Past a quarter of B² pairs (one class filling the batch) batch_pull hands over to the
    two-GEMM torch function; both give the same Ω."""
    labels = torch.zeros(64, dtype=torch.int64)
    z = torch.randn(64, 8, generator=torch.Generator().manual_seed(2))
    alpha = torch.full((64,), 4.0)
    crowded = batch_pull(z, labels, alpha)
    assert crowded.grad_fn is None or "Compiled" not in type(crowded.grad_fn).__name__
    direct = CompiledBatchPull.apply(z, runs_of(labels), alpha)
    torch.testing.assert_close(crowded, direct, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("temperature", [1.0, 0.07])
@pytest.mark.parametrize("training", [True, False])
def test_compiled_dro_term_equals_dro_loss(temperature, training) -> None:
    """DRO-LT's compiled term (float32) against :func:`dro_loss` in float64 on the same
    prototypes: value, the gradients for the features and for ε, and the prototype update. The
    batch has a class seen once (its prototype is its own feature: distance exactly 0) and a
    negative radius."""
    classes, rows, width = 300, 256, 24
    counts = torch.arange(classes, 0, -1, dtype=torch.float64)
    loss = make_registry().build("losses", {"name": "dro-lt", "temperature": temperature}, "t")
    loss.setup(counts)
    loss.train(training)
    gen = torch.Generator().manual_seed(5)
    labels = zipf_labels(rows, classes, 5)
    labels[-1] = classes - 1  # unseen and alone: its prototype is its feature this step
    z = torch.randn(rows, width, generator=gen).relu() + 0.5
    seen = torch.unique(labels)[::2]  # half the batch's classes have a stored prototype
    loss.prototypes = torch.zeros(classes, width)
    loss.prototypes[seen] = torch.randn(seen.numel(), width, generator=gen).relu() + 0.5
    loss.seen[seen] = True
    with torch.no_grad():
        loss.epsilon.copy_(torch.rand(classes, generator=gen) * 2 - 0.5)
    stored, marked = loss.prototypes.clone(), loss.seen.clone()

    present, inverse = torch.unique(labels, return_inverse=True)
    sums = torch.zeros(present.numel(), width, dtype=torch.float64).index_add_(
        0, inverse, z.double()
    )
    means = sums / torch.bincount(inverse).unsqueeze(1)
    current = torch.where(marked[present].unsqueeze(1), stored[present].double(), means)
    x64 = z.double().requires_grad_()
    eps64 = loss.epsilon.detach().double().requires_grad_()
    want = dro_loss(x64, labels, current, present, eps64, temperature)
    want.backward()

    x = z.clone().requires_grad_()
    got = loss._compiled_dro(x, labels)
    got.backward()
    assert x.grad is not None and loss.epsilon.grad is not None
    torch.testing.assert_close(got.double(), want.detach(), rtol=2e-5, atol=1e-6)
    scale = x64.grad.abs().max()
    torch.testing.assert_close(x.grad.double() / scale, x64.grad / scale, rtol=0, atol=2e-5)
    scale = eps64.grad.abs().max()  # a class's −G/T sums terms p − 1/n that nearly cancel
    torch.testing.assert_close(
        loss.epsilon.grad.double() / scale, eps64.grad / scale, rtol=0, atol=2e-5
    )
    if training:
        m = loss.prototype_momentum
        updated = torch.where(marked[present].unsqueeze(1), m * current + (1 - m) * means, means)
        torch.testing.assert_close(loss.prototypes[present].double(), updated, rtol=1e-6, atol=1e-6)
        assert loss.seen[present].all()
    else:
        assert torch.equal(loss.prototypes, stored) and torch.equal(loss.seen, marked)


def _step_outputs(loss, labels, z, logits, step: int) -> tuple[str, list[torch.Tensor]]:
    """One training step's loss node type and its bits: value, the logits' and embeddings'
    gradients, the loss's own parameters' gradients (then cleared) and its state."""
    value = loss(full_batch(labels=labels, logits=logits, embeddings=z, epoch=1, step=step))
    value.backward()
    out = [
        value.detach(),
        logits.grad,
        z.grad,
        *(p.grad.clone() for p in loss.parameters() if p.grad is not None),
        *(t.clone() for t in loss.state_dict().values()),
    ]
    loss.zero_grad(set_to_none=True)
    return type(value.grad_fn).__name__, out


def _one_node_equals_composition(run, module, node: str, monkeypatch) -> None:
    """``run()`` with the one-node path, then with it switched off in ``module``: the node is
    taken only the first time, and every bit agrees."""
    fused_kind, fused = run()
    monkeypatch.setattr(module, "compiled_path", lambda logits: False)
    composed_kind, composed = run()
    assert node in fused_kind and node not in composed_kind
    assert all(torch.equal(a, b) for a, b in zip(fused, composed, strict=True))


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("ce_weighting", ["none", "head-up"])
def test_one_node_dro_lt_equals_the_composition_it_replaces(
    ce_weighting, training, monkeypatch
) -> None:
    """A whole-label float32 CPU batch takes DRO-LT as one autograd node (_CompiledDROLT); the
    same loss built from the CE node, its (weighted) mean, ×λ and the DRO term's own node (what
    a label-sharded batch takes) gives the same bits: value, the logits', embeddings' and ε's
    gradients, and the prototype update (none in eval mode), over three steps."""

    def run() -> tuple[str, list[torch.Tensor]]:
        counts = torch.arange(50, 0, -1, dtype=torch.float64)
        spec = {"name": "dro-lt", "lam": 0.7, "temperature": 0.3, "ce_weighting": ce_weighting}
        loss = make_registry().build("losses", spec, "t")
        loss.setup(counts)
        loss.train(training)  # eval: the prototypes must stay as they are
        gen = torch.Generator().manual_seed(11)
        out = []
        for step in range(3):
            labels = torch.multinomial(counts, 120, replacement=True, generator=gen)
            z = torch.randn(120, 16, generator=gen).requires_grad_()
            logits = torch.randn(120, 50, generator=gen).requires_grad_()
            kind, bits = _step_outputs(loss, labels, z, logits, step)
            out += bits
        return kind, out

    _one_node_equals_composition(run, dro_lt, "CompiledDROLT", monkeypatch)


@pytest.mark.parametrize("positives", ["batch", "memory"])
def test_one_node_elm_equals_the_composition_it_replaces(positives, monkeypatch) -> None:
    """A whole-label float32 CPU batch takes ELM as one autograd node (_CompiledELM); the
    composition it replaces (the CE node and its mean, the pull node and its mean, ×λ, +)
    gives the same bits: value, the logits' and embeddings' gradients and the memory, over
    three steps of a Zipf batch (runs of one row and of many; memory slots filling up)."""

    def run() -> tuple[str, list[torch.Tensor]]:
        counts = torch.arange(60, 0, -1, dtype=torch.float64) ** 2
        spec = {"name": "elm", "lam": 0.3, "positives": positives, "memory_size": 3}
        loss = make_registry().build("losses", spec, "t")
        loss.setup(counts)
        gen = torch.Generator().manual_seed(12)
        out = []
        for step in range(3):
            labels = zipf_labels(150, 60, step)
            z = torch.randn(150, 16, generator=gen).relu().requires_grad_()
            logits = torch.randn(150, 60, generator=gen).requires_grad_()
            kind, bits = _step_outputs(loss, labels, z, logits, step)
            out += bits
        return kind, out

    _one_node_equals_composition(run, elm, "CompiledELM", monkeypatch)


def _steps(spec: dict, threads: int) -> list[torch.Tensor]:
    """Three training steps of a loss (float32, CPU) with ``threads`` numba threads: the loss
    values, the embedding gradients and the loss's state after each."""
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        classes, rows = 40, 96
        counts = torch.arange(classes, 0, -1, dtype=torch.float64) ** 2
        loss = make_registry().build("losses", spec, "test")
        loss.setup(counts)
        gen = torch.Generator().manual_seed(3)
        out = []
        for step in range(3):
            labels = torch.multinomial(counts, rows, replacement=True, generator=gen)
            z = torch.randn(rows, 16, generator=gen).relu().requires_grad_()
            logits = torch.randn(rows, classes, generator=gen).requires_grad_()
            value = loss(full_batch(labels=labels, logits=logits, embeddings=z, epoch=1, step=step))
            value.backward()
            assert z.grad is not None
            out += [value.detach(), z.grad, *(t.clone() for t in loss.state_dict().values())]
        return out
    finally:
        numba.set_num_threads(before)


@pytest.mark.parametrize(
    "spec",
    [
        {"name": "elm"},
        {"name": "elm", "positives": "memory", "memory_size": 4},
        {"name": "dro-lt"},
        {"name": "dro-lt", "temperature": 0.07},
    ],
)
def test_compiled_embedding_losses_do_not_depend_on_the_thread_count(spec) -> None:
    one = _steps(spec, 1)
    many = _steps(spec, numba.config.NUMBA_NUM_THREADS)
    assert all(torch.equal(a, b) for a, b in zip(one, many, strict=True))


@pytest.mark.parametrize("temperature", [1.0, 0.07])
@pytest.mark.parametrize("positives", ["batch", "memory"])
def test_compiled_elm_and_dro_lt_follow_their_float64_runs(temperature, positives) -> None:
    """The float32 run (ELM: compiled kernels) and the float64 run (torch) of the same three
    steps agree to float32 precision."""
    spec_elm = {"name": "elm", "positives": positives, "memory_size": 4}
    spec_dro = {"name": "dro-lt", "temperature": temperature}
    for spec in (spec_elm, spec_dro):
        classes, rows = 30, 80
        counts = torch.arange(classes, 0, -1, dtype=torch.float64) ** 2
        registry = make_registry()
        single, double = registry.build("losses", spec, "t"), registry.build("losses", spec, "t")
        single.setup(counts)
        double.setup(counts)
        double.double()
        gen = torch.Generator().manual_seed(4)
        for step in range(3):
            labels = torch.multinomial(counts, rows, replacement=True, generator=gen)
            z = torch.randn(rows, 12, generator=gen).relu()
            logits = torch.randn(rows, classes, generator=gen)
            grads = []
            values = []
            for loss, dtype in ((single, torch.float32), (double, torch.float64)):
                x = z.to(dtype).detach().clone().requires_grad_()
                f = logits.to(dtype).detach().clone().requires_grad_()
                value = loss(full_batch(labels=labels, logits=f, embeddings=x, epoch=1, step=step))
                value.backward()
                values.append(value.double())
                grads.append(x.grad.double())
            torch.testing.assert_close(values[0], values[1], rtol=1e-5, atol=1e-6)
            scale = grads[1].abs().max().clamp_min(1e-3)
            torch.testing.assert_close(grads[0] / scale, grads[1] / scale, rtol=0, atol=2e-5)


# --- Su's multilabel cross-entropy ------------------------------------------------------------


def _multilabel_case(seed: int, rows: int = 40, classes: int = 300, width: int = 6):
    """Scores with a few −∞ entries, and padded positive lists with an empty row and a positive
    whose score is −∞ (a label the row's shard does not hold)."""
    gen = torch.Generator().manual_seed(seed)
    scores = 4 * torch.randn(rows, classes, generator=gen)
    scores[3, :7] = -torch.inf
    ids = torch.stack([torch.randperm(classes, generator=gen)[:width] for _ in range(rows)])
    ids[torch.rand(rows, width, generator=gen) < 0.4] = -1
    ids[0] = -1  # no positive
    ids[3, 0] = 2  # a positive at −∞
    scores[2, ids[2].clamp(min=0)] += 30.0  # positives far above the negatives
    return scores, ids


@pytest.mark.parametrize("threshold", [True, False])
@pytest.mark.parametrize("seed", [0, 1])
def test_compiled_multilabel_ce_equals_the_torch_path(threshold, seed) -> None:
    scores, ids = _multilabel_case(seed)
    spec = {"name": "multilabel-ce", "threshold": threshold, "reduction": "sum"}
    loss = make_registry().build("losses", spec, "t")
    got_x = scores.clone().requires_grad_()
    got = loss(full_batch(labels=ids, logits=got_x))
    got.backward()
    want_x = scores.double().requires_grad_()  # float64: the torch path
    want = loss(full_batch(labels=ids, logits=want_x))
    want.backward()
    assert got_x.grad is not None and want_x.grad is not None
    torch.testing.assert_close(got.double(), want.detach(), rtol=2e-6, atol=1e-6)
    torch.testing.assert_close(got_x.grad.double(), want_x.grad, rtol=1e-5, atol=1e-7)
    assert (got_x.grad[3, 2:7] == 0).all()  # −∞ scores: exactly no gradient
    # a row without positives: the threshold class still pushes its negatives down; without
    # it, log(1 + Σ_N e^s · Σ_P e^(−s)) is log 1 with no gradient
    assert bool((got_x.grad[0] != 0).any()) == threshold


def test_compiled_masked_lse_of_single_labels_and_empty_sums() -> None:
    scores = torch.tensor([[0.0, 1.0, 2.0], [-torch.inf, -torch.inf, 3.0], [1.0, 1.0, 1.0]])
    ids = torch.tensor([[1], [2], [-1]])
    log_neg, log_pos = compiled_masked_lse(scores, ids)
    want_neg = torch.tensor([np.logaddexp(0.0, 2.0), -np.inf, 1.0 + np.log(3.0)])
    torch.testing.assert_close(log_neg.double(), want_neg.double())
    torch.testing.assert_close(log_pos.double(), torch.tensor([-1.0, -3.0, -np.inf]).double())


def test_compiled_multilabel_ce_keeps_a_diverged_row_nan() -> None:
    scores, ids = _multilabel_case(0, rows=4, classes=50)
    scores[1, 9] = float("nan")
    log_neg, _ = compiled_masked_lse(scores, ids)
    assert torch.isnan(log_neg[1]) and torch.isfinite(log_neg[[0, 2, 3]]).all()
    loss = make_registry().build("losses", {"name": "multilabel-ce"}, "t")
    assert torch.isnan(loss(full_batch(labels=ids, logits=scores)))


def test_compiled_multilabel_ce_does_not_depend_on_the_thread_count() -> None:
    scores, ids = _multilabel_case(2, rows=64, classes=5000)
    loss = make_registry().build("losses", {"name": "multilabel-ce"}, "t")
    before = numba.get_num_threads()
    outs = []
    try:
        for threads in (1, numba.config.NUMBA_NUM_THREADS):
            numba.set_num_threads(threads)
            x = scores.clone().requires_grad_()
            value = loss(full_batch(labels=ids, logits=x))
            value.backward()
            outs.append((value.detach(), x.grad))
    finally:
        numba.set_num_threads(before)
    (v1, g1), (v2, g2) = outs
    assert torch.equal(v1, v2) and torch.equal(g1, g2)
