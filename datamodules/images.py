"""A user's own picture as the network's input: a 28x28 uint8 image, light strokes on a dark background."""

from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageOps
from torch import Tensor

SIDE = 28


def to_mnist_image(path: Path) -> Tensor:
    """Read an image file (PNG, JPEG, BMP, ...; any size, grayscale or colour) and turn it into what the network
    was trained on: grayscale, inverted when its background is light (dark strokes on paper, a scan, a photo),
    fitted into 28x28 keeping its aspect ratio, centred on black. Raises OSError when the file is no image."""
    with Image.open(path) as image:
        gray = ImageOps.grayscale(ImageOps.exif_transpose(image))
    pixels = np.asarray(gray)
    border = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
    if border.mean() > 127:  # the background is what the border is made of
        gray = ImageOps.invert(gray)
    fitted = ImageOps.contain(gray, (SIDE, SIDE), method=Image.Resampling.BOX)  # each pixel: the mean of its area
    canvas = Image.new("L", (SIDE, SIDE), 0)
    canvas.paste(fitted, ((SIDE - fitted.width) // 2, (SIDE - fitted.height) // 2))
    return torch.from_numpy(np.array(canvas))
