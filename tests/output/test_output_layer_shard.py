"""A label shard's initial rows are the whole layer's rows, drawn without the whole layer."""

from __future__ import annotations

import pytest
import torch

from tailkit.output.output_layer import OutputLayer


@pytest.mark.parametrize(
    ("classes", "dim", "start", "stop"),
    [(13, 4, 0, 8), (13, 4, 8, 13), (13, 4, 5, 6), (70_001, 32, 4096 * 9, 70_001),
     (300_000, 8, 1 << 17, 1 << 18), (10, 3, 10, 10)],
)  # fmt: skip
def test_a_shard_draws_the_whole_layers_bits_for_its_rows(classes, dim, start, stop) -> None:
    whole = OutputLayer(classes, dim, generator=torch.Generator().manual_seed(3), initial_bias=0.5)
    shard = OutputLayer(
        classes, dim, generator=torch.Generator().manual_seed(3), initial_bias=0.5,
        rows=(start, stop),
    )  # fmt: skip
    assert torch.equal(shard.weight, whole.weight[start:stop])
    assert torch.equal(shard.bias, whole.bias[start:stop])
    assert (shard.label_start, shard.num_classes, shard.total_classes) == (
        start, stop - start, classes)  # fmt: skip
    assert shard.is_shard == (stop - start != classes)


def test_the_draw_does_not_depend_on_the_thread_count() -> None:
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = OutputLayer(
            50_000, 16, generator=torch.Generator().manual_seed(1), rows=(40_000, 50_000)
        )
        torch.set_num_threads(max(threads, 2))
        many = OutputLayer(50_000, 16, generator=torch.Generator().manual_seed(1))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one.weight, many.weight[40_000:])
