"""The standard CIFAR training augmentation, batched on the device.

``RandomCrop(32, padding=4)`` + ``RandomHorizontalFlip()`` as torchvision applies them image by
image (LDAM-DRW, ELM, DRO-LT; algorithms.md): pad every side with ``padding`` zeros, cut an
H × W window at a uniformly drawn offset in [0, 2·padding] on each axis, and mirror it left-right
with probability ½. Here the whole batch is done by one gather: per image the source row and
column of every output pixel are computed from its offsets (columns reversed when it is
flipped), so there is no per-image Python loop and the batch never leaves the device.

All draws come from the ``torch.Generator`` passed in (on the batch's device), so a seeded
generator gives the same crops and flips, and a checkpointed generator state resumes them.

Zero padding means black on uint8 pixels, as torchvision pads the decoded image; on a batch
already normalised it is the mean pixel instead, so augment before normalising.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass
class CropFlip:
    """Per image: the crop's top-left offsets in the padded image and whether it is flipped."""

    dy: torch.Tensor  # (B,) int64 in [0, 2·padding]
    dx: torch.Tensor  # (B,) int64 in [0, 2·padding]
    flip: torch.Tensor  # (B,) bool


def draw(
    batch: int,
    padding: int,
    generator: torch.Generator,
    *,
    flip: bool = True,
) -> CropFlip:
    """Draw offsets and flips for ``batch`` images on the generator's device."""
    device = generator.device
    offsets = torch.randint(
        0, 2 * padding + 1, (2, batch), generator=generator, device=device, dtype=torch.long
    )
    flips = (
        torch.rand(batch, generator=generator, device=device) < 0.5
        if flip
        else torch.zeros(batch, dtype=torch.bool, device=device)
    )
    return CropFlip(offsets[0], offsets[1], flips)


def apply(x: torch.Tensor, params: CropFlip, padding: int, *, channels_last: bool) -> torch.Tensor:
    """Crop-and-flip ``x`` as ``params`` say; same shape, dtype and layout as ``x``.

    ``channels_last``: ``x`` is (B, H, W, C) (decoded pixels); otherwise (B, C, H, W).
    """
    hwc = x if channels_last else x.permute(0, 2, 3, 1)
    b, h, w, _ = hwc.shape
    padded = F.pad(hwc, (0, 0, padding, padding, padding, padding))  # H and W, not C
    rows = params.dy.unsqueeze(1) + torch.arange(h, device=x.device)  # (B, H)
    ar = torch.arange(w, device=x.device)
    cols = params.dx.unsqueeze(1) + torch.where(params.flip.unsqueeze(1), w - 1 - ar, ar)
    batch = torch.arange(b, device=x.device).view(b, 1, 1)
    out = padded[batch, rows.unsqueeze(2), cols.unsqueeze(1)]  # (B, H, W, C)
    return out if channels_last else out.permute(0, 3, 1, 2).contiguous()


def random_crop_flip(
    x: torch.Tensor,
    generator: torch.Generator,
    *,
    padding: int = 4,
    flip: bool = True,
    channels_last: bool | None = None,
) -> torch.Tensor:
    """Pad ``padding`` zeros, random crop back to H × W, random horizontal flip; batched.

    ``x`` is uint8 or float, (B, H, W, 3) or (B, 3, H, W); ``channels_last=None`` takes a last
    dimension of 3 (and a second one that is not) to mean (B, H, W, 3).
    """
    if x.dim() != 4:
        raise ValueError(f"augment: expected a 4-D image batch, got shape {tuple(x.shape)}")
    if channels_last is None:
        channels_last = x.shape[-1] == 3 and x.shape[1] != 3
    params = draw(x.shape[0], padding, generator, flip=flip)
    return apply(x, params, padding, channels_last=channels_last)
