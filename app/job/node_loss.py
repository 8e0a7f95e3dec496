"""When a process of a torchrun job was lost: noted on its node by the processes that lost it, read by the next
attempt, which says how long the job took to train again.

torchrun's agent outlives the processes it restarts and hands nothing from one attempt to the next but the
environment; a file in the system's temporary folder, named after the agent's pid (unique on its host while it
runs), is what both attempts on a node can find. Nothing else: the run's folder is the run's, not the launcher's.
"""

import contextlib
import os
import tempfile
import time
from pathlib import Path


def _note() -> Path | None:
    """The note of this node's torchrun agent, in a job it restarts after a failure; None elsewhere."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id is None or os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") == "0":
        return None
    return Path(tempfile.gettempdir(), f"train.py-torchrun-{os.getppid()}-{run_id}-lost")


def note_the_loss() -> None:
    """A process of the job is gone: keep the time for the attempt torchrun starts next (the first note wins)."""
    note = _note()
    if note is None:
        return
    with contextlib.suppress(OSError):
        descriptor = os.open(note, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        os.write(descriptor, repr(time.time()).encode())
        os.close(descriptor)


def seconds_since_the_loss() -> float | None:
    """Seconds since this node's processes of the previous attempt lost a peer, or None; the note is used up."""
    note = _note()
    if note is None:
        return None
    try:
        lost_at = float(note.read_text())
        note.unlink()
    except (OSError, ValueError):
        return None
    return time.time() - lost_at
