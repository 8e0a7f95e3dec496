"""Checkpoint files that are either the old one or the new one, never half of one."""

import errno
import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override

from app.errors import UserError

FULL = {errno.ENOSPC: "no space left", errno.EDQUOT: "disk quota exceeded"}
PARTIAL = ".partial"  # `.last.ckpt.partial`: a save in progress, hidden beside its target


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write a local checkpoint beside its target, then rename it into place.

    Lightning's own writer goes through an fsspec transaction whose temporary file lies in the system's temporary
    folder; when that is another file system than the checkpoints (a tmpfs /tmp, say), the final move is a copy
    into the target, and a process killed during it leaves a truncated `last.ckpt`. A rename within one folder is
    atomic. The file is flushed to the disk (fsync) before the rename and its folder after it, so that a power cut
    leaves the old checkpoint or the new one, never an empty `last.ckpt`: without the first fsync a file system may
    commit the rename before the data. Remote paths (s3://, ...) keep Lightning's writer.

    A full disk (or quota) ends the run in one line that names the folder; the partial file is removed, and the
    previous checkpoint stays as it was. A partial file that a killed process left is removed when a run continues
    from that folder (`remove_partial_files`).
    """

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any = None) -> None:
        if "://" in str(path) or storage_options is not None:
            return super().save_checkpoint(checkpoint, path, storage_options)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}{PARTIAL}")
        try:
            with open(partial, "wb") as file:
                torch.save(checkpoint, file)
                file.flush()
                os.fsync(file.fileno())  # the bytes are on the disk before the name points at them
        except (OSError, RuntimeError) as error:
            partial.unlink(missing_ok=True)
            full = _disk_full(error)
            if full is None:
                raise
            if target.exists():
                then = f"{target} still holds the previous save. Free space there, then continue with --ckpt_path last"
            else:
                then = "Free space there, or choose another folder (--trainer.default_root_dir), and train again"
            raise UserError(f"cannot save the checkpoint {target.name}: {full} in {target.parent}. {then}.") from error
        os.replace(partial, target)
        fsync_folder(target.parent)  # and the new name is on the disk too


def remove_partial_files(folder: Path) -> None:
    """Remove what an interrupted save left in `folder` (hidden `.NAME.partial` files), before a run continues."""
    for leftover in folder.glob(f".*{PARTIAL}"):
        leftover.unlink(missing_ok=True)


def _disk_full(error: BaseException | None) -> str | None:
    """ "no space left" or "disk quota exceeded" when `error` or what caused it says so; torch's writer reports a
    failed write as a RuntimeError of its own, with the OSError as its context."""
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
