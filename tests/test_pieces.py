"""The pieces of app/ in Trainers of one's own, with a module and data that are not the project's (Lightning's
`demos.boring_classes`): the README's script ended by SIGTERM, and every piece in one job of two gloo processes."""

import csv
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

from app.callbacks import Dashboard, GracefulStop, PredictionWriter, StallWatchdog
from app.plugins import AtomicCheckpointIO, RendezvousDDPStrategy
from app.runs import RunLogger
from tests.helpers import NO_NETWORK, REPO, ended, job, left_behind, scalars, wait_for

pytestmark = pytest.mark.slow


def test_the_readmes_own_trainer_stops_at_one_step_by_sigterm_without_a_traceback(tmp_path):
    readme = (REPO / "README.md").read_text()
    pieces = readme[readme.index("## The pieces, in your own Lightning program") :]
    (tmp_path / "my_run.py").write_text(re.findall(r"```python\n(.*?)```", pieces, re.DOTALL)[0])
    env = {**os.environ, **NO_NETWORK, "PYTHONUNBUFFERED": "1"}
    script = subprocess.Popen(
        [sys.executable, "my_run.py"], cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    last = tmp_path / "checkpoints" / "last.ckpt"
    try:
        wait_for(last.is_file, 120, "the first epoch's last.ckpt")  # training is under way on both processes
        script.send_signal(signal.SIGTERM)
        stdout, stderr = script.communicate(timeout=120)
        assert left_behind(script.pid) == ""
    finally:
        os.killpg(script.pid, signal.SIGKILL)
    assert script.returncode == 128 + signal.SIGTERM and "Traceback" not in stderr, stderr[-3000:]
    (stopped,) = re.findall(r"Stopped by SIGTERM in epoch (\d+), (after step \d+|at its end); (.*) holds that", stderr)
    saved = torch.load(last, weights_only=True)  # (a signal in the epoch's last steps: the stop at its end)
    step = f"after step {saved['global_step']}" if stopped[1] != "at its end" else stopped[1]
    assert Path(tmp_path, stopped[2]) == last and stopped[1] == step and saved["epoch"] == int(stopped[0])


class Predicted(BoringModel):
    """Lightning's BoringModel, whose `predict_step` gives each input's two outputs and their sum."""

    def predict_step(self, batch, batch_idx):
        out = self(batch)
        return {"output": out, "total": out.sum(dim=1)}


def _every_piece(rank: int, folder: Path) -> None:
    last = ModelCheckpoint(filename="last", enable_version_counter=False)
    trainer = Trainer(
        accelerator="cpu", devices=2, strategy=RendezvousDDPStrategy(agree_on={"seed": 1}), max_epochs=2,
        logger=RunLogger(folder, "boring"), log_every_n_steps=4, enable_progress_bar=False,
        plugins=[AtomicCheckpointIO()],
        callbacks=[last, GracefulStop(checkpoint=last), StallWatchdog(timeout=30), Dashboard()],
    )  # fmt: skip
    trainer.fit(Predicted(), datamodule=BoringDataModule())
    writer = PredictionWriter(str(folder / "predictions.csv"))
    Trainer(accelerator="cpu", devices=2, strategy=RendezvousDDPStrategy(), logger=False, callbacks=[writer]).predict(
        Predicted(), datamodule=BoringDataModule(), return_predictions=False
    )


def test_every_piece_serves_lightnings_boring_model_and_data_in_two_processes(tmp_path):
    assert ended(job(_every_piece, 2, tmp_path, folder=tmp_path)) == [0, 0], (tmp_path / "rank0.log").read_text()
    run = tmp_path / "boring" / "version_0"  # RunLogger's folder, global rank 0's
    assert sorted(p.name for p in (tmp_path / "boring").iterdir()) == ["version_0"]
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 2 * 32  # 64 a process
    assert {"workload/samples_per_s", "workload/step_ms"} <= set(scalars(run))  # the Dashboard's speed
    with (tmp_path / "predictions.csv").open(newline="") as rows:
        table = list(csv.reader(rows))
    assert table[0] == ["index", "output_0", "output_1", "total"] and len(table) == 1 + 64  # every input, once
    assert [int(row[0]) for row in table[1:]] == list(range(64))
    assert all(abs(float(row[1]) + float(row[2]) - float(row[3])) < 1e-5 for row in table[1:])


class Sealed:
    """A batch no library can tell the size of (a custom type, which Lightning passes to the step as it is)."""

    def __init__(self, x: torch.Tensor) -> None:
        self.x = x


class SealedBatches(BoringModel):
    def training_step(self, batch: Sealed, batch_idx: int):
        return super().training_step(batch.x, batch_idx)

    def train_dataloader(self):
        return torch.utils.data.DataLoader([Sealed(torch.randn(2, 32)) for _ in range(4)], batch_size=None)


def test_a_piece_off_by_its_own_argument_does_nothing_in_ones_own_trainer(tmp_path):
    """Off is absent in anyone's Trainer too, not only where train.py leaves an off piece out: no hook reads the
    batches, no handler is put in."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    off = [Dashboard(every_n_steps=0), GracefulStop(every_n_steps=0), StallWatchdog(timeout=0)]
    trainer = Trainer(
        accelerator="cpu",
        max_steps=4,
        limit_val_batches=0,
        logger=False,
        callbacks=off,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(SealedBatches())
    assert trainer.global_step == 4 and {signum: signal.getsignal(signum) for signum in before} == before
