"""The encoder replayed from CUDA graphs (tailkit/training/cuda_graph.py): who is graphed, the
sample batches capture uses, and (on a CUDA device) that replay computes what eager does."""

from __future__ import annotations

import copy

import pytest
import torch

from tailkit.output.optim import RowSparseSGD
from tailkit.output.output_layer import OutputLayer
from tailkit.plugins.losses.softmax import SoftmaxCE
from tailkit.plugins.models.resnet import ResNet32
from tailkit.training.cuda_graph import GraphedEncoder, wants_graphs
from tailkit.training.loop import LoopConfig, _graph_samples, train

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _images(n: int, size: int = 16, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, size, size, 3), generator=g, dtype=torch.uint8)


def test_only_an_encoder_that_opts_in_on_cuda_is_graphed():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert wants_graphs(ResNet32((16, 16, 3)), cuda)
    assert not wants_graphs(ResNet32((16, 16, 3), cuda_graph=False), cuda)
    assert not wants_graphs(ResNet32((16, 16, 3)), cpu)
    assert not wants_graphs(torch.nn.Linear(4, 4), cuda)  # no promise, no graph


@pytest.mark.parametrize(
    ("rows", "batch", "sizes"), [(50, 16, [16, 2]), (48, 16, [16]), (10, 16, [10])]
)
def test_graph_samples_hold_each_batch_shape_of_an_epoch(rows, batch, sizes):
    x = _images(rows)
    samples = _graph_samples(
        x, LoopConfig("t", epochs=1, batch_size=batch), None, torch.device("cpu")
    )
    assert [s.shape[0] for s in samples] == sizes
    assert all(s.shape[1:] == x.shape[1:] and s.dtype == x.dtype for s in samples)


def test_graph_samples_are_transformed_with_a_generator_of_their_own():
    x = _images(40)
    before = x.clone()
    encoder = ResNet32((16, 16, 3))
    samples = _graph_samples(
        x, LoopConfig("t", epochs=1, batch_size=32), encoder.train_transform, torch.device("cpu")
    )
    g = torch.Generator().manual_seed(0)
    expected = [encoder.train_transform(x[:32], g), encoder.train_transform(x[:8], g)]
    assert all(torch.equal(a, b) for a, b in zip(samples, expected, strict=True))
    assert not torch.equal(samples[0], x[:32])  # cropped and flipped, as training batches are
    assert torch.equal(x, before)


def test_an_encoder_without_samples_runs_eagerly():
    encoder = ResNet32((16, 16, 3))
    x = _images(4)
    assert torch.equal(GraphedEncoder(encoder, [])(x), encoder(x))


# --- on a CUDA device ---------------------------------------------------------------------------


def _eager_and_graphed(batch_sizes):
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.manual_seed(0)
    eager = ResNet32((16, 16, 3), amp="off").cuda()
    graphed = copy.deepcopy(eager)
    buffers = {k: v.clone() for k, v in graphed.state_dict().items()}
    replay = GraphedEncoder(graphed, [_images(b, seed=9).cuda() for b in batch_sizes])
    for key, value in graphed.state_dict().items():  # capture's warm-up steps undone
        assert torch.equal(value, buffers[key]), key
    return eager, graphed, replay


@needs_cuda
def test_replay_computes_the_eager_forward_and_gradients():
    eager, graphed, replay = _eager_and_graphed([12, 5])
    for step, n in enumerate([12, 5, 12]):
        x = _images(n, seed=step).cuda()
        w = torch.randn(n, eager.out_dim, device="cuda")
        z_eager, z_replay = eager(x), replay(x)
        torch.testing.assert_close(z_replay, z_eager, rtol=1e-5, atol=1e-5)
        (z_eager * w).sum().backward()
        (z_replay * w).sum().backward()
        for (name, a), b in zip(eager.named_parameters(), graphed.parameters(), strict=True):
            torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5, msg=name)
            a.grad, b.grad = None, None
        for (name, a), b in zip(eager.named_buffers(), graphed.buffers(), strict=True):
            torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)  # BN statistics


@needs_cuda
def test_evaluation_and_other_shapes_run_the_eager_network():
    _, graphed, replay = _eager_and_graphed([8])
    x = _images(3).cuda()
    assert torch.equal(replay(x), graphed(x))  # a shape never captured
    graphed.eval()
    x = _images(8).cuda()
    assert torch.equal(replay(x), graphed(x))  # evaluation mode: running statistics


@needs_cuda
def test_the_loop_trains_the_same_network_graphed_or_eager():
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    g = torch.Generator().manual_seed(0)
    y = torch.randint(4, (70,), generator=g)
    x = _images(70, seed=3)
    results = []
    for cuda_graph in (False, True):
        torch.manual_seed(0)
        encoder = ResNet32((16, 16, 3), amp="off", cuda_graph=cuda_graph).cuda()
        loss = SoftmaxCE()
        layer = OutputLayer.for_loss(
            loss,
            4,
            encoder.out_dim,
            device=torch.device("cuda"),
            generator=torch.Generator().manual_seed(0),
        )
        train(
            cfg=LoopConfig("t", epochs=2, batch_size=32, eval_every=3),
            encoder=encoder,
            layer=layer,
            loss=loss,
            sampler=None,
            optimizer=RowSparseSGD(lr=0.05, momentum=0.9),
            x_train=x,
            y_train=y,
            x_val=x[:16],
            y_val=y[:16],
            class_counts=torch.bincount(y, minlength=4).double(),
        )
        results.append((layer.weight.detach().cpu(), encoder.state_dict()))
    (w_eager, s_eager), (w_graph, s_graph) = results
    torch.testing.assert_close(w_graph, w_eager, rtol=1e-4, atol=1e-5)
    for key, value in s_eager.items():
        torch.testing.assert_close(s_graph[key].cpu(), value.cpu(), rtol=1e-4, atol=1e-5, msg=key)
