"""GracefulStop: every process stops at one step on a stop signal, the time budget's end or a diverged loss."""

import os
import signal
import subprocess
import sys
import threading
import time
from types import FrameType

import torch
from jsonargparse.typing import NonNegativeFloat, NonNegativeInt
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint, Timer
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info

from app.console import UserError, end_bars

NAMES = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "SIGINT (Ctrl-C)", signal.SIGHUP: "SIGHUP (hang-up)"}
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class Stopped(SystemExit):
    """Every process stopped at one step after the stop signal `signum`, having saved `checkpoint` there (None:
    nothing). A `SystemExit`, as Lightning's own `SIGTERMException`: uncaught, it ends a script without a traceback,
    with the status a shell gives a process the signal ended (130 after Ctrl-C, 143 after SIGTERM); train.py ends by
    the signal itself. `command`: how a program goes on, where it knows (the one it prints; [] for nothing to run)."""

    def __init__(self, signum: int, checkpoint: str | None = None, command: list[str] | None = None) -> None:
        super().__init__(128 + signum)
        self.signum, self.checkpoint, self.command = signum, checkpoint, command


class GracefulStop(Callback):
    """Stop every process of the job at one step on a stop signal or a diverged loss; keep the budget's last step.

    SIGTERM, Ctrl-C (SIGINT), a hang-up (SIGHUP), SLURM's requeue signal or a training loss that became NaN or infinite:
    every process stops at the same step, which is kept. The end of the Trainer's time budget (`max_time`) ends the
    fit as Lightning's `Timer` does, and that step is kept too.

    Args:
        every_n_steps: Optimizer steps between two checks, each one `strategy.reduce` of four flags (a stop signal,
            SLURM's requeue signal, a non-finite loss, a timed save); one more at each epoch's end and at each save.
            0: off, as if it were not there (no handler, no check; train.py leaves it out).
        checkpoint: The `ModelCheckpoint` whose folder a stop saves its last checkpoint into, with the loader's
            position (a continued run takes the next sample); None: a stop keeps nothing.
        save_every_s: Seconds of training after which a check saves `last.ckpt` too, mid-epoch (0: each check;
            None: never); a new run then also saves its weights before its first step.

    The handlers only record the signal; the processes act on it together at the next check (`last.ckpt` saved,
    `Stopped` raised on each). SIGTERM and SIGHUP reach the processes Lightning's launcher started. A signal before the
    training loop stops every process as it starts, keeping nothing; one during an evaluation, or a second Ctrl-C a
    second after the first, stops at once; one after the last check stays in `signal` for the caller. After SLURM's
    signal, `scontrol requeue`. A non-finite loss, kept on the device, is read at the checks and before each checkpoint:
    `UserError` before one could hold it. A signal ignored at the start (SIGHUP under `nohup`) stays ignored; the
    handlers from before come back at the stage's end. The budget's end saves `last.ckpt` at the Timer's step (at the
    end of an accumulated step) and the fit ends as Lightning ends it (a validation at an epoch's end, a best by
    `checkpoint.monitor`, which `last.ckpt` then learns); a continued run gets a budget of its own (checkpoints hold no
    Timer's time). Without a checkpoint, or before `min_epochs`/`min_steps`, the stop is Lightning's alone.

    Example::

        last = ModelCheckpoint(dirpath="checkpoints", filename="last", enable_version_counter=False)
        trainer = Trainer(strategy="ddp", devices=2, callbacks=[last, GracefulStop(checkpoint=last)])
        trainer.fit(model)  # SIGTERM: one step on every process, status 143; then ckpt_path="checkpoints/last.ckpt"
    """

    def __init__(
        self,
        every_n_steps: NonNegativeInt = 50,
        checkpoint: ModelCheckpoint | None = None,
        save_every_s: NonNegativeFloat | None = None,
    ) -> None:
        self.every_n_steps, self.checkpoint, self.save_every_s = every_n_steps, checkpoint, save_every_s
        self.signal: int | None = None  # the first stop signal, until the processes act on it
        self.requeue = False
        self._trainer: Trainer | None = None
        self._previous: dict[int, object] = {}  # the handlers this one replaced
        self._active = self._evaluating = self._said = False
        self._first_at = 0.0
        self._nonfinite: torch.Tensor | None = None  # on the device: any loss since the last check not finite
        self._step_seen = self._saved_at = 0
        self._kept: tuple | None = None  # the last checkpoint's settings, while the budget's save stands

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if not self.every_n_steps:
            return
        self._trainer, self._active, self._evaluating = trainer, True, False
        environment = getattr(trainer.strategy, "cluster_environment", None)
        slurm = isinstance(environment, SLURMEnvironment) and environment.auto_requeue and environment.requeue_signal
        self._signals = (*STOP_SIGNALS, *([environment.requeue_signal] if slurm else []))
        self._catch()  # before Lightning's own: it then leaves SLURM's signal to this one
        timers = [index for index, callback in enumerate(trainer.callbacks) if isinstance(callback, Timer)]
        self._timed, self._asked = bool(timers), False
        if timers and trainer.callbacks.index(self) < timers[-1]:  # after the Timer: its stop is seen at its step
            others = [callback for callback in trainer.callbacks if callback is not self]  # a new list: Lightning is
            trainer.callbacks = [*others[: timers[-1]], self, *others[timers[-1] :]]  # going through the old one

    def _catch(self) -> None:
        """Handle the stop signals here, again after Lightning put its SIGTERM handler in (also at each loop start)."""
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in self._signals:
            if self._previous.get(signum, signal.getsignal(signum)) is not signal.SIG_IGN:
                handler = signal.signal(signum, self._on_signal)
                if signum not in self._previous and handler != self._on_signal:
                    self._previous[signum] = handler

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        """Record the signal; no collective, no printing (a handler that writes where the program was writing fails
        with "reentrant call")."""
        if not self._active:  # after a stage that failed, Lightning put this handler back: as the one before
            previous = self._previous.get(signum, signal.SIG_DFL)
            signal.signal(signum, previous)
            if callable(previous):
                previous(signum, frame)
            elif previous == signal.SIG_DFL:
                signal.raise_signal(signum)
            return
        if signum not in STOP_SIGNALS:  # SLURM's
            self.requeue = True
            return
        if signum == signal.SIGHUP and sys.stdout.isatty():  # the terminal is gone: writing to it would fail
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.dup2(devnull, sys.stderr.fileno())
        if signum != signal.SIGINT and self.signal is None and self._trainer.strategy.launcher is not None:
            self._trainer.strategy.launcher.kill(signum)
        again = signum == signal.SIGINT == self.signal and time.monotonic() - self._first_at >= 1.0
        if self._evaluating or again:
            self._active, self.signal = False, None
            raise Stopped(signum)
        if self.signal is None:
            self.signal, self._first_at = signum, time.monotonic()

    def on_sanity_check_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self._active:
            return
        self._catch()
        self._agree(trainer)

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not self._active:
            return
        self.on_sanity_check_start(trainer, pl_module)
        self._saved_at, self._step_seen = time.monotonic(), trainer.global_step
        # Lightning broadcasts its own SIGTERM flag before every training step under DDP, and reads it back: a wait
        # for the device at every step (Lightning-AI/pytorch-lightning#21487). This callback takes SIGTERM in its
        # place (a flag Lightning's handler set before the loops is agreed on above), so the broadcast has nothing
        # to say; the loop's own method is back at the stage's end (`_put_back`).
        trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = lambda: None
        if self.save_every_s is not None and trainer.global_step == 0 and self.checkpoint is not None:
            trainer.save_checkpoint(self.last_path(), weights_only=False)  # a process lost at once restarts this run

    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.state.fn != TrainerFn.FITTING:  # an evaluation of its own: a stop stops it at once
            self._evaluating = True
            self.on_sanity_check_start(trainer, pl_module)

    on_test_start = on_predict_start = on_validation_start

    def _agree(self, trainer: Trainer) -> None:
        """Before the stage's training: a signal any process got stops every one, here, keeping nothing."""
        flag = torch.tensor(
            [self.signal or signal.SIGTERM * trainer.received_sigterm], device=trainer.strategy.root_device
        )
        signum = int(trainer.strategy.reduce(flag, reduce_op="max").item())
        if signum:
            rank_zero_info(f"Stopped by {NAMES[signum]} before this command's first training step: it kept nothing.")
            self.signal = None
            raise Stopped(signum)

    def on_validation_batch_end(self, trainer: Trainer, *args, **kwargs) -> None:
        if self.signal and not self._said and not self._evaluating and not trainer.sanity_checking:
            self._said = True
            step = (trainer.global_step // self.every_n_steps + 1) * self.every_n_steps
            rank_zero_info(
                f"{NAMES[self.signal]}: the run stops after this validation, at the end of epoch"
                f" {trainer.current_epoch} or after step {step}, whichever comes first."
            )

    def on_train_batch_start(self, trainer: Trainer, *args) -> None:
        self._asked = self._active and trainer.should_stop  # by another callback (EarlyStopping before min_epochs)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        if not self._active:
            return
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if isinstance(loss, torch.Tensor):  # no wait for the device: read at the next check
            bad = ~torch.isfinite(loss.detach())
            self._nonfinite = bad if self._nonfinite is None else self._nonfinite | bad
        if trainer.should_stop and not self._asked and self._timed and self.last_path():  # the Timer's, agreed by it
            loop = trainer.fit_loop
            if trainer.current_epoch < (loop.min_epochs or 0) or trainer.global_step < (loop.min_steps or 0):
                pass  # Lightning trains on to the minimum it was given
            elif trainer.global_step == self._step_seen:  # inside an accumulated step: stop at its end, whole
                trainer.should_stop = False  # on every process alike; the Timer asks again after the next batch
            else:
                self._check(trainer, spent=True)
        if trainer.global_step != self._step_seen and trainer.global_step % self.every_n_steps == 0:
            self._check(trainer)
        self._step_seen = trainer.global_step

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self._active:
            self._check(trainer, epoch_end=True)

    def on_save_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        """Before any checkpoint of the fit is written (every process): no diverged weights in it, no Timer time."""
        if self._active and not self._evaluating:
            self._check(trainer, loss_only=True)
            self.on_load_checkpoint(trainer, pl_module, checkpoint)

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        """A continued run's time budget is its own: the Timer does not take the time of the commands before."""
        for timer in (c for c in trainer.callbacks if isinstance(c, Timer) and self._active):
            checkpoint.get("callbacks", {}).pop(timer.state_key, None)

    def _check(self, trainer: Trainer, loss_only: bool = False, epoch_end: bool = False, spent: bool = False) -> None:
        save_due = self.save_every_s is not None and time.monotonic() - self._saved_at >= self.save_every_s
        flags = torch.tensor([self.signal or 0, self.requeue, 0, save_due], device=trainer.strategy.root_device)
        if self._nonfinite is not None:
            flags[2] = self._nonfinite
        signum, requeue, nonfinite, save_due = trainer.strategy.reduce(flags, reduce_op="max").tolist()
        path = self.last_path()
        if nonfinite:
            group = trainer.optimizers[0].param_groups[0]
            kept = f"{path} keeps the weights from before." if path and os.path.exists(path) else "Nothing was saved."
            raise UserError(
                f"the training loss became NaN or infinite by step {trainer.global_step} (epoch"
                f" {trainer.current_epoch}): lower the learning rate (now {group.get('max_lr', group['lr']):g}) and"
                f" train again. {kept}",
                every_process=True,
            )
        if loss_only:  # at a save: the signals wait for the next check
            return
        budget_kept = self._kept is not None  # the budget's step is saved: what follows it (a validation) is no step
        if (signum or requeue or save_due or spent) and path is not None and not budget_kept:
            trainer.save_checkpoint(path, weights_only=False)  # on every process: global rank 0 writes
            self._saved_at = time.monotonic()
        if requeue and trainer.is_global_zero:
            subprocess.run(["scontrol", "requeue", os.environ.get("SLURM_JOB_ID", "")], check=False)
        if spent and not (signum or requeue):  # the budget: the fit ends there, as Lightning ends it
            kept = f"; {path} holds that step" if path else ""
            if path is not None:  # the run's last checkpoint: one Lightning saves as the epoch ends would mark the
                self._kept = (self.checkpoint.save_top_k, self.checkpoint.save_last)  # epoch done, where it stopped
                self.checkpoint.save_last = False  # in the middle; a best one by its monitor is no last
                if self.checkpoint.monitor is None:  # the newest one is kept as the last
                    self.checkpoint.save_top_k = 0
            epoch, step = trainer.current_epoch, trainer.global_step
            rank_zero_info(f"The time budget (max_time) ends the fit in epoch {epoch}, after step {step}{kept}.")
        elif signum or requeue:
            signum = signum or self._signals[-1]
            when = "at its end" if epoch_end and not budget_kept else f"after step {trainer.global_step}"
            kept = f"{path} holds that step" if path else "nothing was saved (no checkpoint)"
            requeued = "; SLURM was asked to requeue the job" if requeue else ""
            name = NAMES.get(signum, "SLURM's requeue signal")
            end_bars(trainer)
            rank_zero_info(f"Stopped by {name} in epoch {trainer.current_epoch}, {when}; {kept}{requeued}.")
            self.signal = None
            raise Stopped(signum, path)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """The budget's last checkpoint, saved before the fit's last validation, learns the checkpoints it kept."""
        if self._kept is not None and trainer.is_global_zero:  # (the process that writes)
            checkpoint_io, path = trainer.strategy.checkpoint_io, self.last_path()
            saved = checkpoint_io.load_checkpoint(path)
            saved["callbacks"].update({c.state_key: c.state_dict() for c in trainer.checkpoint_callbacks})
            checkpoint_io.save_checkpoint(saved, path)

    def last_path(self) -> str | None:
        """`last.ckpt` in the folder of `checkpoint`, as its `save_last` names it."""
        if self.checkpoint is None or not self.checkpoint.dirpath:
            return None
        return self.checkpoint.format_checkpoint_name({}, filename=self.checkpoint.CHECKPOINT_NAME_LAST)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        if not self.every_n_steps:
            return
        end_bars(trainer)  # the lines said next (the stop's, an error's) stand below them
        if isinstance(exception, Stopped) and self._evaluating:
            stage = trainer.state.fn.value
            rank_zero_info(f"Stopped by {NAMES[exception.signum]}: the {stage} was cut short and keeps nothing.")
        self._put_back(trainer)

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        """A signal after the stage's last check stays in `signal`: the stage's work is kept, its caller stops."""
        self._put_back(trainer)

    def _put_back(self, trainer: Trainer) -> None:
        vars(trainer.fit_loop.epoch_loop).pop("_broadcast_sigterm_tensor", None)  # the loop's own method again
        if self._kept is not None:  # the last checkpoint's saving, as before the budget's end
            (self.checkpoint.save_top_k, self.checkpoint.save_last), self._kept = self._kept, None
        self._active = self._said = False
        self._nonfinite = self._trainer = None
        if threading.current_thread() is threading.main_thread():
            for signum, handler in self._previous.items():
                signal.signal(signum, handler)
