"""A line said while a stage runs, on a line of its own beside Lightning's progress bar."""

import sys
from typing import TextIO

from lightning.pytorch.utilities import rank_zero_only
from tqdm import tqdm


def say(text: str) -> None:
    """Print `text` from global rank 0 (`write_line`)."""
    if rank_zero_only.rank == 0:
        write_line(text, sys.stdout)


def write_line(text: str, stream: TextIO) -> None:
    """Print `text` to `stream` with tqdm's `write`, which takes the progress bar away and draws it again below (a
    plain print was glued to the bar's line), from any process or thread; flushed, as the process may end next."""
    tqdm.write(text, file=stream)
    stream.flush()
