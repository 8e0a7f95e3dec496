"""What train.py says: its lines below the progress bar, a mistake in one line, a bug in a short traceback
(docs/errors.md)."""

import contextlib
import logging
import os
import re
import shutil
import socket
import sys
import sysconfig
import traceback
from pathlib import Path

import torch.distributed as dist
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from tqdm import tqdm


class UserError(MisconfigurationException):
    """A mistake the user can fix, in Lightning's class for one; the message says what is wrong and what to do. One
    that every process of the job makes alike (`every_process`) is said once, by global rank 0; one that some
    processes meet (a node's missing data) is said by each of them, with its rank and host. Before the processes
    meet, the first process of each node says its mistakes (each node's output is its own)."""

    def __init__(self, message: str, every_process: bool = False) -> None:
        super().__init__(message)
        self.every_process = every_process


class BelowTheBar(logging.Handler):
    """Lightning's `rank_zero_info` lines on standard output, on lines of their own below a progress bar (tqdm takes
    the bar away and draws it again), flushed: the process may end next. train.py gives Lightning's rank-zero logger
    this handler; in a script of one's own they go where Lightning's own lines go."""

    def emit(self, record: logging.LogRecord) -> None:
        tqdm.write(self.format(record), file=sys.stdout)
        sys.stdout.flush()


def end_bars(trainer) -> None:
    """End a cut-short stage's progress bars where they stand (Lightning's close them only at a stage's end, and
    `tqdm.write` draws an open one again below each line said): what is said next stands on lines of its own."""
    for name in ("val_progress_bar", "train_progress_bar", "test_progress_bar", "predict_progress_bar"):
        with contextlib.suppress(AttributeError, TypeError):  # no such bar, or none open
            getattr(trainer.progress_bar_callback, name).close()


def options_of(settings: object, prefix: str = "-") -> dict[str, object]:
    """Settings as the options that set them: `{"model": {"class_path": "models.SeqNet", "init_args": {"width": 8}}}`
    as `{"--model": "models.SeqNet", "--model.width": 8}`."""
    if not isinstance(settings, dict):
        return {prefix: settings}
    options: dict[str, object] = {}
    for key, value in settings.items():
        name = prefix if key in ("class_path", "init_args") else f"{prefix}.{key}" if prefix != "-" else f"--{key}"
        options.update(options_of(value, key if str(key).startswith("--") else name))
    return options


def runnable(program: Path) -> str:
    """How to type `program` (an interpreter, a tool of its environment) where the user stands: its bare name where
    the PATH leads to it, else its path (`.venv/bin/python`, after the README's set-up without activating it)."""
    found = shutil.which(program.name)
    return program.name if found and Path(found).resolve() == program.resolve() else here(program)


def here(path: Path) -> str:
    """`path` from the current folder where it lies below it, else whole."""
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else str(path)


def global_rank() -> int | None:
    """This process's global rank: the process group's once the processes have met, else the launcher's (torchrun's
    RANK, SLURM's SLURM_PROCID); None before Lightning's launcher made the processes meet (NODE_RANK, LOCAL_RANK)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    rank = os.environ.get("RANK", os.environ.get("SLURM_PROCID"))
    return None if rank is None else int(rank)


def first_process() -> bool:
    """Whether this is the job's first process, the one that writes: global rank 0, or before the processes meet
    the first process of node 0."""
    rank, env = global_rank(), os.environ
    return rank == 0 if rank is not None else env.get("NODE_RANK", "0") == env.get("LOCAL_RANK", "0") == "0"


# What the processes of a job raise when another has gone (gloo, NCCL, torch's store): its own output says why.
PEER_LOST = re.compile(r"Connection closed by peer|Connection reset by peer|Broken pipe|remote process exited")
LOST = (
    "lost the connection to another process of the job, which ended first (its output says why; one killed by SIGKILL,"
    " for want of memory say, says nothing)."
)
TRACEBACK_VARIABLE = "TRAIN_TRACEBACK"  # TRAIN_TRACEBACK=1 keeps every error's whole traceback, on every process


def report(error: BaseException) -> None:
    """Say what went wrong: a mistake (Lightning's `MisconfigurationException`, `UserError` among them) in one line, a
    lost connection to another process in one line from global rank 0, anything else as a bug, in a short
    traceback."""
    rank, met, env = global_rank(), dist.is_available() and dist.is_initialized(), os.environ
    place = f"rank {rank}" if rank is not None else f"node {env.get('NODE_RANK', '0')}"
    who = "error" if first_process() else f"error ({place} on {socket.gethostname()})"
    if isinstance(error, MisconfigurationException):  # said once where every process makes it alike
        first_of_node = env.get("LOCAL_RANK", env.get("SLURM_LOCALID", "0")) == "0"
        said = (rank == 0 or not getattr(error, "every_process", False)) if met else first_of_node
        line = " ".join(str(error).split()) if said else ""
    elif met and PEER_LOST.search(str(error)):
        line = "" if rank else LOST
    else:
        line = (
            f"an unexpected {type(error).__name__}, a bug rather than a mistake in the command; library frames are"
            f" summed up ({TRACEBACK_VARIABLE}=1 shows them all).\n{short_traceback(error)}"
        )
    if line:
        print(f"{who}: {line}", file=sys.stderr, flush=True)


LIBRARIES = [Path(sysconfig.get_paths()[name]) for name in ("purelib", "platlib", "stdlib", "platstdlib")]


def short_traceback(error: BaseException) -> str:
    """Python's traceback of `error` and its causes, each run of library frames one line; the raising frame stays."""
    chain = [traceback.TracebackException.from_exception(error)]
    while chain[-1].__cause__ or (chain[-1].__context__ and not chain[-1].__suppress_context__):
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    parts = []
    for exception in reversed(chain):
        parts.append("Traceback (most recent call last):\n")
        hidden: list[str] = []
        for index, frame in enumerate(exception.stack):
            library = _library_of(frame.filename)
            if library and index < len(exception.stack) - 1:
                hidden.append(library)
                continue
            if hidden:
                parts.append(f"  ... {len(hidden)} frame(s) in {', '.join(dict.fromkeys(hidden))}\n")
                hidden = []
            parts += traceback.StackSummary.from_list([frame]).format()
        parts += [*exception.format_exception_only(), "\nwhich caused:\n\n"]
    return "".join(parts[:-1]).rstrip("\n")


def _library_of(filename: str) -> str | None:
    path = Path(filename)
    if filename.startswith("<"):
        return "python"
    for folder in LIBRARIES:
        if path.is_relative_to(folder):
            inside = path.relative_to(folder).parts
            return inside[0].removesuffix(".py") if folder.name.endswith("-packages") else "python"
    return None
