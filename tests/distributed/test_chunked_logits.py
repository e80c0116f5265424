"""The chunked full step (tailkit/distributed/chunked_logits.py): every built-in loss that says
it is ``chunkable`` gives, on float32 logits scored a chunk at a time, the value and gradients
of the materialised loss computed in float64 (for the embeddings, the layer's rows and biases,
and the loss's own parameters), within 1e-5 relative, over two steps (ELM's memory and DRO-LT's
prototypes carry state): for C not a multiple of the chunk, a tiny C, one-label chunks and
multi-label rows; the training loop gives the materialised run's model; a label shard chunks
its own labels."""

from __future__ import annotations

import json
from typing import cast

import pytest
import torch
from click.testing import CliRunner
from spawn_world import run_world
from test_distributed_losses import SHARDABLE

from tailkit.cli import cli
from tailkit.components import FullBatch
from tailkit.distributed.chunked_logits import AUTO_WIDTH, ChunkedLogits, chunk_width
from tailkit.distributed.ops import gather_rows
from tailkit.distributed.world import ONE_PROCESS, World
from tailkit.output.optim import RowSparseAdagrad, RowSparseSGD
from tailkit.output.output_layer import OutputLayer
from tailkit.plugins.models.linear import Linear
from tailkit.registry import make_registry
from tailkit.training.loop import LoopConfig, log_prior_from_counts, train
from tailkit.training.plan import plan

B, D = 12, 5

# every shardable loss is chunkable too; beside them the one-vs-all family and more settings
CHUNKABLE = {
    **SHARDABLE,
    "softmax-sum": {"name": "softmax", "reduction": "sum"},
    "logit-adjusted-tau": {"name": "logit-adjusted", "tau": 1.5},
    "logit-adjusted-multilabel": {"name": "logit-adjusted"},
    "balanced-softmax-multilabel": {"name": "balanced-softmax"},
    "cb-sigmoid": {"name": "cb-focal", "loss_type": "sigmoid"},
    "cb-focal": {"name": "cb-focal", "loss_type": "focal", "gamma": 2.0},
    "cb-focal-multilabel": {"name": "cb-focal", "loss_type": "focal"},
    "cb-sigmoid-multilabel-sum": {"name": "cb-focal", "loss_type": "sigmoid", "reduction": "sum"},
    "decoupled": {"name": "decoupled"},
    "decoupled-hinge-multilabel": {"name": "decoupled", "margin_loss": "hinge"},
    "distribution-balanced-multilabel": {"name": "distribution-balanced"},
}


def _steps(classes: int, multilabel: bool, gen: torch.Generator) -> list:
    steps = []
    for _ in range(2):
        z = torch.randn(B, D, generator=gen, dtype=torch.float64) * 3
        labels = torch.randint(0, classes, (B,), generator=gen)
        labels[labels == 3] = 4 % classes
        if multilabel:
            second = (labels + 5) % classes
            second[second == 3] = 4 % classes
            second[second == labels] = -1
            labels = torch.stack([labels, second, torch.full_like(labels, -1)], 1)
            labels[0] = -1  # a row without labels
        steps.append((z, labels))
    return steps


def _layer(weight: torch.Tensor, bias: torch.Tensor, cosine: float | None) -> OutputLayer:
    layer = OutputLayer(weight.shape[0], weight.shape[1], cosine_scale=cosine)
    layer.weight, layer.bias = weight.clone(), bias.clone()
    return layer


def _materialised(layer: OutputLayer, z: torch.Tensor, common: dict, loss) -> tuple:
    z = z.clone().requires_grad_()
    logits, rows = layer.full(z)
    batch = FullBatch(logits=logits, embeddings=z, num_classes=layer.num_classes, **common)
    value = loss(batch)
    value.backward()
    bias = rows.bias.grad if rows.bias.grad is not None else torch.zeros_like(layer.bias)
    return value.detach(), z.grad, rows.weight.grad, bias


