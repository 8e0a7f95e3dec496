"""A run's folder: `<root>/<Model>-<dataset>/version_N`, claimed with `mkdir` (which one process wins), locked with
`flock` while the command that writes into it runs, found again to continue it (docs/run-folder.md)."""

import contextlib
import errno
import fcntl
import os
import re
import shutil
from pathlib import Path

import yaml
from lightning.pytorch import Callback
from lightning.pytorch.trainer.states import TrainerFn

from app.errors import UserError
from app.run.checkpoints import write_whole

DEFAULT_ROOT = "runs"  # --trainer.default_root_dir: where the runs are
RECORD = "config.yaml"
CONTINUED_RECORD = re.compile(r"config-continued-(\d+)\.yaml")
VERSION = re.compile(r"version_(\d+)")
CHECKPOINTS = "checkpoints"


def run_name(model_class_path: str, dataset: str) -> str:
    """`SeqNet-fashion_mnist`: the folder that holds the runs of one model on one dataset."""
    return f"{model_class_path.rsplit('.', 1)[-1]}-{dataset}"


class RunFolder(Callback):
    """The folder a run (or an evaluation) writes into: a new `version_N` of `parent`, claimed by global rank 0 when
    the first file is written, or a run it continues. As a callback it notes when the command's work starts: what a
    command that fails before wrote is taken back (`undo`)."""

    def __init__(self, parent: Path, path: Path | None = None) -> None:
        self.parent = parent
        self.started = False  # a batch of the command's own stage has started: training, or the evaluation
        self.path = path  # known from the start when continuing a run; claimed by `claim` otherwise
        self.continued = path is not None
        self._lock: int | None = None
        self._there_before: set[Path] = set()  # what a run that is continued held when this process took it
        self._made: list[Path] = []  # the folders `claim` made above the run's, innermost first

    @property
    def version(self) -> int | str | None:
        """What Lightning's TensorBoardLogger calls the version: `version_N`'s N, once the folder is known."""
        if self.path is None:
            return None
        number = VERSION.fullmatch(self.path.name)
        return int(number.group(1)) if number else self.path.name

    def claim(self) -> Path:
        """The folder: a run taken, or the next free `version_N` of `parent`, created and held the first time."""
        if self.path is not None:
            return self.path
        self._made = [folder for folder in (self.parent, *self.parent.parents) if not folder.exists()]
        self.parent.mkdir(parents=True, exist_ok=True)
        number = max(versions(self.parent), default=-1) + 1
        while True:
            try:
                (self.parent / f"version_{number}").mkdir()
                break
            except FileExistsError:
                number += 1
            except FileNotFoundError:  # another command that failed took back the parent it had made
                self.parent.mkdir(parents=True, exist_ok=True)
        self.path = self.parent / f"version_{number}"
        self._hold()
        return self.path

    def take(self) -> None:
        """Hold the existing run `path` to continue it, or say in one line that another process trains it now."""
        if not self._hold():
            raise UserError(
                f"{self.path} is being trained by another process right now (it holds the run's lock). Wait for it"
                " to end, or start a new run."
            )
        self._there_before = set(self.path.rglob("*"))

    def on_train_batch_start(self, trainer, *args) -> None:
        self.started = True

    on_test_batch_start = on_predict_batch_start = on_train_batch_start

    def on_validation_batch_start(self, trainer, *args) -> None:
        self.started = self.started or trainer.state.fn == TrainerFn.VALIDATING  # not fit's validation

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict) -> None:
        """A run continued under another spelling of its folder (absolute where it started relative, or from another
        working folder): its checkpoint callbacks' states name their files in this spelling. Lightning compares the
        folders as text: it would drop the best score (a worse epoch then taken for the best), and keep the best
        file's old spelling, which from here may name another run's file (then tested after the fit)."""
        if not self.continued:
            return
        for callback in trainer.checkpoint_callbacks:
            state = checkpoint.get("callbacks", {}).get(callback.state_key)
            if state and callback.dirpath:
                _respell(state, callback.dirpath)

    def undo(self) -> None:
        """Remove what this process wrote in a folder it holds: a new run's folder, or a continuation's new files."""
        if self.path is None or self._lock is None:
            return
        if not self.continued:
            shutil.rmtree(self.path)
            self.path = None
            for folder in self._made:  # and the folders it made to hold it, unless something else is there now
                with contextlib.suppress(OSError):
                    folder.rmdir()
            return
        for path in sorted(set(self.path.rglob("*")) - self._there_before, key=lambda p: len(p.parts), reverse=True):
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            else:
                path.unlink()

    def release(self) -> None:
        """Let go of the run's lock when the command ends (a process that ends lets go of it too): a later command of
        the same process, in a notebook or a test, may then continue the run."""
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def _hold(self) -> bool:
        """Lock the folder until `release`; False when another holds it (no locking: taken as unlocked)."""
        descriptor = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                os.close(descriptor)
                return False
        self._lock = descriptor
        return True


