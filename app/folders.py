"""The folders a run writes into (logs, checkpoints, predictions), checked before any process starts work."""

import tempfile
from pathlib import Path

from app.errors import UserError


def check_writable(option: str, folder: str | Path) -> None:
    """Create `folder` if needed and write a file there, or say in one line why that cannot be done.

    Without this a folder under a file, on a read-only disk or without permission fails in the middle of the run,
    with a traceback from every process, after the time spent training.
    """
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        reason = error.strerror or type(error).__name__
        if isinstance(error, (FileExistsError, NotADirectoryError)):
            reason = f"{reason}: a file stands where a folder is needed"
        raise UserError(
            f"{option} {folder}: cannot write there ({reason}). Choose a folder you can write to."
        ) from error
