"""How the processes of a job were started: the shape a launcher gave them, what every node must agree on, the
exit status of the processes Lightning's launcher started, and the threads of one process on a shared CPU."""

import atexit
import gc
import hashlib
import logging
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.process import BaseProcess
from pathlib import Path
from types import FrameType, SimpleNamespace

import torch
import torch.distributed as dist
from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment
from lightning.pytorch.strategies import Strategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from app.callbacks.graceful_stop import NAMES, GracefulStop, Stopped
from app.console import TRACEBACK_VARIABLE, BelowTheBar, UserError, here, options_of, report, runnable
from app.runs import CHECKPOINTS, LAST

# What may differ from node to node (docs/multinode.md): where each node keeps its files, and how it loads them.
# fmt: off
PER_NODE = ("--ckpt_path", "--config", "--trainer.default_root_dir", "--trainer.devices", "--trainer.num_nodes",
            "--trainer.enable_progress_bar", "--data.data_dir", "--data.num_workers", "--data.pin_memory",
            "--checkpoint.dirpath", "--last_checkpoint.dirpath", "--predictions.path")
# fmt: on
PROGRAM = Path(__file__).resolve().parents[1]
# A process that ddp_spawn started (it imports train.py, and so this) leaves its process group at its exit, where
# gloo's threads would abort it ("terminate called without an active exception"): it goes first.
atexit.register(lambda: dist.destroy_process_group() if dist.is_initialized() else None)
# Nothing a user of this program does or can change; in every process (those of ddp_spawn import this module too).
for noise in ("LightningCLI's args", r"`isinstance\(treespec", "'set_vital'", "The dirpath has", "Checkpoint dir"):
    warnings.filterwarnings("ignore", message=noise)


