"""Callbacks the training program adds to every run."""

import signal
import threading
from pathlib import Path
from types import FrameType

import torch
from jsonargparse.typing import PositiveInt
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from app.errors import UserError


class GlobalBatchInfo(Callback):
    """Print and log what one optimizer step is made of, so a user sees what changing `--devices` does.

    Under DDP each of the `world_size` processes takes `batch_size` samples per step and the gradients are
    averaged, so one step sees the global batch. Lightning does not rescale the learning rate.
    """

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        per_device = trainer.datamodule.hparams.batch_size
        global_batch = per_device * trainer.world_size * trainer.accumulate_grad_batches
        steps_per_epoch = trainer.num_training_batches // trainer.accumulate_grad_batches
        group = trainer.optimizers[0].param_groups[0]
        lr = (
            f"peak learning rate {group['max_lr']:g} (one-cycle)"
            if "max_lr" in group
            else f"learning rate {group['lr']:g}"
        )
        rank_zero_info(
            f"Global batch {global_batch} = {per_device} per device x {trainer.world_size} processes"
            f" x {trainer.accumulate_grad_batches} accumulated; {lr};"
            f" {steps_per_epoch} optimizer steps per epoch."
        )
        for logger in trainer.loggers:  # loggers write on rank 0 only
            logger.log_metrics(
                {
                    "global_batch_size": global_batch,
                    "world_size": trainer.world_size,
                    "steps_per_epoch": steps_per_epoch,
                },
                step=0,
            )


