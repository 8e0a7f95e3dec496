"""Running train.py as a user does, and reading what a run leaves behind."""

import atexit
import contextlib
import errno
import io
import json
import logging
import multiprocessing
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests import preloaded

REPO = Path(__file__).resolve().parents[1]
# Where a download would go, nothing answers: tests never reach the network, whatever machine runs them.
NO_NETWORK = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"}


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    pid: int  # of the process the user started: rank 0 under Lightning's launcher


class Said:
    line = ""  # what the program said on standard error, without the last line break


@contextlib.contextmanager
def ends_in_error() -> Iterator[Said]:
    """Around `main(ARGV)` run in this process: it must end with exit status 1; `.line` is what it said on
    standard error (one line, for a mistake)."""
    said, stderr = Said(), io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            yield said
        except SystemExit as exit_info:
            assert exit_info.code == 1, (exit_info.code, stderr.getvalue())
        else:
            raise AssertionError(f"it did not end with an error; it said: {stderr.getvalue()}")
    said.line = stderr.getvalue().rstrip("\n")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


WAIT_S = 60  # the longest a test instrument waits for another process before it fails the run


# A short run on the synthetic data (tests/conftest.py): the options each test starts from, by a name of their own.
SMALL_RUN = {
    "--model": "SeqNet",
    "--data.dataset": "mnist",
    "--data.val_size": 200,  # of the 1200 training images: 1000 left, 10 steps of 50 per epoch on 2 processes
    "--data.batch_size": 50,
    "--trainer.max_epochs": 1,
    "--trainer.accelerator": "cpu",
    "--trainer.enable_progress_bar": "false",
    "--devices": None,
}


def small_run(data_dir: Path, root: Path | None, *args: str, **settings) -> list[str]:
    """The command line of a short run of train.py on the data in `data_dir`, writing under `root`: SMALL_RUN's
    options, changed by their last name (`devices=2`, `max_epochs=3`, `accelerator=None` to leave one out), then
    `args`."""
    options = dict(SMALL_RUN)
    for name, value in settings.items():
        (option,) = [option for option in options if option.rsplit(".", 1)[-1].lstrip("-") == name]
        options[option] = value
    argv = ["--data.data_dir", str(data_dir)]
    if root is not None:
        argv += ["--trainer.default_root_dir", str(root)]
    for option, value in options.items():
        if value is not None:
            argv += [option, str(value)]
    return [*argv, *args]


def run_train(*args: str, timeout: float = 240, env: dict[str, str] | None = None, repo: Path = REPO) -> Run:
    """Run `python train.py ARGS` from the repository root (or the copy of the program in `repo`), with this
    environment and `env`, and wait for it, at most `timeout` seconds.

    The process is forked with torch and Lightning already imported (tests/preloaded.py): the same program, seconds
    sooner. Like `run_command`, it runs in a session of its own: a process of it still running 10 s after it ended
    fails the test (nothing left behind), and every process of it is killed at the end."""
    with tempfile.TemporaryDirectory() as streams:
        stdout, stderr = Path(streams, "stdout"), Path(streams, "stderr")
        process = start_train(*args, stdout=stdout, stderr=stderr, env=env, repo=repo)
        try:
            process.join(timeout)
            if process.exitcode is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.join()
                raise AssertionError(
                    f"train.py {' '.join(args)}\nstill running after {timeout} s. Its output:\n"
                    f"{stdout.read_text()[-2000:]}\n{stderr.read_text()[-4000:]}"
                )
            left = left_behind(session=process.pid)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
        assert not left, f"train.py {' '.join(args)}\nleft behind:\n{left}{stderr.read_text()[-3000:]}"
        return Run(process.exitcode, stdout.read_text(), stderr.read_text(), process.pid)


# The loggers to which Lightning and torchmetrics give a handler of their own, holding the standard error of the moment
# they were imported: `run_in_process` points them at its capture.
LIBRARY_LOGGERS = ("lightning", "lightning.fabric", "lightning.pytorch", "torchmetrics")


