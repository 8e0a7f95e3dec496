"""Running train.py and its pieces as a user does, and reading what a run leaves behind."""

import contextlib
import io
import logging
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from lightning.pytorch.utilities import rank_zero_only
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REPO = Path(__file__).resolve().parents[1]
# Where a download would go, nothing answers: tests never reach the network, whatever machine runs them.
NO_NETWORK = {"http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"}
WAIT_S = 60  # the longest a test instrument waits for another process


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str


# A short run on the synthetic data (tests/conftest.py): the options each test starts from.
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
    """The command line of a short run on the data in `data_dir`, writing under `root`: SMALL_RUN's options, changed
    by their last name (`devices=2`, `max_epochs=3`, `accelerator=None` to leave one out), then `args`."""
    options = dict(SMALL_RUN)
    for name, value in settings.items():
        (option,) = [option for option in options if option.rsplit(".", 1)[-1].lstrip("-") == name]
        options[option] = value
    argv = ["--data.data_dir", str(data_dir)] + (["--trainer.default_root_dir", str(root)] if root else [])
    for option, value in options.items():
        if value is not None:
            argv += [option, str(value)]
    return [*argv, *args]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def run_command(command: list[str], timeout: float = 240, env: dict | None = None, cwd: Path = REPO) -> Run:
    """Run a command in a session of its own and wait for it, at most `timeout` seconds; a process of that session
    still running 10 s after it ended fails the test (nothing left behind), and every one is killed at the end."""
    env = {**os.environ, **NO_NETWORK, "PYTHONUNBUFFERED": "1", **(env or {})}
    process = subprocess.Popen(
        command, cwd=cwd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
        left = left_behind(process.pid)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        raise AssertionError(
            f"{' '.join(command)}\nstill running after {timeout} s:\n{stdout[-2000:]}\n{stderr[-4000:]}"
        ) from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    assert not left, f"{' '.join(command)}\nleft behind:\n{left}{stderr[-3000:]}"
    return Run(process.returncode, stdout, stderr)


def run_train(*args: str, timeout: float = 240, env: dict | None = None, cwd: Path = REPO) -> Run:
    """`python train.py ARGS` (the program in `cwd`), a real process, as `run_command` runs it."""
    return run_command([sys.executable, "train.py", *args], timeout, env, cwd)


@contextlib.contextmanager
def state_kept() -> Iterator[None]:
    """Put back this process's signal handlers, environment and global rank after the block (a run changes them)."""
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    environment, rank = dict(os.environ), rank_zero_only.rank
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        os.environ.clear()
        os.environ.update(environment)
        rank_zero_only.rank = rank


@contextlib.contextmanager
def lines_said() -> Iterator[list[str]]:
    """What Lightning's `rank_zero_info` says within the block (the lines of the program's pieces among them)."""
    said: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    logger.addHandler(handler)
    try:
        yield said
    finally:
        logger.removeHandler(handler)


def run_in_process(*args: str) -> Run:
    """`train.py ARGS` in this process (`train.main`), its output captured, Lightning's log lines too: one process,
    no stop by a signal (it would end this process)."""
    from train import main  # noqa: PLC0415

    stdout, stderr = io.StringIO(), io.StringIO()
    loggers = [
        logging.getLogger(name) for name in ("lightning", "lightning.pytorch", "lightning.fabric", "torchmetrics")
    ]
    handlers = {h for logger in loggers for h in logger.handlers if type(h) is logging.StreamHandler}  # their own
    streams = {handler: handler.setStream(stderr) for handler in handlers}
    status = 0
    try:
        with (
            state_kept(),
            torch.random.fork_rng([]),
            contextlib.redirect_stdout(stdout),
            contextlib.redirect_stderr(stderr),
        ):
            os.environ.update(NO_NETWORK)
            main(list(args))
    except SystemExit as end:
        status = end.code or 0
    finally:
        for handler, stream in streams.items():
            handler.setStream(stream)
    return Run(status, stdout.getvalue(), stderr.getvalue())


# Processes of a job that the test starts itself, forked from a server that imported the libraries and the program
# once: each runs a function of a test module as one process of the job, with its launcher's variables.
_forks = multiprocessing.get_context("forkserver")
_forks.set_forkserver_preload(["torch", "lightning.pytorch", "torchmetrics", "jsonargparse", "train", "tests.helpers"])


def _as_a_process_of_the_job(target: Callable, args: tuple, env: dict, output: str) -> None:
    log = os.open(output, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(log, 1)
    os.dup2(log, 2)
    sys.stdout = io.TextIOWrapper(open(1, "wb", 0, closefd=False), write_through=True)  # noqa: SIM115
    sys.stderr = io.TextIOWrapper(open(2, "wb", 0, closefd=False), write_through=True)  # noqa: SIM115
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a new interpreter
    os.environ.update({**NO_NETWORK, **env})
    rank_zero_only.rank = int(env.get("RANK", env.get("LOCAL_RANK", "0")))
    target(*args)


def job(target: Callable, world_size: int, *args, nodes: int = 1, ranks=None, port=None, folder: Path) -> list:
    """Start `target(rank, *args)` in `world_size` processes (or those of `ranks`), a job of `nodes` nodes as
    Lightning's launcher makes one (MASTER_ADDR, MASTER_PORT, NODE_RANK, LOCAL_RANK, WORLD_SIZE); each writes its
    output to `folder/rank<N>.log`. Returns the processes (`Process.pid`, `.join`, `.exitcode`)."""
    port, per_node, processes = port or free_port(), world_size // nodes, []
    for rank in range(world_size) if ranks is None else ranks:
        variables = {
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "WORLD_SIZE": str(world_size),
            "NODE_RANK": str(rank // per_node),
            "LOCAL_RANK": str(rank % per_node),
        }
        output = str(folder / f"rank{rank}.log")
        process = _forks.Process(target=_as_a_process_of_the_job, args=(target, (rank, *args), variables, output))
        process.start()
        processes.append(process)
    return processes


def ended(processes: list, timeout: float = 120) -> list[int]:
    """The exit statuses of `processes` (minus a signal's number), once all ended; any left after `timeout` seconds
    is killed, failing the test."""
    deadline = time.monotonic() + timeout
    for process in processes:
        process.join(max(0.1, deadline - time.monotonic()))
    left = [process.pid for process in processes if process.exitcode is None]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert not left, f"processes {left} still ran after {timeout} s"
    return [process.exitcode for process in processes]


def _train_py(rank: int, args: list[str]) -> None:
    from train import main  # noqa: PLC0415

    main(args)


def run_job(processes: int, *args: str, folder: Path, timeout: float = 120) -> Run:
    """`train.py ARGS` in `processes` processes of one job the test starts itself (as Lightning's launcher would):
    the first non-zero exit status (0 where all ended well), global rank 0's output as standard output, and every
    process's, rank 0's first, as standard error. Each process writes to `folder/rank<N>.log`."""
    folder.mkdir(parents=True, exist_ok=True)
    statuses = ended(job(_train_py, processes, list(args), folder=folder), timeout)
    outputs = [(folder / f"rank{rank}.log").read_text() for rank in range(processes)]
    return Run(next((status for status in statuses if status), 0), outputs[0], "".join(outputs))


def wait_for(condition: Callable[[], object], timeout: float, what: str, every: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(every)


def left_behind(session: int, timeout: float = 10) -> str:
    """What still runs of the session `session` leads, once nothing does or after `timeout` s: a line each."""
    deadline = time.monotonic() + timeout
    while True:
        left = []
        for entry in os.scandir("/proc"):
            try:
                stat = Path(entry.path, "stat").read_text() if entry.name.isdigit() else ""
                command = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            fields = stat.rsplit(")", 1)[1].split() if stat else []
            if fields and fields[0] not in ("Z", "X") and int(fields[3]) == session:
                left.append(f"{entry.name} {command}\n")
        if not left or time.monotonic() > deadline:
            return "".join(left)
        time.sleep(0.1)


def scalars(log_dir: Path) -> dict[str, list[float]]:
    """Every scalar series TensorBoard shows for the run in `log_dir`."""
    events = EventAccumulator(str(log_dir))
    events.Reload()
    return {tag: [event.value for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def max_difference(first: dict[str, torch.Tensor], second: dict[str, torch.Tensor]) -> float:
    assert first.keys() == second.keys()
    return max((first[k].double() - second[k].double()).abs().max().item() for k in first)


def one_error_line(result: Run, *words: str) -> str:
    """A run that ended with status 1 and one `error:` line, the last, with `words` in it, and no traceback."""
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and lines[0] == result.stderr.strip().splitlines()[-1], result.stderr[-3000:]
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]