class StoppedBySignal(SIGTERMException):
    """Every rank stopped at the same step after SIGTERM or SIGINT; train.py exits with 128 + the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


class TrainingDiverged(UserError):
    """The training loss became NaN or infinite; every rank raises it at the same step."""


SIGNAL_NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT (Ctrl-C)"}


class SigtermCheck(Callback):
    """Act on SIGTERM, Ctrl-C, SLURM's requeue signal and a diverged loss at a step where every rank acts together.

    Args:
        every_n_steps: Training steps between two checks; each check is one all-reduce of three flags. With 1 the
            ranks compare flags before every step, as often as Lightning does by itself.

    `kill`, `docker stop`, SLURM at a time limit and torchrun when stopped all send SIGTERM; a terminal's Ctrl-C
    sends SIGINT to every process of the job; SLURM sends SIGUSR1 (`--signal` in scripts/train.sbatch) before
    pre-empting a job. Lightning (2.5, 2.6) runs collectives inside its signal handlers: a broadcast for SIGTERM,
    a checkpoint save with its barrier for SIGUSR1; SIGINT raises KeyboardInterrupt wherever each rank is. A
    handler runs when its process next executes Python, so when the signal finds one rank in Python and another
    blocked in a collective (a step's gradient all-reduce, the sync of the epoch's metrics), the two collectives
    never match, and the job hangs until the process-group timeout, 30 minutes. Lightning's training loop also
    broadcasts rank 0's SIGTERM flag before every step and reads it back with `.item()`: one collective and, on a
    GPU, one host-device synchronisation per step, 4-19% of a step on 2 CPU processes (benchmarks/README.md).

    Here the handlers only record the signal (and SIGTERM is passed on to the processes Lightning's launcher
    started, as Lightning does; a terminal sends SIGINT to all of them itself). The ranks compare their flags
    with one all-reduce every `every_n_steps` training steps and at the end of each training epoch, points that
    every rank reaches at the same step, whichever rank was signalled. After SIGUSR1 all of them run Lightning's
    requeue there: save `hpc_ckpt_N.ckpt`, and rank 0 asks SLURM to requeue the job, which SLURM then stops with
    SIGTERM. After SIGTERM or SIGINT all raise `StoppedBySignal`, which train.py turns into exit status 143 or 130
    (128 + the signal). At an epoch's end `last.ckpt` is saved first. In the middle of an epoch nothing is saved:
    the checkpoint could not say which batches the epoch's DataLoader had already given, so a resumed epoch would
    see some samples twice and others never (Lightning warns of it). `--ckpt_path last` continues from the last
    finished epoch instead. A second Ctrl-C stops at once. A signal that arrives after training (during the test)
    lets that short stage finish; Ctrl-C there stops it at once.

    The same check looks at the last training loss: NaN or infinite on any rank, and every rank raises
    `TrainingDiverged` there, before `last.ckpt` would be overwritten with the diverged weights. The loss stays on
    its device until the check, so this adds no host-device synchronisation to the other steps.
    """

    def __init__(self, every_n_steps: PositiveInt = 50) -> None:
        self.every_n_steps = every_n_steps
        self.stop_signal: int | None = None
        self.requeue = False
        self.last_loss: torch.Tensor | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Lightning installs its handlers after `setup`, from the connector's attributes: these take their place.
        trainer._signal_connector._sigterm_notifier_fn = self._record_stop_signal
        trainer._signal_connector._slurm_sigusr_handler_fn = self._record_requeue_signal
        self._trainer = trainer
        self._previous_sigint_handler = None
        if stage == "fit" and threading.current_thread() is threading.main_thread():
            self._previous_sigint_handler = signal.signal(signal.SIGINT, self._record_stop_signal)

    # The handlers: no collective, and no printing (a handler that writes to a stream the program was writing to
    # when the signal came fails with "reentrant call").
    def _record_stop_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT and self.stop_signal == signal.SIGINT:
            raise StoppedBySignal(signum)  # the second Ctrl-C: stop now, wherever this rank is
        launcher = self._trainer.strategy.launcher  # only in the process that started the others
        if signum == signal.SIGTERM and launcher is not None and self.stop_signal is None:
            launcher.kill(signum)
        self.stop_signal = self.stop_signal or signum

    def _record_requeue_signal(self, signum: int, frame: FrameType | None) -> None:
        self.requeue = True

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        loop = trainer.fit_loop.epoch_loop
        if hasattr(loop, "_broadcast_sigterm_tensor"):  # Lightning's per-step check, absent before 2.5
            loop._broadcast_sigterm_tensor = lambda: None

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        self.last_loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        batches = trainer.fit_loop.epoch_loop.batch_progress.total.ready  # the same on every rank, kept on resume
        if batches % self.every_n_steps == 0:
            self._check(trainer, at_epoch_end=False)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._check(trainer, at_epoch_end=True)

    def _check(self, trainer: Trainer, at_epoch_end: bool) -> None:
        device = trainer.strategy.root_device
        flags = torch.tensor([self.stop_signal or 0, self.requeue, 0], dtype=torch.int32, device=device)
        if self.last_loss is not None:  # on the device: the flag is made without waiting for the step to finish
            flags[2] = (~torch.isfinite(self.last_loss.detach())).any()
        stop_signal, requeue, diverged = trainer.strategy.reduce(flags, reduce_op="max").tolist()  # any rank
        if requeue:
            self.requeue = False
            connector = trainer._signal_connector
            type(connector)._slurm_sigusr_handler_fn(connector, signal.SIGUSR1, None)  # Lightning's own requeue
        path = last_checkpoint_path(trainer)
        if diverged:
            group = trainer.optimizers[0].param_groups[0]
            raise TrainingDiverged(
                f"the training loss became NaN or infinite by step {trainer.global_step} (epoch"
                f" {trainer.current_epoch}): lower the learning rate (--model.optimizer.lr, now"
                f" {group.get('max_lr', group['lr']):g}) and train again. {_weights_kept(path, trainer.current_epoch)}"
            )
        if not stop_signal:
            return
        if at_epoch_end and path is not None:  # what ModelCheckpoint writes here, when it runs after this callback
            trainer.save_checkpoint(path, weights_only=False)
        when = "at its end" if at_epoch_end else f"after step {trainer.global_step}"
        rank_zero_info(
            f"Stopped by {SIGNAL_NAMES[stop_signal]} in epoch {trainer.current_epoch}, {when}; {_what_is_kept(path)}"
        )
        raise StoppedBySignal(stop_signal)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        vars(trainer.fit_loop.epoch_loop).pop("_broadcast_sigterm_tensor", None)  # the class's own method again
        vars(trainer._signal_connector).pop("_sigterm_notifier_fn", None)
        vars(trainer._signal_connector).pop("_slurm_sigusr_handler_fn", None)
        if self._previous_sigint_handler is not None:
            signal.signal(signal.SIGINT, self._previous_sigint_handler)
        self.last_loss = None


def _weights_kept(path: Path | None, epoch: int) -> str:
    if path is not None and path.exists():
        return f"{path} keeps the weights of epoch {epoch - 1}, from before the divergence."
    return "No epoch had finished, so no checkpoint was written."


def _what_is_kept(path: Path | None) -> str:
    if path is not None and path.exists():
        return f"{path} holds the last finished epoch: continue with --ckpt_path last"
    return "no epoch had finished, so there is no checkpoint to continue from"


def last_checkpoint_path(trainer: Trainer) -> Path | None:
    """Where train.py's `last_checkpoint` callback writes `last.ckpt`; None with checkpointing turned off."""
    for callback in trainer.checkpoint_callbacks:
        if callback.filename == ModelCheckpoint.CHECKPOINT_NAME_LAST and callback.dirpath:
            return Path(callback.format_checkpoint_name({}))  # ModelCheckpoint's own naming: dirpath/last.ckpt
    return None
