"""A model of a user's own, for the tests: `--model tests.tiny_net.TinyNet`. In a module of its own, which only the
train.py processes of the tests import: imported into the test process, it would show among the models the
program's messages list."""

from torch import nn

from models import ImageClassifier


class TinyNet(ImageClassifier):
    """A small network with a setting of its own (`width`), as a user's model would have."""

    def __init__(self, width: int = 8, **kwargs) -> None:
        super().__init__(**kwargs)
        self.net = nn.Sequential(
            nn.Conv2d(1, width, kernel_size=3), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, 10)
        )


class BrokenNet(TinyNet):
    """A model with a bug: building it raises a ValueError of its own, whatever its settings."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        raise ValueError("the table of layers is empty")