def _respell(state: dict, dirpath: str) -> None:
    """A `ModelCheckpoint` state with its folder and files spelled from `dirpath`, where both are a run's own
    checkpoint folder (`version_N/checkpoints`: the run continued, spelled otherwise, or moved, also to another
    `version_N`). Text alone decides, the same on every rank (`dirpath` is rank 0's); another folder
    (`--checkpoint.dirpath` given) is left to Lightning."""
    saved = state.get("dirpath")
    if not saved or saved == dirpath or not (_in_a_run(Path(saved)) and _in_a_run(Path(dirpath))):
        return

    def here(path: str) -> str:
        return os.path.join(dirpath, os.path.basename(path)) if path and os.path.dirname(path) == saved else path

    for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
        if key in state:
            state[key] = here(state[key])
    state["best_k_models"] = {here(path): score for path, score in state.get("best_k_models", {}).items()}
    state["dirpath"] = dirpath


def _in_a_run(folder: Path) -> bool:
    """Whether `folder` is spelled as a run's own checkpoint folder, `version_N/checkpoints`."""
    return folder.name == CHECKPOINTS and VERSION.fullmatch(folder.parent.name) is not None


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
        settings = read_record(record)
        for section in ("last_checkpoint", "timed_checkpoint"):
            if dirpath := (settings.get(section) or {}).get("dirpath"):
                folders.append(Path(dirpath))
    return list(dict.fromkeys(folders))


def last_checkpoint_of(run: Path) -> Path | None:
    """The newest `last*.ckpt` of the run (train.py's last and timed checkpoints), or None."""
    found = [path for folder in checkpoint_folders(run) for path in folder.glob("last*.ckpt")]
    return max(found, key=lambda path: path.stat().st_mtime, default=None)


def newest_run_with_a_checkpoint(parent: Path) -> Path | None:
    """The run `--ckpt_path last` continues: the highest `version_N` of `parent` that holds a last checkpoint."""
    for number in sorted(versions(parent), reverse=True):
        if last_checkpoint_of(parent / f"version_{number}") is not None:
            return parent / f"version_{number}"
    return None


def trained_runs_in(root: Path) -> list[str]:
    """How to name each model and dataset with a trained run in `root`: `--model ConvNet --data.dataset mnist`."""
    groups = (group.name.split("-", 1) for group in sorted(root.glob("*-*")) if newest_run_with_a_checkpoint(group))
    return [f"--model {model} --data.dataset {dataset}" for model, dataset in groups]


def newest_record(run: Path) -> Path | None:
    """The run's settings as its latest start or continuation recorded them, or None for a run without a record."""
    continued = _continued_records(run)
    if continued:
        return max(continued)[1]
    return run / RECORD if (run / RECORD).is_file() else None


def read_record(record: Path) -> dict:
    """The settings a record holds; one line naming the file when it is not the YAML mapping train.py wrote."""
    try:
        settings = yaml.safe_load(record.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as error:
        problem = " ".join(str(error).split())
    else:
        if isinstance(settings, dict):
            return settings
        problem = "it holds no settings"
    raise UserError(
        f"{record} is damaged ({problem}). Put back the file train.py wrote, or remove it: the run then continues"
        " with the settings of its previous record, or of its checkpoint."
    )


def write_record(path: Path, text: str) -> None:
    """Write a record whole or not at all (`write_whole`), never over an existing file."""
    if path.exists():
        raise FileExistsError(errno.EEXIST, "a record is never overwritten", str(path))
    write_whole(path, lambda file: file.write(text), mode="w")


def next_record_name(run: Path, continuing: bool) -> str:
    """The name of the record a start (`config.yaml`) or the K-th continuation of the run writes."""
    if not continuing:
        return RECORD
    return f"config-continued-{max((n for n, _ in _continued_records(run)), default=0) + 1}.yaml"


def _continued_records(run: Path) -> list[tuple[int, Path]]:
    return [(int(m.group(1)), path) for path in run.iterdir() if (m := CONTINUED_RECORD.fullmatch(path.name))]
