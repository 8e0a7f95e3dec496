"""The commands the program prints, spelled so that they run where the user stands: after the README's set-up (a
`.venv` not activated), `.venv/bin/tensorboard` rather than `tensorboard`, unless the PATH already leads there."""

import os
import shutil
import sys
from pathlib import Path


def tool(name: str) -> str:
    """How to run `name` (`tensorboard`) of this interpreter's environment from the current folder."""
    return _command(Path(sys.executable).parent / name)


def train_py() -> str:
    """`python train.py`, as the user can type it here."""
    script = Path(__file__).resolve().parents[1] / "train.py"
    return f"{_command(Path(sys.executable))} {_from_here(script)}"


def _command(program: Path) -> str:
    """The program's bare name where the PATH leads to it (or where it is not there to name), else its path."""
    found = shutil.which(program.name)
    if not program.exists() or (found is not None and os.path.abspath(found) == os.path.abspath(program)):
        return program.name
    path = _from_here(program)
    return path if os.sep in path else f".{os.sep}{path}"  # a bare name would be looked up on the PATH


def _from_here(path: Path) -> str:
    """`path` relative to the current folder where it lies below it, else absolute."""
    absolute = Path(os.path.abspath(path))
    try:
        return str(absolute.relative_to(Path.cwd()))
    except ValueError:
        return str(absolute)