@contextlib.contextmanager
def signal_handlers_and_environment_kept() -> Iterator[None]:
    """Put back, after the block, this process's handlers of SIGINT, SIGTERM and SIGHUP and its environment
    variables, which a run of train.py in this process changes."""
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    environment = dict(os.environ)
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        os.environ.clear()
        os.environ.update(environment)


def run_in_process(*args: str) -> Run:
    """Run `train.py ARGS` in this process (`app.main.run`), capturing what it prints, Lightning's log lines too, for
    a one-process test of a run's folder, checkpoints or settings. What the command changes of the process (signal
    handlers, the environment, torch's random and deterministic settings) is put back. Not for several processes
    (data-loading workers included), a stop by a signal, warnings (pytest records them), or what is read at import:
    those start `python train.py` (`run_train`)."""
    from app.main import run  # noqa: PLC0415 (the program, imported by the tests that run it)

    stdout, stderr = io.StringIO(), io.StringIO()
    loggers = map(logging.getLogger, LIBRARY_LOGGERS)
    handlers = {handler for logger in loggers for handler in logger.handlers if type(handler) is logging.StreamHandler}
    streams = {handler: handler.setStream(stderr) for handler in handlers}
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        with signal_handlers_and_environment_kept(), torch.random.fork_rng([]):
            os.environ.update(NO_NETWORK)
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                status, _met = run(list(args))
    finally:
        torch.use_deterministic_algorithms(deterministic)
        for handler, stream in streams.items():
            handler.setStream(stream)
    return Run(status, stdout.getvalue(), stderr.getvalue(), os.getpid())


def start_train(
    *args: str, stdout: Path, stderr: Path | None = None, env: dict[str, str] | None = None, repo: Path = REPO
) -> multiprocessing.Process:
    """Start `python train.py ARGS` in `repo` as `run_train` does, without waiting for it: its output goes to the
    files (standard error to `stdout`'s too, without `stderr`); its pid leads a session of its own."""
    env = {**os.environ, **NO_NETWORK, "PYTHONUNBUFFERED": "1", **(env or {})}
    return preloaded.start(repo, list(args), env, stdout, stderr or stdout)


class TrainJob:
    """`python train.py ARGS` started by `start_train`, with what the tests use of `subprocess.Popen`'s handle (`pid`,
    `poll`, `communicate`, `wait`, `returncode`), its standard output and error in one file. `kill` ends its process
    group (the forks of Lightning's launcher are in it)."""

    def __init__(self, *args: str, output: Path, env: dict[str, str] | None = None, repo: Path = REPO) -> None:
        self.args = args
        self.output = output
        self.process = start_train(*args, stdout=output, env=env, repo=repo)
        self.pid = self.process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self, timeout: float) -> int:
        """Wait for it to end, at most `timeout` seconds (then subprocess.TimeoutExpired); its exit status."""
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired(["train.py", *self.args], timeout, self.output.read_text())
        return self.process.exitcode

    def communicate(self, timeout: float) -> tuple[str, None]:
        """Wait for it to end, at most `timeout` seconds (then subprocess.TimeoutExpired); its output."""
        self.wait(timeout)
        return self.output.read_text(), None

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, signal.SIGKILL)
        self.process.join()


def run_local_cluster(
    nodes: int,
    devices: int,
    *args: str,
    launcher: str = "lightning",
    max_restarts: int = 0,
    timeout: float = 300,
    env: dict[str, str] | None = None,
) -> Run:
    """Run `scripts/local_cluster.sh NODES DEVICES -- ARGS`: several "nodes" of train.py on this machine; `env`: more
    of the script's variables (NNODES, FIRST_NODE, MASTER_PORT)."""
    command = local_cluster_command(nodes, devices, *args)
    env = {"LAUNCHER": launcher, "MAX_RESTARTS": str(max_restarts), "PYTHON": sys.executable, **(env or {})}
    return run_command(command, timeout, env)


