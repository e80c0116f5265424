"""The CUDA side of the paths whose float32 CPU side runs compiled kernels: the training loop
(full softmax and long-tail losses, sampled softmax with uniform negatives), the
tree sampler's draws and log q, prediction with the tree's per-row correction, the sampled
softmax and the touched-rows Adagrad. Each runs on the GPU and is held to the CPU's result
(tolerances of float32 with a different summation order), so a kernel-only CPU path cannot
hide a device bug. Skipped without a CUDA device; they ran on a lent H200 (session 22).
"""

from __future__ import annotations

import pytest
import torch
from test_training import D, _run

from tailkit.evaluation import predict as predict_module
from tailkit.evaluation.correction import PredictionContext
from tailkit.evaluation.predict import predict
from tailkit.output.output_layer import OutputLayer
from tailkit.output.sparse_rows import apply_row_adagrad
from tailkit.plugins.losses.negative_sampling import NegativeSampling
from tailkit.plugins.losses.sampled_softmax import SampledSoftmax
from tailkit.plugins.models.linear import Linear
from tailkit.plugins.models.mlp import MLP
from tailkit.plugins.samplers.uniform import UniformSampler
from tailkit.registry import make_registry
from tailkit.testing.batches import sampled_batch
from tailkit.testing.trees import random_tree

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

CUDA = torch.device("cuda")


@pytest.mark.parametrize(
    "spec",
    [
        {"name": "softmax"},
        {"name": "logit-adjusted"},
        {"name": "ldam", "drw_epoch": 1},
        {"name": "cb-focal"},
        {"name": "elm", "lam": 0.1, "alpha_power": 0.5},
        {"name": "dro-lt"},
    ],
    ids=lambda spec: spec["name"],
)
def test_full_softmax_losses_train_on_the_gpu(spec):
    torch.manual_seed(0)
    loss = make_registry().build("losses", spec, "test")
    result, layer = _run(loss, encoder=MLP(D, hidden=[32], dim=16), device=CUDA)
    assert layer.weight.device.type == "cuda"
    assert result.curve[-1]["val_accuracy"] > 0.9, result.curve[-1]


@pytest.mark.parametrize("shared", [True, False])
def test_sampled_softmax_trains_on_the_gpu_with_uniform_negatives(shared):
    result, layer = _run(SampledSoftmax(), UniformSampler(shared=shared), negatives=6, device=CUDA)
    assert layer.weight.device.type == layer.bias.device.type == "cuda"
    assert result.curve[-1]["val_accuracy"] > 0.9, result.curve[-1]


def test_tree_sampler_draws_on_the_gpu_with_the_cpu_log_q():
    sampler = random_tree(1024, 6, k=4, seed=0)  # every leaf a label
    x = torch.randn(64, 6, generator=torch.Generator().manual_seed(1))
    y = torch.randint(1024, (64,), generator=torch.Generator().manual_seed(2))
    cpu_ids = torch.randint(1024, (64, 9), generator=torch.Generator().manual_seed(3))
    want = sampler.log_prob(x, cpu_ids)
    gpu = sampler.to(CUDA)
    ids, log_q = gpu.sample(x.to(CUDA), y.to(CUDA), 32, torch.Generator(CUDA).manual_seed(0))
    assert ids.device.type == log_q.device.type == "cuda"
    assert ids.min() >= 0 and ids.max() < 1024
    torch.testing.assert_close(log_q, gpu.log_prob(x.to(CUDA), ids), rtol=0, atol=1e-5)
    got = gpu.log_prob(x.to(CUDA), cpu_ids.to(CUDA)).cpu()
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


