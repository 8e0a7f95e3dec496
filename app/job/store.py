"""The job's TCP store: the key-value server that torch.distributed starts at MASTER_ADDR:MASTER_PORT for the processes
to meet (in global rank 0's process under Lightning's launcher and SLURM, in the agent under torchrun). This
program reaches it with a client of its own, from threads, to say who has arrived (`app/job/rendezvous.py`), who
stopped answering (`app/job/heartbeats.py`) and who speaks for the job (`app/command_line/speaking.py`): training
itself gains no collective and no wait."""

import os
from datetime import timedelta

import torch.distributed as dist


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
