"""CIFAR ResNet-32, its augmentation, SGD with momentum and the lr schedules (LDAM-DRW recipe)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from tailkit.errors import InvalidParameterError
from tailkit.output.optim import RowSparseAdagrad, RowSparseSGD
from tailkit.output.output_layer import OutputLayer
from tailkit.output.schedules import Schedule
from tailkit.plugins.losses.sampled_softmax import SampledSoftmax
from tailkit.plugins.losses.softmax import SoftmaxCE
from tailkit.plugins.models.resnet import CIFAR10_MEAN, CIFAR10_STD, ResNet32, option_a_shortcut
from tailkit.plugins.samplers.uniform import UniformSampler
from tailkit.registry import make_registry
from tailkit.training import augment
from tailkit.training.checkpoint import Checkpointer
from tailkit.training.loop import LoopConfig, train
from tailkit.validation import validate_options


def _images(n: int, size: int = 32, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, size, size, 3), generator=g, dtype=torch.uint8)


# --- the network --------------------------------------------------------------------------------


def _independent_count() -> int:
    """Parameters of LDAM-DRW's resnet32 without its classifier, counted from the architecture:
    convs have no bias, every BatchNorm has γ and β, option-A shortcuts have none."""
    conv = lambda cin, cout: 9 * cin * cout
    total = conv(3, 16) + 2 * 16  # stem
    cin = 16
    for width in (16, 32, 64):
        for _ in range(5):
            total += conv(cin, width) + conv(width, width) + 2 * (2 * width)
            cin = width
    return total


def test_resnet32_has_the_parameters_of_ldam_drw():
    model = ResNet32((32, 32, 3))
    n = sum(p.numel() for p in model.parameters())
    assert n == _independent_count() == 463_504
    # + the CIFAR-10 classifier (64·10 + 10) is the 464,154 ("0.46M") of the ResNet-32 tables
    assert n + 64 * 10 + 10 == 464_154
    assert len([m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]) == 31
    assert model.out_dim == 64


def test_option_a_shortcut_subsamples_and_zero_pads_channels():
    x = torch.randn(2, 16, 8, 8)
    out = option_a_shortcut(x, 32)
    assert out.shape == (2, 32, 4, 4)
    assert torch.equal(out[:, 8:24], x[:, :, ::2, ::2])
    assert not out[:, :8].any() and not out[:, 24:].any()
    block = ResNet32((32, 32, 3)).layer2[0]
    assert block.downsample and sum(1 for _ in block.parameters()) == 6  # 2 convs, 2 BNs


def test_kaiming_normal_init():
    conv = ResNet32((32, 32, 3)).layer3[4].conv2  # 64·64·9 weights
    std = conv.weight.std().item()
    assert std == pytest.approx(math.sqrt(2 / (64 * 9)), rel=0.03)
    assert abs(conv.weight.mean().item()) < 0.01


def test_output_shape_and_every_input_form_agree():
    torch.manual_seed(0)
    model = ResNet32((32, 32, 3)).eval()
    x = _images(4)
    z = model(x)
    assert z.shape == (4, 64) and z.dtype == torch.float32
    # pre-normalised float (B, 3, H, W) gives the same embeddings
    mean = torch.tensor(CIFAR10_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(CIFAR10_STD).view(1, 3, 1, 1)
    xf = (x.permute(0, 3, 1, 2).float() / 255 - mean) / std
    torch.testing.assert_close(model(xf), z, rtol=1e-5, atol=1e-5)
    # flat channels-last rows with in_dim H·W·3, and float pixel values
    flat = ResNet32(32 * 32 * 3).eval()
    flat.load_state_dict(model.state_dict())
    torch.testing.assert_close(flat(x.reshape(4, -1)), z)
    torch.testing.assert_close(model(x.float()), z)
    assert ResNet32((16, 16, 3))(_images(2, 16)).shape == (2, 64)
    with pytest.raises(ValueError, match="in_dim gives no image shape"):
        ResNet32(7)(torch.randn(2, 7))


def test_amp_and_channels_last_do_nothing_on_cpu():
    torch.manual_seed(0)
    a = ResNet32((32, 32, 3), amp="off", channels_last=False).eval()
    b = ResNet32((32, 32, 3), amp="fp16", channels_last=True).eval()
    b.load_state_dict(a.state_dict())
    x = _images(2)
    assert torch.equal(a(x), b(x))


def test_options_are_validated_by_the_registry():
    registry = make_registry()
    model = registry.build("models", {"name": "resnet32", "amp": "off"}, "m", (32, 32, 3))
    assert isinstance(model, ResNet32) and model.augment
    with pytest.raises(InvalidParameterError, match=r"m\.amp"):
        registry.build("models", {"name": "resnet32", "amp": "fp8"}, "m", (32, 32, 3))
    with pytest.raises(InvalidParameterError, match="normalize_std must be 3 numbers"):
        registry.build("models", {"name": "resnet32", "normalize_std": [1, 2]}, "m", 3072)


# --- augmentation -------------------------------------------------------------------------------


def _naive(x_hwc: torch.Tensor, p: augment.CropFlip, padding: int) -> torch.Tensor:
    """torchvision's RandomCrop(padding) + flip, one image at a time."""
    h, w = x_hwc.shape[1:3]
    out = []
    for i in range(x_hwc.shape[0]):
        padded = F.pad(x_hwc[i], (0, 0, padding, padding, padding, padding))
        crop = padded[p.dy[i] : p.dy[i] + h, p.dx[i] : p.dx[i] + w]
        out.append(crop.flip(1) if p.flip[i] else crop)
    return torch.stack(out)


