"""ConvNet: the small CNN of the tutorial, two conv blocks with BatchNorm and a two-layer head; its sizes are
arguments, so that a config can name a smaller or larger one (`configs/convnet_fast_gpu.yaml`)."""

from jsonargparse.typing import PositiveInt
from torch import nn

from models.base import NUM_CLASSES, ImageClassifier


def conv_block(in_channels: int, out_channels: int, kernel_size: int, batch_norm: bool) -> nn.Sequential:
    """Convolution (no padding), BatchNorm if asked, ReLU, 2x2 max-pool."""
    norm = [nn.BatchNorm2d(out_channels)] if batch_norm else []
    return nn.Sequential(nn.Conv2d(in_channels, out_channels, kernel_size), *norm, nn.ReLU(), nn.MaxPool2d(2))


class ConvNet(ImageClassifier):
    """Two conv blocks, flatten, linear to `hidden` + ReLU, linear to 10.

    The defaults are the tutorial's net: conv(1->32, 3x3) and conv(32->64, 3x3) blocks with BatchNorm (28x28 -> 13x13
    -> 5x5), 64*5*5 = 1600 -> 128 -> 10, 225,226 parameters. Under DDP each rank's BatchNorm normalises with its own
    batch's statistics; `--trainer.sync_batchnorm true` makes them use the statistics of the global batch instead.

    Args:
        channels: Output channels of the first and the second convolution.
        kernel_sizes: Kernel size of the first and the second convolution.
        hidden: Width of the hidden linear layer.
        batch_norm: BatchNorm after each convolution. Without it a step launches fewer kernels, which is what a
            step's time is made of on a GPU at these sizes.
    """

    def __init__(
        self,
        channels: tuple[PositiveInt, PositiveInt] = (32, 64),
        kernel_sizes: tuple[PositiveInt, PositiveInt] = (3, 3),
        hidden: PositiveInt = 128,
        batch_norm: bool = True,
        **kwargs,  # optimizer, lr_scheduler, one_cycle, ...: see ImageClassifier
    ) -> None:
        super().__init__(**kwargs)
        side = 28
        for kernel_size in kernel_sizes:  # each block: a convolution without padding, then a 2x2 max-pool
            side = (side - kernel_size + 1) // 2
        if side < 1:
            raise ValueError(
                f"kernel_sizes {list(kernel_sizes)} leave no pixel of a 28x28 image after the two blocks:"
                " give smaller ones (each block takes kernel_size - 1 pixels off a side, then halves it)."
            )
        self.net = nn.Sequential(
            conv_block(1, channels[0], kernel_sizes[0], batch_norm),
            conv_block(channels[0], channels[1], kernel_sizes[1], batch_norm),
            nn.Flatten(),
            nn.Linear(channels[1] * side * side, hidden),
            nn.ReLU(),
            nn.Linear(hidden, NUM_CLASSES),
        )
