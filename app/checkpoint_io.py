"""Checkpoint files that are either the old one or the new one, never half of one."""

import os
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.plugins.io import TorchCheckpointIO
from typing_extensions import override


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write a local checkpoint beside its target, then rename it into place.

    Lightning's own writer goes through an fsspec transaction whose temporary file lies in the system's temporary
    folder; when that is another file system than the checkpoints (a tmpfs /tmp, say), the final move is a copy
    into the target, and a process killed during it leaves a truncated `last.ckpt`. A rename within one folder is
    atomic. The file is flushed to the disk (fsync) before the rename and its folder after it, so that a power cut
    leaves the old checkpoint or the new one, never an empty `last.ckpt`: without the first fsync a file system may
    commit the rename before the data. Remote paths (s3://, ...) keep Lightning's writer.
    """

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any = None) -> None:
        if "://" in str(path) or storage_options is not None:
            return super().save_checkpoint(checkpoint, path, storage_options)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial")
        with open(partial, "wb") as file:
            torch.save(checkpoint, file)
            file.flush()
            os.fsync(file.fileno())  # the bytes are on the disk before the name points at them
        os.replace(partial, target)
        fsync_folder(target.parent)  # and the new name is on the disk too


def fsync_folder(folder: Path) -> None:
    """Make a rename in `folder` durable: a file system may keep the folder's new entry in memory until then."""
    descriptor = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