def test_tree_corrected_prediction_on_the_gpu_equals_the_cpu(monkeypatch):
    num_classes, rows = 5000, 40
    sampler = random_tree(num_classes, 6, k=4, seed=0)
    encoder = Linear(6)
    bias = torch.randn(num_classes, generator=torch.Generator().manual_seed(1))
    x = torch.randn(rows, 6, generator=torch.Generator().manual_seed(2))
    labels = torch.randint(num_classes, (rows,), generator=torch.Generator().manual_seed(3))
    prior = torch.zeros(num_classes)
    # keep the GPU's chunks as narrow as asked (16 rows × 1,500 labels), so that chunks which
    # split subtrees run there too instead of one widened chunk
    monkeypatch.setattr(predict_module, "GPU_CHUNK_SCORES", 16 * 1500)

    def run(device):
        # drawn on the CPU whatever the device (OutputLayer), so both runs hold the same bits
        layer = OutputLayer(
            num_classes, 6, device=device, generator=torch.Generator().manual_seed(0)
        )
        layer.bias.copy_(bias)
        ctx = PredictionContext(log_prior=prior.to(device), sampler=sampler.to(device))
        got, raw = predict(
            encoder.to(device),
            layer,
            NegativeSampling(),
            ctx,
            x,
            labels,
            k=5,
            batch_size=16,
            label_chunk=1500,
        )
        return got, raw

    cpu, _ = run(torch.device("cpu"))
    gpu, _ = run(CUDA)
    assert gpu.top_scores.device.type == "cuda"
    torch.testing.assert_close(gpu.top_scores.cpu(), cpu.top_scores, rtol=0, atol=1e-4)
    torch.testing.assert_close(gpu.true_score.cpu(), cpu.true_score, rtol=0, atol=1e-4)
    torch.testing.assert_close(gpu.log_partition.cpu(), cpu.log_partition, rtol=0, atol=1e-4)
    gap = (cpu.top_scores[:, :-1] - cpu.top_scores[:, 1:]).min(dim=1).values > 1e-3
    assert gap.sum() > rows // 2
    assert torch.equal(gpu.topk.cpu()[gap], cpu.topk[gap])


@pytest.mark.parametrize("shared", [True, False])
def test_sampled_softmax_on_the_gpu_equals_the_compiled_cpu_kernels(shared):
    gen = torch.Generator().manual_seed(int(shared))
    rows, m, classes = 64, 48, 20
    labels = torch.randint(classes, (rows,), generator=gen)
    ids = torch.randint(classes, (m,) if shared else (rows, m), generator=gen)
    hits = (ids.unsqueeze(0) if shared else ids) == labels.unsqueeze(1)
    pos = 3 * torch.randn(rows, generator=gen)
    neg = 3 * torch.randn(rows, m, generator=gen)
    log_q = torch.log(0.1 * torch.rand(ids.shape, generator=gen) + 1e-3)
    pos_log_q = torch.log(0.1 * torch.rand(rows, generator=gen) + 1e-3)
    prior = torch.log(torch.rand(classes, generator=gen))

    def value_and_grads(device):
        p = pos.to(device).requires_grad_()
        n = neg.to(device).requires_grad_()
        batch = sampled_batch(
            labels=labels.to(device),
            pos_logits=p,
            neg_logits=n,
            neg_ids=ids.to(device),
            hits=hits.to(device),
            neg_log_q=log_q.to(device),
            pos_log_q=pos_log_q.to(device),
            log_prior=prior.to(device),
        )
        value = SampledSoftmax(positive_correction=True)(batch)
        value.backward()
        return [t.detach().cpu() for t in (value, p.grad, n.grad)]

    for got, want in zip(value_and_grads(CUDA), value_and_grads("cpu"), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_touched_rows_adagrad_on_the_gpu_equals_the_compiled_cpu_kernel():
    gen = torch.Generator().manual_seed(0)
    table = torch.randn(500, 32, generator=gen)
    acc = torch.rand(500, 32, generator=gen)
    ids = torch.randperm(500, generator=gen)[:120]
    grad = torch.randn(120, 32, generator=gen)
    want_table, want_acc = table.clone(), acc.clone()
    apply_row_adagrad(want_table, want_acc, ids, grad, 0.05, 1e-8)
    got_table, got_acc = table.to(CUDA), acc.to(CUDA)
    apply_row_adagrad(got_table, got_acc, ids.to(CUDA), grad.to(CUDA), 0.05, 1e-8)
    torch.testing.assert_close(got_acc.cpu(), want_acc, rtol=1e-6, atol=0)
    torch.testing.assert_close(got_table.cpu(), want_table, rtol=1e-6, atol=1e-7)
