"""This node's other processes, started first thing: they import torch and Lightning while this one does, as under
torchrun, instead of after it.

Lightning's launcher (the `ddp` strategy's) starts them from `trainer.fit`, once this process has imported
everything, parsed the command line and built model, data and Trainer; each of them then does all of that again
while this one waits: 2.4 s of the 4.9 s to the first training step with 2 processes on the 2-core development VM
(`benchmarks/startup.py`). train.py starts them before its imports instead, with the environment that Lightning's
launcher gives them (MASTER_PORT, NODE_RANK, LOCAL_RANK, WORLD_SIZE; MASTER_ADDR stays 127.0.0.1 unless set).
Lightning then sees processes created outside it, as under torchrun, and starts none; the Trainer and its `ddp`
strategy set up the process group, the samplers and the gradient all-reduce as before.

Only where the number of processes is plain from the command line (`--devices N` or `trainer.devices` in a config
file, with the `ddp` strategy) and no other launcher or cluster manager started this process: `--devices auto` on
a GPU machine is as many processes as torch sees GPUs, which only torch can say. Otherwise Lightning's launcher
starts them, as before. Linux only, where each process dies with this one (`app/job/network.py: die_with_parent`).

One line per mistake: until the processes meet, every process meets the same mistakes in the command line at the
same moment. One started here that fails hands its message to this process and ends without a word; this one
prints it only once its own checks have passed (`NodeProcesses.checked`), so that a mistake all of them make is
said once, by this process. After the meeting, the job's TCP store decides who speaks
(`app/command_line/speaking.py`). `NodeProcesses` holds the processes started and where they stand: the one object
train.py makes first thing and hands to the code that speaks, checks and waits.
"""

import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

from app.command_line.argv import parse_command, resolved_by_lightning, subcommand_of

