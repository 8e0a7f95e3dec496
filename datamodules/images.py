"""A user's own picture as the network's input: a 28x28 uint8 image, light strokes on a dark background, made the
way MNIST made its digits. NumPy and Pillow only: the file also runs beside an exported model, without this
repository (docs/use-the-model.md).

MNIST's digits were fitted, by their bounding box, into 20x20 (aspect ratio kept, anti-aliased), then placed in
28x28 so that their centre of mass falls on the centre (LeCun et al., the MNIST page). A network trained on them has
never seen a digit drawn small in a corner of a page, or one that touches the border: the whole picture fitted into
28x28 leaves a page's margins in, and the digit a few pixels wide.
"""

import warnings
from pathlib import Path

import numpy as np
from PIL import Image, ImageFilter, ImageOps

SIDE = 28  # MNIST's images
BOX = 20  # the square MNIST fitted each digit's bounding box into
FAINTEST = 25  # strokes less darker than the paper than this (of 255) are no strokes: a blank page's noise
INK = 0.5  # a pixel is ink when at least half as much darker than the paper as the darkest stroke is


def mnist_pixels(path: Path | str) -> np.ndarray:
    """Read an image file (PNG, JPEG, BMP, ...; any size, grayscale or colour) and turn it into what the network
    was trained on: grayscale, inverted when its background is light (dark strokes on paper, a scan, a photo), the
    background taken away, the strokes' bounding box fitted into 20x20 and their centre of mass put at the centre of
    28x28. Raises OSError when the file is no image, and Pillow's DecompressionBombError when it has more pixels than
    Pillow decodes safely (`Image.MAX_IMAGE_PIXELS`; where Pillow would only warn, too)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            with Image.open(path) as image:
                gray = ImageOps.grayscale(_opaque(_eight_bit(ImageOps.exif_transpose(image))))
        except Image.DecompressionBombWarning as warning:
            raise Image.DecompressionBombError(str(warning)) from None
    return as_mnist_digit(np.asarray(gray, dtype=np.float32))


def _eight_bit(image: Image.Image) -> Image.Image:
    """A grayscale picture of more than 8 bits (a scan, a camera's 10, 12 or 16 bits, saved as 16-bit) or a float one
    (0 to 1, or to 255) brought to 8 bits by its range: Pillow's own conversion clips every value above 255 to white,
    which leaves of dark strokes on paper only the darkest. The range of whole numbers is the fewest bits (of 8, 10,
    12, 14, 16) that hold its highest value: a 12-bit picture's white is 4095, not 65535."""
    if not image.mode.startswith("I") and image.mode != "F":
        return image
    pixels = np.asarray(image, dtype=np.float64)
    if image.mode == "F":
        top = 1.0 if pixels.max() <= 1 else 255.0
    else:  # "I;16" (a 16-bit PNG), or "I" (32 bits, which Pillow opens 16-bit files as too)
        top = next((2.0**bits - 1 for bits in (8, 10, 12, 14) if pixels.max() < 2**bits), 65535.0)
    return Image.fromarray(np.uint8(np.clip(np.round(pixels / top * 255), 0, 255)))


def _opaque(image: Image.Image) -> Image.Image:
    """A picture with transparency (a canvas's export) on a background that shows its strokes: white under dark
    strokes, black under light ones. Grayscale alone would drop the transparency, and black strokes on a transparent
    black background would vanish."""
    if "A" not in image.getbands() and "transparency" not in image.info:
        return image
    rgba = image.convert("RGBA")
    opaque = np.asarray(rgba.convert("L"))[np.asarray(rgba.getchannel("A")) > 127]
    shade = 255 if opaque.size == 0 or opaque.mean() < 128 else 0
    background = Image.new("RGBA", rgba.size, (shade, shade, shade, 255))
    background.alpha_composite(rgba)
    return background.convert("RGB")


def as_mnist_digit(pixels: np.ndarray) -> np.ndarray:
    """A grayscale picture (any size, 0 to 255) as a 28x28 uint8 MNIST digit. One of 28x28 already is taken as
    the datasets store their images (only inverted, if its background is light)."""
    border = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
    light = float(np.median(border)) > 127  # the page is what the border is made of
    if pixels.shape == (SIDE, SIDE):
        return np.uint8(255 - pixels if light else pixels)
    strokes = _strokes(pixels if light else 255 - pixels)  # light strokes on black, whichever the page was
    if strokes.max() < FAINTEST:  # a blank picture (its noise aside): nothing to centre
        return np.zeros((SIDE, SIDE), dtype=np.uint8)
    strokes = np.clip(strokes / strokes.max(), 0, 1)
    rows, columns = np.nonzero(strokes >= INK)
    box = strokes[rows.min() : rows.max() + 1, columns.min() : columns.max() + 1]
    digit = Image.fromarray(np.uint8(np.round(box * 255)))
    scale = BOX / max(digit.size)
    size = (max(1, round(digit.width * scale)), max(1, round(digit.height * scale)))
    fitted = np.asarray(digit.resize(size, Image.Resampling.LANCZOS if scale < 1 else Image.Resampling.BICUBIC))
    return _centred_by_mass(fitted.astype(np.float32))


def _strokes(page: np.ndarray) -> np.ndarray:
    """How much darker than the paper around it each pixel of `page` (dark strokes on a light page) is.

    The paper is not one grey in a photo (light from one side, a shadow): its brightness is estimated around each
    pixel as the lightest nearby pixel (a maximum filter, which takes the strokes away, on a picture of about 24
    pixels across, where a window of 9 spans more than a third of it: wider than a bold stroke), smoothed and brought
    back to full size.
    """
    height, width = page.shape
    factor = max(1, max(height, width) // 24)
    reduced = Image.fromarray(np.uint8(page)).resize((max(1, width // factor), max(1, height // factor)), Image.BOX)
    paper = reduced.filter(ImageFilter.MaxFilter(9)).filter(ImageFilter.GaussianBlur(2))
    paper = np.asarray(paper.resize((width, height), Image.BILINEAR), dtype=np.float32)
    return np.clip(paper - page, 0, None)


def _centred_by_mass(digit: np.ndarray) -> np.ndarray:
    """`digit` (at most 20x20) placed in 28x28 with its centre of mass on the centre, kept inside the frame."""
    mass = digit.sum()  # more than 0: the box holds the strokes
    rows, columns = np.indices(digit.shape)
    centre = ((rows * digit).sum() / mass, (columns * digit).sum() / mass)
    top = int(np.clip(round(SIDE / 2 - centre[0]), 0, SIDE - digit.shape[0]))
    left = int(np.clip(round(SIDE / 2 - centre[1]), 0, SIDE - digit.shape[1]))
    canvas = np.zeros((SIDE, SIDE), dtype=np.float32)
    canvas[top : top + digit.shape[0], left : left + digit.shape[1]] = digit
    return np.uint8(np.clip(np.round(canvas), 0, 255))
