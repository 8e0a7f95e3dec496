"""Test instruments: callbacks that make a run meet what a cluster does to it (signals, kills, a full disk), or that
record what it did. Given to train.py as `--trainer.callbacks+=tests.instruments.NAME`."""

import atexit
import errno
import fcntl
import json
import os
import signal
import time
from pathlib import Path

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import Timer


class SignalAt(Callback):
    """Global rank `rank` sends `signum` after training step `step` (or, with `step` -1, as the stage is set up,
    before its loops; with `step` -2 at the first test or prediction batch; with -3 as the fit ends, after its last
    check): to itself, with `group` to its process group, as a terminal does (a real run's), or with `parent` to the
    process that started it (ddp_spawn's)."""

    def __init__(
        self, signum: int = int(signal.SIGTERM), step: int = 1, rank: int = 0, group: bool = False, parent: bool = False
    ) -> None:
        self.signum, self.step, self.rank, self.group, self.parent = signum, step, rank, group, parent

    def _send(self, trainer: Trainer) -> None:
        if trainer.global_rank == self.rank and self.group:
            os.killpg(os.getpgrp(), self.signum)
        elif trainer.global_rank == self.rank:
            os.kill(os.getppid() if self.parent else os.getpid(), self.signum)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.step == -1:
            self._send(trainer)

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            self._send(trainer)

    def on_test_batch_start(self, trainer: Trainer, *args) -> None:
        if self.step == -2:
            self._send(trainer)

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.step == -3:
            self._send(trainer)

    on_predict_batch_start = on_test_batch_start


class BudgetSpentAt(Callback):
    """Global rank 0 holds its `batch`-th training batch of the command until the Trainer's time budget
    (`--trainer.max_time`) is spent, as a slow batch would: Lightning's Timer asks the training to stop there."""

    def __init__(self, batch: int = 1) -> None:
        self.batch, self.seen = batch, 0

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        self.seen += 1
        if self.seen == self.batch and trainer.global_rank == 0:
            (timer,) = [callback for callback in trainer.callbacks if isinstance(callback, Timer)]
            while timer.time_remaining() > 0:
                time.sleep(0.01)


class DivergeInEpoch(Callback):
    """Every process trains with a learning rate of 1e38 from epoch `epoch`: the loss overflows within steps."""

    def __init__(self, epoch: int = 1) -> None:
        self.epoch = epoch

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.current_epoch == self.epoch:
            for group in trainer.optimizers[0].param_groups:
                group["lr"] = 1e38


class NoSpaceAfterEpoch(Callback):
    """From the end of epoch `epoch`, every write that reaches `os.fsync` in this process fails with ENOSPC."""

    def __init__(self, epoch: int = 0) -> None:
        self.epoch = epoch

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.current_epoch == self.epoch:

            def full(descriptor: int) -> None:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            os.fsync = full


class FailAtExit(Callback):
    """Global rank `rank` fails as its program ends, after training and once global rank 0's work is done (the run's
    folder no longer held: rank 0 then waits for it): aborted (as a C++ library's "terminate called" does), or exit
    status 3."""

    def __init__(self, rank: int = 1, abort: bool = True) -> None:
        self.rank, self.abort = rank, abort

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if trainer.global_rank == self.rank and stage == "fit":
            atexit.register(self._fail, trainer.default_root_dir)

    def _fail(self, root: str) -> None:
        (run,) = Path(root).glob(
            "*/version_*"
        )  # the test's one run (rank 0's folder; a broadcast would be a collective)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until rank 0 let the run go
            held = os.open(run, os.O_RDONLY)
            try:
                fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                time.sleep(0.05)
            finally:
                os.close(held)
        os.abort() if self.abort else os._exit(3)


class RecordTrainSamples(Callback):
    """Writes which training samples this process was given, in order, per epoch, as indices into the training
    split (the synthetic images all differ), to `<default_root_dir>/samples/rank<R>_epoch<E>[_stopped].json` (an epoch
    cut short: `_stopped`)."""

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        images, _targets = trainer.datamodule.train_set.tensors
        self.index_of = {image.numpy().tobytes(): index for index, image in enumerate(images)}
        self.seen: list[int] = []

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.seen = []

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        self.seen += [self.index_of[image.numpy().tobytes()] for image in batch[0]]

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        whole = trainer.fit_loop.epoch_loop.batch_progress.is_last_batch  # or cut short by the time budget
        self._write(trainer, "" if whole else "_stopped")

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._write(trainer, "_stopped")

    def _write(self, trainer: Trainer, suffix: str) -> None:
        folder = Path(trainer.default_root_dir) / "samples"
        folder.mkdir(exist_ok=True)
        (folder / f"rank{trainer.global_rank}_epoch{trainer.current_epoch}{suffix}.json").write_text(
            json.dumps(self.seen)
        )


class RecordPid(Callback):
    """Writes this process's id to `<default_root_dir>/pids/rank<global rank>` as training starts."""

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        folder = Path(trainer.default_root_dir) / "pids"
        folder.mkdir(exist_ok=True)
        (folder / f"rank{trainer.global_rank}").write_text(str(os.getpid()))


class KillNodeOnce(Callback):
    """Global rank `rank` SIGKILLs its node (the process group of its launcher under scripts/local_cluster.sh, and
    itself; with `node` false itself alone, a pod) before step `step`, as a node that loses its power would, once per
    job (a file `node-killed`)."""

    def __init__(self, rank: int = 1, step: int = 5, node: bool = True) -> None:
        self.rank, self.step, self.node = rank, step, node

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        marker = Path(trainer.default_root_dir) / "node-killed"
        if (trainer.global_rank, trainer.global_step) == (self.rank, self.step) and not marker.exists():
            marker.write_text(str(time.time()))
            if self.node:
                os.killpg(os.getpgid(os.getppid()), signal.SIGKILL)
            os.kill(os.getpid(), signal.SIGKILL)


class HoldUntilStopped(Callback):
    """Global rank 0 holds training before step `step` until the launcher stops the job (a SIGTERM that the
    graceful stop records), once per job: it leaves a file `held` first, which the test waits for."""

    def __init__(self, step: int = 5) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        marker = Path(trainer.default_root_dir) / "held"
        if (trainer.global_rank, trainer.global_step) != (0, self.step) or marker.exists():
            return
        marker.touch()
        stop = next(callback for callback in trainer.callbacks if type(callback).__name__ == "GracefulStop")
        deadline = time.monotonic() + 60
        while not stop.signal and time.monotonic() < deadline:
            time.sleep(0.05)


class BrokenAtBuild(Callback):
    """A callback with a bug: building it raises a ValueError of its own, whatever `every` is."""

    def __init__(self, every: int = 1) -> None:
        self.every = every
        raise ValueError("the table of intervals is empty")
