"""A line global rank 0 says while a stage runs, on a line of its own beside Lightning's progress bar."""

import sys

from lightning.pytorch.utilities import rank_zero_only
from tqdm import tqdm


def say(text: str) -> None:
    """Print `text` from global rank 0 with tqdm's `write`, which takes the progress bar away and draws it again
    below (a plain print was glued to the bar's line)."""
    if rank_zero_only.rank == 0:
        tqdm.write(text, file=sys.stdout)
