"""benchmarks/plain_ddp.py, the plain PyTorch DDP program every benchmark compares train.py with, computes what
train.py computes: the same seed, data, sampler shares, model, optimizer and schedule give the same weights, bit for
bit. So Lightning's DDP is the one the tutorial writes by hand, and the benchmarks compare the cost of one program
against the other, not two trainings."""

import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from tests.helpers import run_command, run_train

# 1000 training images of the synthetic 1200 (200 held out), 50 per batch on each of 2 processes: 10 steps an epoch
STEPS, EPOCHS, BATCH, VAL_SIZE = 50, 5, 50, 200


@pytest.mark.slow  # two jobs of 2 processes: `make test-fast` leaves it out
def test_the_plain_ddp_loop_trains_the_weights_train_py_trains(data_dir, tmp_path):
    """ConvNet (its BatchNorm buffers, which DDP broadcasts, and channels_last convolutions besides what SeqNet has),
    50 steps over 5 epochs, so that the sampler's `set_epoch` and the one-cycle schedule count; the two commands run
    at once, to share the cores' wait for the imports."""
    common = ["--data.dataset", "mnist", "--data.data_dir", str(data_dir), "--data.val_size", str(VAL_SIZE)]
    train_py = [
        *("fit", "--model", "ConvNet", *common, "--data.batch_size", str(BATCH), "--trainer.max_epochs", str(EPOCHS)),
        *("--devices", "2", "--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false"),
        *("--trainer.default_root_dir", str(tmp_path / "runs")),
    ]
    plain = [
        *(sys.executable, "benchmarks/plain_ddp.py", "--model", "ConvNet", "--dataset", "mnist"),
        *("--data-dir", str(data_dir), "--val-size", str(VAL_SIZE), "--batch-size", str(BATCH)),
        *("--epochs", str(EPOCHS), "--processes", "2", "--accelerator", "cpu", "--save", str(tmp_path / "plain.pt")),
    ]
    with ThreadPoolExecutor(2) as pool:
        lightning_run, plain_run = pool.submit(run_train, *train_py, timeout=120), pool.submit(run_command, plain, 120)
        lightning_run, plain_run = lightning_run.result(), plain_run.result()
    assert lightning_run.returncode == 0, (
        lightning_run.returncode,
        lightning_run.stdout[-2000:],
        lightning_run.stderr[-3000:],
    )
    assert plain_run.returncode == 0, plain_run.stderr[-3000:]
    assert "Finished: test/acc" in plain_run.stdout, plain_run.stdout

    (checkpoint,) = (tmp_path / "runs").glob("ConvNet-mnist/version_0/checkpoints/last.ckpt")
    saved = torch.load(checkpoint, map_location="cpu", weights_only=True)
    assert saved["global_step"] == STEPS
    lightning, plain = saved["state_dict"], torch.load(tmp_path / "plain.pt", map_location="cpu", weights_only=True)
    assert lightning.keys() == plain.keys()
    differences = {name: (lightning[name].double() - plain[name].double()).abs().max().item() for name in lightning}
    unequal = {
        name: difference for name, difference in differences.items() if not torch.equal(lightning[name], plain[name])
    }
    assert not unequal, (
        f"{len(unequal)} of {len(differences)} tensors differ, by at most {max(unequal.values())}: {unequal}"
    )
