"""Closing the job's process group, which Lightning opens and leaves open."""

import torch

from app.job.early_start import NodeProcesses


def close_process_group(node: NodeProcesses | None = None) -> None:
    """Destroy the process group while Python is still fully alive.

    Lightning leaves it open when the program ends. Gloo's worker threads may then still hold the work of the last
    collectives, whose tensors get freed during interpreter shutdown: the process aborts (SIGABRT, "terminate called
    without an active exception") after a run that finished well, and its exit status says it failed. Except under
    torchrun, whose agent holds it, the job's TCP store goes with it from global rank 0 (see
    `app/command_line/speaking.py`).
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        if node is not None:  # a process this one started that ends now is not one that failed before the meeting
            node.met.set()
        torch.distributed.destroy_process_group()
