"""Checkpoint files: reading one that a user names (one line that says why when it is not one train.py can use), and
writing one so that it is the old file or the new one, never half of one."""

import errno
import os
import pickle
import sys
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch
from lightning.pytorch import LightningModule
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

from app.errors import UserError

LIGHTNING_KEYS = ("state_dict", "pytorch-lightning_version")


def read_checkpoint(path: str | Path, option: str = "--ckpt_path") -> dict[str, Any]:
    """The contents of a checkpoint written by train.py, loaded as data only (loading cannot run code); a
    `UserError` for anything else (missing, empty, truncated, not a checkpoint, code that would run)."""
    path = Path(path)
    if path.is_dir():  # not a run's (app/run/continuation.py takes those, and names the runs of a model's folder)
        raise UserError(not_a_checkpoint_folder(option, path, sorted(p.name for p in path.glob("*.ckpt"))))
    if not path.is_file():
        there = sorted(p.name for p in path.parent.glob("*.ckpt")) if path.parent.is_dir() else []
        hint = "Give a checkpoint written by train.py (runs/*/checkpoints)"
        if there:
            hint = f"{path.parent} holds {', '.join(there)}: give one of them"
        raise UserError(f"{option} {path}: no such file. {hint}.")
    if path.stat().st_size == 0:
        raise UserError(f"{option} {path} is empty (0 bytes): its writing was cut off. Use another checkpoint.")
    try:
        with warnings.catch_warnings():  # an exported model: said below in one line instead
            warnings.filterwarnings("ignore", message=".*looks like a TorchScript archive")
            checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        raise UserError(unpickling_problem(f"{option} {path}", error)) from error
    except Exception as error:  # torch's readers fail in many ways on bytes that are no checkpoint
        raise UserError(_unreadable(path, option)) from error
    if not isinstance(checkpoint, dict) or not all(key in checkpoint for key in LIGHTNING_KEYS):
        raise UserError(
            f"{option} {path} is no Lightning checkpoint: it was saved with torch.save, not by a Trainer, and holds"
            " no model state. Give a checkpoint written by train.py (runs/*/checkpoints)."
        )
    if not isinstance(checkpoint.get("hyper_parameters"), dict):  # the model's settings, its inputs' scale among them
        raise UserError(
            f"{option} {path} holds no model settings (hyper_parameters), which every checkpoint of train.py holds:"
            " the model could not be built as it was trained. Give a checkpoint written by train.py."
        )
    return checkpoint


def not_a_checkpoint_folder(option: str, path: Path, inside: list[str]) -> str:
    """A folder named where a checkpoint file or a run's folder was wanted: what it holds to give instead."""
    hint = f"It holds {', '.join(inside[:3])}: give one of them" if inside else "Give a checkpoint file"
    return f"{option} {path} is a folder, not a checkpoint file or a run's folder. {hint}, or last."


def saved_model_class(checkpoint: dict[str, Any]) -> type | None:
    """The LightningModule class a checkpoint names (`hyper_parameters._class_path`) in a module imported already,
    else None: a checkpoint cannot choose code to run. (`ImageClassifier.load_from_checkpoint` would build the base.)"""
    found = imported_class(checkpoint.get("hyper_parameters", {}).get("_class_path", ""))
    return found if found is not None and issubclass(found, LightningModule) else None


def imported_class(path: str) -> type | None:
    """The class `module.Name` names, in a module imported already, else None: naming a class runs no code."""
    module_name, _, class_name = path.rpartition(".")
    found = getattr(sys.modules.get(module_name), class_name, None)
    return found if isinstance(found, type) else None


def _unreadable(path: Path, option: str) -> str:
    with open(path, "rb") as file:
        is_zip = file.read(4) == b"PK\x03\x04"  # torch saves checkpoints as zip archives
    if is_zip and _is_torchscript(path):
        return (
            f"{option} {path} is a TorchScript model (`train.py export` writes them), not a checkpoint: give the"
            " checkpoint it was exported from."
        )
    if is_zip:
        return (
            f"{option} {path} is truncated or corrupt: torch cannot read it as a checkpoint. Copy it again, or use"
            " another checkpoint (last.ckpt, or the best one in the same folder)."
        )
    return unpickling_problem(f"{option} {path}", pickle.UnpicklingError())


def _is_torchscript(path: Path) -> bool:
    """Whether the zip archive at `path` is a TorchScript model: its code is inside."""
    try:
        with zipfile.ZipFile(path) as archive:
            return any(name.endswith("constants.pkl") or "/code/" in name for name in archive.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def unpickling_problem(what: str, error: pickle.UnpicklingError) -> str:
    """Why torch's weights-only loader refused a file: code it would run (say so), or bytes that are no pickle."""
    text = str(error)
    if "Unsupported global" in text or "GLOBAL" in text:
        reason = next((line.strip() for line in text.splitlines() if "Unsupported global" in line), "")
        return (
            f"refused to load {what}: it holds more than tensors and plain values, and loading it could run code"
            f" ({reason or 'objects of unknown classes'}). If you trust its source, add --weights_only false."
        )
    return f"{what} is not a checkpoint (not a file saved by torch). Give a checkpoint written by train.py."


# Writing

FULL = {errno.ENOSPC: "no space left", errno.EDQUOT: "disk quota exceeded"}
PARTIAL = ".partial"  # `.last.ckpt.partial`: a save in progress, hidden beside its target


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write a local checkpoint whole (`write_whole`): a kill or a power cut leaves the old one or the new one
    (docs/run-folder.md). A full disk ends the run in one line. Remote paths (s3://, ...) keep Lightning's writer."""

    def __init__(self, continue_command: Callable[[], str] = lambda: "--ckpt_path last") -> None:
        super().__init__()
        self.continue_command = continue_command  # how the user continues the run, for the full disk's line

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any = None) -> None:
        if "://" in str(path) or storage_options is not None:
            return super().save_checkpoint(checkpoint, path, storage_options)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            write_whole(target, lambda file: torch.save(checkpoint, file))
        except (OSError, RuntimeError) as error:
            full = _disk_full(error)
            if full is None:
                raise
            if target.exists():
                then = (
                    f"{target} still holds the previous save. Free space there, then continue with:"
                    f" {self.continue_command()}"
                )
            else:
                then = "Free space there, or choose another folder (--trainer.default_root_dir), and train again."
            # No full stop after a command: copied with it, the path would be another
            raise UserError(f"cannot save the checkpoint {target.name}: {full} in {target.parent}. {then}") from error


def write_whole(target: Path, write: Callable[[IO], object], mode: str = "wb") -> None:
    """Write `target` whole or not at all: a hidden file beside it, flushed to the disk before it takes the name
    (else a file system may commit the rename first), then the folder."""
    partial = target.with_name(f".{target.name}{PARTIAL}")
    try:
        with open(partial, mode) as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())  # the bytes are on the disk before the name points at them
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    fsync_folder(target.parent)


def remove_partial_files(folder: Path) -> None:
    """Remove what an interrupted save left in `folder` (hidden `.NAME.partial` files), before a run continues."""
    for leftover in folder.glob(f".*{PARTIAL}"):
        leftover.unlink(missing_ok=True)


def _disk_full(error: BaseException | None) -> str | None:
    """ "no space left" or "disk quota exceeded" when `error` or its cause says so (torch wraps the OSError)."""
    while error is not None:
        if isinstance(error, OSError) and error.errno in FULL:
            return FULL[error.errno]
        error = error.__cause__ or error.__context__
    return None


def fsync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable: a file system may keep the folder's new entry in memory until then."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
