"""How a failing process tells the user: the job's first process to fail speaks, the others wait until it has (an
event in the job's TCP store) and end quietly (docs/errors.md); a bug in a short traceback. `TRAIN_TRACEBACK=1`
turns all of this off: every error of every process keeps its whole traceback."""

import os
import sys
import sysconfig
import time
import traceback
from contextlib import suppress
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from lightning.pytorch.utilities import rank_zero_only

from app.job.process_group import (
    FAILED,
    REPORTS,
    close_process_group,
    have_met,
    job_store,
    reported,
    store_answers,
    under_torchrun,
)

TRACEBACK_VARIABLE = "TRAIN_TRACEBACK"
TRACEBACK_WANTED = os.environ.get(TRACEBACK_VARIABLE, "") not in ("", "0")
SPOKEN_WAIT_S = 10  # how long the others wait for the first to have printed, should it be killed while it does
REPORTED_WAIT_S = 5  # how long the store's holder waits for the others to have reported (a killed one never does)
TORCHRUN_WAIT_S = 20  # the same under torchrun before the processes meet: another node's may still be starting
# Where installed libraries and Python's own modules live: their frames are summed up in a short traceback.
SITE_FOLDERS = {Path(sysconfig.get_paths()[name]) for name in ("purelib", "platlib")}
PYTHON_FOLDERS = {Path(sysconfig.get_paths()[name]) for name in ("stdlib", "platstdlib")}
CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def error_line(message: str) -> str:
    """`error: MESSAGE` (`error (rank N): MESSAGE` from another rank than 0)."""
    rank = rank_zero_only.rank
    return f"{'error' if rank == 0 else f'error (rank {rank})'}: {message}"


def bug_report(error: BaseException) -> str:
    """A short traceback of an error this program did not expect, to report."""
    return error_line(
        f"an unexpected {type(error).__name__}, a bug in the code rather than a mistake in the command; library"
        f" frames are summed up ({TRACEBACK_VARIABLE}=1 shows them all, from every process).\n"
        f"{short_traceback(error)}"
    )


def report(text: str) -> None:
    """Print `text` to standard error, unless another process of the job failed first and said why."""
    store = _job_store()
    if store is None:  # one process, or the first process alone, before it launched the others
        print(text, file=sys.stderr, flush=True)
        return
    speak_once(store, text)
    leave_the_store(store)


def speak_once(store: dist.Store, text: str, wait_s: float = SPOKEN_WAIT_S) -> None:
    """Print `text` to standard error if this is the job's first process to fail (a count in the job's store); the
    others wait until it has printed, so that they end after it, and print theirs only if it never does."""
    try:
        first = store.add(FAILED, 1) == 1
    except Exception:  # noqa: BLE001 (the store went with the process that held it: speak)
        first = True
    if first:
        print(text, file=sys.stderr, flush=True)
        with suppress(Exception):
            store.set("spoken", "")
    else:
        try:
            store.wait(["spoken"], timedelta(seconds=wait_s))
        except Exception:  # noqa: BLE001 (the first was killed before it spoke, or took its store with it)
            print(text, file=sys.stderr, flush=True)


def leave_the_store(store: dist.Store, wait_s: float = REPORTED_WAIT_S) -> None:
    """Say in the store that this process has reported, and keep the store up until the others have reported too, at
    most `wait_s` seconds: a process still about to report would otherwise find it gone and speak again. The store
    lives in global rank 0's process, which waits after closing the process group (on gloo that frees the others from
    their collectives). Under torchrun it lives in the agent of one node, which ends as soon as one of its processes
    has: there every process waits before the processes have met (`TORCHRUN_WAIT_S`: another node's may still be
    starting), and none once they have (the others learn of the failure at once, or never: a killed one)."""
    met = have_met()
    rank = dist.get_rank() if met else int(os.environ.get("RANK", "0"))
    world_size = dist.get_world_size() if met else int(os.environ.get("WORLD_SIZE", "1"))
    with suppress(Exception):
        store.set(reported(rank), "")
    server = None
    if under_torchrun():
        if met:
            return
        wait_s = TORCHRUN_WAIT_S
    elif rank != 0:
        return
    else:
        server = dist.distributed_c10d._get_default_store()  # no public handle on the store itself
        close_process_group()
    others = [reported(other) for other in range(world_size) if other != rank]
    deadline = time.monotonic() + wait_s
    # `check`, not `wait`: a wait that times out prints torch's warnings. Ctrl-C ends the wait, not the error's exit.
    with suppress(Exception, KeyboardInterrupt):
        while not store.check(others) and time.monotonic() < deadline:
            time.sleep(0.05)
    del server  # the store closes with the last reference to it


def _job_store() -> dist.Store | None:
    """The job's reports in its TCP store (None before the processes have met, where torchrun's agent does not hold
    it, or for one process)."""
    met = have_met() and dist.get_world_size() > 1
    if not (met or under_torchrun()) or not store_answers():  # gone with its process: this one speaks
        return None
    try:
        return job_store(REPORTS, timeout_s=2)
    except Exception:  # noqa: BLE001 (the store has gone already)
        return None


def short_traceback(error: BaseException) -> str:
    """Python's traceback of `error` and its causes, each run of library frames one line; the raising frame stays."""
    chain, links = [traceback.TracebackException.from_exception(error)], []
    while chain[-1].__cause__ or (chain[-1].__context__ and not chain[-1].__suppress_context__):
        cause = chain[-1].__cause__
        links.append(CAUSE if cause else CONTEXT)
        chain.append(cause or chain[-1].__context__)
    parts = []
    for exception, link in zip(reversed(chain), [*reversed(links), ""], strict=True):
        parts.append("Traceback (most recent call last):\n")
        parts += _short_stack(exception.stack)
        parts += exception.format_exception_only()
        parts.append(link)
    return "".join(parts).rstrip("\n")


def _short_stack(stack: traceback.StackSummary) -> list[str]:
    lines, hidden = [], []
    for index, frame in enumerate(stack):
        library = _library_of(frame.filename)
        if library and index < len(stack) - 1:
            hidden.append(library)
            continue
        if hidden:
            frames = "1 frame" if len(hidden) == 1 else f"{len(hidden)} frames"
            lines.append(f"  ... {frames} in {', '.join(dict.fromkeys(hidden))}\n")
            hidden = []
        lines += traceback.StackSummary.from_list([frame]).format()
    return lines


def _library_of(filename: str) -> str | None:
    """`lightning` for a file of Lightning's, `python` for the standard library's; None for other code."""
    if filename.startswith("<"):  # <frozen importlib._bootstrap>, <string>
        return "python"
    path = Path(filename)
    for folder in SITE_FOLDERS:  # first: site-packages may lie inside the standard library's folder
        if path.is_relative_to(folder):
            return path.relative_to(folder).parts[0].removesuffix(".py")
    return "python" if any(path.is_relative_to(folder) for folder in PYTHON_FOLDERS) else None