def local_cluster_command(nodes: int, devices: int, *args: str) -> list[str]:
    return ["scripts/local_cluster.sh", str(nodes), str(devices), "--", *args]


def run_command(command: list[str], timeout: float, env: dict[str, str] | None = None, cwd: Path = REPO) -> Run:
    """Run a command (from the repository root, by default) and wait for it, at most `timeout` seconds.

    The command runs in a session of its own: a process of that session still running 10 s after the command
    ended fails the test (nothing left behind), and every one is killed at the end whatever happened, so that a
    timeout or a crash leaves no rank of a DDP job behind. (local_cluster.sh puts each node in a session of its
    own and ends them itself.) A command still running at the timeout fails the test with what it printed until
    then, so that a hang shows where it happened.
    """
    env = {**os.environ, **NO_NETWORK, "PYTHONUNBUFFERED": "1", **(env or {})}
    process = subprocess.Popen(
        command,
        cwd=cwd,
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
        left = left_behind(session=process.pid)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(
            f"{' '.join(command)}\nstill running after {timeout} s. Its output:\n{stdout[-2000:]}\n{stderr[-4000:]}"
        ) from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        if process.returncode is None:
            process.communicate()
    assert not left, f"{' '.join(command)}\nleft behind:\n{left}{stderr[-3000:]}"
    return Run(process.returncode, stdout, stderr, process.pid)


def wait_for(condition, timeout: float, what: str, every: float = 0.5) -> None:
    """Check `condition()` every `every` seconds until it holds; fail the test, saying what for, after `timeout`."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(every)


def left_behind(session: int | None = None, marker: str | None = None, timeout: float = 10) -> str:
    """What is still running of a job that has ended, once nothing is or after `timeout` s: the processes of its
    `session` (the pid that leads it) and those whose command line holds `marker`, a line each.

    Ask before the test's own clean-up kills what is left, or the answer is always nothing. The forks of
    `run_train` (tests/preloaded.py) are found by their session: their command line is not train.py's."""
    deadline = time.monotonic() + timeout
    while True:
        left = [
            f"{pid} {command}\n"
            for pid, its_session, command in _running_processes()
            if its_session == session or (marker and marker in command)
        ]
        if not left or time.monotonic() > deadline:
            return "".join(left)
        time.sleep(0.1)


def _running_processes() -> Iterator[tuple[int, int, str]]:
    """Each process's pid, session and command line; not those that have ended and wait to be reaped (zombies)."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
            command = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # it has just ended
            continue
        state, _parent, _group, session = stat.rsplit(")", 1)[1].split()[:4]  # after the name, which may hold spaces
        if state not in ("Z", "X"):
            yield int(entry.name), int(session), command.strip()


def scalars(log_dir: Path) -> dict[str, list[float]]:
    """Every scalar series TensorBoard would show for the run in `log_dir`."""
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [event.value for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def max_difference(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> float:
    """The largest difference between two state dicts' tensors of the same names."""
    assert first.keys() == second.keys()
    return max((first[k].double() - second[k].double()).abs().max().item() for k in first)


class RecordTrainSamples(Callback):
    """Test instrument: writes which training samples this rank was given, in order, in each epoch.

    Samples are recognised by their pixels (the synthetic images are all different) and written as indices into
    the datamodule's training split, to `<default_root_dir>/samples/rank<global rank>_epoch<epoch>.json`.
    """

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        datamodule = trainer.datamodule
        images, _targets = datamodule.train_set.tensors
        self.index_of = {image.numpy().tobytes(): index for index, image in enumerate(images)}
        self.seen: list[int] = []  # a run continued mid-epoch starts with no on_train_epoch_start

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.seen: list[int] = []

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        self.seen += [self.index_of[image.numpy().tobytes()] for image in batch[0]]

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._write(trainer, "")

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self._write(trainer, "_stopped")  # the part of the epoch before a stop

    def _write(self, trainer: Trainer, suffix: str) -> None:
        folder = Path(trainer.default_root_dir) / "samples"
        folder.mkdir(exist_ok=True)
        name = f"rank{trainer.global_rank}_epoch{trainer.current_epoch}{suffix}.json"
        (folder / name).write_text(json.dumps(self.seen))


class FailOnRank(Callback):
    """Test instrument: the process of global rank `rank` raises when training starts, as a bug would; every
    process does with `rank` None."""

    def __init__(self, rank: int | None = 0) -> None:
        self.rank = rank

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.rank in (None, trainer.global_rank):
            raise RuntimeError(f"planned failure on rank {trainer.global_rank}")


class WaitOnRank0(Callback):
    """Test instrument: global rank 0 waits when training starts, as it would in a collective on NCCL for a process
    that is lost; after WAIT_S seconds it ends its process with exit status 3, and the test fails."""

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.global_rank == 0 and not threading.Event().wait(WAIT_S):
            os._exit(3)


class FailOnceRank0Spoke(Callback):
    """Test instrument: global rank 0 raises when training starts, as a bug would; global rank 1 raises the same once
    rank 0 has printed its error (the `spoken` key of app/command_line/speaking.py in the job's store), as a process
    that meets the bug a moment later does."""

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.global_rank == 1:
            from app.job.process_group import store_client

            spoken = torch.distributed.PrefixStore("report/0/", store_client(timeout_s=WAIT_S))
            spoken.wait(["spoken"])
        raise RuntimeError(f"planned failure on rank {trainer.global_rank}")


class FailToBuildOnLocalRank(Callback):
    """Test instrument: the process of local rank `local_rank` alone fails with a one-line mistake while the command
    line is turned into objects, before the processes meet."""

    def __init__(self, local_rank: int = 1) -> None:
        if os.environ.get("LOCAL_RANK", "0") != str(local_rank):
            return
        from app.errors import UserError

        raise UserError(f"planned mistake in local rank {local_rank} alone")


class StopAfterEpoch(Callback):
    """Test instrument: stops training after epoch `epoch`, as an interrupted run would have."""

    def __init__(self, epoch: int = 0) -> None:
        self.epoch = epoch

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.current_epoch == self.epoch:
            trainer.should_stop = True


class RecordPid(Callback):
    """Test instrument: writes this rank's process id to `<default_root_dir>/pids/rank<global rank>`."""

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        folder = Path(trainer.default_root_dir) / "pids"
        folder.mkdir(exist_ok=True)
        (folder / f"rank{trainer.global_rank}").write_text(str(os.getpid()))


class CheckpointAndKillAtStep(Callback):
    """Test instrument: what a pre-empted job leaves behind. After training step `step`, the process writes
    `last.ckpt` into its run's checkpoint folder, in the middle of the epoch, and SIGKILLs itself. One process."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            trainer.save_checkpoint(Path(trainer.log_dir) / "checkpoints" / "last.ckpt")
            os.kill(os.getpid(), signal.SIGKILL)


class KillRankOnce(Callback):
    """Test instrument: the process of global rank `rank` SIGKILLs itself in the middle of epoch `epoch`, once per
    job: it leaves a file `killed` in the default root folder first, and a restarted job finds it there."""

    def __init__(self, rank: int = 0, epoch: int = 1) -> None:
        self.rank = rank
        self.epoch = epoch

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        marker = Path(trainer.default_root_dir) / "killed"
        here = (trainer.global_rank, trainer.current_epoch, batch_idx) == (self.rank, self.epoch, 2)
        if here and not marker.exists():
            marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)


class KillNodeOnce(Callback):
    """Test instrument: the process of global rank `rank` SIGKILLs its node (under scripts/local_cluster.sh, the
    process group of its launcher, and itself) before training step `step`, as a node that loses its power would,
    once per job: it leaves a file `node-killed` in the default root folder first, holding the time."""

    def __init__(self, rank: int = 1, step: int = 5) -> None:
        self.rank = rank
        self.step = step

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        marker = Path(trainer.default_root_dir) / "node-killed"
        if (trainer.global_rank, trainer.global_step) == (self.rank, self.step) and not marker.exists():
            marker.write_text(str(time.time()))
            os.killpg(os.getpgid(os.getppid()), signal.SIGKILL)  # torchrun's agent, and this node's others
            os.kill(os.getpid(), signal.SIGKILL)  # torchrun starts its processes in sessions of their own


class HoldUntilStopped(Callback):
    """Test instrument: global rank 0 holds training before step `step` until the launcher stops the job (SIGTERM,
    which FaultGuard records), once per job: it leaves a file `held` in the default root folder first, which the test
    waits for. A job a node joins is stopped so, by torchrun, to start again with the new node."""

    def __init__(self, step: int = 5) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        marker = Path(trainer.default_root_dir) / "held"
        if (trainer.global_rank, trainer.global_step) != (0, self.step) or marker.exists():
            return
        marker.touch()
        guard = next(callback for callback in trainer.callbacks if type(callback).__name__ == "FaultGuard")
        wait_for(lambda: guard.stop_signal, WAIT_S, "the launcher to stop the job", every=0.05)


class SigtermAfterStep(Callback):
    """Test instrument: the process of global rank `rank` sends itself SIGTERM after training step `step`, as
    `kill`, a container runtime or a scheduler would."""

    def __init__(self, rank: int = 0, step: int = 1) -> None:
        self.rank = rank
        self.step = step

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        if (trainer.global_rank, trainer.global_step) == (self.rank, self.step):
            os.kill(os.getpid(), signal.SIGTERM)


class SigtermMidWindow(Callback):
    """Test instrument: global rank `rank` sends itself SIGTERM after batch `batch` of epoch `epoch` (by default
    the second of the three batches whose gradients one optimizer step accumulates), once."""

    def __init__(self, rank: int = 1, epoch: int = 1, batch: int = 4) -> None:
        self.rank, self.epoch, self.batch = rank, epoch, batch

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        if (trainer.global_rank, trainer.current_epoch, batch_idx) == (self.rank, self.epoch, self.batch):
            os.kill(os.getpid(), signal.SIGTERM)


class SignalInEvaluation(Callback):
    """Test instrument: the process of global rank 0 sends itself `signum` (SIGTERM by default) at the start of the
    first test or prediction batch, as a scheduler's time limit, Ctrl-C or a closed terminal would."""

    def __init__(self, signum: int = int(signal.SIGTERM)) -> None:
        self.signum = signum

    def _stop(self, trainer: Trainer) -> None:
        if trainer.global_rank == 0 and not trainer.sanity_checking:
            os.kill(os.getpid(), self.signum)

    def on_test_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args) -> None:
        self._stop(trainer)

    def on_predict_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args) -> None:
        self._stop(trainer)


