"""What the TensorBoard dashboard shows besides the metrics the model logs: speed, confusion, graph."""

import time

from jsonargparse.typing import NonNegativeInt
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger

from app.callbacks.drawing import confusion_picture
from models import ImageClassifier


class Dashboard(Callback):
    """Speed and per-class accuracy scalars, confusion matrices and the graph, by rank 0.

    Args:
        images_every_n_epochs: Draw the validation confusion matrix every this many validation epochs (0: never).
            The test confusion matrix is drawn whenever a test runs.
        log_graph: Write the model graph (traced from the model's `example_input_array`) when fitting starts.

    Speed is rank 0's wall clock over each logging interval, without device synchronisation (Lightning's
    `ThroughputMonitor` synchronises after every step); per-class accuracy comes from the validation confusion matrix
    the model has already summed over the ranks (no collective more)."""

    def __init__(self, images_every_n_epochs: NonNegativeInt = 1, log_graph: bool = False) -> None:
        self.images_every_n_epochs = images_every_n_epochs
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
                self._add_confusion(writer, trainer, pl_module, "val")

    def on_test_end(self, trainer: Trainer, pl_module: ImageClassifier) -> None:
        if trainer.is_global_zero:
            for writer in _tensorboard_writers(trainer):
                self._add_confusion(writer, trainer, pl_module, "test")

    def _add_confusion(self, writer, trainer: Trainer, pl_module: ImageClassifier, stage: str) -> None:
        picture = confusion_picture(pl_module.confusion_matrices[stage], trainer.datamodule.class_names)
        writer.add_image(f"visuals/{stage}_confusion_matrix", picture, trainer.global_step, dataformats="HWC")


def _tensorboard_writers(trainer: Trainer) -> list:
    return [logger.experiment for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)]
