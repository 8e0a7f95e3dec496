"""Checkpoint files: written whole or not at all (`AtomicCheckpointIO`), and read as data only, with one line that
says why a file named is not a checkpoint train.py can use (`read_checkpoint`)."""

import errno
import os
import pickle
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

from app.console import UserError

FULL = {errno.ENOSPC: "no space left", errno.EDQUOT: "disk quota exceeded"}
OTHER = "Give another checkpoint (last.ckpt, or the best one in the same folder)."


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint writer, each file written whole (`write_whole`): a kill or a power cut leaves the old
    file or the new one, never half of one. A full disk ends the run in one line that says where, and that the
    previous file is intact. A remote path (`s3://...`) keeps Lightning's own writer.

    Example::

        trainer = Trainer(plugins=[AtomicCheckpointIO()])  # every checkpoint the Trainer saves, whole
    """

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any = None) -> None:
        if "://" in str(path) or storage_options is not None:
            return super().save_checkpoint(checkpoint, path, storage_options)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            write_whole(target, lambda file: torch.save(checkpoint, file))
        except (OSError, RuntimeError) as error:  # torch wraps the OSError of a failed write in a RuntimeError
            cause = error
            while cause is not None and not (isinstance(cause, OSError) and cause.errno in FULL):
                cause = cause.__cause__ or cause.__context__
            if cause is None:
                raise
            kept = f"{target} still holds the previous save" if target.exists() else "nothing was saved before"
            raise UserError(
                f"cannot save the checkpoint {target.name}: {FULL[cause.errno]} in {target.parent}; {kept}. Free"
                " space there, then continue the run (--ckpt_path last)."
            ) from error


def write_whole(target: Path, write: Callable[[IO], object], over: bool = True) -> None:
    """Write `target` whole or not at all: a hidden file beside it, flushed to the disk before it takes the name (a
    file system may commit the rename first), then the folder. Not `over` an existing file: `FileExistsError`."""
    partial = target.with_name(f".{target.name}.partial")
    try:
        with open(partial, "wb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())
        (os.replace if over else os.link)(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    folder = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)


def read_checkpoint(path: Path, weights_only: bool = True, option: str = "--ckpt_path") -> dict[str, Any]:
    """The checkpoint at `path` (as data, unless not `weights_only`: loading it runs no code); a `UserError` for
    anything else."""
    if not path.is_file():
        there = sorted(p.name for p in path.parent.glob("*.ckpt")) if path.parent.is_dir() else []
        hint = f"{path.parent} holds {', '.join(there)}: give one of them" if there else "Give a checkpoint file"
        raise UserError(f"{option} {path}: no such file. {hint}, a run's folder, or last.")
    if path.stat().st_size == 0:
        raise UserError(f"{option} {path} is empty (0 bytes): its writing was cut off. Give another checkpoint.")
    try:
        with warnings.catch_warnings():  # an exported TorchScript file: said below
            warnings.simplefilter("ignore")
            checkpoint = torch.load(path, map_location="cpu", weights_only=weights_only)
    except pickle.UnpicklingError as error:
        if "Unsupported global" not in str(error):
            raise UserError(f"{option} {path} is not a checkpoint (not a file torch saved).") from error
        raise UserError(
            f"refused to load {option} {path}: it holds more than tensors and plain values, and loading it could run"
            " code. If you trust where it comes from, add --weights_only false."
        ) from error
    except OSError as error:
        if not os.access(path, os.R_OK):  # else a file one can read that torch cannot (a zip cut short, say)
            raise UserError(f"{option} {path}: cannot read it ({error.strerror}).") from error
        raise UserError(
            f"{option} {path} is truncated or corrupt: torch cannot read it ({error.strerror}). {OTHER}"
        ) from error
    except (RuntimeError, EOFError, ValueError) as error:  # torch's readers, on bytes that are no checkpoint
        what = "is truncated or corrupt, or an exported model: torch cannot read it as a checkpoint"
        raise UserError(f"{option} {path} {what}. {OTHER}") from error
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint or "hyper_parameters" not in checkpoint:
        raise UserError(
            f"{option} {path} is no checkpoint of train.py's: it holds no model state and settings (a file saved"
            " with torch.save, not by a Trainer of this program)."
        )
    return checkpoint
