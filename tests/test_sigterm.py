"""SIGTERM under DDP (`kill`, `docker stop`, SLURM's time limit, torchrun stopping): every process stops at the
same step with exit status 143, within a bounded time, and the run continues with `--ckpt_path last`."""

import json
import signal
from pathlib import Path

import torch

from tests.conftest import TRAIN_SIZE
from tests.helpers import run_train

VAL_SIZE = 200  # 1000 training samples: 10 steps per epoch with 2 processes of 50
STOPPED = 128 + signal.SIGTERM


def two_process_run(data_dir: Path, root: Path) -> tuple[str, ...]:
    return (
        *("--model", "SeqNet", "--data.dataset", "mnist", "--data.data_dir", str(data_dir)),
        *("--data.val_size", str(VAL_SIZE), "--data.batch_size", "50", "--trainer.max_epochs", "3"),
        *("--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false", "--devices", "2"),
        *("--trainer.default_root_dir", str(root)),
    )


def saved_step(root: Path) -> int:
    last = root / "SeqNet-mnist" / "version_0" / "checkpoints" / "last.ckpt"
    return torch.load(last, map_location="cpu", weights_only=True)["global_step"]


def test_sigterm_while_the_other_rank_waits_in_a_collective_stops_both_at_the_epoch_end(data_dir, tmp_path):
    """Lightning's own handler broadcasts from inside the signal handler; here it met the other rank's metric sync
    and both waited for each other until the 30-minute timeout (so this run would outlast `timeout`)."""
    run = run_train(
        *two_process_run(data_dir, tmp_path), "--trainer.callbacks+=tests.helpers.SigtermWhileOthersWait", timeout=120
    )
    assert run.returncode == STOPPED, run.stderr[-3000:]
    assert "Stopped by SIGTERM in epoch 0, at its end;" in run.stdout + run.stderr
    assert "Traceback" not in run.stderr
    assert saved_step(tmp_path) == 10  # saved at the end of the epoch, before stopping


def test_sigterm_to_one_rank_stops_every_rank_and_the_run_continues_from_the_last_finished_epoch(data_dir, tmp_path):
    """Rank 1 alone is signalled after step 13; both stop after step 16 (checks every 4 steps). The checkpoint of
    epoch 0 stays the last one, and the continued run gives epoch 1 every training sample exactly once."""
    argv = (*two_process_run(data_dir, tmp_path), "--sigterm_check.every_n_steps", "4")
    signalled = ("--trainer.callbacks+=tests.helpers.SigtermAfterStep", "--trainer.callbacks.rank", "1")
    run = run_train(*argv, *signalled, "--trainer.callbacks.step", "13", timeout=120)
    assert run.returncode == STOPPED, run.stderr[-3000:]
    assert "Stopped by SIGTERM in epoch 1, after step 16;" in run.stdout + run.stderr
    assert "holds the last finished epoch: continue with --ckpt_path last" in run.stdout + run.stderr
    assert saved_step(tmp_path) == 10

    resumed = run_train(*argv, "--ckpt_path", "last", "--trainer.callbacks+=tests.helpers.RecordTrainSamples")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Finished: test/acc" in resumed.stdout + resumed.stderr
    assert "dataloader is not resumable" not in resumed.stderr  # Lightning's warning for a mid-epoch checkpoint
    shards = [json.loads((tmp_path / "samples" / f"rank{rank}_epoch1.json").read_text()) for rank in (0, 1)]
    assert sorted(shards[0] + shards[1]) == list(range(TRAIN_SIZE - VAL_SIZE))
    assert saved_step(tmp_path) == 30
