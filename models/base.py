"""What both networks share: the loss, the metrics of each stage, logging and the injected optimizer."""

import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from lightning.pytorch.cli import LRSchedulerCallable, OptimizerCallable
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

NUM_CLASSES = 10


class ImageClassifier(LightningModule):
    """Base class of `SeqNet` and `ConvNet`: subclasses build `self.net`, mapping (N, 1, 28, 28) images to logits.

    The optimizer and the optional LR scheduler are constructor arguments, so the CLI chooses them
    (`--model.optimizer Adadelta --model.optimizer.lr 0.01`), as the LightningCLI docs show for dependency injection.

    Each stage has its own torchmetrics objects. Under DDP they sum their states (correct predictions, loss times
    samples, sample counts) over all ranks before computing, so a validation or test figure is weighted by samples,
    not by each rank's number of batches.
    """

    net: nn.Module

    def __init__(
        self,
        optimizer: OptimizerCallable = torch.optim.Adam,
        lr_scheduler: LRSchedulerCallable | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.train_acc = MulticlassAccuracy(NUM_CLASSES, average="micro")
        self.val_acc = MulticlassAccuracy(NUM_CLASSES, average="micro")
        self.test_acc = MulticlassAccuracy(NUM_CLASSES, average="micro")
        self.val_loss = MeanMetric()
        self.test_loss = MeanMetric()

    def forward(self, images: Tensor) -> Tensor:
        return self.net(images)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, targets = batch
        logits = self(images)
        loss = F.cross_entropy(logits, targets)
        self.train_acc(logits, targets)
        # Per-step curves of this rank's batches; Lightning writes them every `log_every_n_steps`.
        self.log("train/loss", loss, prog_bar=True)
        self.log("train/acc", self.train_acc)
        return loss

    def validation_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "val", self.val_loss, self.val_acc)

    def test_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> None:
        self._evaluate(batch, "test", self.test_loss, self.test_acc)

    def _evaluate(self, batch: tuple[Tensor, Tensor], stage: str, loss: MeanMetric, acc: MulticlassAccuracy) -> None:
        images, targets = batch
        logits = self(images)
        loss.update(F.cross_entropy(logits, targets), weight=len(targets))
        acc.update(logits, targets)
        # Logging the metric objects: Lightning calls compute() (synced across ranks) at epoch end, then resets.
        self.log(f"{stage}/loss", loss, prog_bar=True)
        self.log(f"{stage}/acc", acc, prog_bar=True)

    def predict_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        images, _targets = batch
        return self(images).argmax(dim=1)

    def configure_optimizers(self):
        optimizer = self.optimizer(self.parameters())
        if self.lr_scheduler is None:
            return optimizer
        return {"optimizer": optimizer, "lr_scheduler": self.lr_scheduler(optimizer)}
