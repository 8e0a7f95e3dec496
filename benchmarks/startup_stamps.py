"""Moments of a process's start-up, for `startup.py` and `end_to_end.py`: each process writes its own to
`$STARTUP_STAMPS/<pid>.json`, and `read_stamps` reads a job's back.

Standard library only, so that stamping costs nothing next to what it measures. Each moment is kept the first time
it happens; the file is rewritten at each new one, so a process that is killed later still leaves what it reached.
"""

import json
import os
import time
from pathlib import Path

_STAMPS: dict[str, float | int | None] = {"rank": None}


def set_rank(rank: int) -> None:
    """The global rank of this process, once known (a launcher that does not train has none)."""
    _STAMPS["rank"] = rank
    _write()


def stamp(name: str) -> None:
    if name not in _STAMPS:
        _STAMPS[name] = time.time()
        _write()


def read_stamps(folder: Path) -> dict[int, dict]:
    """The moments of each process of the job that trains, by global rank (the launchers themselves have none)."""
    ranks = {}
    for path in folder.glob("*.json"):
        try:
            moments = json.loads(path.read_text())
        except json.JSONDecodeError:  # being written
            continue
        if moments["rank"] is not None:
            ranks[moments["rank"]] = moments
    return ranks


def _write() -> None:
    folder = os.environ.get("STARTUP_STAMPS")
    if folder:
        Path(folder, f"{os.getpid()}.json").write_text(json.dumps(_STAMPS))
