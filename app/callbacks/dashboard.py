"""Dashboard: what TensorBoard shows of a run besides the metrics its LightningModule logs: its speed and its graph."""

import time

from jsonargparse.typing import NonNegativeInt
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.data import extract_batch_size


class Dashboard(Callback):
    """Log the training speed, and the model's graph to TensorBoard, from global rank 0.

    Args:
        every_n_steps: Optimizer steps between two figures of the speed, `workload/samples_per_s` (of all processes:
            rank 0's batches times the world size) and `workload/step_ms` (None: the Trainer's `log_every_n_steps`;
            0: none). They come from rank 0's wall clock over the interval, without a wait for the device
            (Lightning's `ThroughputMonitor` synchronises it after every step); the time between epochs (validation,
            checkpoints) is not counted.
        log_graph: Write the model's graph to each TensorBoard logger as fitting starts, traced from the module's
            `example_input_array` (a module without one has no graph to trace: nothing is written).

    With no speed and no graph it does nothing; train.py then leaves it out.

    Example::

        trainer = Trainer(callbacks=[Dashboard(log_graph=True)], logger=TensorBoardLogger("runs"))
    """

    def __init__(self, every_n_steps: NonNegativeInt | None = None, log_graph: bool = False) -> None:
        self.every_n_steps, self.log_graph = every_n_steps, log_graph

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.log_graph and trainer.is_global_zero and pl_module.example_input_array is not None:
            example = pl_module.example_input_array.to(pl_module.device)
            for logger in (logger for logger in trainer.loggers if isinstance(logger, TensorBoardLogger)):
                logger.experiment.add_graph(pl_module, example)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start_interval(trainer)  # a run resumed in the middle of an epoch gets no on_train_epoch_start first

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._start_interval(trainer)

    def _start_interval(self, trainer: Trainer) -> None:
        self._interval_start, self._samples, self._first_step = time.perf_counter(), 0, trainer.global_step

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        every = trainer.log_every_n_steps if self.every_n_steps is None else self.every_n_steps
        if not every or not trainer.is_global_zero:
            return
        self._samples += extract_batch_size(batch)
        steps = trainer.global_step - self._first_step  # optimizer steps: a batch is a step's part under gradient
        if not steps or trainer.global_step % every != 0:  # accumulation
            return
        seconds = time.perf_counter() - self._interval_start
        speed = {"workload/samples_per_s": self._samples * trainer.world_size / seconds}
        pl_module.log_dict({**speed, "workload/step_ms": 1000 * seconds / steps}, prog_bar=True, rank_zero_only=True)
        self._start_interval(trainer)
