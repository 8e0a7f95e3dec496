"""While the processes of a job run, which one stopped answering (frozen by SIGSTOP, or its host hung or lost the
network), and whether they all still answer but wait for each other in different places (a deadlock)."""

import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable
from contextlib import suppress

import torch.distributed as dist

from app.job.children import end_after_the_first_process
from app.job.process_group import store_answers, under_torchrun
from app.job.watch import watch
from app.say import write_line

# What a store call raises when no answer came within the store's timeout (the store lives, its holder may not).
NO_ANSWER_IN_TIME = (dist.DistStoreError, TimeoutError)
DEADLOCK_SAID = "deadlock_said"  # set by the process that named a deadlock: the others end without a word


class Heartbeats:
    """Every process of a running job counts up a key in the job's store every few seconds, and reads the others'
    (docs/multinode.md, "How it works").

    A process whose count has not moved for `limit_s` seconds is frozen, or its host hung or lost the network: the
    lowest live rank names it (global rank, host, pid), every process that noticed ends, and a silent process on this
    host is killed. A store that stops answering names its holder. Processes that all count and all wait in
    collectives in different places, none moving for `limit_s`, are deadlocked: the lowest names where each stands.

    `store` is the job's store (under a prefix of this job's own), `where` says where this process stands (JSON
    values, read in the heartbeat thread), `on_stall` is called before the process ends and returns what is kept of
    the run (a sentence), `end_job` ends the process and `waiting` says whether its main thread waits in a
    collective (tests give their own). An error of this thread's own is printed with its traceback, and this
    process then stops being watched.
    """

    LEFT = 10**12  # added to a count by a process that stopped watching on purpose: the others stop watching it too

    def __init__(
        self,
        rank: int,
        world_size: int,
        limit_s: float,
        store: dist.Store,
        on_stall: Callable[[], str],
        where: Callable[[], list] = list,
        end_job: Callable[[int], object] = os._exit,
        waiting: Callable[[], bool] | None = None,
    ):
        self.rank, self.world_size, self.limit_s = rank, world_size, limit_s
        self.store = store
        self.on_stall = on_stall
        self.where = where
        self.waiting = waiting or main_thread_waits_in_a_collective
        self.end_job = end_job
        self.interval_s = min(max(limit_s / 10, 0.5), 10)
        self.stopped = threading.Event()
        self.ending = threading.Lock()
        self.who: list[dict] = []  # every rank's host and pid, once all have said
        self.last_answer = time.monotonic()
        self.counts = [0] * world_size  # each rank's count as last read, and when it last moved
        self.moved = [time.monotonic()] * world_size
        self.places: list | None = None  # where each process stood when one of them last moved
        self.still_since = time.monotonic()

    def start(self) -> None:
        me = {"host": socket.gethostname(), "pid": os.getpid(), "pid_space": _pid_space()}
        self.store.set(f"at/{self.rank}", json.dumps(self.where()))  # before its first beat, as who it is
        self.store.set(f"who/{self.rank}", json.dumps(me))
        self.store.add(f"beat/{self.rank}", 1)
        self.last_answer = self.still_since = time.monotonic()
        self.moved = [self.last_answer] * self.world_size
        # An error of the beat's own (a bug) is said with its cause, and the others stop watching this process
        name = f"heartbeat thread of global rank {self.rank}"
        watch(self._beat, self.stopped, every_s=self.interval_s, name=name, on_error=self.stop)
        watch(self._look_at_the_store, self.stopped)

    def stop(self) -> None:
        if not self.stopped.is_set():
            self.stopped.set()
            with suppress(Exception):
                if store_answers(self.store):  # else gone with its process (global rank 0's): no one watches
                    self.store.add(f"beat/{self.rank}", self.LEFT)

    def _beat(self) -> None:
        """Count up this process's key, read every count, and name the processes that no longer move."""
        ranks = range(self.world_size)
        who_keys, at_keys = [f"who/{rank}" for rank in ranks], [f"at/{rank}" for rank in ranks]
        here = json.dumps([*self.where(), self.waiting()])
        try:
            if self.store.check([DEADLOCK_SAID]):  # the lowest live rank named a deadlock and ended
                self._end("", "", speaker_not_in=range(self.world_size))
            self.store.set(f"at/{self.rank}", here)
            self.store.add(f"beat/{self.rank}", 1)
            now_counts = [self.store.add(f"beat/{rank}", 0) for rank in ranks]  # add 0: a missing key reads 0
            everyone_came = min(now_counts) > 0  # every rank said who and where it is before its first beat
            if everyone_came and not self.who:  # kept at once: a store that stops answering next is named by it
                self.who = [json.loads(value) for value in self.store.multi_get(who_keys)]
            at = self.store.multi_get(at_keys) if everyone_came and self.store.check(at_keys) else None
        except NO_ANSWER_IN_TIME:  # its holder may be frozen: `_look_at_the_store` names it after `limit_s`
            return
        except Exception:  # the store is gone (connection closed): its process ended, so does the job
            self.stopped.set()
            return
        now = self.last_answer = time.monotonic()
        for rank, count in enumerate(now_counts):
            if count != self.counts[rank]:
                self.counts[rank], self.moved[rank] = count, now
        live = [rank for rank in ranks if self.counts[rank] < self.LEFT]
        silent = [rank for rank in live if now - self.moved[rank] > self.limit_s]
        if silent and not self.stopped.is_set():
            self._end_for_silence(silent, round(now - min(self.moved[r] for r in silent)))
        if at is not None:
            now_places = [json.loads(at[rank]) if rank in live else None for rank in ranks]
            if now_places != self.places:
                self.places, self.still_since = now_places, now
            elif now - self.still_since > self.limit_s and self.rank == min(live) and _deadlocked(self.places):
                self._end_for_deadlock(self.places, round(now - self.still_since))

    def _look_at_the_store(self) -> None:
        """A store call of `_beat` that meets a frozen holder waits for it without end (the client's timeout does
        not bound it): the watch thread, which makes no call, names the holder once no answer came for `limit_s`."""
        silent_for = time.monotonic() - self.last_answer
        if silent_for > self.limit_s:
            # Under torchrun the agent of rank 0's node holds it: name the ranks of that host, this one aside (it
            # is running this very line: a rank of that host, as when several "nodes" share one machine).
            store_holders = [0] if not under_torchrun() else self._same_host_as(0)
            store_holders = [rank for rank in store_holders if rank != self.rank] or store_holders
            what = f"holds the job's store, which has not answered for {round(silent_for)} s"
            self._end_for_silence(store_holders, what=what)

    def _end_for_silence(self, silent: list[int], silent_s: int = 0, what: str = "") -> None:
        named = ", ".join(self._describe(rank) for rank in silent)
        what = what or f"has given no sign of life for {silent_s} s"
        line = f"Global rank {named} {what}: frozen, or its host hung or lost the network."
        self._end(line, "a process of the job stopped answering", speaker_not_in=silent, kill=silent)

    def _end_for_deadlock(self, places: list, still_s: int) -> None:
        where = "; ".join(
            f"global rank {self._describe(rank)} is in {_place(place)}" for rank, place in enumerate(places) if place
        )
        line = f"The processes of the job wait for each other in different places, none moved for {still_s} s: {where}."
        self._end(line, "the processes of the job no longer meet in the same collective (a deadlock)", said=True)

    def _end(
        self, line: str, error: str, speaker_not_in: Iterable[int] = (), kill: list[int] = (), said: bool = False
    ) -> None:
        """Say `line` and `error` from the lowest rank outside `speaker_not_in` (and, `said`, tell the others it
        did), kill the processes of `kill` that live here, and end this process, whatever fails on the way."""
        if not self.ending.acquire(blocking=False):
            return
        try:
            speakers = [rank for rank in range(self.world_size) if rank not in speaker_not_in]
            if self.rank == min(speakers, default=-1):
                write_line(line, sys.stdout)
                kept = self.on_stall()
                # No full stop: `kept` ends with the command that continues the run
                write_line(f"error: {error}, so the job ends; {kept}", sys.stderr)
                if said:
                    self.store.set(DEADLOCK_SAID, "1")
            else:
                self.on_stall()
            here = _pid_space()
            for rank in kill:  # a process of this machine and pid namespace only: a pid means nothing elsewhere
                if (
                    rank != self.rank
                    and here is not None
                    and rank < len(self.who)
                    and self.who[rank]["pid_space"] == here
                ):
                    with suppress(OSError):
                        os.kill(self.who[rank]["pid"], signal.SIGKILL)
        finally:
            self.stopped.set()
            end_after_the_first_process()
            self.end_job(1)

    def _describe(self, rank: int) -> str:
        if rank >= len(self.who):
            return str(rank)
        return f"{rank} (pid {self.who[rank]['pid']} on {self.who[rank]['host']})"

    def _same_host_as(self, rank: int) -> list[int]:
        if rank >= len(self.who):
            return [rank]
        return [r for r, who in enumerate(self.who) if who["host"] == self.who[rank]["host"]]


