"""The other processes of a job, said aloud: while they meet, how many have come; while they train, which one stopped
answering.

Both go through the job's TCP store, the key-value server that torch.distributed starts at MASTER_ADDR:MASTER_PORT
for the processes to meet (in global rank 0's process under Lightning's launcher and SLURM, in the agent under
torchrun): a client of our own, in a thread, so that training itself gains no collective and no wait.
"""

import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import timedelta

import torch.distributed as dist

FIRST_NOTICE_S = 10  # the first "still waiting" line, then one every NOTICE_EVERY_S
NOTICE_EVERY_S = 60
ARRIVED_KEY = "rendezvous/arrived"  # counted up once by each process that reached the store


def store_client(timeout_s: float) -> dist.TCPStore:
    """A client of the job's TCP store at MASTER_ADDR:MASTER_PORT that does not count as one of its processes."""
    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def under_torchrun() -> bool:
    """torchrun's workers use the store of torchrun's agent, which met the other nodes before starting them."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


@contextmanager
def announce_rendezvous(world_size: int, num_nodes: int, node_rank: int, local_rank: int) -> Iterator[None]:
    """While this process waits for the others to meet (`init_process_group`), say every minute what it waits for.

    Without it the wait is silent until the process-group timeout, 30 minutes by default, when a node was never
    started or was started with another MASTER_PORT. Every process counts itself in the store once it reaches it
    (torch counts the processes too, under a key its Python API cannot read); one process per node speaks.
    Under torchrun the agents met before they started the processes: nothing to say.
    """
    if world_size == 1 or dist.is_initialized() or under_torchrun():
        yield
        return
    stop = threading.Event()
    arguments = (stop, world_size, num_nodes, node_rank, local_rank == 0)
    notice = threading.Thread(target=_announce, args=arguments, name="rendezvous-notice", daemon=True)
    notice.start()
    try:
        yield
    finally:
        stop.set()
        notice.join(timeout=5)  # a run shorter than its one-second look still says that the processes met


def _announce(stop: threading.Event, world_size: int, num_nodes: int, node_rank: int, speaks: bool) -> None:
    started = time.monotonic()
    next_notice = started + FIRST_NOTICE_S
    counted = spoke = False
    while True:
        stopping = stop.wait(1.0)
        waited = round(time.monotonic() - started)
        if dist.is_initialized() or stopping:
            if spoke and dist.is_initialized():
                print(f"All {world_size} processes of the job have met, after {waited} s.", flush=True)
            return
        if not counted:
            with suppress(Exception):  # the store is not up yet, or not reachable from here
                counted = bool(store_client(timeout_s=2).add(ARRIVED_KEY, 1))
        if speaks and time.monotonic() >= next_notice:
            next_notice += NOTICE_EVERY_S
            print(_waiting_line(waited, world_size, num_nodes, node_rank, counted), flush=True)
            spoke = True


def _waiting_line(waited: int, world_size: int, num_nodes: int, node_rank: int, reached: bool) -> str:
    address = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    causes = (
        "Usual causes: a node not started yet, or started with another MASTER_ADDR or MASTER_PORT; a firewall"
        " closing that port; another network interface (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME). Waiting up to the"
        " process-group timeout (--trainer.strategy.timeout, 30 minutes by default)."
    )
    if not reached:
        return f"Node {node_rank} has waited {waited} s to reach node 0 at MASTER_ADDR:MASTER_PORT {address}. {causes}"
    arrived = None
    with suppress(Exception):
        arrived = store_client(timeout_s=2).add(ARRIVED_KEY, 0)
    if arrived is None or arrived >= world_size:
        return (
            f"Waited {waited} s for the {world_size} processes of the job to connect to each other (they met at"
            f" {address}). {causes}"
        )
    return (
        f"Waited {waited} s at {address} for the {world_size} processes of the job ({num_nodes} node(s) x"
        f" {world_size // num_nodes}): {arrived} have arrived. {causes}"
    )


class Heartbeats:
    """Every process of a running job counts up a key in the job's store every few seconds, and reads the others'.

    A process whose count has not moved for `limit_s` seconds is frozen (SIGSTOP), or its host hung or lost the
    network: one line names it (global rank, host, pid), and every process that noticed ends the job; the lowest
    global rank that is still alive prints, and a silent process on this host is killed (a stopped process would
    otherwise stay). When the store itself stops answering, the process that holds it (global rank 0, or torchrun's
    agent) is the silent one. The counts come from a thread: a long validation, a checkpoint on slow storage or a
    download by one rank keeps counting, while the process runs at all.

    `on_stall` is called before the process ends and returns what is kept of the run (a sentence).
    """

    LEFT = 10**12  # added to a count by a process that stopped watching on purpose: the others stop watching it too

    def __init__(self, rank: int, world_size: int, limit_s: float, namespace: str, on_stall: Callable[[], str]):
        self.rank, self.world_size, self.limit_s = rank, world_size, limit_s
        self.namespace = namespace
        self.on_stall = on_stall
        self.interval_s = min(max(limit_s / 10, 0.5), 10)
        self.stopped = threading.Event()
        self.ending = threading.Lock()
        self.who: list[dict] = []  # every rank's host and pid, once all have said
        self.last_answer = time.monotonic()

    def start(self) -> None:
        self.store = dist.PrefixStore(self.namespace, store_client(timeout_s=self.limit_s))
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
            except Exception:  # the store is gone: its process ended, so does the job; nothing to watch
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
                store_holders = [0] if not under_torchrun() else self._same_host_as(0)
                self._end(store_holders, f"holds the job's store, which has not answered for {round(silent_for)} s")

    def _end(self, silent: list[int], what: str) -> None:
        """Say which process stopped answering (from the lowest live rank), kill it if it lives here, and exit."""
        if not self.ending.acquire(blocking=False):
            return
        alive = [rank for rank in range(self.world_size) if rank not in silent]
        if self.rank == min(alive, default=self.rank):
            named = ", ".join(self._describe(rank) for rank in silent)
            print(f"Global rank {named} {what}: frozen, or its host hung or lost the network.", flush=True)
            kept = self.on_stall()
            error = f"error: a process of the job stopped answering, so the job ends; {kept}."
            print(error, file=sys.stderr, flush=True)
        else:
            self.on_stall()
        for rank in silent:
            if rank < len(self.who) and self.who[rank]["pid_space"] == _pid_space():
                with suppress(OSError):
                    os.kill(self.who[rank]["pid"], signal.SIGKILL)
        os._exit(1)

    def _describe(self, rank: int) -> str:
        if rank >= len(self.who):
            return str(rank)
        return f"{rank} (pid {self.who[rank]['pid']} on {self.who[rank]['host']})"

    def _same_host_as(self, rank: int) -> list[int]:
        if rank >= len(self.who):
            return [rank]
        return [r for r, who in enumerate(self.who) if who["host"] == self.who[rank]["host"]]


def _pid_space() -> str | None:
    """Which process ids this process can signal: the machine's boot and the pid namespace (containers differ)."""
    with suppress(OSError), open("/proc/sys/kernel/random/boot_id") as boot:
        return f"{boot.read().strip()}:{os.readlink('/proc/self/ns/pid')}"
    return None
