"""FaultGuard: a stop signal, a diverged loss or a process that stopped answering ends every rank together, and keeps
what was computed."""

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import torch
from jsonargparse.typing import NonNegativeFloat, NonNegativeInt, PositiveInt
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from app.errors import UserError
from app.job.heartbeats import Heartbeats
from app.job.process_group import have_met, job_store
from app.say import say


class StoppedBySignal(SIGTERMException):
    """Every rank stopped at the same step after a stop signal; train.py then ends by that signal (130, 143)."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


class TrainingDiverged(UserError):
    """The training loss became NaN or infinite; every rank raises it at the same step."""


SIGNAL_NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGHUP: "SIGHUP (hang-up)"}


class FaultGuard(Callback):
    """Act on stop signals, SLURM's requeue signal, a diverged loss and a process that stopped answering, on every
    rank at the same step (how and why: docs/multinode.md, "How it works").

    Args:
        every_n_steps: Optimizer steps between two checks of signals and loss; each check is one all-reduce of four
            flags, never between the batches whose gradients one step accumulates, and one more at each epoch's end.
        stall_timeout: Seconds without a sign of life from a process of the job before the others name it and end
            the job (0: never): `app/job/heartbeats.py`, from a thread, nothing the training step waits for.
            Processes that all answer but wait in different collectives for as long are named too (a deadlock).
        checkpoint_every_s: Seconds of training after which every rank saves `last.ckpt` at the next check, in the
            middle of an epoch too (None: only at each epoch's end; 0: at every check). The decision travels in the
            check's all-reduce, where Lightning's `ModelCheckpoint(train_time_interval=...)` broadcasts before every
            step. A new run then also saves its weights before the first step. 60 by default in a job that torchrun
            restarts (`app/job/launcher_shape.py`).

    Lightning runs collectives inside its signal handlers, which hang the job when they meet another rank's gradient
    all-reduce, and broadcasts rank 0's SIGTERM flag before every step. Here the handlers only record the signal
    (SIGTERM and SIGHUP are passed on to the processes Lightning's launcher started, as Lightning does), and each
    check all-reduces the flags. After SIGUSR1 every rank runs Lightning's requeue there; after another stop signal
    every rank saves `last.ckpt` there (the loader's position with it: `datamodules/sampler.py`) and raises
    `StoppedBySignal`: `--ckpt_path last` continues from the next sample. A second Ctrl-C stops at once, as does a
    stop in an evaluation (nothing to keep), or while the processes meet (`app/job/rendezvous.py`); one before the
    loops stops every rank as they start (`catch_stop_signals`). A loss that became NaN or infinite on any
    rank raises `TrainingDiverged` at the check, before `last.ckpt` would hold the diverged weights; the loss stays
    on its device until then.
    """

    def __init__(
        self,
        every_n_steps: PositiveInt = 50,
        stall_timeout: NonNegativeInt = 60,
        checkpoint_every_s: NonNegativeFloat | None = None,
    ) -> None:
        self.every_n_steps = every_n_steps
        self.stall_timeout = stall_timeout
        self.checkpoint_every_s = checkpoint_every_s
        self.saved_at = 0.0  # when this process last saw a checkpoint saved, or training start
        self.stop_signal: int | None = None
        self.stop_said = False  # that the stop waits for the validation under way
        self.stopped_at_once = False  # by a second Ctrl-C
        self.requeue = False
        self.last_loss: torch.Tensor | None = None
        self.heartbeats: Heartbeats | None = None
        self.batches = 0  # of every stage, for the heartbeats: where this process stands moves with it
        self.step_seen = 0  # the optimizer steps as of the last training batch
        self.test_after_fit = False  # given by train.py: the command's last stage is the test, not the fit
        self.continue_command: Callable[[], str] = lambda: "--ckpt_path last"  # given by train.py: the whole command
        self._in_the_loops = False  # a stage's loops run: a stop waits for a check, or stops an evaluation
        self._stopping = False  # `_on_stop_signal` raised: the command ends
        self._agree_at_the_start = False  # a stop signal before the stage's loops waits for their start
        self._handlers_before: dict[int, object] = {}  # those `catch_stop_signals` replaced, for the command
        self._handlers_before_the_loops: dict[int, object] = {}  # those `_enter_the_loops` replaced, for a stage

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        # Lightning installs its handlers after `setup`, from the connector's attributes. Its SIGTERM handler calls
        # its own (which broadcasts from the handler), then the one in place: where that is this guard's
        # (`catch_stop_signals`), its own does nothing; else its own is this guard's.
        caught = signal.SIGTERM in self._handlers_before
        trainer._signal_connector._sigterm_notifier_fn = _do_nothing if caught else self._on_stop_signal
        trainer._signal_connector._slurm_sigusr_handler_fn = self._record_requeue_signal
        self._trainer, self._agree_at_the_start = trainer, True  # a stop before the loops waits for their start
        self._start_heartbeats(trainer)

    def _start_heartbeats(self, trainer: Trainer) -> None:
        """Once per process, at its first stage: they go on through every stage of the command (a fit and the test
        after it), and end with its last stage, or with a stage that failed."""
        if self.heartbeats or trainer.world_size == 1 or not self.stall_timeout or not have_met():
            return
        store = job_store("fault_guard", timeout_s=self.stall_timeout)
        self.heartbeats = Heartbeats(
            trainer.global_rank, trainer.world_size, self.stall_timeout, store, self._before_stall_exit, self._where
        )
        self.heartbeats.start()

    def _where(self) -> list:
        """Where this process stands, read by the heartbeat thread: stage, loop, epoch, step, batches done."""
        state = self._trainer.state
        fn, stage = (getattr(value, "value", value) for value in (state.fn, state.stage))
        return [fn, stage, self._trainer.current_epoch, self._trainer.global_step, self.batches]

    def _before_stall_exit(self) -> str:
        """Runs in the heartbeat thread before the process ends."""
        _write_out_loggers(self._trainer)
        return self._what_is_kept("holds the last saved step")

    def catch_stop_signals(self, trainer: Trainer) -> None:
        """From the processes' meeting (a lone process: from before the stage) to the command's end, SIGTERM and
        SIGHUP stop the command, where their own action ended the process in silence, leaving a new run's folder
        half-written (`_on_stop_signal`). Before the loops of the command's stage (or of the test after a fit), the
        signal is recorded, and every rank stops as the loops start (`_enter_the_loops`), also where it reached one
        rank only: a new run's folder is then taken back (`TrainCLI._run_subcommand`). The handlers from before go
        back with `put_back_the_handlers`. A signal the process was started ignoring stays ignored: SIGHUP under
        `nohup` (the run was meant to outlive the terminal)."""
        self._trainer = trainer
        self._agree_at_the_start = True
        for signum in (signal.SIGTERM, signal.SIGHUP):
            self._catch(signum, self._handlers_before)

    def put_back_the_handlers(self) -> None:
        """The signal handlers from before the command, once it has ended."""
        _put_back_signal_handlers(self._handlers_before)

    def _catch(self, signum: int, replaced: dict[int, object]) -> None:
        """`_on_stop_signal` handles `signum` (once), the handler it replaces kept in `replaced`."""
        caught = signum in self._handlers_before or signum in self._handlers_before_the_loops
        if caught or threading.current_thread() is not threading.main_thread():  # only the main thread may
            return
        if signal.getsignal(signum) is not signal.SIG_IGN:
            replaced[signum] = signal.signal(signum, self._on_stop_signal)

    def _on_stop_signal(self, signum: int, frame: FrameType | None) -> None:
        """In a fit's loops, record the signal for the next check (a second Ctrl-C stops at once); before the loops,
        for their start; in an evaluation's loops (nothing to keep) and after the command's last loops, stop now.
        No collective, and no printing: a handler that writes to a stream the program was writing to when the signal
        came fails with "reentrant call"."""
        if self._stopping:  # a signal again while ending: ending
            return
        if signum == signal.SIGINT and self.stop_signal == signal.SIGINT:
            self.stopped_at_once = True  # said in `on_exception`, outside the handler
            raise StoppedBySignal(signum)
        self._pass_on(signum)
        evaluating = self._in_the_loops and self._trainer.state.fn != TrainerFn.FITTING
        if evaluating or not (self._in_the_loops or self._agree_at_the_start):
            self._stopping = True
            raise StoppedBySignal(signum)
        self.stop_signal = self.stop_signal or signum

    def _pass_on(self, signum: int) -> None:
        """The first SIGTERM or SIGHUP goes on to the processes Lightning's launcher started from this one."""
        if signum == signal.SIGHUP and sys.stdout.isatty():  # the terminal is gone: writing to it would fail (EIO)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.dup2(devnull, sys.stderr.fileno())
        launcher = self._trainer.strategy.launcher  # only in the process that started the others
        if signum in (signal.SIGTERM, signal.SIGHUP) and launcher is not None and self.stop_signal is None:
            launcher.kill(signum)

    def _record_requeue_signal(self, signum: int, frame: FrameType | None) -> None:
        self.requeue = True

    def on_sanity_check_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._enter_the_loops(trainer)

    on_validation_start = on_test_start = on_predict_start = on_sanity_check_start  # an evaluation stops at once

    def _enter_the_loops(self, trainer: Trainer) -> None:
        """A stop signal recorded before the stage's loops (`catch_stop_signals`) stops every rank here, together; in
        them, a stop waits for a check, or stops an evaluation at once, and Ctrl-C is a stop signal too, as SIGHUP
        where the command did not catch it. (Caught once Lightning has saved the handlers it puts back when the
        stage ends, however it ends: those from before. Ignored, as in a job a shell started with `&`, it stays
        ignored.)"""
        self._in_the_loops = True
        for signum in (signal.SIGINT, signal.SIGHUP):
            self._catch(signum, self._handlers_before_the_loops)
        if self._agree_at_the_start:
            self._agree_at_the_start = False
            self.stop_if_signalled(trainer)

    def on_sanity_check_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """A stop signal during the sanity check stops every rank here, together (a signal may reach one node
        only): nothing is trained yet, so nothing waits for the first check."""
        self.stop_if_signalled(trainer)

    def stop_if_signalled(self, trainer: Trainer) -> None:
        """Raise `StoppedBySignal` on every rank if a stop signal reached any (one all-reduce: every rank calls
        this)."""
        flag = torch.tensor([self.stop_signal or 0], dtype=torch.int32, device=trainer.strategy.root_device)
        stop_signal = int(trainer.strategy.reduce(flag, reduce_op="max").item())
        if stop_signal:
            raise StoppedBySignal(stop_signal)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._enter_the_loops(trainer)
        path = last_checkpoint_path(trainer)
        if self.checkpoint_every_s is not None and trainer.global_step == 0 and path is not None:
            # A new run's weights before its first step: a process lost before the first interval is over then
            # restarts the same run, in its folder, where `--ckpt_path last` would otherwise find none and start anew.
            trainer.save_checkpoint(path, weights_only=False)
        self.saved_at = time.monotonic()  # `checkpoint_every_s` counts training time, from here
        self.step_seen = trainer.global_step  # a continued run's first check comes after its first step
        trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = lambda: None  # Lightning's per-step check

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        self.saved_at = time.monotonic()

    def state_dict(self) -> dict:
        """Which job saved the checkpoint, on how many nodes: for `TrainCLI._say_the_job_changed_size`."""
        return {"torchrun_run_id": os.environ.get("TORCHELASTIC_RUN_ID"), "num_nodes": self._trainer.num_nodes}

    def on_validation_batch_end(self, trainer: Trainer, *args, **kwargs) -> None:
        """A stop recorded in training waits for its check at the epoch's end (or the next `every_n_steps`-th step),
        after the validation under way, which may take a while: said once, from global rank 0, as it starts."""
        self.batches += 1
        fitting = trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking  # not the test after it
        if self.stop_signal and not self.stop_said and fitting:
            self.stop_said = True
            again = (
                "; Ctrl-C again stops at once, keeping what was saved before"
                if self.stop_signal == signal.SIGINT
                else ""
            )
            check = (trainer.global_step // self.every_n_steps + 1) * self.every_n_steps
            say(
                f"{SIGNAL_NAMES[self.stop_signal]}: the run stops after this validation, at the end of epoch"
                f" {trainer.current_epoch} or after step {check}, whichever comes first{again}."
            )

    on_test_batch_end = on_predict_batch_end = on_validation_batch_end  # no stop waits there (`_on_stop_signal`)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        """Check after every `every_n_steps`-th optimizer step: with `--trainer.accumulate_grad_batches N` a stop
        inside the N batches of one step would lose the gradients accumulated so far (a checkpoint holds none). After
        an epoch's last batch, the loss only: a stop, a requeue and a save wait for the epoch's end, after its
        validation (a checkpoint of its last step counts the epoch as done: the continued run never validated it)."""
        self.batches += 1
        self.last_loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        step, stepped = trainer.global_step, trainer.global_step != self.step_seen  # the same on every rank
        self.step_seen = step
        if stepped and step % self.every_n_steps == 0:  # as many batches on every rank: the same last one
            self._check(trainer, at_epoch_end=False, loss_only=trainer.fit_loop.epoch_loop.batch_progress.is_last_batch)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._check(trainer, at_epoch_end=True)

    def _check(self, trainer: Trainer, at_epoch_end: bool, loss_only: bool = False) -> None:
        device = trainer.strategy.root_device
        interval = self.checkpoint_every_s
        save_due = interval is not None and time.monotonic() - self.saved_at >= interval and not at_epoch_end
        flags = torch.tensor([self.stop_signal or 0, self.requeue, 0, save_due], dtype=torch.int32, device=device)
        if self.last_loss is not None:  # on the device: the flag is made without waiting for the step to finish
            flags[2] = (~torch.isfinite(self.last_loss.detach())).any()
        stop_signal, requeue, diverged, save_due = trainer.strategy.reduce(flags, reduce_op="max").tolist()
        path = last_checkpoint_path(trainer)
        if diverged:
            group = trainer.optimizers[0].param_groups[0]
            raise TrainingDiverged(
                f"the training loss became NaN or infinite by step {trainer.global_step} (epoch"
                f" {trainer.current_epoch}): lower the learning rate (--model.optimizer.lr, now"
                f" {group.get('max_lr', group['lr']):g}) and train again. {_weights_kept(path)}"
            )
        if loss_only:
            return
        if requeue:
            self.requeue = False
            connector = trainer._signal_connector
            type(connector)._slurm_sigusr_handler_fn(connector, signal.SIGUSR1, None)  # Lightning's own requeue
        if stop_signal and at_epoch_end:  # the epoch's checkpoints first (the best by val/acc): Lightning calls
            for callback in trainer.checkpoint_callbacks:  # them after this hook, which stops the run
                callback.on_train_epoch_end(trainer, trainer.lightning_module)
        # On every rank: Lightning's save has a barrier; global rank 0 alone writes. (At an epoch's end the
        # last_checkpoint callback has saved it already, the same state: written again, as at any stop.)
        if (stop_signal or save_due) and path is not None:
            trainer.save_checkpoint(path, weights_only=False)
        if not stop_signal:
            return
        when = "at its end" if at_epoch_end else f"after step {trainer.global_step}"
        say(
            f"Stopped by {SIGNAL_NAMES[stop_signal]} in epoch {trainer.current_epoch}, {when};"
            f" {self._what_is_kept('holds that step')}"
        )
        raise StoppedBySignal(stop_signal)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        """A stage failed (Lightning calls this, not `teardown`): the others stop watching this process. Ctrl-C where no
        handler of this guard is in place stops as a shell expects (130, `app/main.py`), where Lightning would kill
        the processes its launcher started and exit with status 1."""
        self._put_back(trainer)
        self.stop_heartbeats()
        if self.stopped_at_once:
            say(f"Stopped at once by a second Ctrl-C; {self._what_is_kept('holds the last saved step')}")
        if isinstance(exception, KeyboardInterrupt):
            _write_out_loggers(trainer)  # what Lightning does next, skipped by the raise
            raise exception

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._put_back(trainer)
        test_follows = stage == TrainerFn.FITTING and self.test_after_fit
        self._agree_at_the_start = test_follows  # a stop before the test's loops waits for their start
        if not test_follows:
            self.stop_heartbeats()  # the command's work is done here: the others stop watching this process

    def _what_is_kept(self, holds: str) -> str:
        path = last_checkpoint_path(self._trainer)
        if path is not None and path.exists():
            return f"{path} {holds}; continue with: {self.continue_command()}"
        return "no checkpoint had been written, so there is nothing to continue from"

    def stop_heartbeats(self) -> None:
        if self.heartbeats is not None:
            self.heartbeats.stop()
            self.heartbeats = None

    def _put_back(self, trainer: Trainer) -> None:
        """Lightning's handlers and per-step check, and the signal handlers from before the loops, after a stage."""
        vars(trainer.fit_loop.epoch_loop).pop("_broadcast_sigterm_tensor", None)  # the class's own method again
        vars(trainer._signal_connector).pop("_sigterm_notifier_fn", None)
        vars(trainer._signal_connector).pop("_slurm_sigusr_handler_fn", None)
        _put_back_signal_handlers(self._handlers_before_the_loops)
        self._in_the_loops = False
        self.last_loss = None


def _do_nothing(signum: int, frame: FrameType | None) -> None:
    pass


def _put_back_signal_handlers(replaced: dict[int, object]) -> None:
    """The handlers `FaultGuard._catch` replaced, each for its signal again; `replaced` is then empty."""
    for signum, handler in replaced.items():
        signal.signal(signum, handler)
    replaced.clear()


def _write_out_loggers(trainer: Trainer) -> None:
    for logger in trainer.loggers:
        try:
            logger.finalize("failed")
        except Exception:  # noqa: BLE001, S112 (the process ends anyway; what could be written was)
            continue


def _weights_kept(path: Path | None) -> str:
    if path is not None and path.exists():
        return f"{path} keeps the weights from before the divergence."
    return "No checkpoint had been written."


def last_checkpoint_path(trainer: Trainer) -> Path | None:
    """Where train.py's `last_checkpoint` callback writes `last.ckpt`; None with checkpointing turned off."""
    for callback in trainer.checkpoint_callbacks:
        if callback.filename == ModelCheckpoint.CHECKPOINT_NAME_LAST and callback.dirpath:
            return Path(callback.format_checkpoint_name({}))  # ModelCheckpoint's own naming: dirpath/last.ckpt
    return None
