"""A run's folder: `<root>/<Model>-<dataset>/version_N`, claimed atomically, held while the run lives, found again
to continue it.

Lightning's loggers pick `version_N` by listing the folder and taking the next number, so two runs started at the
same moment can pick the same one and write into each other's folder. Here global rank 0 claims the folder with
`mkdir`, which exactly one process wins, and holds a lock on it (`flock`) as long as its process lives: a second
process that would continue the same run is refused while the first still trains. The lock writes nothing, and the
kernel drops it when the process ends, however it ends.

What a run writes, all in its folder: `config.yaml` (how it was started), one `config-continued-K.yaml` per
continuation (its settings, with what it changed in a comment at the top), `checkpoints/`, TensorBoard's event files
and `hparams.yaml`, and one folder per evaluation of its checkpoints (`test/version_N`, `predict/version_N`, ...).
"""

import errno
import fcntl
import os
import re
from pathlib import Path

import yaml

from app.errors import UserError

RECORD = "config.yaml"
CONTINUED_RECORD = re.compile(r"config-continued-(\d+)\.yaml")
VERSION = re.compile(r"version_(\d+)")
CHECKPOINTS = "checkpoints"


def run_name(model_class_path: str, dataset: str) -> str:
    """`SeqNet-fashion_mnist`: the folder that holds the runs of one model on one dataset."""
    return f"{model_class_path.rsplit('.', 1)[-1]}-{dataset}"


class RunFolder:
    """The folder a run (or an evaluation) writes into: a new `version_N` of `parent`, or an existing run that it
    continues. Global rank 0 claims or takes it before the processes start training; the other ranks never touch it
    (Lightning broadcasts rank 0's folders to them)."""

    def __init__(self, parent: Path, path: Path | None = None) -> None:
        self.parent = parent
        self.path = path  # known from the start when continuing a run; claimed by `claim` otherwise
        self._lock: int | None = None

    @property
    def version(self) -> int | str | None:
        """What Lightning's TensorBoardLogger calls the version: `version_N`'s N, once the folder is known."""
        if self.path is None:
            return None
        number = VERSION.fullmatch(self.path.name)
        return int(number.group(1)) if number else self.path.name

    def claim(self) -> Path:
        """Create the next free `version_N` of `parent` and hold it; safe against any number of processes doing the
        same at the same moment."""
        self.parent.mkdir(parents=True, exist_ok=True)
        number = max(versions(self.parent), default=-1) + 1
        while True:
            try:
                (self.parent / f"version_{number}").mkdir()
                break
            except FileExistsError:
                number += 1
        self.path = self.parent / f"version_{number}"
        self._hold()
        return self.path

    def take(self) -> None:
        """Hold the existing run `path` to continue it, or say in one line that another process trains it now."""
        if not self._hold():
            raise UserError(
                f"{self.path} is being trained by another process right now (it holds the run's lock). Wait for it"
                " to end, or start a new run (without --ckpt_path last)."
            )

    def release(self) -> None:
        """Let another process take the folder (the end of this process does the same)."""
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def _hold(self) -> bool:
        """Lock the folder for as long as this process lives; False when another process holds it. File systems
        that cannot lock a folder (some network file systems) are taken as unlocked."""
        descriptor = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                os.close(descriptor)
                return False
        self._lock = descriptor  # closed, and so released, when the process ends
        return True


def versions(parent: Path) -> list[int]:
    """The N of every `version_N` folder in `parent`."""
    if not parent.is_dir():
        return []
    return [int(match.group(1)) for path in parent.iterdir() if (match := VERSION.fullmatch(path.name))]


def is_run(path: Path) -> bool:
    """Whether `path` is a run's folder: it holds the run's record or its checkpoints."""
    return (path / RECORD).is_file() or (path / CHECKPOINTS).is_dir()


def checkpoint_folders(run: Path) -> list[Path]:
    """Where the run saves its last checkpoints: `<run>/checkpoints`, or the folders its settings name instead
    (`--last_checkpoint.dirpath`, `--timed_checkpoint.dirpath`)."""
    folders = [run / CHECKPOINTS]
    if (record := newest_record(run)) is not None:
        settings = yaml.safe_load(record.read_text()) or {}
        for section in ("last_checkpoint", "timed_checkpoint"):
            if dirpath := (settings.get(section) or {}).get("dirpath"):
                folders.append(Path(dirpath))
    return list(dict.fromkeys(folders))


def last_checkpoint_of(run: Path) -> Path | None:
    """The newest `last*.ckpt` of the run (train.py's last and timed checkpoints), or None."""
    found = [path for folder in checkpoint_folders(run) for path in folder.glob("last*.ckpt")]
    return max(found, key=lambda path: path.stat().st_mtime, default=None)


def newest_run_with_a_checkpoint(parent: Path) -> Path | None:
    """The run `--ckpt_path last` continues: the `version_N` of `parent` with the highest N that holds a last
    checkpoint. Runs that never saved one (refused, or stopped before their first save) are passed over."""
    for number in sorted(versions(parent), reverse=True):
        if last_checkpoint_of(parent / f"version_{number}") is not None:
            return parent / f"version_{number}"
    return None


def newest_record(run: Path) -> Path | None:
    """The run's settings as its latest start or continuation recorded them, or None for a run without a record."""
    continued = [(int(m.group(1)), path) for path in run.iterdir() if (m := CONTINUED_RECORD.fullmatch(path.name))]
    if continued:
        return max(continued)[1]
    return run / RECORD if (run / RECORD).is_file() else None


def next_record_name(run: Path) -> str:
    """The name of the record a start (`config.yaml`) or the K-th continuation of the run writes."""
    if not (run / RECORD).exists():
        return RECORD
    taken = [int(m.group(1)) for path in run.iterdir() if (m := CONTINUED_RECORD.fullmatch(path.name))]
    return f"config-continued-{max(taken, default=0) + 1}.yaml"
