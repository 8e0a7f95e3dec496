"""The job's process group, which Lightning opens and leaves open, and its TCP store: the key-value server at
MASTER_ADDR:MASTER_PORT where the processes meet (in global rank 0's process, or in torchrun's agent). The project's
threads reach the store with clients of their own: training gains no collective and no wait."""

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist


def have_met() -> bool:
    """Whether this process is in a process group: the processes of the job have met."""
    return dist.is_available() and dist.is_initialized()


def close_process_group() -> None:
    """Destroy the process group while Python is still fully alive. Lightning leaves it open, and Gloo's threads
    then abort the process at exit (SIGABRT, "terminate called without an active exception") after a run that
    finished well. Except under torchrun, the job's TCP store goes with it from global rank 0."""
    if have_met():
        torch.distributed.destroy_process_group()


def store_client(timeout_s: float) -> dist.TCPStore:
    """A client of the job's TCP store that does not count as one of its processes."""
    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def store_answers(store: dist.Store | None = None, timeout_s: float = 1.0) -> bool:
    """Whether the TCP store under `store` (the job's, at MASTER_ADDR:MASTER_PORT, by default) still listens: a plain
    connection, quiet and short. A client's call to a store that has gone with its process prints torch's C++
    warnings, some 30 frames each, and a new client retries, printing more."""
    while isinstance(store, dist.PrefixStore):
        store = store.underlying_store
    if store is not None and not isinstance(store, dist.TCPStore):  # a test's: it has no process to go with
        return True
    try:
        job = store is None  # the job's store, where the processes meet
        address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])) if job else (store.host, store.port)
        with socket.create_connection(address, timeout=timeout_s):
            return True
    except (KeyError, ValueError, OSError):
        return False


def job_store(part: str, timeout_s: float) -> dist.Store:
    """A part of the job's store, `part`'s own in each restart of a torchrun job (whose store lives on)."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return dist.PrefixStore(f"{part}/{restart}/", store_client(timeout_s))


# The part of the job's store where its processes say that one failed (`FAILED`, counted up by each process that
# fails) and that each has reported (`reported(rank)`): app/command_line/speaking.py.
REPORTS, FAILED = "report", "failed"


def reported(rank: int) -> str:
    return f"reported/{rank}"


def under_torchrun() -> bool:
    """torchrun's workers use the store of torchrun's agent, which met the other nodes before starting them."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
