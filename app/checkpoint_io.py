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
    atomic. Remote paths (s3://, ...) keep Lightning's writer.
    """

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options: Any = None) -> None:
        if "://" in str(path) or storage_options is not None:
            return super().save_checkpoint(checkpoint, path, storage_options)
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(f".{target.name}.partial")
        torch.save(checkpoint, partial)
        os.replace(partial, target)
