"""A run's folder, `<root>/<Model>-<dataset>/version_N`, which nothing overwrites (`RunLogger`), and what `--ckpt_path`
names: a checkpoint file, a run's folder, or `last`, the newest run of a model on a dataset (`find_start`);
docs/run-folder.md."""

import contextlib
import errno
import fcntl
import itertools
import os
import re
import shlex
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.tensorboard.summary import hparams
from typing_extensions import override

from app.console import UserError, options_of

if TYPE_CHECKING:
    from app.start import Start

RECORD, CHECKPOINTS, LAST, KEPT = "config.yaml", "checkpoints", "last.ckpt", (".ckpt", ".csv")
VERSION, CONTINUED = re.compile(r"version_(\d+)"), re.compile(r"config-continued-(\d+)\.yaml")
METRICS = ("val/acc", "val/loss", "test/acc", "test/loss")  # the HPARAMS tab's columns


def run_name(model_class_path: str, dataset: str) -> str:
    """`SeqNet-fashion_mnist`: the folder of the runs of one model on one dataset."""
    return f"{model_class_path.rsplit('.', 1)[-1]}-{dataset}"


def versions(parent: Path) -> list[int]:
    return [int(m.group(1)) for p in parent.iterdir() if (m := VERSION.fullmatch(p.name))] if parent.is_dir() else []


def records(run: Path) -> list[Path]:
    """The run's records of its settings, oldest first: `config.yaml`, then `config-continued-K.yaml` for each
    continuation."""
    continued = sorted(
        (int(m.group(1)), p) for p in run.glob("config-continued-*") if (m := CONTINUED.fullmatch(p.name))
    )
    return [p for p in (run / RECORD,) if p.is_file()] + [p for _k, p in continued]


def next_record(run: Path | None) -> str:
    """The name of the record this command writes: `config.yaml` for a new folder, the next `config-continued-K`."""
    return f"config-continued-{len(records(run))}.yaml" if run is not None and records(run) else RECORD


def check_writable(option: str, folder: str | Path, how: str = "") -> None:
    """One line saying why `folder`, where `option` (as typed: `--trainer.default_root_dir runs`) writes, cannot be
    made or written, if it cannot, and `how` to do without; nothing is created."""
    folder = Path(folder)
    existing = next(path for path in (folder, *folder.parents) if path.exists() or path == path.parent)
    if not existing.is_dir():
        raise UserError(f"{option}: {existing} is a file, where a folder is needed. Move it, or choose another folder.")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise UserError(
            f"{option}: cannot write {existing} ({error.strerror})."
            f" {how or 'Choose a folder you can write to'}, or ask its owner to let you."
        ) from error


def check_folders(trainer, start: "Start | None", subcommand: str) -> None:
    """Refuse in one line, before anything is written, a folder the command would write into and cannot: the root of
    its run (a continued run's checkpoints; for an evaluation of a run's checkpoint, that run), and a fit's
    checkpoint folders. Global rank 0 alone looks, the process that writes (before the processes meet too)."""
    if not trainer.is_global_zero:
        return
    logger = next((logger for logger in trainer.loggers if isinstance(logger, RunLogger)), None)
    if logger is not None and start is not None and start.continues:  # another's run, say
        how = f"Start a new run from its weights (--model.weights {shlex.quote(str(start.checkpoint))})"
        check_writable(f"--ckpt_path {start.named}", start.run / CHECKPOINTS, how)
    elif logger is not None and start is not None and start.run is not None and subcommand != "fit":
        how = "Logs go beside the run evaluated: copy its checkpoint to a file, give that and a folder of yours"
        check_writable(f"--ckpt_path {start.named}", logger.root_dir, how)
    elif logger is not None:
        check_writable(f"--trainer.default_root_dir {trainer.default_root_dir}", logger.root_dir)
    for callback in trainer.checkpoint_callbacks if subcommand == "fit" else []:
        if callback.dirpath and "://" not in str(callback.dirpath):  # given, on this machine
            check_writable(f"--checkpoint.dirpath {callback.dirpath}", callback.dirpath)


