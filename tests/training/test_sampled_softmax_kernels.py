"""The compiled float32 CPU path of the sampled softmax (sampled_softmax_kernels.py) against the
torch path it replaces, run in float64 on the same batch; its masking of accidental hits, its
NaN rule, its independence of the thread count; and the sorted-draws hit finder of the
output layer against the broadcast compare it replaces. The loss's own references (numpy,
TensorFlow's worked vectors, gradcheck) are in test_losses.py, which runs float32 through
these kernels too."""

from __future__ import annotations

import math

import numba
import pytest
import torch

from tailkit.output.output_layer import per_row_hits, shared_hits
from tailkit.plugins.losses.sampled_softmax import SampledSoftmax, _CompiledSampledSoftmax
from tailkit.testing.batches import sampled_batch


def _batch(rows: int, m: int, classes: int, shared: bool, seed: int, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(classes, (rows,), generator=gen)
    ids = torch.randint(classes, (m,) if shared else (rows, m), generator=gen)
    hits = (ids.unsqueeze(0) if shared else ids) == labels.unsqueeze(1)
    pos = (3 * torch.randn(rows, generator=gen)).to(dtype).requires_grad_()
    neg = (3 * torch.randn(rows, m, generator=gen)).to(dtype).requires_grad_()
    log_q = torch.log(0.1 * torch.rand(ids.shape, generator=gen) + 1e-3)
    return sampled_batch(
        labels=labels,
        pos_logits=pos,
        neg_logits=neg,
        neg_ids=ids,
        hits=hits,
        neg_log_q=log_q,
        pos_log_q=torch.log(0.1 * torch.rand(rows, generator=gen) + 1e-3),
        log_prior=torch.log(torch.rand(classes, generator=gen)),
    )


def _in(dtype: torch.dtype, batch):
    """The same batch with the logits as fresh leaves of ``dtype``."""
    pos = batch.pos_logits.detach().to(dtype).requires_grad_()
    neg = batch.neg_logits.detach().to(dtype).requires_grad_()
    fields = {
        name: getattr(batch, name)
        for name in ("labels", "neg_ids", "hits", "neg_log_q", "pos_log_q", "log_prior")
    }
    return sampled_batch(pos_logits=pos, neg_logits=neg, **fields)


def _value_and_grads(loss, batch):
    value = loss(batch)
    value.backward()
    return value.detach(), batch.pos_logits.grad, batch.neg_logits.grad


@pytest.mark.parametrize("weighting", ["importance", "constant", "relative", "self-normalized"])
@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize("positive_correction", [False, True])
def test_compiled_sampled_softmax_equals_the_torch_path(weighting, shared, positive_correction):
    batch = _batch(48, 37, 12, shared, seed=len(weighting) + 2 * shared + positive_correction)
    assert batch.hits.any() and not batch.hits.all()
    loss = SampledSoftmax(weighting=weighting, positive_correction=positive_correction)
    got = _value_and_grads(loss, _in(torch.float32, batch))
    want = _value_and_grads(loss, _in(torch.float64, batch))
    assert got[0].grad_fn is None
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.double(), w, rtol=2e-6, atol=1e-7)
    assert (got[2][batch.hits] == 0).all()  # a hit takes exactly no gradient


def _backward_names(value: torch.Tensor) -> set[str]:
    names, stack = set(), [value.grad_fn]
    while stack:
        node = stack.pop()
        if node is not None:
            names.add(type(node).__name__)
            stack.extend(next_node for next_node, _ in node.next_functions)
    return names


def test_the_compiled_path_is_the_one_float32_takes() -> None:
    batch = _in(torch.float32, _batch(4, 6, 5, True, seed=0))
    value = SampledSoftmax(reduction="sum")(batch)
    assert "_CompiledSampledSoftmaxBackward" in _backward_names(value)
    wide = SampledSoftmax(reduction="sum")(_in(torch.float64, batch))
    assert "_CompiledSampledSoftmaxBackward" not in _backward_names(wide)
    per_row = _CompiledSampledSoftmax.apply(
        batch.pos_logits,
        batch.neg_logits,
        (-(batch.neg_log_q + math.log(6))).reshape(1, -1).float(),
        batch.hits,
    )
    assert torch.equal(value.detach(), per_row.sum().detach())