def _chunked(layer: OutputLayer, z: torch.Tensor, common: dict, loss, width: int) -> tuple:
    z = z.clone().requires_grad_()
    grad_w, grad_b = torch.zeros_like(layer.weight), torch.zeros_like(layer.bias)
    seen: list[tuple[int, int]] = []

    def collect(start: int, stop: int, gw: torch.Tensor, gb: torch.Tensor | None) -> None:
        seen.append((start, stop))
        grad_w[start:stop] = gw
        if gb is not None:
            grad_b[start:stop] = gb

    chunks = layer.chunked(z, width, collect)
    batch = FullBatch(
        logits=cast(torch.Tensor, chunks),
        embeddings=z,
        num_classes=layer.num_classes,
        **common,
    )
    value = loss(batch)
    value.backward()
    assert [s for s, _ in seen] == list(range(0, layer.num_classes, width)), "every chunk once"
    return value.detach(), z.grad, grad_w, grad_b


@pytest.mark.parametrize("name", CHUNKABLE)
@pytest.mark.parametrize(("classes", "width"), [(7, 3), (7, 1), (50, 16)])
def test_each_chunkable_loss_equals_the_float64_materialised_one(name, classes, width) -> None:
    registry = make_registry()
    gen = torch.Generator().manual_seed(classes * 31 + width)
    counts = torch.randint(1, 40, (classes,), generator=gen).double()
    counts[3] = 0  # balanced softmax: a label without rows, offset −inf
    weight = torch.randn(classes, D, generator=gen, dtype=torch.float64)
    bias = torch.randn(classes, generator=gen, dtype=torch.float64)
    losses = []
    for dtype in (torch.float64, torch.float32):
        torch.manual_seed(0)  # a loss that draws its init draws the same
        loss = registry.build("losses", CHUNKABLE[name], "test")
        loss.train_rows = 1000  # distribution-balanced's prior bias needs N
        loss.setup(counts)
        losses.append(loss.to(dtype))  # after setup: DRO-LT's ε is made there
    whole, chunked = losses
    assert chunked.chunkable
    reference = _layer(weight, bias, whole.cosine_scale)
    layer = _layer(weight.float(), bias.float(), chunked.cosine_scale)
    for epoch, (z, labels) in enumerate(_steps(classes, "multilabel" in name, gen)):
        common = {"labels": labels, "log_prior": log_prior_from_counts(counts), "epoch": epoch}
        expected = _materialised(reference, z, common, whole)
        common["log_prior"] = common["log_prior"].float()
        got = _chunked(layer, z.float(), common, chunked, width)
        where = f"{name}, C = {classes}, chunks of {width}, step {epoch}"
        for what, value, ref in zip(("value", "z", "weight", "bias"), got, expected, strict=True):
            scale = float(ref.abs().max()) if ref.numel() else 1.0
            torch.testing.assert_close(
                value.double(),
                ref,
                rtol=1e-5,
                atol=1e-5 * scale,
                msg=lambda m, what=what, where=where: f"{where}, {what}: {m}",
            )
        for (key, p), q in zip(chunked.named_parameters(), whole.parameters(), strict=True):
            assert (p.grad is None) == (q.grad is None), f"{where}: {key}"
            if p.grad is not None:
                scale = float(q.grad.abs().max())
                torch.testing.assert_close(p.grad.double(), q.grad, rtol=1e-5, atol=1e-5 * scale)
                p.grad, q.grad = None, None


def test_chunked_logits_are_reduced_once_a_step() -> None:
    layer = OutputLayer(10, 4, generator=torch.Generator().manual_seed(0))
    chunks = layer.chunked(torch.randn(3, 4), 4, lambda *_: None)
    labels = torch.tensor([1, 2, 9])
    chunks.softmax_stats(labels)
    with pytest.raises(RuntimeError, match="once per step"):
        chunks.softmax_stats(labels)


