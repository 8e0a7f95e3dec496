"""Closing the job's process group, which Lightning opens and leaves open."""

import torch


def have_met() -> bool:
    """Whether this process is in a process group: the processes of the job have met."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def close_process_group() -> None:
    """Destroy the process group while Python is still fully alive.

    Lightning leaves it open when the program ends. Gloo's worker threads may then still hold the work of the last
    collectives, whose tensors get freed during interpreter shutdown: the process aborts (SIGABRT, "terminate called
    without an active exception") after a run that finished well, and its exit status says it failed. Except under
    torchrun, whose agent holds it, the job's TCP store goes with it from global rank 0 (see
    `app/command_line/speaking.py`).
    """
    if have_met():
        torch.distributed.destroy_process_group()
