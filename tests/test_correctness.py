"""Correct numbers under DDP, checked with real multi-process gloo runs of train.py on CPU.

- Evaluation counts every held-out sample exactly once, for any number of processes.
- N processes with per-device batch b train the same weights as one process with batch N*b on the same samples,
  except where BatchNorm normalises each rank's share with its own statistics (SyncBatchNorm, GPU only, fixes it).
- The same seed and configuration give identical results.
"""

import shutil
import signal
from pathlib import Path

import pytest
import torch

from app.main import main
from tests.helpers import ends_in_error, max_difference, run_in_process, run_train, scalars

pytestmark = pytest.mark.slow  # long multi-process runs: `make test-fast` leaves them out

# One epoch of 1,000 training images (1,200 minus 200 for validation): 10 optimizer steps of 100 samples.
COMMON = (
    *("fit", "--data.dataset", "mnist", "--data.val_size", "200", "--trainer.max_epochs", "1"),
    *("--trainer.accelerator", "cpu", "--trainer.deterministic", "true", "--trainer.enable_progress_bar", "false"),
    *("--model.optimizer", "SGD", "--model.optimizer.lr", "0.05", "--model.optimizer.momentum", "0.9"),
)
TOLERANCE = 1e-5  # float32 rounding of the gradient all-reduce and of summed BatchNorm statistics


@pytest.fixture(scope="module")
def train(data_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """Train one epoch with `train.py` (model, devices, per-device batch size, more options) and return the final
    weights and TensorBoard scalars; each configuration runs once per module."""
    done: dict[tuple[str, ...], dict[str, torch.Tensor]] = {}

    def run(model: str, devices: int, batch_size: int, *extra: str, repeat: int = 0) -> dict[str, torch.Tensor]:
        key = (model, str(devices), str(batch_size), *extra, str(repeat))
        if key not in done:
            root = tmp_path_factory.mktemp("fit")
            one_process = devices == 1 and "--data.num_workers" not in extra  # runs in this one
            runner = run_in_process if one_process else run_train
            result = runner(
                *COMMON,
                *("--model", model, "--data.data_dir", str(data_dir), "--data.batch_size", str(batch_size)),
                *("--devices", str(devices), "--trainer.default_root_dir", str(root), *extra),
            )
            assert result.returncode == 0, result.stderr[-3000:]
            (run_dir,) = root.glob(f"{model}-mnist/version_*")
            checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
            done[key] = {"weights": checkpoint["state_dict"], "scalars": scalars(run_dir)}
        return done[key]

    return run


def test_two_processes_train_the_same_seqnet_as_one_process_with_twice_the_batch(train):
    one = train("SeqNet", 1, 100)
    two = train("SeqNet", 2, 50)
    assert one["scalars"]["workload/global_batch_size"] == two["scalars"]["workload/global_batch_size"] == [100.0]
    assert max_difference(one["weights"], two["weights"]) < TOLERANCE


# Reproducible with data-loading workers too (each seeded from the run's seed); shared by the ConvNet tests' runs.
WORKERS = ("--data.num_workers", "1", "--trainer.log_every_n_steps", "2")


def test_convnet_batchnorm_makes_two_processes_differ_from_one(train):
    one = train("ConvNet", 1, 100, *WORKERS)
    two = train("ConvNet", 2, 50, *WORKERS)
    # Each rank's BatchNorm normalises with the statistics of its own 50 samples: a different computation.
    assert max_difference(one["weights"], two["weights"]) > 100 * TOLERANCE


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="SyncBatchNorm needs a GPU per process (no CPU kernels)")
def test_sync_batchnorm_makes_the_convnet_match_one_process(train):
    gpu = ("--trainer.accelerator", "gpu", "--trainer.deterministic", "false")
    one = train("ConvNet", 1, 100, *gpu)
    synced = train("ConvNet", 2, 50, *gpu, "--trainer.sync_batchnorm", "true")
    # SyncBatchNorm uses the statistics of all 100 samples of the step, as the single process does.
    assert max_difference(one["weights"], synced["weights"]) < 1e-4  # GPU kernels round differently


def test_sync_batchnorm_on_cpu_is_refused_in_one_line():
    with ends_in_error() as said:
        main(["--trainer.accelerator", "cpu", "--trainer.sync_batchnorm", "true"])
    message = said.line
    assert message.startswith("error: ") and "sync_batchnorm" in message and "\n" not in message


def test_same_seed_and_config_give_identical_runs(train):
    first = train("ConvNet", 2, 50, *WORKERS)
    second = train("ConvNet", 2, 50, *WORKERS, repeat=1)
    assert max_difference(first["weights"], second["weights"]) == 0.0
    for tag in ("train/loss", "val/loss", "val/acc"):
        assert first["scalars"][tag] == second["scalars"][tag]
    one = train("ConvNet", 1, 100, *WORKERS)  # shared with the BatchNorm test
    reseeded = train("ConvNet", 1, 100, *WORKERS, "--seed_everything", "7")
    assert max_difference(one["weights"], reseeded["weights"]) > 100 * TOLERANCE


def test_a_run_killed_in_the_middle_of_an_epoch_resumes_from_its_checkpoint_and_finishes(data_dir, tmp_path):
    """A pre-empted job (a SLURM requeue, a spot instance) leaves a checkpoint written in the middle of an epoch; the
    restarted job resumes inside that epoch, where Lightning skips `on_train_epoch_start`."""
    argv = (*COMMON, "--data.data_dir", str(data_dir), "--data.batch_size", "50", "--trainer.max_epochs", "2")
    argv += ("--trainer.default_root_dir", str(tmp_path), "--trainer.log_every_n_steps", "2")
    killed = run_train(
        *argv, "--trainer.callbacks+=tests.helpers.CheckpointAndKillAtStep", "--trainer.callbacks.step", "7"
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    (run_dir,) = (tmp_path / "SeqNet-mnist").iterdir()
    last = run_dir / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 7  # of the first epoch's 20

    # Continued with 8 batches a step: Lightning steps after batches 8 and 16 of the epoch and after its last, 3 steps
    # (its one-cycle schedule was planned over 2 and failed at the last: "Tried to step 10 times").
    copy = tmp_path / "accumulated"
    shutil.copytree(tmp_path / "SeqNet-mnist", copy / "SeqNet-mnist")
    more = ("--trainer.default_root_dir", str(copy), "--trainer.accumulate_grad_batches", "8", "--ckpt_path", "last")
    accumulated = run_in_process(*argv, *more, "--trainer.max_epochs", "1")
    assert accumulated.returncode == 0, accumulated.stderr[-3000:]
    assert "x 8 accumulated; peak learning rate 0.05 (one-cycle); 3 optimizer steps per epoch, 10 in the run." in (
        accumulated.stdout
    )
    assert torch.load(copy / last.relative_to(tmp_path), weights_only=True)["global_step"] == 10

    resumed = run_in_process(*argv, "--ckpt_path", "last")  # one process: it runs in this one
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"--ckpt_path last: continuing {run_dir}, from checkpoints/last.ckpt (step 7, epoch 0)." in resumed.stderr
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 40
    assert len(scalars(run_dir)["workload/step_ms"]) >= 16  # the dashboard's speed, every 2 steps, after the resume too
