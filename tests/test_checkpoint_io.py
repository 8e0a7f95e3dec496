"""Checkpoint files written whole (AtomicCheckpointIO), and read as data only with one line for what is not one."""

import errno
import os
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from app.console import UserError
from app.plugins.checkpoint_io import AtomicCheckpointIO, read_checkpoint


def test_a_checkpoint_reaches_the_disk_before_it_takes_its_name_and_the_folder_after(tmp_path, monkeypatch):
    events, fsync, replace = [], os.fsync, os.replace
    monkeypatch.setattr(
        os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))), fsync(fd))
    )
    monkeypatch.setattr(os, "replace", lambda a, b: (replace(a, b), events.append(("rename", str(a), str(b)))))
    target = tmp_path / "checkpoints" / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(3)}}, target)
    partial = str(tmp_path / "checkpoints" / ".last.ckpt.partial")
    assert events == [("fsync", partial), ("rename", partial, str(target)), ("fsync", str(target.parent))]
    assert torch.load(target, weights_only=True)["state_dict"]["w"].tolist() == [1, 1, 1]
    assert [p.name for p in target.parent.iterdir()] == ["last.ckpt"]


def test_a_save_cut_short_leaves_the_previous_file_and_a_full_disk_says_so_in_one_line(tmp_path, monkeypatch):
    target = tmp_path / "last.ckpt"
    AtomicCheckpointIO().save_checkpoint({"step": 1}, target)

    def full(descriptor: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(UserError) as said:
        AtomicCheckpointIO().save_checkpoint({"step": 2}, target)
    assert str(said.value) == (
        f"cannot save the checkpoint last.ckpt: no space left in {tmp_path}; {target} still holds the previous save."
        " Free space there, then continue the run (--ckpt_path last)."
    )
    assert torch.load(target, weights_only=True) == {"step": 1} and [p.name for p in tmp_path.iterdir()] == [
        target.name
    ]


class Code:
    """A class a pickle would import and build: loading it would run code."""


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda p: None, "no such file"),
        (lambda p: p.write_bytes(b""), r"is empty \(0 bytes\)"),
        (lambda p: p.write_text("not a checkpoint"), "is not a checkpoint"),
        (
            lambda p: torch.save({"state_dict": {}, "hyper_parameters": {}}, p) or p.write_bytes(p.read_bytes()[:200]),
            "is truncated or corrupt",
        ),
        (lambda p: torch.save(torch.ones(2), p), "is no checkpoint of train.py's"),
        (lambda p: torch.save(OrderedDict(w=torch.ones(1)), p), "is no checkpoint of train.py's"),
        (lambda p: torch.save({"state_dict": {}, "code": Code()}, p), "loading it could run code"),
        (
            lambda p: torch.jit.save(torch.jit.script(torch.nn.Linear(1, 1)), p),
            "is truncated or corrupt, or an exported",
        ),
    ],
)
def test_a_file_that_is_no_checkpoint_of_train_py_is_one_line(tmp_path, make, words):
    path = tmp_path / "named.ckpt"
    make(path)
    with pytest.raises(UserError, match=words):
        read_checkpoint(path)


@pytest.mark.parametrize("kept", [0.01, 0.05, 0.2, 0.5, 0.9, 0.999])
def test_a_checkpoint_cut_short_anywhere_is_said_to_be_truncated(tmp_path, kept):
    """A copy or a download cut off: at any length, the same line (torch's reader fails in several ways)."""
    path = tmp_path / "cut.ckpt"
    torch.save({"state_dict": {"w": torch.ones(64, 64)}, "hyper_parameters": {}, "epoch": 1}, path)
    path.write_bytes(path.read_bytes()[: int(path.stat().st_size * kept)])
    with pytest.raises(UserError, match=f"--ckpt_path {path} is truncated or corrupt"):
        read_checkpoint(path)


def test_a_missing_file_names_the_checkpoints_of_its_folder(tmp_path):
    (tmp_path / "epoch=0-step=10.ckpt").write_bytes(b"x")
    with pytest.raises(UserError, match=r"holds epoch=0-step=10\.ckpt: give one of them"):
        read_checkpoint(Path(tmp_path / "last.ckpt"))


def test_a_checkpoint_that_would_run_code_is_read_as_its_message_says_with_weights_only_false(tmp_path):
    path = tmp_path / "trusted.ckpt"
    torch.save({"state_dict": {}, "hyper_parameters": {}, "code": Code()}, path)
    with pytest.raises(UserError, match="If you trust where it comes from, add --weights_only false"):
        read_checkpoint(path)
    assert isinstance(read_checkpoint(path, weights_only=False)["code"], Code)
