"""The dashboard's two pictures, drawn with Pillow in milliseconds (matplotlib took 0.5-0.7 s, docs/dashboard.md): a
grid of labelled samples and a confusion matrix."""

import numpy as np
from PIL import Image, ImageDraw, ImageFont
from torch import Tensor

SCALE = 4  # screen pixels per image pixel
PAD = 8
BLACK, WHITE, RED, GREY = (0, 0, 0), (255, 255, 255), (220, 0, 0), (110, 110, 110)
LIGHT, DARK = np.array([247, 251, 255]), np.array([8, 48, 107])  # the ends of the confusion matrix's blue scale


def font(size: int) -> ImageFont.ImageFont:
    return ImageFont.load_default(size=size)


def sample_grid(images: Tensor, predicted: list[str], true: list[str], columns: int = 8) -> np.ndarray:
    """uint8 images (N, 28, 28) in a grid under their predicted labels, mistakes in red: an RGB array (H, W, 3)."""
    side = images.shape[-1] * SCALE
    text = font(12)
    cell_width, caption = side + 2 * PAD, 2 * 14 + 4
    rows = -(-len(images) // columns)
    picture = Image.new("RGB", (columns * cell_width, rows * (side + caption + PAD)), WHITE)
    draw = ImageDraw.Draw(picture)
    for index, (image, guess, truth) in enumerate(zip(images, predicted, true, strict=True)):
        left, top = (index % columns) * cell_width, (index // columns) * (side + caption + PAD)
        digit = Image.fromarray(image.numpy()).resize((side, side), Image.Resampling.NEAREST)
        picture.paste(digit, (left + PAD, top + caption))
        centre = left + cell_width // 2
        if guess == truth:
            draw.text((centre, top + caption - 4), guess, fill=BLACK, font=text, anchor="md")
        else:
            draw.text((centre, top + caption - 18), guess, fill=RED, font=text, anchor="md")
            draw.text((centre, top + caption - 4), f"(true {truth})", fill=RED, font=text, anchor="md")
    return np.asarray(picture)


def confusion_picture(matrix: Tensor, class_names: list[str]) -> np.ndarray:
    """A confusion matrix as a table of counts shaded by each row's share: an RGB array (H, W, 3)."""
    counts = matrix.long().tolist()
    shares = (matrix.float() / matrix.sum(dim=1, keepdim=True).clamp(min=1)).tolist()
    size, cell = len(counts), 56
    text, small = font(14), font(12)
    labels = [name if name == str(index) else f"{index} {name}" for index, name in enumerate(class_names)]
    label_width = int(max(small.getlength(label) for label in labels)) + 2 * PAD
    top = 48
    width, height = label_width + size * cell + PAD, top + size * cell + PAD
    picture = Image.new("RGB", (width, height), WHITE)
    draw = ImageDraw.Draw(picture)
    draw.text((label_width, 6), "rows: true class, columns: predicted class", fill=BLACK, font=text)
    for column in range(size):
        draw.text((label_width + column * cell + cell // 2, top - 4), str(column), fill=GREY, font=small, anchor="md")
    for row in range(size):
        y = top + row * cell
        draw.text((label_width - PAD, y + cell // 2), labels[row], fill=BLACK, font=small, anchor="rm")
        for column in range(size):
            x, share = label_width + column * cell, shares[row][column]
            shade = tuple(int(c) for c in LIGHT + share * (DARK - LIGHT))
            draw.rectangle((x, y, x + cell - 1, y + cell - 1), fill=shade)
            ink = WHITE if share > 0.5 else BLACK
            draw.text((x + cell // 2, y + cell // 2), str(counts[row][column]), fill=ink, font=text, anchor="mm")
    return np.asarray(picture)