def _deadlocked(places: list) -> bool:
    """Every live process waits in a collective (the last item of its place), and not all in the same place."""
    live = [place for place in places if place]
    return all(place[-1] for place in live) and len({str(place[:-1]) for place in live}) > 1


def main_thread_waits_in_a_collective() -> bool:
    """Whether this process's main thread waits in torch's collectives right now: its innermost Python frame is one
    of `torch.distributed`'s (a barrier, an all-reduce or all-gather of metrics or flags) or of autograd's backward
    (DDP's gradient all-reduce), where it waits for the other processes in C++."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    if frame is None:
        return False
    path = frame.f_code.co_filename.replace(os.sep, "/")
    return "/torch/distributed/" in path or "/torch/autograd/" in path


def _place(place: list) -> str:
    """`["fit", "train", 1, 24]`: "fit (train), epoch 1, step 24"."""
    command, stage, epoch, step = place[:4]
    stage = f" ({stage})" if stage and stage != command else ""
    return f"{command}{stage}, epoch {epoch}, step {step}"


def _pid_space() -> str | None:
    """Which process ids this process can signal: the machine's boot and the pid namespace (containers differ);
    None where /proc does not say."""
    with suppress(OSError), open("/proc/sys/kernel/random/boot_id") as boot:
        return f"{boot.read().strip()}:{os.readlink('/proc/self/ns/pid')}"
    return None
