"""A line global rank 0 says while a stage runs, on a line of its own beside Lightning's progress bar."""

import sys

from lightning.pytorch.utilities import rank_zero_only
from tqdm import tqdm


def say(text: str) -> None:
    """Print `text` from global rank 0. Lightning's progress bar (tqdm, on standard output) keeps its line open while
    it runs, so a line printed the usual way was glued to the bar's; tqdm's `write` takes the bar away, prints the
    line and draws the bar again below it (and prints plainly where no bar is drawn)."""
    if rank_zero_only.rank == 0:
        tqdm.write(text, file=sys.stdout)