class RunLogger(TensorBoardLogger):
    """Lightning's TensorBoard logger in a run folder that nothing overwrites.

    Args:
        save_dir, name: The folder `<save_dir>/<name>/version_N` with the next free N, claimed with `mkdir` (one
            process wins) by global rank 0 when Lightning first asks for the version, once the processes have met;
            the others get the folder from Lightning's broadcast (`Trainer.log_dir`) and write nothing.
        version: The name of a run it continues (`version_3`) instead.
        **kwargs: `TensorBoardLogger`'s.

    Global rank 0 holds the folder (`flock`) while a stage runs, from the moment Lightning first asks for the
    version (the stage's start) to the logger's `finalize` at its end: another process that would continue it is
    refused. A command that fails or stops before it saved a checkpoint or a prediction takes back what it wrote.
    The HPARAMS tab has the run's metrics as columns; Lightning's own scalars (epoch, learning rates) go under
    `workload/`.

    Example::

        trainer = Trainer(logger=RunLogger("runs", "my-model"))  # runs/my-model/version_0, then version_1, ...
    """

    def __init__(self, save_dir: str, name: str, version: str | None = None, **kwargs: Any) -> None:
        super().__init__(save_dir, name=name, version=version, default_hp_metric=False, **kwargs)
        self.continues = version is not None
        self.folder: Path | None = None  # global rank 0's, once claimed
        self._lock: int | None = None  # the folder's, while a stage runs
        self._before: dict[Path, int] = {}  # what the folder held when this command took it, and when
        self._made = [path for path in (Path(self.root_dir), *Path(self.root_dir).parents) if not path.exists()]
        self._trained = self._tab = False  # training logged a step; the HPARAMS table is written

    @property
    @override
    def version(self) -> int | str | None:
        if self._lock is None and rank_zero_only.rank == 0:
            self._hold()
        name = self.folder.name if self.folder is not None else super().version if self.continues else None
        number = VERSION.fullmatch(name or "")
        return int(number.group(1)) if number else name

    def _hold(self) -> None:
        parent, folder = Path(self.root_dir), self.folder
        try:
            if folder is None and self.continues:
                folder = parent / str(super().version)
            elif folder is None:
                parent.mkdir(parents=True, exist_ok=True)
                for number in itertools.count(max(versions(parent), default=-1) + 1):  # mkdir: one process wins each
                    with contextlib.suppress(FileExistsError):
                        (folder := parent / f"version_{number}").mkdir()
                        break
            lock = os.open(folder, os.O_RDONLY)
        except OSError as error:
            raise UserError(
                f"{parent}: cannot write there ({error.strerror}). Choose a folder you can write to"
                " (--trainer.default_root_dir)."
            ) from error
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:  # else a file system without locks (NFS without lockd): unlocked
            if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                os.close(lock)
                raise UserError(
                    f"{folder} is being trained by another process right now (it holds the run's lock):"
                    " wait for it to end, or start a new run."
                ) from error
        if self.folder is None:  # what the folder held when this command took it
            self._before = {path: path.stat().st_mtime_ns for path in folder.rglob("*")}
        self.folder, self._lock = folder, lock

    @override
    @rank_zero_only
    def finalize(self, status: str) -> None:
        super().finalize(status)
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None
        if status != "failed" or self.folder is None or self._trained:
            return
        if any(p.stat().st_mtime_ns != self._before.get(p) for p in self.folder.rglob("*") if p.suffix in KEPT):
            return  # a checkpoint or predictions are new: the run, and how it got there, stay
        if not self.continues:
            shutil.rmtree(self.folder, ignore_errors=True)
            for folder in self._made:  # and the folders its claim made, unless another run is there now
                if folder.is_dir() and not any(folder.iterdir()):
                    folder.rmdir()
            return
        for path in sorted(set(self.folder.rglob("*")) - set(self._before), key=lambda p: len(p.parts), reverse=True):
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)

    @override
    @rank_zero_only
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        lightnings, self._trained = ("epoch", "lr-"), self._trained or bool(step)  # a step's figures: kept
        super().log_metrics({f"workload/{k}" if k.startswith(lightnings) else k: v for k, v in metrics.items()}, step)

    @override
    @rank_zero_only
    def log_hyperparams(self, params: Any, metrics: Any = None, step: int | None = None) -> None:
        super().log_hyperparams(params, metrics, step)
        if metrics is None and not self._tab:  # TensorBoard reads a run's first table only
            table = {
                option[2:].replace(".", "/"): value if isinstance(value, bool | int | float | str) else str(value)
                for option, value in options_of(dict(params)).items()
                if value is not None
            }
            for summary in hparams(table, dict.fromkeys(METRICS, 0.0)):
                self.experiment.file_writer.add_summary(summary)
            self._tab = True


class RunRecord(SaveConfigCallback):
    """LightningCLI's record of the settings (`config.yaml`, never over an earlier one), which also gives the
    loggers the command's settings: the HPARAMS tab compares runs by them."""

    @override
    def save_config(self, trainer, pl_module, stage: str) -> None:
        settings = yaml.safe_load(self.parser.dump(self.config))
        for logger in trainer.loggers:
            logger.log_hyperparams({key: settings[key] for key in ("model", "data", "trainer", "seed_everything")})
