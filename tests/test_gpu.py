"""On a GPU, with the process group on NCCL (skipped on a machine without an NVIDIA GPU, as CI is): a stop mid-epoch
continues to the weights of a run never stopped, a bug is one short traceback, ConvNet in channels_last trains
without DDP's warning about gradient strides, and `--model.cuda_graph` trains to the weights of the usual step.

One process on the one GPU: NCCL refuses two ranks on one device, so the cases of several processes run on the CPU
with gloo (test_graceful_stop.py, test_stall_watchdog.py, test_continuation.py), on a GPU machine too."""

import re
import shutil
import signal
from pathlib import Path

import pytest
import torch

from tests.helpers import max_difference, run_train, small_run

pytestmark = [
    pytest.mark.slow,
    # Without asking torch, which would load the GPU driver into this process on every machine that collects it.
    pytest.mark.skipif(shutil.which("nvidia-smi") is None, reason="needs an NVIDIA GPU"),
]

LAST = Path("SeqNet-mnist") / "version_0" / "checkpoints" / "last.ckpt"


def on_the_gpu(data_dir: Path, root: Path, *args: str) -> list[str]:
    """One process on the GPU, two epochs of 20 steps, deterministic, the stop check every 4 steps."""
    deterministic = ("--trainer.deterministic", "true", "--stop.every_n_steps", "4")
    return small_run(data_dir, root, *deterministic, *args, devices=1, accelerator="gpu", max_epochs=2)


def test_on_the_gpu_a_stop_mid_epoch_continues_to_the_weights_of_a_run_never_stopped(data_dir, tmp_path):
    uninterrupted = run_train("fit", *on_the_gpu(data_dir, tmp_path / "uninterrupted"))
    assert uninterrupted.returncode == 0, uninterrupted.stderr[-3000:]
    assert "GPU available: True (cuda), used: True" in uninterrupted.stdout + uninterrupted.stderr

    root = tmp_path / "stopped"
    sigterm = ("--trainer.callbacks+=tests.instruments.SignalAt", "--trainer.callbacks.step", "13")
    stopped = run_train("fit", *on_the_gpu(data_dir, root, *sigterm))
    assert stopped.returncode == -signal.SIGTERM, stopped.stderr[-3000:]
    assert re.search(r"Stopped by SIGTERM in epoch 0, after step 16;", stopped.stdout + stopped.stderr)
    resumed = run_train("fit", *on_the_gpu(data_dir, root, "--ckpt_path", "last"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]

    final, expected = (
        torch.load(r / LAST, map_location="cpu", weights_only=True) for r in (root, tmp_path / "uninterrupted")
    )
    assert final["global_step"] == expected["global_step"] == 40
    assert max_difference(final["state_dict"], expected["state_dict"]) == 0


def test_on_the_gpu_a_bug_is_one_short_traceback(data_dir, tmp_path):
    result = run_train("fit", *on_the_gpu(data_dir, tmp_path, "--trainer.callbacks+=tests.test_cli.Bug"))
    assert result.returncode == 1 and result.stderr.count("error: an unexpected ZeroDivisionError") == 1


def test_on_the_gpu_convnet_in_channels_last_trains_without_a_warning_from_ddp(data_dir, tmp_path):
    """cuDNN gives the first convolution's weight gradient plain strides; the weight keeps them on a GPU, so that DDP's
    bucket view matches (models/base.py)."""
    convnet = small_run(data_dir, tmp_path, "--trainer.max_steps", "3", model="ConvNet", devices=1, accelerator="gpu")
    result = run_train("fit", *convnet)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Grad strides do not match bucket view strides" not in result.stderr


def test_on_the_gpu_a_cuda_graph_trains_to_the_weights_of_the_usual_step(data_dir, tmp_path, monkeypatch):
    """The forward and backward replayed as graphs, at each full batch, give the weights and BatchNorm's statistics
    of the step run kernel by kernel; each epoch's short last batch (1000 images, batches of 64) runs without them."""
    from lightning.pytorch import Trainer, seed_everything

    from datamodules import MNISTDataModule
    from models import ConvNet

    replays = 0
    replay = torch.cuda.CUDAGraph.replay

    def counted(graph: torch.cuda.CUDAGraph) -> None:
        nonlocal replays
        replays += 1
        replay(graph)

    monkeypatch.setattr(torch.cuda.CUDAGraph, "replay", counted)

    def fit(cuda_graph: bool) -> dict[str, torch.Tensor]:
        seed_everything(0)
        model = ConvNet(cuda_graph=cuda_graph)
        data = MNISTDataModule(dataset="mnist", data_dir=str(data_dir), val_size=200, batch_size=64, on_device=True)
        quiet = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
        trainer = Trainer(accelerator="gpu", devices=1, max_epochs=2, deterministic="warn", **quiet)
        trainer.fit(model, datamodule=data)
        return {name: tensor.cpu() for name, tensor in model.state_dict().items()}

    usual = fit(cuda_graph=False)
    assert replays == 0
    graphed = fit(cuda_graph=True)
    assert replays == 2 * 15 * 2  # forward and backward, 15 full batches an epoch, 2 epochs
    assert max_difference(graphed, usual) < 1e-3