class CtrlCInSanityCheck(Callback):
    """Test instrument: global rank 0 gets Ctrl-C at the start of the sanity check's first batch."""

    def on_validation_batch_start(self, trainer: Trainer, pl_module: LightningModule, *args) -> None:
        if trainer.global_rank == 0 and trainer.sanity_checking:
            os.kill(os.getpid(), signal.SIGINT)


class SignalAt(Callback):
    """Test instrument: at `hook`, global rank 0 sends `signum` to its process group, or with `alone` global rank 1 to
    itself alone: `setup` (once the logger has made the run's folder and its event file, before the stage's loops)
    or `on_train_end` (after the fit's last check)."""

    def __init__(self, hook: str = "setup", signum: int = int(signal.SIGTERM), alone: bool = False) -> None:
        self.hook, self.signum, self.alone = hook, signum, alone

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.hook == "setup":
            log_dir = Path(trainer.log_dir)  # a broadcast from rank 0: on every rank
            assert trainer.global_rank != 0 or any(log_dir.iterdir()), "the run's folder holds no file yet"
            self._send(trainer)

    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.hook == "on_train_end":
            self._send(trainer)

    def _send(self, trainer: Trainer) -> None:
        if self.alone and trainer.global_rank == 1:
            os.kill(os.getpid(), self.signum)
        elif not self.alone and trainer.global_rank == 0:
            os.killpg(os.getpgid(0), self.signum)