def test_a_hit_far_above_the_rest_is_left_out_not_underflowed() -> None:
    """A hit's logit never sets the row's maximum: one 1,000 above the others (where e^(a − max)
    of every other term would underflow) gives the loss of the row without that entry."""
    batch = _in(torch.float32, _batch(3, 8, 50, False, seed=1))
    neg = batch.neg_logits.detach().clone()
    hits = torch.zeros_like(batch.hits)
    hits[1, 3] = True
    neg[1, 3] = 1000.0
    loss = SampledSoftmax(weighting="constant", reduction="sum")
    far = loss(sampled_batch(**{**_fields(batch), "neg_logits": neg, "hits": hits})).item()
    pos, wide = batch.pos_logits.detach().double(), neg.double()
    want = sum(
        torch.logsumexp(torch.cat([pos[i : i + 1], wide[i][~hits[i]]]), 0).item() - pos[i].item()
        for i in range(3)
    )
    assert far == pytest.approx(want, rel=1e-6)


def _fields(batch) -> dict:
    names = ("labels", "pos_logits", "neg_logits", "neg_ids", "hits", "neg_log_q", "pos_log_q")
    return {name: getattr(batch, name) for name in names}


def test_a_nan_logit_gives_a_nan_loss_unless_it_is_a_hit() -> None:
    batch = _in(torch.float32, _batch(2, 5, 50, False, seed=3))
    loss = SampledSoftmax(reduction="sum")
    neg = batch.neg_logits.detach().clone()
    neg[0, 2] = float("nan")
    hits = torch.zeros_like(batch.hits)
    fields = {**_fields(batch), "neg_logits": neg, "hits": hits}
    assert math.isnan(loss(sampled_batch(**fields)).item())
    hits[0, 2] = True
    assert math.isfinite(loss(sampled_batch(**fields)).item())
    pos = batch.pos_logits.detach().clone()
    pos[1] = float("nan")
    assert math.isnan(loss(sampled_batch(**{**_fields(batch), "pos_logits": pos})).item())


def test_compiled_sampled_softmax_does_not_depend_on_the_thread_count() -> None:
    batch = _batch(301, 257, 40, False, seed=4)
    before = numba.get_num_threads()
    results = []
    try:
        for threads in (1, numba.config.NUMBA_NUM_THREADS):
            numba.set_num_threads(threads)
            results.append(_value_and_grads(SampledSoftmax(), _in(torch.float32, batch)))
    finally:
        numba.set_num_threads(before)
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


@pytest.mark.parametrize(
    ("rows", "m", "classes"), [(200, 150, 30), (7, 5, 3), (1, 1, 1), (0, 4, 3), (5, 0, 3)]
)
def test_shared_hits_equal_the_broadcast_compare(rows, m, classes) -> None:
    gen = torch.Generator().manual_seed(rows + m)
    neg = torch.randint(classes, (m,), generator=gen)  # repeated draws included
    labels = torch.randint(classes, (rows,), generator=gen)
    want = neg.unsqueeze(0) == labels.unsqueeze(1)
    # int64 takes the compiled kernel, int32 the torch ops (the path of other devices)
    for got in (shared_hits(neg, labels), shared_hits(neg.int(), labels.int())):
        assert got.dtype == torch.bool and torch.equal(got, want)


@pytest.mark.parametrize(
    ("rows", "m", "classes"), [(200, 150, 30), (7, 5, 3), (0, 4, 3), (5, 0, 3)]
)
def test_per_row_hits_equal_the_broadcast_compare(rows, m, classes) -> None:
    gen = torch.Generator().manual_seed(rows + m)
    neg = torch.randint(classes, (rows, m), generator=gen)
    labels = torch.randint(classes, (rows,), generator=gen)
    want = neg == labels.unsqueeze(1)
    assert want.any() or rows * m < 10  # the cases hold hits
    # a transposed (non-contiguous) draw table as well
    for draws in (neg, neg.t().contiguous().t()):
        got = per_row_hits(draws, labels)
        assert got.dtype == torch.bool and torch.equal(got, want)
