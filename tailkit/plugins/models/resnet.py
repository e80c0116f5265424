"""ResNet-32 for CIFAR, as LDAM-DRW defines it (kaidic/LDAM-DRW, models/resnet_cifar.py).

A 3×3 stem of 16 channels, then 3 stages × 5 BasicBlocks of widths 16, 32, 64 (the second and
third stages start with stride 2), then global average pooling: a 64-d embedding. Shortcuts are
"option A" of He et al.: where a block halves the resolution and doubles the width, the
shortcut subsamples every second pixel and pads the new channels with zeros, so it has no
parameters. Convolutions are initialised Kaiming-normal (fan-in, gain √2), BatchNorm γ = 1,
β = 0. The classifier is the core's output layer (LDAM's cosine layer comes from its loss), so
the 0.46M parameters of the usual count are 463,504 here plus C·64 (+ C) in the output layer.

Inputs, per batch:

* uint8 (B, H, W, 3), decoded pixels channels last, as the ``pixels`` featurizer stores them:
  converted on the device to float, scaled by 1/255 and normalised by ``normalize_mean`` /
  ``normalize_std`` (the CIFAR-10 statistics LDAM-DRW uses, by default);
* float (B, 3, H, W), already normalised: used as it is (a float (B, H, W, 3) is read as
  pixel values in [0, 255], like uint8);
* (B, H·W·3), the same pixels flattened channels last (uint8, or float pixel values in
  [0, 255]): reshaped to (B, H, W, 3) using ``in_dim``.

``in_dim`` (positional, from the core) is the shape of one feature row: (H, W, 3), or its
product H·W·3 for square images. The network is fully convolutional and pooled, so it needs the
shape only to unflatten flat rows; any H, W divisible by 4 works.

On CUDA, the batch enters the convolutions in channels-last memory format (``channels_last``)
and runs under autocast (``amp``: bf16, or fp16 — the loop does no loss scaling, so bf16 is
the safe choice); the embedding is returned in float32. On CPU both are off: FP32 throughout
(performance rules: CPU bf16 is far slower). Training on CUDA replays the forward and
backward from CUDA graphs (``cuda_graph``, tailkit/training/cuda_graph.py): at B = 128 the
eager network spends its step launching ~600 tiny kernels (H200: 13.4 ms a step eager, 3.3 ms
replayed).

Training augmentation (``augment``, on by default) is the CIFAR pad-4 random crop and
horizontal flip of :mod:`tailkit.training.augment`; the loop applies it through
:meth:`ResNet32.train_transform` with its own checkpointed generator, to training batches
only: validation and evaluation see the images as they are.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from tailkit.components import Encoder
from tailkit.training.augment import random_crop_flip

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2023, 0.1994, 0.2010)
WIDTHS = (16, 32, 64)
BLOCKS_PER_STAGE = 5  # 6·5 + 2 = 32 layers
AMP_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def option_a_shortcut(x: torch.Tensor, planes: int) -> torch.Tensor:
    """Subsample by 2 and zero-pad the channels to ``planes`` (no parameters)."""
    extra = planes - x.shape[1]
    return F.pad(x[:, :, ::2, ::2], (0, 0, 0, 0, extra // 2, extra - extra // 2))


class BasicBlock(nn.Module):
    """conv3×3-BN-ReLU-conv3×3-BN, plus the (option A) shortcut, then ReLU."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.planes = planes
        self.downsample = stride != 1 or in_planes != planes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = option_a_shortcut(x, self.planes) if self.downsample else x
        return F.relu(out + shortcut)


