"""Callbacks the training program adds to every run."""

import signal
from pathlib import Path
from types import FrameType

import torch
from jsonargparse.typing import PositiveInt
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException


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


class SigtermCheck(Callback):
    """Act on SIGTERM, and on SLURM's requeue signal, at a step where every rank acts together.

    Args:
        every_n_steps: Training steps between two checks; each check is one all-reduce of two flags. With 1 the
            ranks compare flags before every step, as often as Lightning does by itself.

    `kill`, `docker stop`, SLURM at a time limit and torchrun when stopped all send SIGTERM; SLURM sends SIGUSR1
    (`--signal` in scripts/train.sbatch) before pre-empting a job. Lightning (2.5, 2.6) runs collectives inside
    its signal handlers: a broadcast for SIGTERM, a checkpoint save with its barrier for SIGUSR1. A handler runs
    when its process next executes Python, so when the signal finds one rank in Python and another blocked in a
    collective (a step's gradient all-reduce, the sync of the epoch's metrics), the two collectives never match,
    and the job hangs until the process-group timeout, 30 minutes. Lightning's training loop also broadcasts rank
    0's SIGTERM flag before every step and reads it back with `.item()`: one collective and, on a GPU, one
    host-device synchronisation per step, 4-19% of a step on 2 CPU processes (benchmarks/README.md).

    Here the handlers only record the signal (and SIGTERM is passed on to the processes Lightning's launcher
    started, as Lightning does). The ranks compare their flags with one all-reduce every `every_n_steps` training
    steps and at the end of each training epoch, points that every rank reaches at the same step, whichever rank
    was signalled. After SIGUSR1 all of them run Lightning's requeue there: save `hpc_ckpt_N.ckpt`, and rank 0
    asks SLURM to requeue the job, which SLURM then stops with SIGTERM. After SIGTERM all raise Lightning's
    SIGTERMException, which train.py turns into exit status 143 (128 + SIGTERM). At an epoch's end `last.ckpt` is
    saved first. In the middle of an epoch nothing is saved: the checkpoint could not say which batches the
    epoch's DataLoader had already given, so a resumed epoch would see some samples twice and others never
    (Lightning warns of it). `--ckpt_path last` continues from the last finished epoch instead. A signal that
    arrives after training (during the test) lets that short stage finish.
    """

    def __init__(self, every_n_steps: PositiveInt = 50) -> None:
        self.every_n_steps = every_n_steps
        self.sigterm = False
        self.requeue = False

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Lightning installs its handlers after `setup`, from the connector's attributes: these take their place.
        trainer._signal_connector._sigterm_notifier_fn = self._record_sigterm
        trainer._signal_connector._slurm_sigusr_handler_fn = self._record_requeue_signal
        self._trainer = trainer

    # The handlers: no collective, and no printing (a handler that writes to a stream the program was writing to
    # when the signal came fails with "reentrant call").
    def _record_sigterm(self, signum: int, frame: FrameType | None) -> None:
        launcher = self._trainer.strategy.launcher  # only in the process that started the others
        if launcher is not None and not self.sigterm:
            launcher.kill(signum)
        self.sigterm = True

    def _record_requeue_signal(self, signum: int, frame: FrameType | None) -> None:
        self.requeue = True

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        loop = trainer.fit_loop.epoch_loop
        if hasattr(loop, "_broadcast_sigterm_tensor"):  # Lightning's per-step check, absent before 2.5
            loop._broadcast_sigterm_tensor = lambda: None

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        batches = trainer.fit_loop.epoch_loop.batch_progress.total.ready  # the same on every rank, kept on resume
        if batches % self.every_n_steps == 0:
            self._act_on_signals(trainer, at_epoch_end=False)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._act_on_signals(trainer, at_epoch_end=True)

    def _act_on_signals(self, trainer: Trainer, at_epoch_end: bool) -> None:
        flags = torch.tensor([self.sigterm, self.requeue], dtype=torch.int32, device=trainer.strategy.root_device)
        sigterm, requeue = (trainer.strategy.reduce(flags, reduce_op="sum") > 0).tolist()  # from any rank
        if requeue:
            self.requeue = False
            connector = trainer._signal_connector
            type(connector)._slurm_sigusr_handler_fn(connector, signal.SIGUSR1, None)  # Lightning's own requeue
        if not sigterm:
            return
        path = last_checkpoint_path(trainer)
        if at_epoch_end and path is not None:  # what ModelCheckpoint writes here, when it runs after this callback
            trainer.save_checkpoint(path, weights_only=False)
        if path is not None and path.exists():
            how = f"{path} holds the last finished epoch: continue with --ckpt_path last"
        else:
            how = "no epoch had finished, so there is no checkpoint to continue from"
        when = "at its end" if at_epoch_end else f"after step {trainer.global_step}"
        rank_zero_info(f"Stopped by SIGTERM in epoch {trainer.current_epoch}, {when}; {how}")
        raise SIGTERMException

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        vars(trainer.fit_loop.epoch_loop).pop("_broadcast_sigterm_tensor", None)  # the class's own method again
        vars(trainer._signal_connector).pop("_sigterm_notifier_fn", None)
        vars(trainer._signal_connector).pop("_slurm_sigusr_handler_fn", None)


def last_checkpoint_path(trainer: Trainer) -> Path | None:
    """Where train.py's `last_checkpoint` callback writes `last.ckpt`; None with checkpointing turned off."""
    for callback in trainer.checkpoint_callbacks:
        if callback.filename == ModelCheckpoint.CHECKPOINT_NAME_LAST and callback.dirpath:
            return Path(callback.format_checkpoint_name({}))  # ModelCheckpoint's own naming: dirpath/last.ckpt
    return None
