"""Pixels for CNN training: uint8 (N, H, W, 3) images, channels last, never converted to float.

Decoded images (CIFAR's (N, 32, 32, 3)) pass through as they are: normalisation and
augmentation belong to the model's input pipeline, and uint8 keeps the feature cache at a
quarter of float32's size. Image files (an (N,) array of paths, as ImageNet-LT gives) are decoded
with Pillow, converted to RGB and brought to ``size`` × ``size`` the way torchvision's
``Resize(size)`` + ``CenterCrop(size)`` do on PIL images: the shorter side is scaled to ``size``
(the longer to ``int(size · long / short)``) with bilinear resampling, then the centre square
is cut at offsets ``round((side − size) / 2)``.
"""

from __future__ import annotations

import os
from typing import Any, ClassVar

import numpy as np
from PIL import Image

from tailkit.errors import DataValidationError
from tailkit.plugins.featurizers._inputs import is_path_array, is_pixel_array, wrong_kind
from tailkit.validation import Interval


def decode_image(path: str | os.PathLike[str], size: int) -> np.ndarray:
    """One image file as a (size, size, 3) uint8 array (resize shorter side, centre crop)."""
    try:
        with Image.open(path) as opened:
            img = opened.convert("RGB")
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise DataValidationError(f"{os.fspath(path)}: cannot decode image ({exc})") from exc
    w, h = img.size
    short, long = (w, h) if w <= h else (h, w)
    new_long = int(size * long / short)
    new_w, new_h = (size, new_long) if w <= h else (new_long, size)
    if (new_w, new_h) != (w, h):
        img = img.resize((new_w, new_h), Image.Resampling.BILINEAR)
    top = round((new_h - size) / 2.0)
    left = round((new_w - size) / 2.0)
    img = img.crop((left, top, left + size, top + size))
    return np.asarray(img, dtype=np.uint8)


class Pixels:
    """Images as uint8 pixels (N, H, W, 3) for CNNs; image files are resized and centre-cropped.

    ``size`` applies to image files only; decoded arrays keep their own H × W.
    """

    accepts: ClassVar[tuple[str, ...]] = ("image",)
    output: ClassVar[str] = "image"
    constraints: ClassVar[dict[str, Interval]] = {"size": Interval(1, None)}

    def __init__(self, size: int = 32) -> None:
        self.size = size

    def fit(self, inputs: Any) -> Pixels:
        """Nothing to learn; checks the input kind so a bad dataset fails here."""
        self._check(inputs)
        return self

    def transform(self, inputs: Any) -> np.ndarray:
        if self._check(inputs) == "pixels":
            return np.ascontiguousarray(inputs)  # the very array when already contiguous
        out = np.empty((len(inputs), self.size, self.size, 3), dtype=np.uint8)
        for i, path in enumerate(inputs):
            out[i] = decode_image(path, self.size)
        return out

    @staticmethod
    def _check(inputs: Any) -> str:
        if is_pixel_array(inputs):
            return "pixels"
        if is_path_array(inputs):
            return "paths"
        raise wrong_kind(
            "pixels", "images: (N, H, W, 3) uint8 or an (N,) object array of file paths", inputs
        )
