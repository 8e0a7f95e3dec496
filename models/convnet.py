"""ConvNet: the small CNN of the tutorial, two conv blocks with BatchNorm and a two-layer head."""

from torch import nn

from models.base import NUM_CLASSES, ImageClassifier


def conv_block(in_channels: int, out_channels: int) -> nn.Sequential:
    """3x3 convolution, BatchNorm, ReLU, 2x2 max-pool: 28x28 -> 13x13 -> 5x5 over the two blocks."""
    return nn.Sequential(
        nn.Conv2d(in_channels, out_channels, kernel_size=3),
        nn.BatchNorm2d(out_channels),
        nn.ReLU(),
        nn.MaxPool2d(2),
    )


class ConvNet(ImageClassifier):
    """conv(1->32) + conv(32->64) blocks, flatten (64*5*5 = 1600), linear 1600->128 + ReLU, linear 128->10.

    225,226 parameters. Under DDP each rank's BatchNorm normalises with its own batch's statistics;
    `--trainer.sync_batchnorm true` makes them use the statistics of the global batch instead.
    """

    def __init__(self, **kwargs) -> None:  # optimizer, lr_scheduler, one_cycle, ...: see ImageClassifier
        super().__init__(**kwargs)
        self.net = nn.Sequential(
            conv_block(1, 32),
            conv_block(32, 64),
            nn.Flatten(),
            nn.Linear(64 * 5 * 5, 128),
            nn.ReLU(),
            nn.Linear(128, NUM_CLASSES),
        )