def test_a_chunk_never_exceeds_its_width_and_the_logits_match() -> None:
    """The statistics against torch's on the materialised logits, for large logits (the
    running maximum moves between chunks) and a label whose offset is −inf."""
    gen = torch.Generator().manual_seed(1)
    layer = OutputLayer(1000, 8, generator=gen)
    layer.bias = torch.linspace(-50, 80, 1000)
    z = torch.randn(6, 8, generator=gen) * 20
    offsets = torch.zeros(1000)
    offsets[7] = float("-inf")
    labels = torch.tensor([0, 999, 500, 8, 77, 640])
    lse, picked = layer.chunked(z, 128, lambda *_: None).softmax_stats(labels, offsets=offsets)
    logits = torch.addmm(layer.bias, z, layer.weight.t()).double() + offsets.double()
    torch.testing.assert_close(lse.double(), torch.logsumexp(logits, 1), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(picked.double(), logits.gather(1, labels[:, None]).squeeze(1))


@pytest.mark.parametrize("optimizer", ["adagrad", "sgd-momentum"])
def test_a_chunked_run_trains_the_materialised_model(optimizer) -> None:
    """Eight steps of the training loop, chunked against materialised: the same layer, up to
    the order of float additions."""
    gen = torch.Generator().manual_seed(2)
    classes, rows = 300, 256
    x = torch.randn(rows, D, generator=gen)
    y = torch.randint(0, classes, (rows,), generator=gen)
    counts = torch.bincount(y, minlength=classes).double()
    results = []
    for chunk in (None, 64):
        cfg = LoopConfig(experiment="t", epochs=1, batch_size=32, eval_every=100, label_chunk=chunk)
        layer = OutputLayer(classes, D, generator=torch.Generator().manual_seed(3))
        loss = make_registry().build("losses", {"name": "logit-adjusted"}, "t")
        opt = (
            RowSparseAdagrad(lr=0.5)
            if optimizer == "adagrad"
            else RowSparseSGD(lr=0.5, momentum=0.9, weight_decay=1e-3)
        )
        encoder = torch.nn.Linear(D, D)
        torch.nn.init.eye_(encoder.weight)
        torch.nn.init.zeros_(encoder.bias)
        encoder.out_dim = D  # type: ignore[assignment]
        train(
            cfg=cfg, encoder=encoder, layer=layer, loss=loss, sampler=None, optimizer=opt,
            x_train=x, y_train=y, x_val=x[:20], y_val=y[:20], class_counts=counts,
        )  # fmt: skip
        results.append((layer.weight, layer.bias, encoder.weight.detach()))
    for got, expected in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    assert not torch.equal(results[0][0], OutputLayer(classes, D).weight)


def _sharded_chunks(world: World) -> None:
    classes, block, width = 13, 4, 3
    gen = torch.Generator().manual_seed(0)
    counts = torch.randint(1, 40, (classes,), generator=gen).double()
    weight = torch.randn(classes, D, generator=gen, dtype=torch.float64)
    bias = torch.randn(classes, generator=gen, dtype=torch.float64)
    z = torch.randn(B, D, generator=gen, dtype=torch.float64)
    labels = torch.randint(0, classes, (B,), generator=gen)
    start, stop = world.label_range(classes, block)
    loss = make_registry().build("losses", {"name": "logit-adjusted"}, "test").double()
    loss.setup(counts)
    mine = torch.arange(B).tensor_split(world.size)[world.rank]
    shard = _layer(weight[start:stop], bias[start:stop], None)
    shard.label_start, shard.total_classes = start, classes
    own = z[mine].clone().requires_grad_()
    gathered = gather_rows(own, world)
    grad_w = torch.zeros_like(shard.weight)

    def collect(lo: int, hi: int, gw: torch.Tensor, gb: torch.Tensor | None) -> None:
        grad_w[lo:hi] = gw

    common = {"labels": labels, "log_prior": log_prior_from_counts(counts)}
    chunks = shard.chunked(gathered, width, collect, world)
    batch = FullBatch(
        logits=cast(torch.Tensor, chunks),
        embeddings=gathered,
        num_classes=classes,
        label_start=start,
        world=world,
        **common,
    )
    value = loss(batch)
    value.backward()
    expected = _materialised(_layer(weight, bias, None), z, common, loss)
    torch.testing.assert_close(value, expected[0])
    torch.testing.assert_close(own.grad, expected[1][mine])
    torch.testing.assert_close(grad_w, expected[2][start:stop])


@pytest.mark.slow
def test_a_label_shard_chunks_its_own_labels(tmp_path) -> None:
    run_world(tmp_path, _sharded_chunks, 2)


def test_one_process_is_the_world_of_one() -> None:
    _sharded_chunks(ONE_PROCESS)


def test_chunked_logits_describe_themselves_as_the_logits_would() -> None:
    chunks = ChunkedLogits(
        torch.zeros(3, 4, dtype=torch.float64),
        torch.zeros(10, 4, dtype=torch.float64),
        torch.zeros(10, dtype=torch.float64),
        width=4,
        apply_rows=lambda *_: None,
    )
    assert chunks.shape == (3, 10) and chunks.dtype == torch.float64 and chunks.ndim == 2
    assert chunks.bounds() == [(0, 4), (4, 8), (8, 10)]
    with pytest.raises(ValueError, match="at least one label"):
        ChunkedLogits(chunks.z, chunks.weight, chunks.bias, width=0, apply_rows=lambda *_: None)


def test_auto_chunks_once_the_logits_would_reach_two_to_the_27() -> None:
    assert chunk_width("auto", 512, 3875) is None  # the default study: 2 M logits, held
    assert chunk_width("auto", 512, 2**18) == AUTO_WIDTH  # 2^27 logits: chunked
    assert chunk_width("auto", 512, 2**18 - 1) is None
    assert chunk_width(None, 4096, 10**7) is None
    assert chunk_width(1000, 1, 1000) is None and chunk_width(1000, 1, 1001) == 1000


def test_the_plan_counts_one_chunk_instead_of_the_logits() -> None:
    c, d, b = 1_000_000, 128, 512
    held, chunked = plan(c, d, 1, batch_size=b, label_chunk=None), plan(c, d, 1, batch_size=b)
    assert held.label_chunk is None and chunked.label_chunk == AUTO_WIDTH
    assert held.activation_bytes == 2 * b * c * 4
    w = AUTO_WIDTH
    assert chunked.activation_bytes == (b * w + w * (d + 1) + b * d) * 4
    assert chunked.layer_bytes == held.layer_bytes
    # sampled mode is not chunked, whatever label_chunk says
    assert plan(c, d, 1, batch_size=b, negatives=64).label_chunk is None
    runner = CliRunner()
    text = runner.invoke(cli, ["plan", "--num-classes", "1000000", "--dim", "128"])
    assert "full softmax in chunks of 4,096 labels" in text.output, text.output
    none = runner.invoke(cli, ["plan", "--num-classes", "1000000", "--dim", "8", "--json",
                               "--label-chunk", "none"])  # fmt: skip
    assert json.loads(none.output)["label_chunk"] is None
    bad = runner.invoke(cli, ["plan", "--num-classes", "10", "--dim", "8", "--label-chunk", "0"])
    assert bad.exit_code == 2 and "--label-chunk" in bad.output


def test_a_loss_that_cannot_be_chunked_says_so_and_keeps_the_logits(capsys) -> None:
    gen = torch.Generator().manual_seed(4)
    classes, rows = 200, 64
    x = torch.randn(rows, D, generator=gen)
    y = torch.randint(0, classes, (rows,), generator=gen)
    loss = make_registry().build("losses", {"name": "multilabel-ce"}, "t")
    assert not loss.chunkable
    layer = OutputLayer.for_loss(loss, classes, D, generator=gen)
    before = layer.weight.clone()
    train(
        cfg=LoopConfig(experiment="su", epochs=1, batch_size=32, eval_every=100,
                       label_chunk=50),
        encoder=Linear(D), layer=layer, loss=loss, sampler=None,
        optimizer=RowSparseAdagrad(lr=0.1), x_train=x, y_train=y, x_val=x[:8], y_val=y[:8],
        class_counts=torch.bincount(y, minlength=classes).double(),
    )  # fmt: skip
    said = capsys.readouterr().out
    assert "experiments.su: loss MultilabelCE" in said and "Loss.chunkable" in said
    assert "32 × 200 logits" in said and "chunks of 50 labels" in said
    assert not torch.equal(layer.weight, before)


@pytest.mark.parametrize("name", ["softmax", "logit-adjusted", "ldam-drw", "cb-focal-multilabel"])
def test_bf16_chunk_gemms_stay_within_bf16s_rounding_of_the_float64_loss(name) -> None:
    """bf16 inputs (8 bits of mantissa), float32 accumulation and statistics: value and
    gradients within 3e-2 relative of the float64 materialised loss, where float32 is within
    1e-5 (above)."""
    classes, width = 50, 16
    gen = torch.Generator().manual_seed(11)
    counts = torch.randint(1, 40, (classes,), generator=gen).double()
    weight = torch.randn(classes, D, generator=gen, dtype=torch.float64)
    bias = torch.randn(classes, generator=gen, dtype=torch.float64)
    losses = []
    for dtype in (torch.float64, torch.float32):
        loss = make_registry().build("losses", CHUNKABLE[name], "test")
        loss.setup(counts)
        losses.append(loss.to(dtype))
    reference = _layer(weight, bias, losses[0].cosine_scale)
    layer = _layer(weight.float(), bias.float(), losses[1].cosine_scale)
    z, labels = _steps(classes, "multilabel" in name, gen)[0]
    common = {"labels": labels, "log_prior": log_prior_from_counts(counts)}
    expected = _materialised(reference, z, common, losses[0])
    z32 = z.float().requires_grad_()
    grad_w = torch.zeros_like(layer.weight)

    def collect(start: int, stop: int, gw: torch.Tensor, gb: torch.Tensor | None) -> None:
        grad_w[start:stop] = gw

    chunks = layer.chunked(z32, width, collect, matmul=torch.bfloat16)
    batch = FullBatch(logits=cast(torch.Tensor, chunks), embeddings=z32, num_classes=classes,
                      **{**common, "log_prior": common["log_prior"].float()})  # fmt: skip
    value = losses[1](batch)
    value.backward()
    for got, ref in ((value.detach(), expected[0]), (z32.grad, expected[1]), (grad_w, expected[2])):
        assert got.dtype == torch.float32
        scale = float(ref.abs().max())
        torch.testing.assert_close(got.double(), ref, rtol=3e-2, atol=3e-2 * scale)


def test_bf16_training_reaches_the_float32_accuracy() -> None:
    """Measured, not assumed: one epoch on 40 Gaussian classes in 16 dimensions, chunked in
    float32 and with bf16 GEMMs, from the same start: the same held-out accuracy within two
    points, and far above chance."""
    gen = torch.Generator().manual_seed(5)
    classes, dim, rows = 40, 16, 4000
    centres = torch.randn(classes, dim, generator=gen) * 2
    y = torch.randint(0, classes, (rows,), generator=gen)
    x = centres[y] + torch.randn(rows, dim, generator=gen)
    train_x, train_y, test_x, test_y = x[:3000], y[:3000], x[3000:], y[3000:]
    accuracy = {}
    for matmul in ("fp32", "bf16"):
        layer = OutputLayer(classes, dim, generator=torch.Generator().manual_seed(6))
        train(
            cfg=LoopConfig(experiment="t", epochs=1, batch_size=50, eval_every=1000,
                           label_chunk=8, matmul=matmul),
            encoder=Linear(dim), layer=layer,
            loss=make_registry().build("losses", {"name": "softmax"}, "t"), sampler=None,
            optimizer=RowSparseAdagrad(lr=0.5), x_train=train_x, y_train=train_y,
            x_val=test_x[:100], y_val=test_y[:100],
            class_counts=torch.bincount(train_y, minlength=classes).double(),
        )  # fmt: skip
        scores = torch.addmm(layer.bias, test_x, layer.weight.t())
        accuracy[matmul] = float((scores.argmax(1) == test_y).float().mean())
    assert accuracy["fp32"] > 0.5  # chance is 0.025
    assert abs(accuracy["bf16"] - accuracy["fp32"]) <= 0.02, accuracy


def test_bf16_on_a_step_that_is_not_chunked_says_it_runs_float32(capsys) -> None:
    x = torch.randn(64, D)
    y = torch.randint(0, 20, (64,))
    train(
        cfg=LoopConfig(experiment="held", epochs=1, batch_size=32, eval_every=100,
                       matmul="bf16"),
        encoder=Linear(D), layer=OutputLayer(20, D),
        loss=make_registry().build("losses", {"name": "softmax"}, "t"), sampler=None,
        optimizer=RowSparseAdagrad(lr=0.1), x_train=x, y_train=y, x_val=x[:8], y_val=y[:8],
        class_counts=torch.bincount(y, minlength=20).double(),
    )  # fmt: skip
    assert "experiments.held: train.matmul bf16 is built for the chunked full step only" in (
        capsys.readouterr().out
    )