# Set by another launcher or a cluster manager, whose processes Lightning takes as they are.
LAUNCHER_VARIABLES = (
    *("LOCAL_RANK", "RANK", "TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "LSB_JOBID", "JSM_NAMESPACE_SIZE"),
    *("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"),
)
DDP_NAMES = (
    *("ddp", "ddp_find_unused_parameters_false", "ddp_find_unused_parameters_true", "DDPStrategy"),
    *("lightning.pytorch.strategies.DDPStrategy", "lightning.pytorch.strategies.ddp.DDPStrategy"),
)
ACCELERATORS = ("none", "auto", "cpu", "gpu", "cuda")
REPORT_FD = "TRAIN_REPORT_FD"  # in a process started here: where it hands its message over before the meeting
PIPE_ROOM = 60_000  # bytes of a message handed over; Linux pipes hold 64 KiB
# How a process ends when Ctrl-C or SIGTERM stops it before training: train.py's status, or the signal's.
STOPPED = {128 + signal.SIGINT, 128 + signal.SIGTERM, -signal.SIGINT, -signal.SIGTERM}


def processes_asked_for(argv: list[str]) -> tuple[int, int]:
    """Processes per node and nodes, when train.py may start this node's processes itself; (1, 1) otherwise."""
    if sys.platform != "linux" or any(name in os.environ for name in LAUNCHER_VARIABLES):
        return 1, 1
    settings = _trainer_settings(argv)
    if settings is None or settings.get("plugins") is not None:  # a cluster environment, say: Lightning's to read
        return 1, 1
    if str(settings.get("accelerator")).lower() not in ACCELERATORS:
        return 1, 1
    strategy = settings.get("strategy", "ddp")
    if isinstance(strategy, dict):  # class_path and init_args
        start_method = (strategy.get("init_args") or {}).get("start_method", "popen")
        strategy = strategy.get("class_path") if start_method == "popen" else None
    nodes = _number(settings, "num_nodes", 1)
    if strategy not in DDP_NAMES or nodes is None:
        return 1, 1
    return _number(settings, "devices", 1) or 1, nodes


def _trainer_settings(argv: list[str]) -> dict | None:
    """The Trainer's settings that decide the processes (devices, num_nodes, accelerator, strategy, plugins), as the
    command line and its config files give them, later ones winning; None for a command that trains no model
    (`--help`, `export`), one these cannot be read from without LightningCLI, and one that names a file that is not
    there (a config file, a checkpoint): the first process alone then finds the mistake and says it."""
    if argv[:1] == ["export"]:
        return None
    args, _ = parse_command(argv)
    subcommand = subcommand_of(args)
    if subcommand is None or any(
        arg in ("-h", "--help") or arg.startswith("--print_config") or arg.endswith(".help") for arg in args
    ):
        return None
    settings: dict = {}
    position = 0
    while position < len(args):
        name, has_value, value = args[position].partition("=")
        if not has_value and name.startswith("-") and position + 1 < len(args):
            value = args[position + 1]  # the option's value, if the option takes one
        if name in ("-c", "--config"):
            config = _read_config(value)
            if config is None:
                return None
            section = config.get(subcommand) if position < args.index(subcommand) else config  # root: per subcommand
            settings.update(((section or {}).get("trainer")) or {})
        elif name == "--trainer" or "start_method" in name:
            return None
        elif name == "--ckpt_path" and _not_there(value):  # a mistake the first process says alone, before the
            return None  # others would start and import everything for nothing
        elif name.startswith("--trainer."):
            key, _, sub_key = name.removeprefix("--trainer.").partition(".")
            if key in ("devices", "num_nodes", "accelerator", "strategy", "plugins") and sub_key in ("", "class_path"):
                settings[key] = value  # strategy.timeout and the like: the strategy's own arguments
        position += 1 if has_value or not name.startswith("-") else 2
    return settings


def _not_there(ckpt_path: str) -> bool:
    """A `--ckpt_path` that names a file or folder that does not exist (not `last`, nor a name Lightning resolves)."""
    return ckpt_path != "last" and not resolved_by_lightning(ckpt_path) and not Path(ckpt_path).exists()


def _read_config(path: str) -> dict | None:
    try:
        import yaml  # here: only a command line with a config file needs it

        config = yaml.safe_load(Path(path).read_text())
    except Exception:  # noqa: BLE001 (LightningCLI says what is wrong with it)
        return None
    return config if isinstance(config, dict) else None


def _number(settings: dict, key: str, default: int) -> int | None:
    """A count the way jsonargparse reads it, or None: `auto`, -1 and lists of devices are for torch to count."""
    value = settings.get(key, default)
    text = str(value).strip()
    return int(text) if not isinstance(value, bool) and text.isascii() and text.isdigit() else None


def _free_port() -> int:
    """As Lightning's launcher chooses MASTER_PORT (`find_free_network_port`, in Lightning, not imported yet)."""
    if "STANDALONE_PORT" in os.environ:
        return int(os.environ["STANDALONE_PORT"])
    with socket.socket() as probe:
        probe.bind(("", 0))
        return probe.getsockname()[1]


def _own_command() -> list[str]:
    """This program's command line, as Lightning's launcher repeats it (`_basic_subprocess_cmd`)."""
    import __main__

    if __main__.__spec__ is None:
        return [sys.executable, os.path.abspath(sys.argv[0]), *sys.argv[1:]]
    return [sys.executable, "-m", __main__.__spec__.name, *sys.argv[1:]]


def _as_a_shell_reports(status: int) -> int:
    """An exit status as a shell reports it: a process ended by signal N (status -N) as 128 + N (130, 143)."""
    return status if status >= 0 else 128 - status


def _status(status: int) -> str:
    return f"{status} (killed by signal {-status})" if status < 0 else str(status)


def wait_for_the_meeting_place() -> None:
    """In a process started here: wait until the process that started it listens at MASTER_PORT, where the job's
    TCP store will be (torch.distributed starts it in that process's `init_process_group`).

    A store client that comes before the store retries after a back-off (0.2-0.5 s seen here), which the whole job
    then waits for; the processes started here usually come first, since they skip the launch. No-op elsewhere.
    """
    if REPORT_FD not in os.environ:
        return
    address = (os.environ.get("MASTER_ADDR", "127.0.0.1"), int(os.environ["MASTER_PORT"]))
    while True:
        try:
            socket.create_connection(address, timeout=1).close()
            return
        except OSError:
            time.sleep(0.01)


class NodeProcesses:
    """The processes of this node that this one started first thing, and where they stand until they meet.

    `start` makes it (train.py, before its imports); the process the user started holds it for the whole program,
    and so do the processes it started (with none started). It says when this process's checks have passed
    (`checked`) and when the processes have met (`met`); it watches the processes it started, and ends the job in
    one line when one fails before the meeting (`_watch`), or after it while this one still waits
    (`_end_unless_leaving`, for those Lightning's launcher started too: `watch_after_the_meeting`); it gives the word
    to one thread (`take_the_word`), hands a message over to the process that started this one (`hand_over`), ends
    the wait for the meeting on Ctrl-C (`ctrl_c_ends_the_meeting`), and waits for the processes of its node at the
    end (`wait_for_the_others`).
    """

    EXIT_GRACE_S = 60  # how long the processes started here may take to end once this one's work is done
    NOTICE_AFTER_S = 5  # before a wait for them is said

    def __init__(self) -> None:
        self.started: list[subprocess.Popen] = []
        self.checked = threading.Event()  # this process's checks before the launch have passed
        self.met = threading.Event()  # the processes have met (set again before the process group is closed)
        self.leaving = threading.Event()  # this process's work has ended, well or not (app/main.py)
        self.lost_process_grace_s = float(self.EXIT_GRACE_S)  # see `_end_unless_leaving`; FaultGuard sets it
        self.killed_ones_are_named = False  # by the heartbeats (app/job/heartbeats.py), when they run
        self._watched: list[subprocess.Popen] = []  # those Lightning's launcher started here, once they have met
        self._speaking = threading.Lock()  # held by whichever thread of this process prints the job's error

    @classmethod
    def start(cls, argv: list[str]) -> "NodeProcesses":
        """Start the other processes of this node, if train.py can tell how many there are (the module says when)."""
        node = cls()
        processes, nodes = processes_asked_for(argv)
        if processes < 2:
            return node
        os.environ["MASTER_PORT"] = os.environ.get("MASTER_PORT") or str(_free_port())
        os.environ["NODE_RANK"] = os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", "0"))
        os.environ["WORLD_SIZE"] = str(processes * nodes)
        os.environ["LOCAL_RANK"] = "0"
        for local_rank in range(1, processes):
            read_end, write_end = os.pipe()
            env = {**os.environ, "LOCAL_RANK": str(local_rank), REPORT_FD: str(write_end)}
            process = subprocess.Popen(_own_command(), env=env, pass_fds=(write_end,))
            os.close(write_end)
            node.started.append(process)
            threading.Thread(target=node._watch, args=(local_rank, process, read_end), daemon=True).start()
        return node

    def have_met(self) -> bool:
        distributed = sys.modules.get("torch.distributed")
        initialized = distributed is not None and distributed.is_available() and distributed.is_initialized()
        return self.met.is_set() or initialized

    def take_the_word(self) -> None:
        """Before this process prints the error that ends it, with others started here: wait if a thread watching
        them prints one already (`_watch` then ends the process), else end them first (those Lightning's launcher
        started too), so that what they print as they start does not follow the error line, and no thread prints
        another."""
        if self.started or self._watched:
            self._speaking.acquire()  # never released: the process is ending
            for process in [*self.started, *self._watched]:
                process.kill()
                process.wait()

    def hand_over(self, text: str) -> bool:
        """In a process started here, before the processes met: give the message to the process that started this
        one, which says it unless it fails the same way itself (the module says why). False elsewhere."""
        if REPORT_FD not in os.environ or self.have_met():
            return False
        data = (text + "\n").encode()[:PIPE_ROOM]  # the pipe is read once this process has ended: it must not fill up
        try:
            while data:
                data = data[os.write(int(os.environ[REPORT_FD]), data) :]
        except OSError:  # that process has gone (and this one goes with it): say it here
            return False
        return True

    def end_job(self, exit_status: int, text: str = "") -> NoReturn:
        """From a thread: end the processes started here first (nothing they print as they start comes after
        `text`), say `text`, if any, and end this process."""
        self.take_the_word()
        sys.stdout.flush()
        if text:
            print(text, file=sys.stderr)
        sys.stderr.flush()
        os._exit(exit_status)

    def _watch(self, local_rank: int, process: subprocess.Popen, report: int | None = None) -> None:
        """Wait for one process started here; if it fails before the processes meet, say why once (the message
        from `report`, the pipe it hands it over in) and end this one, which would otherwise wait for it until the
        process-group timeout (blocked in `init_process_group`, it does not see Ctrl-C either: a process stopped by
        Ctrl-C or SIGTERM ends the job with its status). After the meeting: `_end_unless_leaving`."""
        status = process.wait()
        if status == 0:
            return
        if report is None or self.have_met():
            self._end_unless_leaving(local_rank, process, status)
            return
        if status in STOPPED:  # Ctrl-C or SIGTERM before the meeting: the job stops, as one process would, silently
            self.end_job(_as_a_shell_reports(status))
        os.set_blocking(report, False)
        message = b""
        try:
            while chunk := os.read(report, 65536):
                message += chunk
        except BlockingIOError:
            pass
        self.checked.wait()  # a mistake this process makes too is said by this process, at its own pace
        text = message.decode(errors="replace").rstrip("\n") or (
            f"error: the process of local rank {local_rank} (pid {process.pid}) ended with exit status"
            f" {_status(status)} before the processes of the job met."
        )
        self.end_job(1, text)

    def watch_after_the_meeting(self, processes: list[subprocess.Popen], grace_s: float, heartbeats: bool) -> None:
        """Once the processes have met: watch those that Lightning's launcher started here (Lightning's own watch is
        stood down: app/job/lightnings_observer.py) as `_watch` does those started here; `grace_s` and whether the
        heartbeats run are for `_end_unless_leaving`."""
        self.lost_process_grace_s, self.killed_ones_are_named = grace_s, heartbeats
        self._watched += processes
        for local_rank, process in enumerate(processes, start=1):  # Lightning starts them in the order of local rank
            threading.Thread(target=self._watch, args=(local_rank, process), daemon=True).start()

    def _end_unless_leaving(self, local_rank: int, process: subprocess.Popen, status: int) -> None:
        """A process of this node failed after the processes met. On gloo this one meets the loss at its next
        collective and ends by itself; on NCCL that collective waits for the lost process until the process-group
        timeout, 30 minutes by default. So unless this process is leaving `lost_process_grace_s` seconds later, the
        job ends here: silently where the failed process said why (exit status 1: app/command_line/speaking.py),
        with 130 or 143 after Ctrl-C or SIGTERM, else in one line. A process killed without a word (SIGKILL, a
        crash) is the heartbeats' to name, where they run: they also say what is kept of the run."""
        said_why = status == 1 or status in STOPPED
        if (not said_why and self.killed_ones_are_named) or self.leaving.wait(self.lost_process_grace_s):
            return
        if status in STOPPED:
            self.end_job(_as_a_shell_reports(status))
        self.end_job(
            1,
            ""
            if status == 1
            else f"error: the process of local rank {local_rank} (pid {process.pid}) ended with exit status"
            f" {_status(status)}, and this one was still running {self.lost_process_grace_s:g} s later, so the job"
            " ends.",
        )

    @contextmanager
    def ctrl_c_ends_the_meeting(self) -> Iterator[None]:
        """While the processes meet, Ctrl-C ends this one at once, with status 130, and those it started with it.

        The wait for the other processes happens inside `init_process_group` (torch's C++ code), where Python's
        handler of Ctrl-C does not run until the wait is over: up to the process-group timeout, 30 minutes by
        default, when a node never comes. Python still notes the signal at once in a file descriptor
        (`signal.set_wakeup_fd`), which a thread watches here. It acts only while the processes have not met, where
        Ctrl-C still has Python's own handler (a strategy without a process group never meets: there FaultGuard's
        handler, `fault_guard.py`, stops the training gracefully), and only when the main thread has not stopped by
        itself a second later. SIGTERM needs nothing of this: its default action ends a waiting process at once.
        """
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        read_end, write_end = os.pipe()
        os.set_blocking(write_end, False)
        previous = signal.set_wakeup_fd(write_end)
        done = threading.Event()
        watcher = threading.Thread(target=self._end_on_ctrl_c, args=(read_end, done), name="ctrl-c", daemon=True)
        watcher.start()
        try:
            yield
        finally:
            done.set()
            signal.set_wakeup_fd(previous)
            watcher.join()
            os.close(read_end)
            os.close(write_end)

    def _end_on_ctrl_c(self, wakeup: int, done: threading.Event) -> None:
        while not done.is_set() and not self.have_met():
            if not select.select([wakeup], [], [], 0.5)[0]:
                continue
            pressed = signal.SIGINT in os.read(wakeup, 512)
            if pressed and not self.have_met() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
                main = threading.main_thread()
                main.join(timeout=1)  # in Python, the main thread stops by itself, and the process with it
                if main.is_alive():  # stuck in C code: init_process_group
                    self.end_job(128 + signal.SIGINT)

    def wait_for_the_others(self, processes: list[subprocess.Popen]) -> None:
        """After this process's work ended well: wait for the processes of its node that it started (here, and
        `processes` by Lightning's launcher), and end with their failure when one failed, so that the job's exit
        status is honest.

        A process that failed after the processes met has usually said why itself (exit status 1:
        `app/command_line/speaking.py`); one killed by a signal or ended with another status (an abort at exit,
        say) is named here. A process that has not ended `EXIT_GRACE_S` seconds after this one's work is named and
        killed. Ctrl-C ends the wait, and them."""
        failed, children = None, list(dict.fromkeys([*self.started, *self._watched, *processes]))
        try:
            for local_rank, process in enumerate(children, start=1):
                status = self._wait_for(local_rank, process)
                if status != 0 and failed is None:
                    failed = local_rank, process, status
        except KeyboardInterrupt:
            for process in children:
                process.kill()
                process.wait()
            sys.exit(128 + signal.SIGINT)
        if failed is None:
            return
        local_rank, process, status = failed
        if status in STOPPED:  # Ctrl-C or SIGTERM: the job was stopped, as a shell reports it
            sys.exit(_as_a_shell_reports(status))
        if status != 1:
            ended = f"ended with exit status {_status(status)}" if status is not None else "did not end; it was killed"
            print(
                f"error: the process of local rank {local_rank} (pid {process.pid}) {ended} after this process's"
                " work was done, so the job failed.",
                file=sys.stderr,
                flush=True,
            )
        sys.exit(1)

    def _wait_for(self, local_rank: int, process: subprocess.Popen) -> int | None:
        """The exit status of `process`, saying so if it takes more than a few seconds; None if it had to be
        killed."""
        try:
            return process.wait(timeout=self.NOTICE_AFTER_S)
        except subprocess.TimeoutExpired:
            print(f"Waiting for the process of local rank {local_rank} (pid {process.pid}) to end.", flush=True)
        try:
            return process.wait(timeout=self.EXIT_GRACE_S - self.NOTICE_AFTER_S)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            return None
