"""The meeting of a job's processes: said aloud while it waits, ended by Ctrl-C, and followed by what must happen
before any process writes a file."""

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from datetime import timedelta
from typing import NoReturn

import torch.distributed as dist
from lightning.pytorch import Trainer

from app.job.children import ctrl_c_ends_at_once
from app.job.process_group import (
    FAILED,
    REPORTS,
    have_met,
    job_store,
    reported,
    store_answers,
    store_client,
    under_torchrun,
)
from app.job.watch import watch

FIRST_NOTICE_S = 5  # the first "has waited" line, then one every NOTICE_EVERY_S
NOTICE_EVERY_S = 60
SHAPE_WAIT_S = 30  # once met, how long a node's first process waits for another node's shape (`ShapeCheck`)
SHAPE_SAID_WAIT_S = 5  # how long node 0 waits for the other node to say that their shapes differ


class Meeting:
    """Takes the place of the strategy's `setup_environment`, where the processes meet (`init_process_group`), once.

    While they meet, this process says what it waits for (`announce_rendezvous`), and Ctrl-C ends it at once
    (`ctrl_c_ends_at_once`): nothing is written yet, so nothing is lost. Once they have met, `after()` runs in every
    process: Lightning has no hook in between, and its setup hook, next, opens every logger's folder and event file.
    """

    def __init__(self, trainer: Trainer, after: Callable[[], None]) -> None:
        self.trainer, self.set_up, self.after = trainer, trainer.strategy.setup_environment, after

    @classmethod
    def install(cls, trainer: Trainer, after: Callable[[], None]) -> None:
        trainer.strategy.setup_environment = cls(trainer, after)

    def __call__(self) -> None:
        trainer = self.trainer
        trainer.strategy.setup_environment = self.set_up  # once: a test after the fit has met already
        meeting = announce_rendezvous(trainer.world_size, trainer.num_nodes, trainer.node_rank, trainer.local_rank)
        with ctrl_c_ends_at_once(), meeting:
            self.set_up()
        if have_met() and dist.get_world_size() > 1:
            self.after()