class SigtermWhileOthersWait(Callback):
    """Test instrument: at the end of the first validation, rank 0 waits until every other rank has said (a file)
    that it goes on to the next collective (the sync of the epoch's metrics), then sends itself SIGTERM: the signal
    finds one rank running Python and the others inside that collective, where their handlers cannot run."""

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.sanity_checking or trainer.current_epoch != 0:
            return
        folder = Path(trainer.default_root_dir)
        if trainer.global_rank != 0:
            (folder / f"rank{trainer.global_rank}_goes_to_sync").touch()
            return
        others = [folder / f"rank{rank}_goes_to_sync" for rank in range(1, trainer.world_size)]
        deadline = time.monotonic() + WAIT_S
        while not all(path.exists() for path in others):
            if time.monotonic() > deadline:
                raise RuntimeError(f"not every rank went on to the metrics' sync within {WAIT_S} s")
            time.sleep(0.01)
        os.kill(os.getpid(), signal.SIGTERM)


class HangUpAfterStep(Callback):
    """Test instrument: after training step `step`, rank 0 sends SIGHUP to every process of its process group, as a
    terminal that closes (or an ssh session that drops) does."""

    def __init__(self, step: int = 1) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        if (trainer.global_rank, trainer.global_step) == (0, self.step):
            os.killpg(os.getpgrp(), signal.SIGHUP)