def test_augmentation_matches_crop_and_flip_image_by_image():
    x = _images(64, size=8)
    p = augment.draw(64, 4, torch.Generator().manual_seed(3))
    out = augment.apply(x, p, 4, channels_last=True)
    assert out.dtype == torch.uint8 and out.shape == x.shape
    assert torch.equal(out, _naive(x, p, 4))
    chw = augment.apply(x.permute(0, 3, 1, 2).float(), p, 4, channels_last=False)
    assert torch.equal(chw, out.permute(0, 3, 1, 2).float())


def test_augmentation_is_deterministic_given_the_generator():
    x = _images(16)
    a = augment.random_crop_flip(x, torch.Generator().manual_seed(7))
    b = augment.random_crop_flip(x, torch.Generator().manual_seed(7))
    c = augment.random_crop_flip(x, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)
    layouts = augment.random_crop_flip(
        x.permute(0, 3, 1, 2).contiguous(), torch.Generator().manual_seed(7)
    )
    assert torch.equal(layouts, a.permute(0, 3, 1, 2))


def test_augmentation_statistics():
    n, size, padding = 4000, 6, 4
    p = augment.draw(n, padding, torch.Generator().manual_seed(0))
    assert abs(p.flip.float().mean().item() - 0.5) < 0.03
    for offsets in (p.dy, p.dx):
        assert offsets.min() == 0 and offsets.max() == 2 * padding
        counts = torch.bincount(offsets, minlength=2 * padding + 1).float()
        assert (counts / n - 1 / 9).abs().max() < 0.02  # uniform over the 9 offsets
    # distinct nonzero values: every output pixel is a source pixel or padding, never mixed
    x = (torch.arange(size * size * 3, dtype=torch.float32) + 1).view(1, size, size, 3)
    x = x.expand(n, -1, -1, -1)
    out = augment.apply(x, p, padding, channels_last=True)
    kept = out[out != 0]
    assert torch.isin(kept, x[0]).all()
    # the count of zero rows/columns is the crop's displacement past the border
    inside_rows = (out[..., 0] != 0).any(2).sum(1)
    assert torch.equal(inside_rows, size - (p.dy - padding).abs().clamp(max=size))
    flipped = out[p.flip & (p.dy == padding) & (p.dx == padding)]
    assert torch.equal(flipped, x[: flipped.shape[0]].flip(2))


