"""How well `predict` reads pictures unlike the training set: typed, drawn and painted digits, small on a page with
margins, large, bold, slanted, and "photographed" (a grey, uneven page, noise, blur, a slight turn), by a ConvNet
trained 2 epochs on real MNIST. Each picture is turned into the network's input two ways: as `predict` does now (MNIST's
recipe: the strokes' bounding box fitted into 20x20, the centre of mass at the centre of 28x28,
`datamodules/images.py`) and as it did before (the whole picture fitted into 28x28); the accuracy of each, by kind.

    python benchmarks/own_pictures.py --data-dir ../shared/datasets            # trains the ConvNet first (a minute)
    python benchmarks/own_pictures.py --ckpt runs/ConvNet-mnist/version_0/checkpoints/last.ckpt
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from PIL import Image, ImageDraw, ImageFilter, ImageFont, ImageOps

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from datamodules.images import as_mnist_digit  # noqa: E402
from models import ConvNet  # noqa: E402

FONTS = Path("/usr/share/fonts/truetype/dejavu")
KINDS = {  # font file, size of the digit, page size, stroke width (drawn: a thick pen), photographed
    "typed, small on a page": ("DejaVuSans.ttf", 40, (600, 400), 0, False),
    "typed, large": ("DejaVuSans.ttf", 220, (300, 300), 0, False),
    "bold serif, small on a page": ("DejaVuSerif-Bold.ttf", 48, (500, 500), 0, False),
    "slanted, small on a page": ("DejaVuSans-Oblique.ttf", 44, (400, 600), 0, False),
    "drawn with a thick pen": ("DejaVuSans-ExtraLight.ttf", 120, (320, 320), 6, False),
    "painted with a broad brush, large": ("DejaVuSans-Bold.ttf", 200, (280, 280), 12, False),
    "photographed page": ("DejaVuSans.ttf", 90, (480, 360), 2, True),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data-dir", default="../shared/datasets", help="folder holding MNIST/raw/")
    parser.add_argument("--ckpt", help="a ConvNet checkpoint of MNIST; trained here (2 epochs) when left out")
    parser.add_argument("--per-digit", type=int, default=4, help="pictures of each digit, of each kind")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = Path(args.ckpt) if args.ckpt else train(Path(args.data_dir).resolve(), Path(scratch))
        model = ConvNet.load_from_checkpoint(checkpoint, map_location="cpu").eval()
        rng = np.random.default_rng(0)
        print(f"\n{args.per_digit * 10} pictures of each kind, ConvNet of {checkpoint.name}\n")
        print("| kind | before: the whole picture in 28x28 | now: MNIST's recipe |")
        print("| --- | --- | --- |")
        totals = np.zeros(2)
        for kind, style in KINDS.items():
            pictures = [(digit, picture(digit, *style, rng)) for digit in range(10) for _ in range(args.per_digit)]
            labels = torch.tensor([digit for digit, _ in pictures])
            right = [accuracy(model, [way(image) for _, image in pictures], labels) for way in (whole, as_mnist_digit)]
            totals += right
            print(f"| {kind} | {right[0]:.0%} | {right[1]:.0%} |")
        print(f"| all | {totals[0] / len(KINDS):.0%} | {totals[1] / len(KINDS):.0%} |")


def train(data_dir: Path, scratch: Path) -> Path:
    command = [sys.executable, "train.py", "fit", "--model", "ConvNet", "--data.dataset", "mnist"]
    command += ["--data.data_dir", str(data_dir), "--trainer.max_epochs", "2"]
    command += ["--trainer.default_root_dir", str(scratch)]
    subprocess.run([*command, "--trainer.enable_progress_bar", "false"], cwd=REPO, check=True, capture_output=True)
    return next(scratch.glob("ConvNet-mnist/version_0/checkpoints/last.ckpt"))


def picture(digit: int, font: str, size: int, page: tuple, stroke: int, photo: bool, rng) -> np.ndarray:
    """A grayscale picture of `digit`: dark on a light page, somewhere with margins, as a user would give it."""
    image = Image.new("L", page, 255)
    typeface = ImageFont.truetype(str(FONTS / font), size)
    left, top, right, bottom = ImageDraw.Draw(image).textbbox((0, 0), str(digit), font=typeface, stroke_width=stroke)
    x = rng.integers(page[0] // 10, max(page[0] // 10 + 1, page[0] - right - page[0] // 10))
    y = rng.integers(page[1] // 10 - top, max(page[1] // 10 - top + 1, page[1] - bottom - page[1] // 10))
    ImageDraw.Draw(image).text((x, y), str(digit), fill=0, font=typeface, stroke_width=stroke, stroke_fill=0)
    if photo:  # a grey page lit from one side, a slight turn, the camera's blur and noise
        shade = np.linspace(150, 215, page[0])[None, :].repeat(page[1], 0)
        pixels = np.minimum(np.asarray(image, dtype=np.float32), shade)
        image = Image.fromarray(np.uint8(pixels)).rotate(rng.uniform(-8, 8), fillcolor=int(shade.mean()))
        image = image.filter(ImageFilter.GaussianBlur(1.5))
        noisy = np.asarray(image, dtype=np.float32) + rng.normal(0, 8, (page[1], page[0]))
        image = Image.fromarray(np.uint8(np.clip(noisy, 0, 255)))
    return np.asarray(image, dtype=np.float32)


def whole(pixels: np.ndarray) -> np.ndarray:
    """Before: the whole picture, inverted when light, fitted into 28x28 and centred (its margins and all)."""
    gray = Image.fromarray(np.uint8(pixels))
    border = np.concatenate([pixels[0], pixels[-1], pixels[:, 0], pixels[:, -1]])
    if border.mean() > 127:
        gray = ImageOps.invert(gray)
    fitted = ImageOps.contain(gray, (28, 28), method=Image.Resampling.BOX)
    canvas = Image.new("L", (28, 28), 0)
    canvas.paste(fitted, ((28 - fitted.width) // 2, (28 - fitted.height) // 2))
    return np.asarray(canvas)


def accuracy(model: ConvNet, images: list[np.ndarray], labels: torch.Tensor) -> float:
    with torch.no_grad():
        predictions = model(torch.from_numpy(np.stack(images))).argmax(dim=1)
    return (predictions == labels).float().mean().item()


if __name__ == "__main__":
    main()