@contextmanager
def announce_rendezvous(world_size: int, num_nodes: int, node_rank: int, local_rank: int) -> Iterator[None]:
    """While this process waits for the others to meet, say every minute what it waits for (from the node's first
    process), and under torchrun end it, quietly, once a process of the job has said that it failed.

    Without it the wait is silent until the process-group timeout, 30 minutes by default, when a node was never
    started, was started with another MASTER_PORT, or its process failed before the meeting. Under torchrun the
    agents hold the job's store from the start, where a process that fails says so (app/command_line/speaking.py);
    elsewhere the store opens with the meeting itself.
    """
    if world_size == 1 or have_met():
        yield
        return
    reports = None
    if under_torchrun():
        with suppress(Exception):  # no store to read (it would have failed the meeting too): announced only
            reports = job_store(REPORTS, timeout_s=5)
    if local_rank != 0 and reports is None:  # nothing to say, nothing to read
        yield
        return
    started = time.monotonic()
    next_notice = [started + FIRST_NOTICE_S]  # moved on by the watch thread each time it speaks
    address = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"
    checks_shape = local_rank == 0 and reports is None and num_nodes > 1
    shapes = ShapeCheck(node_rank, world_size // num_nodes, num_nodes) if checks_shape else None

    def look_at_the_shapes() -> None:  # a watch of its own: at a port another program holds, a client waits forever
        if shapes.differ():
            _end_as_said()

    def look() -> None:
        if reports is not None and _failure_said(reports):
            _end_as_said()
        if local_rank == 0 and time.monotonic() >= next_notice[0]:
            next_notice[0] += NOTICE_EVERY_S
            print(
                f"Node {node_rank} has waited {round(time.monotonic() - started)} s at {address} for the {world_size}"
                f" processes of the job ({num_nodes} node(s) x {world_size // num_nodes}). Usual causes: a node not"
                " started yet, or started with another MASTER_ADDR or MASTER_PORT, or whose process failed (its"
                " output says why); another program holding that port; a firewall closing it; another network"
                " interface (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME). Waiting up to the process-group timeout"
                " (--trainer.strategy.timeout, 30 minutes by default).",
                flush=True,
            )

    stop = threading.Event()
    watcher, shape_watcher = watch(look, stop), watch(look_at_the_shapes, stop) if shapes is not None else None
    try:
        yield
    finally:
        stop.set()
        watcher.join()
        if shape_watcher is not None:
            shape_watcher.join(timeout=SHAPE_SAID_WAIT_S)  # not without end: it may wait on another program
    if shapes is not None and shapes.differ(wait_s=SHAPE_WAIT_S):  # met, perhaps part of a job
        _end_as_said()  # of another size, the rest of which the first collective would wait for
    if next_notice[0] > started + FIRST_NOTICE_S:  # it said it waited: now it says that the wait is over
        print(
            f"All {world_size} processes of the job have met, after {round(time.monotonic() - started)} s.", flush=True
        )


def _end_as_said() -> NoReturn:
    """End this process, a failure of the job said already (by this process or another): nothing to add or keep."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


class ShapeCheck:
    """Nodes started with other `--devices` or `--num_nodes` (by hand, under Lightning's launcher) wait for jobs of
    different sizes, silent until the process-group timeout, or meet in part and wait in the first collective. The
    first process of each node puts its shape in the job's store (opened by global rank 0's meeting) and compares it
    with another node's (node 0's, node 1's for node 0), while it waits and once it has met; the first to see a
    difference says it, and every node ends. (torchrun's agents give every node one shape: `launcher_shape.py`.)"""

    SAID, SPEAKER = "shape_said", "shape_speaker"

    def __init__(self, node_rank: int, devices: int, num_nodes: int) -> None:
        self.node_rank, self.shape = node_rank, f"{devices} process(es) per node, {num_nodes} node(s)"
        self.store: dist.Store | None = None

    def differ(self, wait_s: float = 0.0) -> bool:
        """Whether the nodes were started with different shapes (then said, once for the job); False until known, or
        when no other node's shape came within `wait_s`."""
        other = "shape/1" if self.node_rank == 0 else "shape/0"
        try:
            if self.store is None:
                if not store_answers(timeout_s=max(0.5, wait_s)):  # no store yet: a client would wait, printing
                    return False
                store = store_client(timeout_s=max(1.0, wait_s))
                store.set(f"shape/{self.node_rank}", self.shape)
                self.store = store  # once its shape is there
            if self.store.check([self.SAID]):
                return True
            if wait_s:
                self.store.wait([other], timedelta(seconds=wait_s))
            theirs = self.store.get(other).decode() if self.store.check([other]) else self.shape
        except Exception:  # noqa: BLE001 (no store yet, or gone with its holder: the meeting says)
            return False
        if theirs == self.shape:
            return False
        # One node speaks: not node 0, the store's holder, unless no other does (the store goes with node 0)
        with suppress(Exception):
            if self.node_rank == 0:
                self.store.wait([self.SAID], timedelta(seconds=SHAPE_SAID_WAIT_S))
                return True
            if self.store.add(self.SPEAKER, 1) > 1:
                return True
        print(
            f"error: the nodes were started with different --devices or --num_nodes: node {self.node_rank} with"
            f" {self.shape}, node {other[-1]} with {theirs}. Start every node with the same ones.",
            file=sys.stderr,
            flush=True,
        )
        with suppress(Exception):
            self.store.set(self.SAID, "")
        return True


def _failure_said(reports: dist.Store) -> bool:
    """Whether a process of the job said that it failed; if so, this one counts as having reported (the one that
    failed keeps torchrun's store up until every process has). Each torchrun restart has reports of its own, by its
    count (`job_store`)."""
    try:
        if not reports.check([FAILED]):
            return False
    except Exception:  # noqa: BLE001 (the agent's store has gone: its node ended, this process ends with it)
        return False
    with suppress(Exception):
        reports.set(reported(int(os.environ["RANK"])), "")
    return True
