"""`python train.py ARGS` as a fresh process that finds torch and Lightning already imported.

Importing torch, torchvision and Lightning takes about 3 s of CPU on the 2-core CI machine, in every process, and
most of the suite's runs are one process that ends in a second or two. Here each run is forked from a server that
imported those libraries once (multiprocessing's forkserver, which never runs a tensor operation, so the forks
inherit no thread pool), then runs train.py as `__main__` in a session of its own, with the command line, the
environment, the working directory and the standard streams it would have had. Everything train.py and `app/`
import and do is theirs, as in a user's run; the processes train.py starts (the node's other ranks) are real
`python train.py` processes. One thing differs: the fork ends with `os._exit` after the exit handlers, without the
interpreter's own shutdown, where a library that aborts at exit would show (gloo's "terminate called ..."). The
tests of that (tests/test_ddp.py's run, the README's commands, the launcher tests) start `python train.py` itself.
"""

import atexit
import io
import multiprocessing
import os
import runpy
import signal
import sys
import threading
from pathlib import Path

# Libraries only: what train.py and app/ import themselves they import in each run, as a user's run does.
LIBRARIES = ["torch", "torchvision", "lightning.pytorch", "torchmetrics", "jsonargparse", "yaml"]

_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload(LIBRARIES)


def start(repo: Path, args: list[str], env: dict[str, str], stdout: Path, stderr: Path) -> multiprocessing.Process:
    """Start `python train.py ARGS` in `repo`, writing its streams to the two files; its pid leads its session."""
    process = _context.Process(target=_train, args=(str(repo), args, env, str(stdout), str(stderr)), daemon=False)
    process.start()
    return process


def _train(repo: str, args: list[str], env: dict[str, str], stdout: str, stderr: str) -> None:
    os.setsid()
    for fd, path in ((1, stdout), (2, stderr)):  # appended: the ranks train.py starts write to the same files
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644), fd)
    sys.stdout = io.TextIOWrapper(open(1, "wb", 0, closefd=False), write_through=True)  # noqa: SIM115 (PYTHONUNBUFFERED)
    sys.stderr = io.TextIOWrapper(open(2, "wb", 0, closefd=False), write_through=True, errors="backslashreplace")  # noqa: SIM115
    sys.stdin = open(os.devnull)  # noqa: SIM115 (open for the life of the process)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as Python sets it in a new interpreter
    # The forkserver made this process its default way to start processes: a new interpreter's default again, with
    # which a DataLoader's workers are forked, as in a user's run, instead of importing train.py once more each.
    multiprocessing.set_start_method(None, force=True)
    os.chdir(repo)
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["train.py", *args]
    sys.path[0] = repo
    try:
        runpy.run_path("train.py", run_name="__main__")
        code = 0
    except SystemExit as error:
        code = _exit_status(error.code)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    threading._shutdown()  # what the interpreter does at exit, which the forkserver's child would skip: wait for
    atexit._run_exitfuncs()  # the threads that are not daemons, then run the exit handlers
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)  # sys.exit("message"): the interpreter prints it and exits with 1
    return 1
