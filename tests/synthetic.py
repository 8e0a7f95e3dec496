"""Small, learnable stand-ins for MNIST and FashionMNIST, written as IDX files in torchvision's layout.

Each class is a fixed random pattern; each sample is its class's pattern plus noise, so a network learns the
task within a few epochs, and no two samples are equal (the tests tell samples apart by their pixels). A few
labels are wrong, so a trained network scores about 0.95, not 1.
"""

import struct
from pathlib import Path

import numpy as np
import torch

IMAGE_MAGIC, LABEL_MAGIC = 0x0803, 0x0801  # uint8 data with 3 and 1 dimensions
LABEL_NOISE = 0.05


def write_idx(path: Path, data: torch.Tensor) -> None:
    """Write a uint8 tensor as an IDX file: magic number, big-endian dimensions, then the raw bytes."""
    magic = IMAGE_MAGIC if data.dim() == 3 else LABEL_MAGIC
    header = struct.pack(f">I{data.dim()}I", magic, *data.shape)
    path.write_bytes(header + data.to(torch.uint8).numpy().tobytes())


def read_idx_images(path: Path) -> np.ndarray:
    """The images of an IDX file written by `write_idx`, as a uint8 array (N, 28, 28)."""
    data = path.read_bytes()
    count = int.from_bytes(data[4:8], "big")
    return np.frombuffer(data[16:], dtype=np.uint8).reshape(count, 28, 28)


def read_idx_labels(path: Path) -> np.ndarray:
    """The labels of an IDX file written by `write_idx`, as a uint8 array (N,)."""
    return np.frombuffer(path.read_bytes()[8:], dtype=np.uint8)


def make_split(size: int, generator: torch.Generator, patterns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    labels = torch.arange(size) % 10
    labels = labels[torch.randperm(size, generator=generator)]
    noise = torch.randint(0, 96, (size, 28, 28), generator=generator)
    images = (patterns[labels] * 160 + noise).clamp(max=255)
    # Wrong labels on LABEL_NOISE of the samples, so that accuracy stays below 1 and every sample counts.
    mislabelled = torch.rand(size, generator=generator) < LABEL_NOISE
    labels[mislabelled] = (labels[mislabelled] + 1) % 10
    return images.to(torch.uint8), labels.to(torch.uint8)


def write_dataset(root: Path, folder: str, train_size: int, test_size: int, seed: int = 0) -> Path:
    """Write `root/folder/raw/` with the four files torchvision's MNIST and FashionMNIST classes read."""
    generator = torch.Generator().manual_seed(seed)
    patterns = (torch.rand(10, 28, 28, generator=generator) > 0.5).long()
    raw = root / folder / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for prefix, size in (("train", train_size), ("t10k", test_size)):
        images, labels = make_split(size, generator, patterns)
        write_idx(raw / f"{prefix}-images-idx3-ubyte", images)
        write_idx(raw / f"{prefix}-labels-idx1-ubyte", labels)
    return raw
