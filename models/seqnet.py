"""SeqNet: the multilayer perceptron of the DDP tutorial, 784 -> 200 -> 200 -> 10 with sigmoid activations."""

from torch import nn

from models.base import NUM_CLASSES, ImageClassifier


class SeqNet(ImageClassifier):
    """The tutorial's MLP (199,210 parameters) with its two bugs fixed.

    The tutorial applies `log_softmax` between the second and third linear layer (so the last layer sees
    log-probabilities instead of features), and divides images by 255 after `ToTensor()` already did. Here the
    hidden layers end in a sigmoid as intended, and the images are normalised once, by the model (`ImageClassifier`).
    """

    def __init__(self, **kwargs) -> None:  # optimizer, lr_scheduler, one_cycle, ...: see ImageClassifier
        super().__init__(**kwargs)
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(28 * 28, 200),
            nn.Sigmoid(),
            nn.Linear(200, 200),
            nn.Sigmoid(),
            nn.Linear(200, NUM_CLASSES),
        )
