"""StallWatchdog: a process of the job that stopped answering, or a job whose processes all wait and none moves, is
named, and the job ends."""

import contextlib
import json
import os
import random
import signal
import socket
import sys
import threading
import time

import torch.distributed as dist
from jsonargparse.typing import NonNegativeFloat
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn
from tqdm import tqdm


class StallWatchdog(Callback):
    """Name a process that gave no sign of life, or a job where none moves, and end the job.

    A process of the job that gave no sign of life for `timeout` seconds (frozen, its host hung or its network cut),
    global rank 0 too, and a job whose processes all answer but none of which has finished a batch for as long (where
    each one stands: stage, epoch, step); then the job ends: each process that noticed exits with status 1.

    Args:
        timeout: Seconds without a sign of life, or without progress anywhere (0: off, and nothing runs: no thread,
            no socket, no collective).

    One thread per process sends a datagram with where it stands to every other process every `timeout / 10` s (at
    most 5) and reads theirs: a call to the job's TCP store would wait without end for a holder that froze (global
    rank 0, under Lightning's launcher), and no one would be left to name it. The addresses are exchanged as a stage
    starts (one `all_gather_object`). The lowest process that still answers names the others; each process that
    noticed ends, killing the silent ones of its own host. What the last checkpoint holds stays.

    Example::

        trainer = Trainer(strategy="ddp", devices=2, num_nodes=2, callbacks=[StallWatchdog(timeout=300)])
    """

    def __init__(self, timeout: NonNegativeFloat = 60) -> None:
        self.timeout = timeout
        self.batches = 0  # this process's progress: its batches of any stage
        self.started = False  # this stage's first batch done (a fit's first training batch)
        self._trainer: Trainer | None = None
        self._stop: threading.Event | None = None

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if not self.timeout or trainer.world_size == 1 or not dist.is_initialized() or self._stop is not None:
            return
        beats = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        beats.bind(("0.0.0.0", 0))  # noqa: S104 (the other nodes' datagrams arrive on any interface)
        address = (_local_address(), beats.getsockname()[1])
        me = {"address": address, "host": socket.gethostname(), "pid": os.getpid(), "space": _pid_space()}
        everyone: list = [None] * trainer.world_size
        dist.all_gather_object(everyone, (me, random.getrandbits(62)))
        self._trainer, self._stop, self.started = trainer, threading.Event(), False
        nonce = everyone[0][1]  # global rank 0's: datagrams of another job are not this one's
        threading.Thread(
            target=self._watch,
            args=(beats, [m for m, _ in everyone], nonce, self._stop),
            name=f"stall watchdog of global rank {trainer.global_rank}",
            daemon=True,
        ).start()

    def on_train_batch_end(self, *args, **kwargs) -> None:
        self.batches, self.started = self.batches + 1, True  # a fit's first step is done (its compiling too)

    def on_validation_batch_end(self, trainer: Trainer, *args, **kwargs) -> None:
        self.batches, self.started = self.batches + 1, self.started or trainer.state.fn != TrainerFn.FITTING

    on_test_batch_end = on_predict_batch_end = on_validation_batch_end

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self._stop is not None:  # the others stop watching this process (its leaving datagram)
            self._stop.set()
            self._stop = None

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self.teardown(trainer, pl_module, "")

    def _where(self) -> str:
        state, trainer = self._trainer.state, self._trainer
        fn, stage = (getattr(value, "value", value) for value in (state.fn, state.stage))
        place = f"{fn} ({stage})" if stage and stage != fn else f"{fn}"
        return f"{place}, epoch {trainer.current_epoch}, step {trainer.global_step}"

    def _watch(self, beats: socket.socket, everyone: list[dict], nonce: int, stop: threading.Event) -> None:
        me, interval = self._trainer.global_rank, min(max(self.timeout / 10, 0.2), 5.0)
        heard, left, where = [time.monotonic()] * len(everyone), set(), [""] * len(everyone)
        progress, moved = [-1] * len(everyone), time.monotonic()
        next_beat = then = 0.0
        while True:  # an exception here (a bug) is said by threading's hook; the job goes on unwatched
            now = time.monotonic()
            if then and now - then > interval + 1:  # this process was stopped (Ctrl-Z, a suspended job): all is old
                heard, moved = [now] * len(everyone), now
            then, batches = now, self.batches if self.started else -1  # -1: no progress judged before the first
            if now >= next_beat or stop.is_set():
                moved = now if batches != progress[me] else moved
                where[me], progress[me] = self._where(), batches
                said = json.dumps([nonce, me, where[me], batches, stop.is_set()]).encode()
                for rank, other in enumerate(everyone):
                    if rank != me and rank not in left:
                        with contextlib.suppress(OSError):  # a host that cannot be reached is silent, said later
                            beats.sendto(said, _reachable(other))
                if stop.is_set():
                    beats.close()
                    return
                next_beat = now + interval
                self._judge(now, heard, left, moved, where, everyone, progress)
            beats.settimeout(max(0.01, next_beat - time.monotonic()))
            try:
                nonce_of, rank, at, batches, leaving = json.loads(beats.recv(4096))
            except (TimeoutError, ValueError):
                continue
            if nonce_of == nonce and 0 <= rank < len(everyone):
                heard[rank], where[rank] = time.monotonic(), at
                left |= {rank} if leaving else set()
                if batches != progress[rank]:
                    progress[rank], moved = batches, time.monotonic()

    def _judge(self, now: float, heard: list, left: set, moved: float, where: list, everyone: list, progress: list):
        me, live = self._trainer.global_rank, [rank for rank in range(len(everyone)) if rank not in left]
        silent = [rank for rank in live if rank != me and now - heard[rank] > self.timeout]
        if not silent and (now - moved <= self.timeout or min(progress[rank] for rank in live) < 0):
            return
        named = ", ".join(f"rank {rank} (pid {everyone[rank]['pid']} on {everyone[rank]['host']})" for rank in silent)
        if silent:
            line = f"Global {named} gave no sign of life for {self.timeout:g} s: frozen, or its host hung or lost the"
            line += " network."
            error = "a process of the job stopped answering"
        else:
            stands = "; ".join(f"global rank {rank} in {where[rank] or '?'}" for rank in live)
            line = f"No process of the job has finished a batch for {self.timeout:g} s: {stands}."
            error = "the job's processes wait for each other and none moves"
        if me == min(rank for rank in live if rank not in silent):
            tqdm.write(("\n" if me and sys.stdout.isatty() else "") + line, file=sys.stdout)  # below rank 0's bar
            kept = "what the last checkpoint holds, if one was saved, stays (--ckpt_path last continues from it)"
            print(f"error: {error}, so the job ends; {kept}.", file=sys.stderr, flush=True)
        for logger in self._trainer.loggers:
            with contextlib.suppress(Exception):
                logger.finalize("failed")
        for rank in silent:  # a frozen process of this machine: nothing is left behind
            if everyone[rank]["space"] is not None and everyone[rank]["space"] == _pid_space():
                with contextlib.suppress(OSError):
                    os.kill(everyone[rank]["pid"], signal.SIGKILL)
        sys.stdout.flush()
        os._exit(1)


def _reachable(other: dict) -> tuple[str, int]:
    """Where `other` receives: a loopback address of another host is node 0's, whose own name led to it."""
    host, port = other["address"]
    elsewhere = host.startswith("127.") and other["host"] != socket.gethostname()
    return (os.environ.get("MASTER_ADDR", host) if elsewhere else host), port


def _local_address() -> str:
    """The address of this host that the job's first node is reached from (the processes met there)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect((os.environ.get("MASTER_ADDR", "127.0.0.1"), 9))  # picks the route; sends nothing
            return probe.getsockname()[0]
        except OSError:
            return "127.0.0.1"


def _pid_space() -> str | None:
    """Which process ids this process can signal: the machine's boot and its pid namespace; None where unknown."""
    with contextlib.suppress(OSError), open("/proc/sys/kernel/random/boot_id") as boot:
        return f"{boot.read().strip()}:{os.readlink('/proc/self/ns/pid')}"
    return None
