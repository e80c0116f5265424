"""Label-sharded collectives (tailkit/distributed): at W = 2 and 3 gloo processes on this CPU,
each against the single-process computation on the whole label range, in float64."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.distributed as dist
from spawn_world import run_world

from tailkit.distributed.ops import (
    gather_rows,
    pick,
    row_logsumexp,
    scale_gradient,
    sharded_cross_entropy,
    sum_over_ranks,
)
from tailkit.distributed.world import World, shard_range
from tailkit.evaluation.topk import chunk_topk, rank_topk
from tailkit.evaluation.topk_merge import merge_logsumexp, merge_topk
from tailkit.plugins.losses.fused_softmax import adjusted_cross_entropy

C, BLOCK, B = 13, 4, 6  # 4 blocks: at W = 2 the shards hold 8 and 5 labels


def _data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, C, generator=gen, dtype=torch.float64) * 3
    labels = torch.randint(0, C, (B,), generator=gen)
    return logits, labels


def _cross_entropy_matches_one_process(world: World) -> None:
    logits, labels = _data()
    gen = torch.Generator().manual_seed(1)
    offsets = torch.randn(C, generator=gen, dtype=torch.float64)
    shift = -torch.rand(B, generator=gen, dtype=torch.float64) * 2
    weights = torch.rand(B, generator=gen, dtype=torch.float64)
    start, stop = world.label_range(C, BLOCK)
    mine = logits[:, start:stop].clone().requires_grad_()
    loss = sharded_cross_entropy(
        mine, labels, start, world, offsets=offsets[start:stop], target_shift=shift
    )
    (loss * weights).sum().backward()
    whole = logits.clone().requires_grad_()
    ref = adjusted_cross_entropy(whole, labels, offsets=offsets, target_shift=shift)
    (ref * weights).sum().backward()
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mine.grad, whole.grad[:, start:stop], rtol=1e-12, atol=1e-12)
    # the value is the same bits on every rank: each runs the same loss downstream
    values = [torch.empty_like(loss) for _ in range(world.size)]
    dist.all_gather(values, loss.detach())
    assert all(torch.equal(v, values[0]) for v in values)


@pytest.mark.parametrize("size", [2, 3])
def test_sharded_cross_entropy_equals_one_process(tmp_path, size) -> None:
    run_world(tmp_path, _cross_entropy_matches_one_process, size)


def _pick_and_sums(world: World) -> None:
    logits, _ = _data(2)
    ids = torch.tensor([[0, 12, -1], [7, 8, 3], [-1, -1, -1], [4, 4, 11], [5, 6, 9], [1, 2, 10]])
    start, stop = world.label_range(C, BLOCK)
    mine = logits[:, start:stop].clone().requires_grad_()
    picked = pick(mine, ids, start, world)
    lse = row_logsumexp(mine, world)
    partial = mine.square().sum(dim=1)
    total = sum_over_ranks(partial, world)
    gen = torch.Generator().manual_seed(3)
    g1, g2, g3 = (torch.randn(s, generator=gen, dtype=torch.float64) for s in ((B, 3), B, B))
    ((picked * g1).sum() + (lse * g2).sum() + (total * g3).sum()).backward()

    whole = logits.clone().requires_grad_()
    padded = torch.cat([whole, whole.new_zeros(B, 1)], dim=1)  # id −1 reads the 0 column
    ref_pick = padded.gather(1, torch.where(ids < 0, C, ids))
    ref_lse = torch.logsumexp(whole, dim=1)
    ref_total = whole.square().sum(dim=1)
    ((ref_pick * g1).sum() + (ref_lse * g2).sum() + (ref_total * g3).sum()).backward()
    assert torch.equal(picked, ref_pick)  # one owner per entry: exact
    torch.testing.assert_close(lse, ref_lse, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(total, ref_total, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(mine.grad, whole.grad[:, start:stop], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("size", [2, 3])
def test_pick_logsumexp_and_sums_equal_one_process(tmp_path, size) -> None:
    run_world(tmp_path, _pick_and_sums, size)


def _gather(world: World) -> None:
    gen = torch.Generator().manual_seed(4)
    sizes = [3, 2, 4][: world.size]  # uneven: the last batch of an epoch
    everything = torch.randn(sum(sizes), 5, generator=gen, dtype=torch.float64)
    first = sum(sizes[: world.rank])
    rows = everything[first : first + sizes[world.rank]].clone().requires_grad_()
    gathered = gather_rows(rows, world)
    assert torch.equal(gathered, everything)
    # each rank's part of a loss on the gathered rows: the parts sum to A·Z
    weights = torch.randn(sum(sizes), 5, generator=gen, dtype=torch.float64)
    part = weights * (world.rank + 1) / (world.size * (world.size + 1) / 2)
    (gathered * part).sum().backward()
    torch.testing.assert_close(rows.grad, weights[first : first + sizes[world.rank]])
    # a replicated term, scaled by 1/W, reaches the rows once in all
    again = rows.detach().clone().requires_grad_()
    (scale_gradient(gather_rows(again, world), 1 / world.size) * weights).sum().backward()
    torch.testing.assert_close(again.grad, weights[first : first + sizes[world.rank]])


@pytest.mark.parametrize("size", [2, 3])
def test_gathered_rows_take_back_their_own_gradient(tmp_path, size) -> None:
    run_world(tmp_path, _gather, size)


def _topk(world: World) -> None:
    gen = torch.Generator().manual_seed(5)
    scores = (torch.randn(B, C, generator=gen) * 2).round() / 4  # ties within and across ranks
    start, stop = world.label_range(C, BLOCK)
    ids = torch.arange(start, stop)
    top, top_ids = chunk_topk(scores[:, start:stop], ids, 5)
    merged, merged_ids = merge_topk(top, top_ids, 5, world)
    ref, ref_ids = rank_topk(scores, torch.arange(C).expand(B, C), 5)
    assert torch.equal(merged, ref) and torch.equal(merged_ids, ref_ids)
    lse = torch.logsumexp(scores[:, start:stop].double(), dim=1)
    torch.testing.assert_close(
        merge_logsumexp(lse, world), torch.logsumexp(scores.double(), dim=1), rtol=1e-12, atol=0
    )


def test_top_k_merges_across_ranks_with_the_lower_id_winning_ties(tmp_path) -> None:
    run_world(tmp_path, _topk, 2)


def test_shards_are_whole_blocks_that_cover_every_label_once() -> None:
    for num_classes in (1, 5, 13, 4096 * 3 + 7):
        for size in (1, 2, 3, 8):
            ranges = [shard_range(num_classes, r, size, BLOCK) for r in range(size)]
            assert ranges[0][0] == 0 and ranges[-1][1] == num_classes
            assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
            assert all(lo % BLOCK == 0 for lo, _ in ranges)
    assert shard_range(C, 0, 2, BLOCK) == (0, 8) and shard_range(C, 1, 2, BLOCK) == (8, 13)
    assert shard_range(5, 0, 3, BLOCK) == (0, 0)  # fewer blocks than ranks: rank 0 owns none
    with pytest.raises(ValueError, match="rank 2 is not one of 2"):
        shard_range(C, 2, 2)
