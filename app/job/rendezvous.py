"""The meeting of a job's processes: said aloud while it waits, ended by Ctrl-C, and followed by what must happen
before any process writes a file."""

import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

import torch.distributed as dist
from lightning.pytorch import Trainer

from app.job.children import ctrl_c_ends_at_once
from app.job.process_group import FAILED, have_met, report_store, reported, under_torchrun
from app.job.watch import watch

FIRST_NOTICE_S = 5  # the first "has waited" line, then one every NOTICE_EVERY_S
NOTICE_EVERY_S = 60


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
            reports = report_store(timeout_s=5)
    if local_rank != 0 and reports is None:  # nothing to say, nothing to read
        yield
        return
    started = time.monotonic()
    next_notice = [started + FIRST_NOTICE_S]  # moved on by the watch thread each time it speaks
    address = f"{os.environ.get('MASTER_ADDR', '?')}:{os.environ.get('MASTER_PORT', '?')}"

    def look() -> None:
        if reports is not None and _failure_said(reports):  # it said why: nothing to add, nothing to keep
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(1)
        if local_rank == 0 and time.monotonic() >= next_notice[0]:
            next_notice[0] += NOTICE_EVERY_S
            print(
                f"Node {node_rank} has waited {round(time.monotonic() - started)} s at {address} for the {world_size}"
                f" processes of the job ({num_nodes} node(s) x {world_size // num_nodes}). Usual causes: a node not"
                " started yet, or started with another MASTER_ADDR or MASTER_PORT, or whose process failed (its"
                " output says why); a firewall closing that port; another network interface (GLOO_SOCKET_IFNAME,"
                " NCCL_SOCKET_IFNAME). Waiting up to the process-group timeout (--trainer.strategy.timeout, 30"
                " minutes by default).",
                flush=True,
            )

    stop = threading.Event()
    watcher = watch(look, stop)
    try:
        yield
    finally:
        stop.set()
        watcher.join()
    if next_notice[0] > started + FIRST_NOTICE_S:  # it said it waited: now it says that the wait is over
        print(
            f"All {world_size} processes of the job have met, after {round(time.monotonic() - started)} s.", flush=True
        )


def _failure_said(reports: dist.Store) -> bool:
    """Whether a process of the job said that it failed; if so, this one counts as having reported (the one that
    failed keeps torchrun's store up until every process has). Each torchrun restart has reports of its own, by its
    count (`report_store`)."""
    try:
        if not reports.check([FAILED]):
            return False
    except Exception:  # noqa: BLE001 (the agent's store has gone: its node ended, this process ends with it)
        return False
    with suppress(Exception):
        reports.set(reported(int(os.environ["RANK"])), "")
    return True