def _image_shape(in_dim: int | Sequence[int]) -> tuple[int, int] | None:
    """(H, W) from the core's ``in_dim``: (H, W, 3), or H·W·3 for a square image; else None."""
    if isinstance(in_dim, Sequence) and not isinstance(in_dim, str):
        dims = tuple(int(d) for d in in_dim)
        if len(dims) != 3 or dims[2] != 3 or min(dims) < 1:
            raise ValueError(f"resnet32: in_dim must be (H, W, 3) for images, got {in_dim!r}")
        return dims[0], dims[1]
    side = math.isqrt(max(int(in_dim), 0) // 3)
    return (side, side) if side > 0 and 3 * side * side == int(in_dim) else None


class ResNet32(Encoder):
    """CIFAR ResNet-32 (LDAM-DRW): 3×5 BasicBlocks, widths 16/32/64, option-A shortcuts, 64-d.

    Takes uint8 (B, H, W, 3) pixels (normalised on the device with ``normalize_mean`` /
    ``normalize_std``) or normalised float (B, 3, H, W); ``augment`` applies the CIFAR pad-4
    crop + flip to training batches; ``channels_last``, ``amp`` and ``cuda_graph`` act on CUDA
    only.
    """

    #: What :func:`tailkit.testing.check_model` feeds this model: image batches, not (B, D) rows.
    input_kind: ClassVar[str] = "image"
    # Buffers registered in __init__.
    scale: torch.Tensor
    shift: torch.Tensor

    def __init__(
        self,
        in_dim: int | Sequence[int],
        /,
        *,
        # The option's type is what params.yaml gives (a list); the default is an immutable tuple.
        normalize_mean: list[float] = CIFAR10_MEAN,  # type: ignore[assignment]
        normalize_std: list[float] = CIFAR10_STD,  # type: ignore[assignment]
        augment: bool = True,
        channels_last: bool = True,
        amp: Literal["off", "bf16", "fp16"] = "bf16",
        cuda_graph: bool = True,
    ) -> None:
        super().__init__()
        for name, values in (("normalize_mean", normalize_mean), ("normalize_std", normalize_std)):
            if len(values) != 3 or any(
                isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
                for v in values
            ):
                raise ValueError(f"resnet32: {name} must be 3 numbers (R, G, B), got {values!r}")
        if any(v <= 0 for v in normalize_std):
            raise ValueError(f"resnet32: normalize_std must be positive, got {normalize_std!r}")
        self.image_shape = _image_shape(in_dim)
        self.augment = augment
        self.channels_last = channels_last
        self.amp = amp
        self.cuda_graph = cuda_graph  # read by the loop (tailkit/training/cuda_graph.py)
        mean = torch.tensor([float(v) for v in normalize_mean]).view(1, 3, 1, 1)
        std = torch.tensor([float(v) for v in normalize_std]).view(1, 3, 1, 1)
        # x/255 − mean over std as one multiply-add; buffers follow .to(device), not saved.
        self.register_buffer("scale", 1.0 / (255.0 * std), persistent=False)
        self.register_buffer("shift", -mean / std, persistent=False)

        self.conv1 = nn.Conv2d(3, WIDTHS[0], 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(WIDTHS[0])
        stages, in_planes = [], WIDTHS[0]
        for i, planes in enumerate(WIDTHS):
            blocks = []
            for j in range(BLOCKS_PER_STAGE):
                stride = 2 if i > 0 and j == 0 else 1
                blocks.append(BasicBlock(in_planes, planes, stride))
                in_planes = planes
            stages.append(nn.Sequential(*blocks))
        self.layer1, self.layer2, self.layer3 = stages
        self.out_dim = WIDTHS[-1]
        for m in self.modules():
            if isinstance(m, nn.Conv2d | nn.Linear):
                nn.init.kaiming_normal_(m.weight)

    def _pixels(self, x: torch.Tensor) -> torch.Tensor:
        """Flat (B, H·W·3) rows → (B, H, W, 3); other shapes pass through."""
        if x.dim() != 2:
            return x
        if self.image_shape is None:
            raise ValueError(
                f"resnet32: got flat rows of {x.shape[1]} values but in_dim gives no image "
                "shape; pass (H, W, 3) as in_dim or feed (B, H, W, 3) uint8 images"
            )
        h, w = self.image_shape
        if x.shape[1] != h * w * 3:
            raise ValueError(f"resnet32: rows of {x.shape[1]} values, expected {h}·{w}·3")
        return x.view(x.shape[0], h, w, 3)

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        """Any accepted input → normalised float (B, 3, H, W), a view of channels-last memory
        for pixel input."""
        x = self._pixels(x)
        if x.dim() != 4:
            raise ValueError(f"resnet32: expected an image batch, got shape {tuple(x.shape)}")
        if x.dtype == torch.uint8 or (x.shape[-1] == 3 and x.shape[1] != 3):
            if x.shape[-1] != 3:
                raise ValueError(f"resnet32: uint8 images must be (B, H, W, 3), got {x.shape}")
            return torch.addcmul(self.shift, x.permute(0, 3, 1, 2).float(), self.scale)
        if x.shape[1] != 3:
            raise ValueError(f"resnet32: float images must be (B, 3, H, W), got {x.shape}")
        return x.float()

    def train_transform(self, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """The training augmentation (pad-4 crop + flip) of a raw batch; the identity when
        ``augment`` is off. The loop calls it on training batches only."""
        if not self.augment:
            return x
        x = self._pixels(x)
        return random_crop_flip(x, generator, channels_last=x.shape[-1] == 3 and x.shape[1] != 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.normalize(x)
        cuda = x.is_cuda
        if cuda and self.channels_last:
            # cuDNN then runs every convolution NHWC (weights are converted per call: tiny here).
            x = x.contiguous(memory_format=torch.channels_last)
        else:
            x = x.contiguous()
        dtype = AMP_DTYPES.get(self.amp)
        enabled = cuda and dtype is not None
        with torch.autocast("cuda", dtype=dtype or torch.bfloat16, enabled=enabled):
            out = F.relu(self.bn1(self.conv1(x)))
            out = self.layer3(self.layer2(self.layer1(out)))
            z = out.mean(dim=(2, 3))
        return z.float()
