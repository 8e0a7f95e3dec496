"""Reading a checkpoint the user names, with one line that says why when the file is not one train.py can use."""

import pickle
import sys
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule

from app.errors import UserError

LIGHTNING_KEYS = ("state_dict", "pytorch-lightning_version")


def read_checkpoint(path: str | Path, option: str = "--ckpt_path") -> dict[str, Any]:
    """The contents of a checkpoint written by train.py, loaded as data only (loading cannot run code).

    Raises `UserError` when `path` is missing, a folder, empty, truncated or corrupt, something other than a
    checkpoint (a text file, an image, a tensor saved with torch.save), or a file that would run code when loaded.
    """
    path = Path(path)
    if path.is_dir():
        inside = sorted(p.name for p in path.glob("*.ckpt"))
        hint = f" It holds {', '.join(inside[:3])}: give one of them." if inside else " Give a .ckpt file."
        raise UserError(f"{option} {path} is a folder, not a checkpoint file.{hint}")
    if not path.is_file():
        raise UserError(f"{option} {path}: no such file. Give a checkpoint written by train.py (runs/*/checkpoints).")
    if path.stat().st_size == 0:
        raise UserError(f"{option} {path} is empty (0 bytes): its writing was cut off. Use another checkpoint.")
    try:
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
    return checkpoint


def saved_model_class(checkpoint: dict[str, Any]) -> type | None:
    """The model class a checkpoint of LightningCLI names (`hyper_parameters._class_path`, `models.SeqNet`), where it
    is a LightningModule of a module imported already; else None. Nothing is imported: a checkpoint cannot choose
    code to run. (Lightning's own `ImageClassifier.load_from_checkpoint` drops `_class_path` and would build the
    base class: the subclass has to load it.)"""
    module_name, _, class_name = checkpoint.get("hyper_parameters", {}).get("_class_path", "").rpartition(".")
    found = getattr(sys.modules.get(module_name), class_name, None)
    return found if isinstance(found, type) and issubclass(found, LightningModule) else None


def _unreadable(path: Path, option: str) -> str:
    with open(path, "rb") as file:
        is_zip = file.read(4) == b"PK\x03\x04"  # torch saves checkpoints as zip archives
    if is_zip:
        return (
            f"{option} {path} is truncated or corrupt: torch cannot read it as a checkpoint. Copy it again, or use"
            " another checkpoint (last.ckpt, or the best one in the same folder)."
        )
    return unpickling_problem(f"{option} {path}", pickle.UnpicklingError())


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