def test_resnet_train_transform_follows_the_augment_option():
    x = _images(8)
    g = torch.Generator().manual_seed(0)
    assert ResNet32((32, 32, 3), augment=False).train_transform(x, g) is x
    out = ResNet32((32, 32, 3)).train_transform(x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape and out.dtype == torch.uint8 and not torch.equal(out, x)
    flat = ResNet32(3072).train_transform(x.reshape(8, -1), torch.Generator().manual_seed(0))
    assert torch.equal(flat, out)


# --- schedules ----------------------------------------------------------------------------------


def _ldam_lr(epoch: int, lr: float = 0.1) -> float:
    """LDAM-DRW cifar_train.py adjust_learning_rate, with its 1-based epoch."""
    e = epoch + 1
    if e <= 5:
        return lr * e / 5
    if e > 180:
        return lr * 0.0001
    if e > 160:
        return lr * 0.01
    return lr


def test_step_schedule_by_epoch_is_ldam_drw():
    s = Schedule(name="step", warmup_epochs=5, milestones=[160, 180], gamma=0.01, interval="epoch")
    spe = 7
    for epoch in range(200):
        for step in (epoch * spe, epoch * spe + spe - 1):
            assert 0.1 * s.factor(step, spe, 200 * spe) == pytest.approx(_ldam_lr(epoch))


def test_step_schedule_by_step():
    s = Schedule(name="step", warmup_epochs=5, milestones=[160, 180], gamma=0.01)
    spe = 10
    assert s.factor(0, spe) == pytest.approx(1 / 50)
    assert s.factor(24, spe) == pytest.approx(25 / 50)
    assert s.factor(49, spe) == 1.0
    assert s.factor(1599, spe) == 1.0
    assert s.factor(1600, spe) == pytest.approx(0.01)
    assert s.factor(1799, spe) == pytest.approx(0.01)
    assert s.factor(1800, spe) == pytest.approx(1e-4)


def test_cosine_schedule():
    s = Schedule(name="cosine")
    assert s.factor(0, 10, 100) == 1.0
    assert s.factor(50, 10, 100) == pytest.approx(0.5)
    assert s.factor(100, 10, 100) == pytest.approx(0.0, abs=1e-12)
    w = Schedule(name="cosine", warmup_epochs=5)
    assert w.factor(49, 10, 200) == 1.0  # the end of the warmup
    assert w.factor(50, 10, 200) == 1.0  # the cosine starts at 1
    for t in (60, 125, 170, 199):
        expected = 0.5 * (1 + math.cos(math.pi * (t - 50) / 150))
        assert w.factor(t, 10, 200) == pytest.approx(expected)
    assert w.factor(125, 10, 200) == pytest.approx(0.5)
    assert Schedule(name="constant", warmup_epochs=2).factor(5, 10) == pytest.approx(0.3)
    assert Schedule().factor(0, 10) == 1.0


def test_schedule_params_are_validated_with_their_key():
    key = "experiments.x.optimizer"
    good = {"name": "sgd", "lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 2e-4}
    good["schedule"] = {"name": "step", "warmup_epochs": 5, "milestones": [160, 180]}
    options = {k: v for k, v in good.items() if k != "name"}  # as build_optimizer does
    opt = RowSparseSGD(**validate_options(key, RowSparseSGD, options))
    assert opt.schedule.milestones == [160.0, 180.0]
    for bad in (
        {"name": "cosin"},
        {"name": "step", "milestones": [180, 160]},
        {"name": "cosine", "milestones": [10]},
        {"name": "step", "gamma": 0},
        {"name": "step", "warmup": 5},
        "cosine",
    ):
        spec = {"lr": 0.1, "schedule": bad}
        with pytest.raises(InvalidParameterError, match=rf"{key}\.schedule: got"):
            validate_options(key, RowSparseSGD, spec)
    with pytest.raises(InvalidParameterError, match=r"schedule\.milestones: .*increasing"):
        RowSparseSGD(schedule={"name": "step", "milestones": [3, 1]})
    with pytest.raises(InvalidParameterError, match="nesterov"):
        RowSparseSGD(nesterov=True)
    with pytest.raises(InvalidParameterError, match="not both"):
        RowSparseAdagrad(decay_steps=10.0, schedule={"name": "cosine"})


# --- SGD with momentum --------------------------------------------------------------------------


@pytest.mark.parametrize("nesterov", [False, True])
@pytest.mark.parametrize("cosine", [False, True])
def test_sgd_momentum_matches_torch_sgd(nesterov, cosine):
    """The output layer's dense update is torch.optim.SGD's, step for step (full-mode loss)."""
    c, d, steps = 7, 5, 6
    layer = OutputLayer(c, d, generator=torch.Generator().manual_seed(0))
    weight = torch.nn.Parameter(layer.weight.clone())
    bias = torch.nn.Parameter(layer.bias.clone())
    schedule = {"name": "cosine", "warmup_epochs": 1} if cosine else None
    opt = RowSparseSGD(
        lr=0.3, momentum=0.9, nesterov=nesterov, weight_decay=5e-4, schedule=schedule
    )
    opt.attach(layer, [], steps_per_epoch=2, total_steps=steps)
    ref = torch.optim.SGD(
        [weight, bias], lr=0.3, momentum=0.9, nesterov=nesterov, weight_decay=5e-4
    )
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        z, y = torch.randn(8, d, generator=g), torch.randint(c, (8,), generator=g)
        logits, rows = layer.full(z)
        F.cross_entropy(logits, y).backward()
        opt.step(rows, step)
        for group in ref.param_groups:
            group["lr"] = opt.learning_rate(step)
        ref.zero_grad()
        F.cross_entropy(torch.addmm(bias, z, weight.t()), y).backward()
        ref.step()
        torch.testing.assert_close(layer.weight, weight.detach(), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(layer.bias, bias.detach(), rtol=1e-6, atol=1e-7)
    if cosine:
        assert opt.learning_rate(steps) == pytest.approx(0.0, abs=1e-12)


def test_encoder_parameters_get_the_same_sgd():
    opt = RowSparseSGD(lr=0.2, momentum=0.9, nesterov=True, weight_decay=2e-4)
    opt.attach(OutputLayer(3, 2), [torch.nn.Parameter(torch.zeros(2))])
    assert opt.dense.defaults["momentum"] == 0.9 and opt.dense.defaults["nesterov"]
    assert opt.dense.defaults["weight_decay"] == 2e-4


def test_momentum_is_refused_with_a_sampled_loss():
    opt = RowSparseSGD(lr=0.1, momentum=0.9)
    with pytest.raises(InvalidParameterError, match=r"experiments\.t\.optimizer: momentum"):
        opt.attach(OutputLayer(3, 2), [], sparse=True, owner="experiments.t.optimizer")
    RowSparseSGD(lr=0.1).attach(OutputLayer(3, 2), [], sparse=True)  # plain SGD is exact
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(64, 4, generator=g), torch.randint(5, (64,), generator=g)
    sampler = UniformSampler()
    sampler.fit(None, y, 5)
    with pytest.raises(InvalidParameterError, match=r"experiments\.t\.optimizer"):
        train(
            cfg=LoopConfig("t", epochs=1, batch_size=16, negatives=2),
            encoder=torch.nn.Identity(),
            layer=OutputLayer(5, 4),
            loss=SampledSoftmax(),
            sampler=sampler,
            optimizer=RowSparseSGD(weight_decay=1e-4),
            x_train=x,
            y_train=y,
            x_val=x,
            y_val=y,
            class_counts=torch.bincount(y, minlength=5).double(),
        )


# --- training through the real loop -------------------------------------------------------------

C, SIZE = 4, 16
COLOURS = torch.tensor([[200, 40, 40], [40, 200, 40], [40, 40, 200], [200, 200, 40]])


def _colour_images(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Tiny uint8 images whose class is their mean colour, under heavy noise."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(C, (n,), generator=g)
    noise = torch.randint(-60, 61, (n, SIZE, SIZE, 3), generator=g)
    x = (COLOURS[y].view(n, 1, 1, 3) + noise).clamp(0, 255).to(torch.uint8)
    return x, y


class _Interrupt(Exception):
    pass


def _fit(checkpoint=None, crash_at=None, seen=None):
    torch.manual_seed(0)
    encoder = ResNet32((SIZE, SIZE, 3))
    if seen is not None:
        inner = encoder.train_transform

        def counting(x, g):
            seen.append(x.shape[0])
            return inner(x, g)

        encoder.train_transform = counting
    x, y = _colour_images(96, 0)
    xv, yv = _colour_images(48, 1)
    loss = SoftmaxCE()
    layer = OutputLayer.for_loss(
        loss, C, encoder.out_dim, generator=torch.Generator().manual_seed(0)
    )

    class Optimizer(RowSparseSGD):
        def step(self, rows, step):
            if step == crash_at:
                raise _Interrupt
            super().step(rows, step)

    optimizer = Optimizer(
        lr=0.02,
        momentum=0.9,
        nesterov=True,
        weight_decay=5e-4,
        schedule={"name": "cosine", "warmup_epochs": 1},
    )
    result = train(
        cfg=LoopConfig("t", epochs=6, batch_size=24, eval_every=4, checkpoint_every=5),
        encoder=encoder,
        layer=layer,
        loss=loss,
        sampler=None,
        optimizer=optimizer,
        x_train=x,
        y_train=y,
        x_val=xv,
        y_val=yv,
        class_counts=torch.bincount(y, minlength=C).double(),
        checkpoint=checkpoint,
    )
    return result, layer, encoder


def test_resnet32_trains_through_the_loop_and_resumes_exactly(tmp_path):
    seen: list[int] = []
    reference, ref_layer, ref_encoder = _fit(seen=seen)
    assert reference.steps == 24 and len(seen) == 24  # every training batch, and only those
    losses = [row["loss"] for row in reference.curve]
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] < losses[0]
    assert reference.curve[-1]["val_accuracy"] > 0.75  # chance is 0.25

    checkpoint = Checkpointer(tmp_path / "ckpt", key="k")
    with pytest.raises(_Interrupt):
        _fit(checkpoint, crash_at=17)
    assert checkpoint.load()["step"] == 15  # mid-epoch, mid-cosine, after the warmup
    resumed, layer, encoder = _fit(checkpoint)
    assert torch.equal(layer.weight, ref_layer.weight)
    assert torch.equal(layer.bias, ref_layer.bias)
    for key, value in ref_encoder.state_dict().items():
        assert torch.equal(encoder.state_dict()[key], value), key
    strip = [{k: v for k, v in row.items() if k != "seconds"} for row in reference.curve]
    assert [{k: v for k, v in r.items() if k != "seconds"} for r in resumed.curve] == strip
