"""When a process of a torchrun job was lost: noted on its node by the processes that lost it, read by the next
attempt, which says how long the job took to train again.

torchrun's agent outlives the processes it restarts and hands nothing from one attempt to the next but the
environment; a file in the system's temporary folder, named after the agent's pid (unique on its host while it
runs), is what both attempts on a node can find. Nothing else: the run's folder is the run's, not the launcher's.
"""

import contextlib
import os
import re
import tempfile
import time
from pathlib import Path


def _note() -> Path | None:
    """The note of this node's torchrun agent, in a job it restarts after a failure; None elsewhere."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id is None or os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") == "0":
        return None
    name = re.sub(r"[^\w.-]", "_", f"train.py-torchrun-{os.getppid()}-{run_id}-lost")
    return Path(tempfile.gettempdir(), name)


def note_the_loss() -> None:
    """A process of the job is gone: keep the time for the attempt torchrun starts next (the first note wins)."""
    note = _note()
    if note is None or note.exists():
        return
    with contextlib.suppress(OSError):
        written = note.with_name(f"{note.name}.{os.getpid()}")
        written.write_text(repr(time.time()))
        written.rename(note)  # whole, or not there


def seconds_since_the_loss() -> float | None:
    """Seconds since this node's processes of the previous attempt lost a peer, or None. Read once, by local rank 0
    of each attempt at its start, which uses the note up: a later loss gets a note of its own."""
    note = _note()
    if note is None:
        return None
    try:
        return time.time() - float(note.read_text())
    except (OSError, ValueError):
        return None
    finally:
        with contextlib.suppress(OSError):
            note.unlink()