class SlowValidation(Callback):
    """Test instrument: global rank 0 spends `seconds` in each validation after the sanity check, as a long
    validation would, while the other ranks wait for it in the next collective."""

    def __init__(self, seconds: float = 1.0) -> None:
        self.seconds = seconds

    def on_validation_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.global_rank == 0 and not trainer.sanity_checking:
            time.sleep(self.seconds)


class MoreEpochsOnRank(Callback):
    """Test instrument: global rank `rank` trains `epochs` epochs whatever --trainer.max_epochs says, as a node
    whose settings differ in a way no comparison sees: the others go on to the test while it still trains."""

    def __init__(self, rank: int = 1, epochs: int = 2) -> None:
        self.rank, self.epochs = rank, epochs

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.global_rank == self.rank:
            trainer.fit_loop.max_epochs = self.epochs


class NoSpaceAfterEpoch(Callback):
    """Test instrument: from the end of epoch `epoch`, every write that reaches `os.fsync` in this process fails with
    ENOSPC, as on a full disk (for machines where the tests cannot mount a small file system). Real runs only."""

    def __init__(self, epoch: int = 0) -> None:
        self.epoch = epoch

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.current_epoch == self.epoch:

            def full(descriptor: int) -> None:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

            os.fsync = full


class CtrlCAfterStep(Callback):
    """Test instrument: after training step `step`, rank 0 sends SIGINT to every process of its process group, as a
    terminal does on Ctrl-C (tests start train.py in a session of its own); `presses` times, each once the one before
    has reached rank 0's FaultGuard (two signals that arrive before Python runs the handler count as one)."""

    def __init__(self, step: int = 1, presses: int = 1) -> None:
        self.step = step
        self.presses = presses

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, outputs, batch, batch_idx: int) -> None:
        if (trainer.global_rank, trainer.global_step) == (0, self.step):
            guard = next(callback for callback in trainer.callbacks if type(callback).__name__ == "FaultGuard")
            for _press in range(self.presses):
                os.killpg(os.getpgrp(), signal.SIGINT)
                deadline = time.monotonic() + WAIT_S
                while guard.stop_signal is None:  # Python runs the handler between two steps of this loop
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"SIGINT did not reach FaultGuard's handler in {WAIT_S} s")


class DivergeInEpoch(Callback):
    """Test instrument: from the start of epoch `epoch`, every rank trains with a learning rate of 1e38, as a user
    who chose far too high a one would: the weights and then the loss overflow within a few steps."""

    def __init__(self, epoch: int = 1) -> None:
        self.epoch = epoch

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.current_epoch == self.epoch:
            for group in trainer.optimizers[0].param_groups:
                group["lr"] = 1e38