def launcher_shape(kubeflow: bool = False) -> dict | None:
    """The processes per node and the nodes torchrun, SLURM or a PyTorchJob started (an elastic torchrun job's change
    with each restart), and how many times torchrun restarts a failed job; None where Lightning's launcher starts
    them. `kubeflow`: the Trainer was given Lightning's KubeflowEnvironment (which cannot be detected)."""
    env = os.environ
    if TorchElasticEnvironment.detect():
        devices, restarts = int(env["LOCAL_WORLD_SIZE"]), int(env.get("TORCHELASTIC_MAX_RESTARTS", "0"))
        nodes = int(env["WORLD_SIZE"]) // devices
        return {"launcher": "torchrun", "devices": devices, "num_nodes": nodes, "restarts": restarts}
    if SLURMEnvironment.detect():
        nodes = int(env.get("SLURM_NNODES", env.get("SLURM_JOB_NUM_NODES", "1")))
        devices = int(str(env.get("SLURM_NTASKS_PER_NODE", int(env["SLURM_NTASKS"]) // nodes)).split("(")[0])
        return {"launcher": "SLURM", "devices": devices, "num_nodes": nodes, "restarts": 0}
    if kubeflow and "WORLD_SIZE" not in env:
        raise UserError(
            "--trainer.plugins KubeflowEnvironment: WORLD_SIZE is not set. The Training Operator sets it in each pod of"
            " a PyTorchJob; leave the plugin out elsewhere."
        )
    if kubeflow:  # a PyTorchJob: one process a pod
        return {"launcher": "the PyTorchJob", "devices": 1, "num_nodes": int(env["WORLD_SIZE"]), "restarts": 0}
    return None


def shared(settings: dict, subcommand: str, starts_from: object) -> dict:
    """What every node of a job must agree on: the command's `settings` but where each node keeps and loads its files
    (`PER_NODE`), the subcommand, the program's own code, and the checkpoint it starts from."""
    program = hashlib.sha256()
    for path in sorted(p for folder in ("app", "models", "datamodules") for p in (PROGRAM / folder).rglob("*.py")):
        program.update(path.read_bytes())
    program.update((PROGRAM / "train.py").read_bytes())
    options = {key: value for key, value in options_of(settings).items() if not key.startswith(PER_NODE)}
    return {**options, "--subcommand": subcommand, "--program": program.hexdigest()[:12], "--starts_from": starts_from}


def settle_shape(trainer, stop, kubeflow: bool) -> None:
    """Under torchrun, SLURM or a PyTorchJob, the Trainer's `devices` and `num_nodes` (the settings `trainer`) are
    what the launcher started (said where the command gave others: an elastic job's change with each restart), and a
    job torchrun restarts saves last.ckpt every minute (the settings of `GracefulStop`, `stop`, unless its
    `save_every_s` is given)."""
    shape = launcher_shape(kubeflow)
    if shape is None:
        return
    given = {key: trainer[key] for key in ("devices", "num_nodes")}
    if any(str(given[key]) not in ("auto", "-1", "1", str(shape[key])) for key in given):
        rank_zero_info(
            f"{shape['launcher']} started {shape['num_nodes']} node(s) x {shape['devices']} process(es): training on"
            f" those, not --devices {given['devices']} --num_nodes {given['num_nodes']}."
        )
    trainer.devices, trainer.num_nodes = shape["devices"], shape["num_nodes"]
    if shape["restarts"] and stop.save_every_s is None:
        stop.save_every_s = 60.0


@contextmanager
def end_the_job(args: list[str], fit: bool) -> Iterator[SimpleNamespace]:
    """Around the program's work, which sets the job's exit status (`job.status`), end the process as a shell
    expects: 0; 1 after a mistake or a bug, said in one line or a short traceback (`report`); after a stop by a
    signal, by that signal (130 after Ctrl-C, 143 after SIGTERM: a shell loop stops), with the command that goes on,
    quoted for a shell: `python train.py` as the user types it here (and `fit` where the command named it)
    continuing the run's folder where it ran (`job.shape`: `--devices 2`), the stop's own `command`, or the same
    `args` again (a stop that kept nothing: an evaluation cut short, a fit before its first step). The program's lines
    (`rank_zero_info`) stand below the progress bar. The work runs in the caller's frame: no frame of its own."""
    job, program = SimpleNamespace(status=0, shape=[]), [runnable(Path(sys.executable)), here(PROGRAM / "train.py")]
    if signal.getsignal(signal.SIGINT) == signal.SIG_DFL:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C is KeyboardInterrupt again
    said = logging.getLogger("lightning.pytorch.utilities.rank_zero")  # rank_zero_info: the program's lines
    if not any(isinstance(handler, BelowTheBar) for handler in said.handlers):
        said.addHandler(BelowTheBar())
        said.addFilter(lambda record: "litlogger" not in record.getMessage())
        said.propagate = False
    try:
        yield job
    except Stopped as stop:  # the run's folder is what --ckpt_path continues, with its settings
        folder, fit = Path(stop.checkpoint or "").parent.parent, ["fit"] * fit  # without fit named, a test follows
        if stop.command:
            rank_zero_info(f"Continue with: {shlex.join([*program, *stop.command, *job.shape])}")
        elif stop.command is None and stop.checkpoint and (folder / "config.yaml").is_file():
            rank_zero_info(f"Continue with: {shlex.join([*program, *fit, '--ckpt_path', str(folder), *job.shape])}")
        elif stop.command is None and stop.checkpoint is None:
            rank_zero_info(f"Run it again with: {shlex.join([*program, *args])}")
        job.status = -stop.signum
    except KeyboardInterrupt:
        job.status = -signal.SIGINT
    except SIGTERMException:  # Lightning's own stop (a SystemExit without a status), where GracefulStop is off
        job.status = -signal.SIGTERM
    except SystemExit as end:  # Lightning ends a stage that Ctrl-C interrupted with status 1: a shell loop would go on
        job.status = -signal.SIGINT if isinstance(end.__context__, KeyboardInterrupt) else end.code or 0
    except Exception as error:
        if os.environ.get(TRACEBACK_VARIABLE, "") not in ("", "0"):
            raise
        report(error)
        job.status = 1
    finally:
        if dist.is_available() and dist.is_initialized():  # else gloo's threads may abort the process at its exit
            dist.destroy_process_group()
    sys.stdout.flush()
    gc.freeze()  # Python's last collection would scan the million objects of torch's and Lightning's: 1 s a process
    if job.status < 0:
        signal.signal(-job.status, signal.SIG_DFL)
        os.kill(os.getpid(), -job.status)
    sys.exit(job.status)


def wait_for_the_launched(strategy: Strategy) -> int:
    """In the process the strategy's launcher (Lightning's) started the others from, once its work is done: the job's
    exit status when they have ended (a minute at most), one that failed failing it, one a signal stopped stopping
    it."""
    deadline = time.monotonic() + 60
    launched = [p for p in getattr(strategy.launcher, "procs", []) if isinstance(p, subprocess.Popen)]  # ddp_spawn's:
    for local_rank, process in enumerate(launched, start=1):  # joined by Lightning, which raised where one failed
        try:
            status = process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            status = None
        if status in (1, -signal.SIGINT, -signal.SIGTERM, -signal.SIGHUP, -signal.SIGUSR1):  # said why, or stopped
            return status  # as the job is (SIGUSR1: SLURM's requeue signal)
        if status != 0:
            ended = "did not end within a minute: it was killed" if status is None else f"ended with status {status}"
            failed = f"error: the process of local rank {local_rank} (pid {process.pid}) {ended}, after this one's"
            print(f"{failed} work was done, so the job failed.", file=sys.stderr, flush=True)
            return 1
    return 0


def pass_stop_signals_on(trainer) -> None:
    """Under Lightning's multiprocessing launcher (`--trainer.strategy ddp_spawn`) this process trains nothing: it
    waits for the processes it starts. A stop signal it gets then goes on to them, whose GracefulStop stops them at
    one step; once they have ended, this one stops as they did (`Stopped`, with the `last.ckpt` of the fit they wrote:
    the one of the runs under the Trainer's folder that changed since this was called). Where it trains itself
    (Lightning's subprocess launcher: GracefulStop takes the signals while a stage runs) or without a GracefulStop,
    nothing changes; in another process, or before any such process runs, a signal acts as it did before."""
    stop = next((c for c in trainer.callbacks if isinstance(c, GracefulStop) and c.every_n_steps), None)
    spawns = type(trainer.strategy.launcher).__module__.endswith(".launchers.multiprocessing")  # (Lightning's module)
    if not spawns or stop is None or threading.current_thread() is not threading.main_thread():
        return  # (elsewhere a handler here would wait for a C call to return: a meeting's wait, say)
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    here, saved = os.getpid(), {path: path.stat().st_mtime_ns for path in last_checkpoints(trainer, stop)}

    def pass_on(signum: int, frame: FrameType | None) -> None:
        spawned = (
            [p for p in trainer.strategy.launcher.procs if isinstance(p, BaseProcess)] if os.getpid() == here else []
        )
        if not any(process.is_alive() for process in spawned):
            signal.signal(signum, before[signum])
            return before[signum](signum, frame) if callable(before[signum]) else signal.raise_signal(signum)
        fitting, stage = trainer.state.fn == TrainerFn.FITTING, trainer.state.fn.value
        for process in (process for process in spawned if process.is_alive()):
            os.kill(process.pid, signum)
        for process in spawned:
            process.join()  # (a frozen one: their StallWatchdog ends them)
        codes = {process.exitcode for process in spawned}  # 0, or -signum: their stage was over (or not begun)
        written = [path for path in last_checkpoints(trainer, stop) if saved.get(path) != path.stat().st_mtime_ns]
        last = str(written[0]) if fitting and len(written) == 1 else None  # (two runs at once: none to name)
        cut_short = not fitting and codes != {0}
        if cut_short:
            rank_zero_info(f"Stopped by {NAMES[signum]}: the {stage} was cut short and keeps nothing.")
        elif last and codes <= {0, -signum}:
            rank_zero_info(f"Stopped by {NAMES[signum]} as the fit ended; {last} holds its end.")
        raise Stopped(signum, last, None if last or cut_short else [])

    for signum, handler in before.items():
        if handler is not signal.SIG_IGN:  # (SIGHUP under nohup: ignored, as before)
            signal.signal(signum, pass_on)


def last_checkpoints(trainer, stop: GracefulStop) -> list[Path]:
    """The `last.ckpt` files a fit of `trainer` may write: in its `checkpoint`'s folder, or in a run's under the
    Trainer's folder (a run folder is claimed in the process that trains)."""
    if (path := stop.last_path()) is not None:  # its folder given
        return [Path(path)] if Path(path).is_file() else []
    return sorted(Path(trainer.default_root_dir).glob(f"*/version_*/{CHECKPOINTS}/{LAST}"))


def one_process_on_the_cpu(trainer) -> None:
    """Where `trainer` trains in one process on the CPU that no launcher started, say so; where other work keeps half
    or more of the cores it may use busy (and OMP_NUM_THREADS is not set), train with one thread, and say so: torch's
    thread per core would wait for the others at every operation (1.9-2x slower, docs/speed.md)."""
    if trainer.world_size != 1 or trainer.strategy.root_device.type != "cpu" or launcher_shape():
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    busy = 0.0 if "OMP_NUM_THREADS" in os.environ else busy_cores()  # the user's choice stays
    shared_with = f", {busy:.1f} of them busy with other work: 1 thread" if busy >= cores / 2 else ""
    if shared_with:
        os.environ["OMP_NUM_THREADS"] = "1"  # and the processes it starts
        torch.set_num_threads(1)
    rank_zero_info(
        f"Training in 1 process on the CPU ({cores} cores{shared_with}): --devices N trains with DDP in N processes."
    )


def busy_cores(seconds: float = 0.1) -> float:
    """How many of the cores this process may use other processes keep busy now: measured from /proc/stat while this
    process sleeps `seconds` (elsewhere the load average, which counts this program's own last run for a minute)."""
    mine = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None

    def times() -> list[list[int]]:  # user nice system idle iowait irq softirq, of each core of ours
        with open("/proc/stat") as stat:
            rows = [line.split() for line in stat if re.match(r"cpu\d", line)]
        return [[int(n) for n in row[1:8]] for row in rows if mine is None or int(row[0][3:]) in mine]

    try:
        before = times()
        time.sleep(seconds)
        spent = [[b - a for a, b in zip(*core, strict=True)] for core in zip(before, times(), strict=True)]
    except (OSError, ValueError):
        return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    busy = sum(sum(core) - core[3] - core[4] for core in spent)
    return len(spent) * busy / max(sum(sum(core) for core in spent), 1)
