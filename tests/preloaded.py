"""`python train.py ARGS` as a fresh process that finds torch and Lightning already imported.

Importing torch, torchvision and Lightning takes about 3 s of CPU on the 2-core CI machine, in every process, and
most of the suite's runs are one to four processes that end in a second or two. Here each run is forked from a
server that imported those libraries once (multiprocessing's forkserver, which never runs a tensor operation, so the
forks inherit no thread pool), then runs train.py as `__main__` in a session of its own, with the command line, the
environment, the working directory and the standard streams it would have had. Everything train.py and `app/`
import and do is theirs, as in a user's run.

The node's other processes that Lightning's launcher starts from `trainer.fit` (`subprocess.Popen` of train.py's own
command line, with LOCAL_RANK set) are forked the same way, from that process: each is a child of the process that
started it, with the command line and environment it was given, and runs train.py again from its first line, with
train.py's own modules imported afresh. (It inherits the library state of the process it was forked from, which a new
interpreter would not: warnings and logging filters, jsonargparse's registered types.) The processes torchrun or
scripts/local_cluster.sh start are real `python train.py` processes.

What differs from a new interpreter: a forked process ends with `os._exit` after the exit handlers, without the
interpreter's own shutdown, where a library that aborts at exit would show (gloo's "terminate called ..."); its
command line in /proc is the forkserver's, so a test finds what a run left behind by its session, not by its
command line; the start-up's own variables (PYTHONPATH, a sitecustomize) are not read again, and sys.path beyond its
first entry is the test's. The tests of those (tests/test_ddp.py's run, the README's commands, the launcher tests)
start `python train.py` itself.
"""

import atexit
import contextlib
import io
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import threading
from pathlib import Path

from lightning.fabric.utilities.rank_zero import _get_rank, rank_zero_only

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
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    _standard_streams()
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as Python sets it in a new interpreter
    # The forkserver made this process its default way to start processes: a new interpreter's default again, with
    # which a DataLoader's workers are forked, as in a user's run, instead of importing train.py once more each.
    multiprocessing.set_start_method(None, force=True)
    subprocess.Popen = (
        _ForkTheLaunchersProcesses  # before train.py runs: Lightning's launcher forks (the module says why)
    )
    atexit.register = _recorded(atexit.register)  # what train.py registers is not its forks' (_as_a_new_process)
    os.chdir(repo)
    _run_train_py("train.py", args, env)


def _standard_streams() -> None:
    """sys.stdin, sys.stdout and sys.stderr on descriptors 0, 1 and 2, unbuffered (PYTHONUNBUFFERED)."""
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 (open for the life of the process)
    sys.stdout = io.TextIOWrapper(open(1, "wb", 0, closefd=False), write_through=True)  # noqa: SIM115
    sys.stderr = io.TextIOWrapper(open(2, "wb", 0, closefd=False), write_through=True, errors="backslashreplace")  # noqa: SIM115


def _run_train_py(script: str, args: list[str], env: dict[str, str]) -> None:
    """Run train.py as `python SCRIPT ARGS` would, with this environment, then end this process as Python would."""
    os.environ.clear()
    os.environ.update(env)
    sys.argv = [script, *args]
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    interrupted = False
    try:
        # Lightning read the process's rank from the environment when the forkserver imported it (`rank_zero_only`:
        # which process prints its messages before the processes meet); read it from this one's, as a new one would.
        rank_zero_only.rank = _get_rank() or 0
        runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as error:
        code = _exit_status(error.code)
    except BaseException as error:
        import traceback

        traceback.print_exc()
        code, interrupted = 1, isinstance(error, KeyboardInterrupt)
    threading._shutdown()  # what the interpreter does at exit, which the forkserver's child would skip: wait for
    atexit._run_exitfuncs()  # the threads that are not daemons, then run the exit handlers
    sys.stdout.flush()
    sys.stderr.flush()
    if interrupted:  # Python ends a program that Ctrl-C interrupted by SIGINT, for the shell to see
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)  # sys.exit("message"): the interpreter prints it and exits with 1
    return 1


_registered_by_the_run: list = []


def _recorded(register):
    """`atexit.register`, noting what it registers: the handlers of the libraries imported before are a new
    interpreter's too, those registered by the run are not its forks'."""

    def register_and_note(function, *args, **kwargs):
        _registered_by_the_run.append(function)
        return register(function, *args, **kwargs)

    return register_and_note


class _ForkTheLaunchersProcesses(subprocess.Popen):
    """`subprocess.Popen`, except that train.py's own command line, launched by Lightning's launcher, is forked from
    this process and run as a new interpreter would run it (the module says why); every other command runs as it is."""

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, *rest) -> None:
        own_command = isinstance(args, (list, tuple)) and len(args) > 1 and args[0] == sys.executable
        own_command = own_command and args[1] == os.path.abspath(sys.argv[0])
        if not (own_command and "LOCAL_RANK" in (env or {})):
            super()._execute_child(args, executable, preexec_fn, close_fds, pass_fds, cwd, env, *rest)
            return
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            try:
                _as_a_new_process(args[1], list(args[2:]), dict(env), pass_fds)
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                os._exit(1)  # never back into the stack of the process it was forked from
        self.pid = pid
        self._child_created = True


def _as_a_new_process(script: str, args: list[str], env: dict[str, str], pass_fds: tuple[int, ...]) -> None:
    """In the forked process: what Popen's child and a new interpreter would hold, then train.py from its first line."""
    for fd in map(int, os.listdir("/proc/self/fd")):  # Popen's close_fds
        if fd not in (0, 1, 2, *pass_fds):
            with contextlib.suppress(OSError):  # the listing's own descriptor, closed already
                os.close(fd)
    _standard_streams()
    for function in _registered_by_the_run:
        atexit.unregister(function)
    _registered_by_the_run.clear()
    repo = os.path.dirname(script)
    for name, module in list(sys.modules.items()):  # train.py's own modules import afresh, as in a new process
        top = os.path.join(repo, name.split(".")[0])
        own = os.path.exists(top) or os.path.exists(top + ".py")
        if own and (getattr(module, "__file__", None) or "").startswith(top):
            del sys.modules[name]
    _run_train_py(script, args, env)
