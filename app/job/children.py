"""The ends of the processes Lightning's launcher starts beside the first one with `--devices N`.

Lightning watches them from a thread (0-5 s after one ends with a non-zero status it kills them all, the first one
too, with SIGKILL), but neither ends them when the first process dies nor waits for them when it ends well. What
train.py adds: each dies with the first process; one that fails or is stopped ends after the first one, having
said why (else Lightning's watch would kill the first while it says why the job ended); the first one waits for
them, so that the job's exit status says whether one failed. And Ctrl-C ends a wait in C code at once.
"""

import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
FIRST_PROCESS = "TRAIN_PY_FIRST_PROCESS"  # its pid, inherited by the processes Lightning's launcher starts from it
FIRST_PROCESS_GRACE_S = 10  # how long a failed process waits for the first one to end (on NCCL it may not see why)
NOTICE_AFTER_S = 5  # before a wait for the others is said
EXIT_GRACE_S = 60  # how long the others may take to end once the first process's work is done


def die_with_parent() -> None:
    """In a process started by a launcher (LOCAL_RANK is set: Lightning's, or torchrun's agent), have Linux kill it
    when its parent dies; elsewhere, mark this process as the one whose launcher may start the others. First thing
    in train.py: the parent may fail while this process still imports."""
    if "LOCAL_RANK" not in os.environ:
        os.environ[FIRST_PROCESS] = str(os.getpid())
        return
    if sys.platform != "linux":
        return
    started_by_lightning = FIRST_PROCESS in os.environ and "TORCHELASTIC_RUN_ID" not in os.environ
    parent = int(os.environ[FIRST_PROCESS]) if started_by_lightning else os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the request was in place
        os._exit(1)


@contextmanager
def ctrl_c_ends_at_once() -> Iterator[None]:
    """Within: Ctrl-C ends this process at once, by SIGINT's default action (130 in a shell), where Python's own
    handler would run only once the C code under way returns (`init_process_group` waiting for a node that never
    comes: up to the process-group timeout) or print a traceback of an import. Nothing where a shell made Ctrl-C
    ignored (a job started with `&`), or outside the main thread, which alone may set a handler."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def end_after_the_first_process() -> None:
    """In a process Lightning's launcher started, about to end with a failure or a stop once the processes have met:
    wait until the process that started it has ended (this one dies with it), at most `FIRST_PROCESS_GRACE_S`
    seconds. No-op elsewhere."""
    first = os.getppid()
    if os.environ.get(FIRST_PROCESS) != str(first):
        return
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        select.select([os.pidfd_open(first)], [], [], FIRST_PROCESS_GRACE_S)
    except (AttributeError, OSError):  # no pidfd (Linux before 5.3, a seccomp profile that refuses it): look
        deadline = time.monotonic() + FIRST_PROCESS_GRACE_S
        while os.getppid() == first and time.monotonic() < deadline:
            time.sleep(0.1)


def wait_for_the_others(processes: list[subprocess.Popen]) -> int:
    """In the first process, once its work has ended well: wait for the processes Lightning's launcher started from
    it (`processes`), and return the job's exit status: one stopped by Ctrl-C or SIGTERM stops the job too (minus
    the signal); one that failed fails it (1), named where it did not say why itself (its exit status 1 says it
    did), or where it did not end within `EXIT_GRACE_S` seconds (then it is killed). Says what it waits for after
    `NOTICE_AFTER_S` seconds. Lightning's watch may kill this process first, 0-5 s after one of them failed (exit
    status 137, with Lightning's line naming the failed one): non-zero either way."""
    for local_rank, process in enumerate(processes, start=1):
        try:
            status = process.wait(timeout=NOTICE_AFTER_S)
        except subprocess.TimeoutExpired:
            print(f"Waiting for the process of local rank {local_rank} (pid {process.pid}) to end.", flush=True)
            try:
                status = process.wait(timeout=EXIT_GRACE_S - NOTICE_AFTER_S)
            except subprocess.TimeoutExpired:
                process.kill()
                status = None
        if status == 0:
            continue
        if status in (-signal.SIGINT, -signal.SIGTERM):  # stopped, as the job is
            return status
        if status != 1:
            ended = "did not end; it was killed" if status is None else f"ended with exit status {status}"
            print(
                f"error: the process of local rank {local_rank} (pid {process.pid}) {ended} after this process's work"
                " was done, so the job failed.",
                file=sys.stderr,
                flush=True,
            )
        return 1
    return 0
