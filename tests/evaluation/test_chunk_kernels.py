"""The compiled top-k + log-sum-exp pass against torch.topk and a float64 logsumexp."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from tailkit.evaluation.chunk_kernels import merge_chunk


def _fold(scores: torch.Tensor, k: int, chunk: int):
    rows = scores.shape[0]
    top = torch.full((rows, k), float("-inf"))
    ids = torch.full((rows, k), -1, dtype=torch.long)
    lse = torch.full((rows,), float("-inf"))
    for start in range(0, scores.shape[1], chunk):
        part = scores[:, start : start + chunk].contiguous()
        labels = np.arange(start, start + part.shape[1], dtype=np.int64)
        merge_chunk(part.numpy(), labels, top.numpy(), ids.numpy(), lse.numpy())
    return top, ids, lse


@pytest.mark.parametrize(("width", "chunk", "k"), [(1, 1, 1), (37, 5, 5), (5000, 999, 7)])
def test_topk_and_log_partition_equal_torch(width, chunk, k):
    g = torch.Generator().manual_seed(width)
    scores = torch.randn(9, width, generator=g) * 6
    scores[1] = scores[1].round()  # many ties: the lower label id must win
    top, ids, lse = _fold(scores, k, chunk)
    k = min(k, width)
    expected = torch.logsumexp(scores.double(), dim=1)
    torch.testing.assert_close(lse.double(), expected, rtol=2e-7, atol=0)
    # ties broken by label id: sort by (−score, id) in float64
    order = np.lexsort((np.arange(width)[None].repeat(9, 0), -scores.numpy()), axis=1)
    assert torch.equal(ids[:, :k], torch.from_numpy(order[:, :k]))
    assert torch.equal(top[:, :k], scores.gather(1, ids[:, :k]))


def test_edge_rows():
    scores = torch.tensor(
        [
            [float("-inf")] * 4,
            [float("-inf"), 2.0, float("-inf"), float("-inf")],
            [1.0, float("nan"), 3.0, 0.0],
            [200.0, -200.0, 0.0, 199.0],
        ]
    )
    _, ids, lse = _fold(scores, 2, 3)
    assert lse[0] == float("-inf") and lse[1] == 2.0
    assert torch.isnan(lse[2])
    assert ids[1].tolist() == [1, 0]  # the finite label first, then the first −inf one
    assert ids[2].tolist() == [2, 0]  # NaN never ranks
    assert lse[3].item() == pytest.approx(200.0 + np.log1p(np.exp(-1.0)), abs=1e-5)


def test_a_rows_values_do_not_depend_on_the_rows_beside_it():
    g = torch.Generator().manual_seed(3)
    scores = torch.randn(50, 3000, generator=g) * 4
    whole = _fold(scores, 5, 700)
    for lo, hi in ((0, 1), (7, 31), (31, 50)):
        part = _fold(scores[lo:hi], 5, 700)
        for a, b in zip(whole, part, strict=True):
            assert torch.equal(a[lo:hi], b)
