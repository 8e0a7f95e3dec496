"""The meeting of a job's processes: said aloud while it waits, ended by Ctrl-C, and followed by what must happen
before any process writes a file."""

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

import torch.distributed as dist
from lightning.pytorch import Trainer

from app.job.children import ctrl_c_ends_at_once
from app.job.store import store_client, under_torchrun

FIRST_NOTICE_S = 10  # the first "still waiting" line, then one every NOTICE_EVERY_S
NOTICE_EVERY_S = 60
ARRIVED_KEY = "rendezvous/arrived"  # counted up once by each process that reached the store


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
        if dist.is_initialized() and dist.get_world_size() > 1:
            self.after()


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