class RecordDurableWrites(Callback):
    """Test instrument: records, in order, the files and folders this process flushes to the disk (`os.fsync`) and
    the renames it makes, and writes them to `<default_root_dir>/durable_writes.json` when the stage ends."""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.events: list[list[str]] = []
        fsync, replace = os.fsync, os.replace

        def recording_fsync(descriptor: int) -> None:
            self.events.append(["fsync", os.readlink(f"/proc/self/fd/{descriptor}")])
            fsync(descriptor)

        def recording_replace(source, target) -> None:
            replace(source, target)
            self.events.append(["rename", str(source), str(target)])

        self.originals = fsync, replace
        os.fsync, os.replace = recording_fsync, recording_replace

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        os.fsync, os.replace = self.originals
        if trainer.global_rank == 0:
            (Path(trainer.default_root_dir) / "durable_writes.json").write_text(json.dumps(self.events))

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        os.fsync, os.replace = self.originals  # a run in the test's process (`run_in_process`) leaves them as found


class SendsAtExit(Callback):
    """Like a logger that sends what it buffered from a thread of its own when the program ends (MLflow's, W&B's):
    the thread waits for the main thread to finish, then writes `path`. A process ended with `os._exit` never lets
    it run."""

    def __init__(self, path: str) -> None:
        self.path = path

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if trainer.is_global_zero and stage == "fit":
            threading.Thread(target=self._send_when_main_ends, daemon=False).start()

    def _send_when_main_ends(self) -> None:
        threading.main_thread().join()
        Path(self.path).write_text("sent")


class FailAtExit(Callback):
    """Test instrument: the process of global rank `rank` fails as the program ends, once its training is over:
    aborted at exit (`abort`, as a C++ library's "terminate called ..." does), or with exit status 3."""

    def __init__(self, rank: int = 1, abort: bool = True) -> None:
        self.rank = rank
        self.abort = abort

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if trainer.global_rank == self.rank and stage == "fit":
            atexit.register(os.abort if self.abort else lambda: os._exit(3))


class RecordCheckpointIO(Callback):
    """Test instrument: global rank 0 writes the class name of the Trainer's checkpoint writer to `path`."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.global_rank == 0:
            Path(self.path).write_text(type(trainer.strategy.checkpoint_io).__name__)


class KillLoaderWorkers(Callback):
    """Test instrument: before training step `step`, this process's children (its data-loading workers, with one
    device) are killed with SIGKILL, as the kernel's out-of-memory killer ends one, and this process waits until
    they have died: torch's SIGCHLD handler then says so at once. (Killed while the loader reads a batch from it,
    a worker breaks the pipe instead: a race, and another error.)"""

    def __init__(self, step: int = 2) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        if trainer.global_step != self.step:
            return
        for pid in Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").read_text().split():
            died = os.pidfd_open(int(pid))
            os.kill(int(pid), signal.SIGKILL)
            select.select([died], [], [], WAIT_S)  # readable once the process has ended
            os.close(died)


def error_line(argv: list[str]) -> str:
    """Run `train.py ARGV` in this process; the one line it ends with (on standard error, exit status 1)."""
    from app.main import main  # noqa: PLC0415 (the program, imported by the tests that run it)

    with ends_in_error() as said:
        main(argv)
    message = said.line
    assert isinstance(message, str) and message.startswith("error: "), message
    assert "\n" not in message and "Traceback" not in message
    return message


def assert_one_error_line(result, *words: str) -> str:
    """A real run ended with status 1 and one `error:` line from one process, with `words` in it. Where every rank
    meets the mistake, the first to get there speaks for the job: `error (rank 1): ` from a rank other than 0."""
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and re.match(r"error( \(rank \d+\))?: ", lines[0]), result.stderr[-3000:]
    assert lines == [result.stderr.strip().splitlines()[-1]]
    for word in words:
        assert word in lines[0]
    return lines[0]
