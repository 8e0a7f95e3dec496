"""What the TensorBoard dashboard shows besides the metrics the model logs: speed, samples, confusion, graph."""

import time

import torch
from jsonargparse.typing import NonNegativeInt, PositiveInt
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger

from app.callbacks.drawing import confusion_picture, sample_grid
from datamodules import MNISTDataModule
from models import ImageClassifier

SAMPLE_POOL = 512  # validation images searched for mistakes to show


class Dashboard(Callback):
    """Speed and per-class accuracy scalars, validation samples, confusion matrices and the graph, by rank 0.

    Args:
        images_every_n_epochs: Draw the sample grid and the confusion matrix every this many validation epochs
            (0: never). The test confusion matrix is drawn whenever a test runs.
        num_images: Validation samples in the grid, with predicted and true labels, misclassified ones first.
        log_graph: Write the model graph (traced from the model's `example_input_array`) when fitting starts.

    Speed is rank 0's wall clock over each logging interval, without device synchronisation (Lightning's
    `ThroughputMonitor` synchronises after every step); per-class accuracy comes from the validation confusion matrix
    the model has already summed over the ranks (no collective more)."""

    def __init__(
        self, images_every_n_epochs: NonNegativeInt = 1, num_images: PositiveInt = 32, log_graph: bool = False
    ) -> None:
        self.images_every_n_epochs = images_every_n_epochs
        self.num_images = num_images
        self.log_graph = log_graph

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.log_graph and trainer.is_global_zero:
            example = pl_module.example_input_array.to(pl_module.device)
            for writer in _tensorboard_writers(trainer):
                writer.add_graph(pl_module, example)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start_interval(trainer)  # a run resumed in the middle of an epoch gets no on_train_epoch_start first

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start_interval(trainer)  # the time between epochs (validation, checkpoints) is not training speed

    def _start_interval(self, trainer: Trainer) -> None:
        self._interval_start, self._interval_batches = time.perf_counter(), 0
        self._interval_first_step = trainer.global_step

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        self._interval_batches += 1
        steps = trainer.global_step - self._interval_first_step  # optimizer steps: a batch is a step's part under
        every = trainer.log_every_n_steps  # gradient accumulation. 0: never, as Lightning reads it
        if not every or not steps or trainer.global_step % every != 0 or not trainer.is_global_zero:
            return
        seconds = time.perf_counter() - self._interval_start
        samples = self._interval_batches * len(batch[0]) * trainer.world_size
        speed = {"workload/samples_per_s": samples / seconds, "workload/step_ms": 1000 * seconds / steps}
        pl_module.log_dict(speed, prog_bar=True, rank_zero_only=True)
        self._start_interval(trainer)

    def on_validation_end(self, trainer: Trainer, pl_module: ImageClassifier) -> None:
        if trainer.sanity_checking or not trainer.is_global_zero:
            return
        matrix = pl_module.confusion_matrices["val"]  # summed over all ranks by the model
        per_class = matrix.diag() / matrix.sum(dim=1).clamp(min=1)
        due = self.images_every_n_epochs > 0 and (trainer.current_epoch + 1) % self.images_every_n_epochs == 0
        for writer in _tensorboard_writers(trainer):
            for label, accuracy in enumerate(per_class.tolist()):
                writer.add_scalar(f"val_per_class/acc_{label}", accuracy, trainer.global_step)
            if due:
                grid = self._sample_grid(trainer.datamodule, pl_module)
                writer.add_image("visuals/val_samples", grid, trainer.global_step, dataformats="HWC")
                self._add_confusion(writer, trainer, pl_module, "val")

    def on_test_end(self, trainer: Trainer, pl_module: ImageClassifier) -> None:
        if trainer.is_global_zero:
            for writer in _tensorboard_writers(trainer):
                self._add_confusion(writer, trainer, pl_module, "test")

    def _add_confusion(self, writer, trainer: Trainer, pl_module: ImageClassifier, stage: str) -> None:
        picture = confusion_picture(pl_module.confusion_matrices[stage], trainer.datamodule.class_names)
        writer.add_image(f"visuals/{stage}_confusion_matrix", picture, trainer.global_step, dataformats="HWC")

    @torch.no_grad()
    def _sample_grid(self, datamodule: MNISTDataModule, pl_module: LightningModule):
        """The first validation images, predicted by the model as it is now; mistakes first, labelled in red."""
        images, targets = datamodule.val_set[:SAMPLE_POOL]
        was_training = pl_module.training
        pl_module.eval()
        predictions = pl_module(images.to(pl_module.device)).argmax(dim=1).cpu()
        pl_module.train(was_training)
        shown = torch.argsort((predictions == targets).int(), stable=True)[: self.num_images]
        names = datamodule.class_names
        predicted = [names[k] for k in predictions[shown].tolist()]
        true = [names[k] for k in targets[shown].tolist()]
        return sample_grid(images[shown], predicted, true)


def _tensorboard_writers(trainer: Trainer) -> list:
    return [logger.experiment for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)]
