"""What the processes of a DDP job need beyond what Lightning does: dying with their launcher."""

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def die_with_parent() -> None:
    """In a process started by a launcher (LOCAL_RANK is set), have Linux kill it when its parent dies.

    When Lightning's launching process (rank 0) fails after starting the other ranks (a port already in use, an
    error during its setup), nothing ends those ranks: they would wait in a collective until the process-group
    timeout, 30 minutes by default. A torchrun worker likewise ends with its agent. No-op elsewhere.
    """
    if sys.platform != "linux" or "LOCAL_RANK" not in os.environ:
        return
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the request was in place
        os._exit(1)
