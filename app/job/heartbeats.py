"""While the processes of a job train, which one stopped answering: frozen (SIGSTOP), or its host hung or lost the
network."""

import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable
from contextlib import suppress

import torch.distributed as dist

from app.job.node_loss import note_the_loss
from app.job.store import under_torchrun

# What a store call raises when no answer came within the store's timeout (the store lives, its holder may not).
NO_ANSWER_IN_TIME = (dist.DistStoreError, TimeoutError)


class Heartbeats:
    """Every process of a running job counts up a key in the job's store every few seconds, and reads the others'.

    A process whose count has not moved for `limit_s` seconds is frozen (SIGSTOP), or its host hung or lost the
    network: one line names it (global rank, host, pid), and every process that noticed ends the job; the lowest
    global rank that is still alive prints, and a silent process on this host is killed (a stopped process would
    otherwise stay). When the store itself stops answering, the process that holds it (global rank 0, or torchrun's
    agent) is the silent one. The counts come from a thread: a long validation, a checkpoint on slow storage or a
    download by one rank keeps counting, while the process runs at all.

    `store` is the job's store (under a prefix of this stage's own), `on_stall` is called before the process ends
    and returns what is kept of the run (a sentence), and `end_job` ends the process (tests give their own).
    """

    LEFT = 10**12  # added to a count by a process that stopped watching on purpose: the others stop watching it too

    def __init__(
        self,
        rank: int,
        world_size: int,
        limit_s: float,
        store: dist.Store,
        on_stall: Callable[[], str],
        end_job: Callable[[int], object] = os._exit,
    ):
        self.rank, self.world_size, self.limit_s = rank, world_size, limit_s
        self.store = store
        self.on_stall = on_stall
        self.end_job = end_job
        self.interval_s = min(max(limit_s / 10, 0.5), 10)
        self.stopped = threading.Event()
        self.ending = threading.Lock()
        self.who: list[dict] = []  # every rank's host and pid, once all have said
        self.last_answer = time.monotonic()

    def start(self) -> None:
        me = {"host": socket.gethostname(), "pid": os.getpid(), "pid_space": _pid_space()}
        self.store.set(f"who/{self.rank}", json.dumps(me))
        self.store.add(f"beat/{self.rank}", 1)
        self.last_answer = time.monotonic()
        for target, name in ((self._count, "heartbeat"), (self._watch_store, "store-watch")):
            threading.Thread(target=target, name=name, daemon=True).start()

    def stop(self) -> None:
        if not self.stopped.is_set():
            self.stopped.set()
            with suppress(Exception):
                self.store.add(f"beat/{self.rank}", self.LEFT)

    def _count(self) -> None:
        keys = [f"beat/{rank}" for rank in range(self.world_size)]
        counts: list[int] = [0] * self.world_size
        moved = [time.monotonic()] * self.world_size
        while not self.stopped.is_set():
            try:
                self.store.add(f"beat/{self.rank}", 1)
                now_counts = [self.store.add(key, 0) for key in keys]  # add 0: a missing key reads 0, no wait
                if not self.who and min(now_counts) > 0:  # every rank said who it is before its first beat
                    self.who = [
                        json.loads(value)
                        for value in self.store.multi_get([f"who/{r}" for r in range(self.world_size)])
                    ]
            except NO_ANSWER_IN_TIME:  # its holder may be frozen: `_watch_store` names it once `limit_s` is over
                self.stopped.wait(self.interval_s)
                continue
            except Exception:  # the store is gone (connection closed): its process ended, so does the job
                self.stopped.set()
                return
            now = self.last_answer = time.monotonic()
            for rank, count in enumerate(now_counts):
                if count != counts[rank]:
                    counts[rank], moved[rank] = count, now
            silent = [r for r in range(self.world_size) if counts[r] < self.LEFT and now - moved[r] > self.limit_s]
            if silent and not self.stopped.is_set():
                self._end(silent, f"has given no sign of life for {round(now - min(moved[r] for r in silent))} s")
            self.stopped.wait(self.interval_s)

    def _watch_store(self) -> None:
        while not self.stopped.wait(1.0):
            silent_for = time.monotonic() - self.last_answer
            if silent_for > self.limit_s:
                # Under torchrun the agent of rank 0's node holds it: name the ranks of that host, this one aside
                # (it is running this very line: a rank of that host, as when several "nodes" share one machine).
                store_holders = [0] if not under_torchrun() else self._same_host_as(0)
                store_holders = [rank for rank in store_holders if rank != self.rank] or store_holders
                self._end(store_holders, f"holds the job's store, which has not answered for {round(silent_for)} s")

    def _end(self, silent: list[int], what: str) -> None:
        """Say which process stopped answering (from the lowest live rank), kill it if it lives here, and exit."""
        if not self.ending.acquire(blocking=False):
            return
        note_the_loss()
        alive = [rank for rank in range(self.world_size) if rank not in silent]
        if self.rank == min(alive, default=self.rank):
            named = ", ".join(self._describe(rank) for rank in silent)
            print(f"Global rank {named} {what}: frozen, or its host hung or lost the network.", flush=True)
            kept = self.on_stall()
            error = f"error: a process of the job stopped answering, so the job ends; {kept}."
            print(error, file=sys.stderr, flush=True)
        else:
            self.on_stall()
        here = _pid_space()
        for rank in silent:  # a process of this machine and pid namespace only: a pid means nothing elsewhere
            if rank != self.rank and here is not None and rank < len(self.who) and self.who[rank]["pid_space"] == here:
                with suppress(OSError):
                    os.kill(self.who[rank]["pid"], signal.SIGKILL)
        self.stopped.set()
        self.end_job(1)

    def _describe(self, rank: int) -> str:
        if rank >= len(self.who):
            return str(rank)
        return f"{rank} (pid {self.who[rank]['pid']} on {self.who[rank]['host']})"

    def _same_host_as(self, rank: int) -> list[int]:
        if rank >= len(self.who):
            return [rank]
        return [r for r, who in enumerate(self.who) if who["host"] == self.who[rank]["host"]]


def _pid_space() -> str | None:
    """Which process ids this process can signal: the machine's boot and the pid namespace (containers differ);
    None where /proc does not say."""
    with suppress(OSError), open("/proc/sys/kernel/random/boot_id") as boot:
        return f"{boot.read().strip()}:{os.readlink('/proc/self/ns/pid')}"
    return None
