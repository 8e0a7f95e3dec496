"""Checkpoints are replaced atomically: an interrupted save leaves the previous file whole."""

import pytest
import torch

from app.run.checkpoints import AtomicCheckpointIO
from tests.helpers import run_in_process, small_run


def test_an_interrupted_save_leaves_the_previous_checkpoint_intact(tmp_path, monkeypatch):
    path = tmp_path / "checkpoints" / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"epoch": 1, "weights": torch.ones(1000)}, path)

    def dies_halfway(obj, file):  # a process killed while writing: half the bytes, then nothing
        file.write(b"PK\x03\x04 half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"epoch": 2, "weights": torch.zeros(1000)}, path)
    monkeypatch.undo()

    previous = torch.load(path, weights_only=True)
    assert previous["epoch"] == 1 and torch.equal(previous["weights"], torch.ones(1000))


def test_a_completed_save_replaces_the_file_and_leaves_nothing_else(tmp_path):
    path = tmp_path / "last.ckpt"
    io = AtomicCheckpointIO()
    for epoch in (1, 2):
        io.save_checkpoint({"epoch": epoch}, path)
    assert torch.load(path, weights_only=True)["epoch"] == 2
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]


@pytest.mark.parametrize(
    ("plugins", "writer"),
    [
        ([], "AtomicCheckpointIO"),
        (["--trainer.plugins", "lightning.pytorch.plugins.environments.LightningEnvironment"], "AtomicCheckpointIO"),
        (["--trainer.plugins", "lightning.pytorch.plugins.TorchCheckpointIO"], "TorchCheckpointIO"),
    ],
    ids=["no plugins", "a cluster environment", "a checkpoint writer"],
)
def test_a_run_writes_its_checkpoints_atomically_unless_a_checkpoint_writer_is_given(
    data_dir, tmp_path, plugins, writer
):
    record = ("--trainer.callbacks+=tests.helpers.RecordCheckpointIO", "--trainer.callbacks.path", str(tmp_path / "io"))
    result = run_in_process("fit", *small_run(data_dir, tmp_path, *plugins, *record, "--trainer.max_steps", "1"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "io").read_text() == writer
