"""When something goes wrong in a DDP job (real gloo runs of train.py on CPU): a stop keeps the step it was at and
continues from the next sample, on the same or another number of processes; a process that stops answering is
named and the job ends; a full disk ends the run in one line with the last checkpoint intact."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.demos.boring_classes import BoringModel

from app.job.fault_guard import FaultGuard, StoppedBySignal
from tests.conftest import TRAIN_SIZE
from tests.helpers import SMALL_RUN, max_difference, run_command, run_in_process, run_train, scalars, small_run

pytestmark = pytest.mark.slow  # long multi-process runs: `make test-fast` leaves them out

VAL_SIZE = SMALL_RUN["--data.val_size"]  # 1000 training samples: 10 steps of a global batch of 100 per epoch
CHECKPOINTS = Path("SeqNet-mnist") / "version_0" / "checkpoints"
STALL_TIMEOUT = ("--fault_guard.stall_timeout", "5")  # the default is 60 s


def argv(data_dir: Path, root: Path, *args: str, **settings) -> list[str]:
    """Two processes, two epochs, deterministic, the stop check every 4 steps; `settings` as `small_run` takes them."""
    deterministic = ("--trainer.deterministic", "true", "--fault_guard.every_n_steps", "4")
    return small_run(data_dir, root, *deterministic, *args, **{"devices": 2, "max_epochs": 2, **settings})


def last_checkpoint(root: Path) -> dict:
    return torch.load(root / CHECKPOINTS / "last.ckpt", map_location="cpu", weights_only=True)


def samples_of_epoch(root: Path, epoch: int, ranks: int, suffix: str = "") -> list[int]:
    folder = root / "samples"
    return sum(
        (json.loads((folder / f"rank{rank}_epoch{epoch}{suffix}.json").read_text()) for rank in range(ranks)), []
    )


@pytest.fixture(scope="module")
def uninterrupted(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The last checkpoint of a 2-process run of 2 epochs that nothing stopped, its validation accuracy curve and its
    output. Started as `nohup python train.py` and hung up on after step 13, as a closed terminal does: a run that
    ignores SIGHUP, as `nohup` asks, trains on."""
    root = tmp_path_factory.mktemp("uninterrupted")
    hang_up = ("--trainer.callbacks+=tests.helpers.HangUpAfterStep", "--trainer.callbacks.step", "13")
    result = run_command(["nohup", sys.executable, "train.py", "fit", *argv(data_dir, root, *hang_up)], timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    return {**last_checkpoint(root), "val/acc": scalars(root / CHECKPOINTS.parent)["val/acc"], "output": output}


def test_a_run_under_nohup_trains_on_through_a_hang_up(uninterrupted):
    assert "Stopped" not in uninterrupted["output"] and "Traceback" not in uninterrupted["output"]
    assert uninterrupted["global_step"] == 20


# 1. A stop keeps the step it was at, and the run continues from the next sample

RECORD = "--trainer.callbacks+=tests.helpers.RecordTrainSamples"
WORKER = ("--data.num_workers", "1")


@pytest.fixture(scope="module")
def stopped(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A 2-process run that got SIGHUP after step 13, in every process, as a closed terminal or a dropped ssh session
    sends it: every rank stopped after step 16 (checks every 4 steps), in the middle of epoch 1, and saved it. Each
    test continues a copy of it; its folder and output.

    With one data-loading worker per process: the loader asks for batches ahead as soon as it is made, which on
    resume is before Lightning sets the continued epoch, so the position must bring its epoch along. The batches are
    those of the run without workers (`uninterrupted`)."""
    root = tmp_path_factory.mktemp("stopped")
    hang_up = ("--trainer.callbacks+=tests.helpers.HangUpAfterStep", "--trainer.callbacks.step", "13")
    result = run_train("fit", *argv(data_dir, root, RECORD, *WORKER, *hang_up))
    assert result.returncode == -signal.SIGHUP, result.stderr[-3000:]
    return root, result.stdout + result.stderr


def test_a_hang_up_stops_every_rank_at_one_step_saves_it_and_says_how_to_continue(stopped):
    root, output = stopped
    assert "Traceback" not in output
    assert "Stopped by SIGHUP (hang-up) in epoch 1, after step 16;" in output
    continuing = f"train.py fit --ckpt_path {root / CHECKPOINTS.parent} --devices 2"
    assert re.search(rf"holds that step; continue with: \S+ {re.escape(continuing)}$", output, re.MULTILINE), output
    assert last_checkpoint(root)["global_step"] == 16


def copy_of(stopped: tuple[Path, str], tmp_path: Path) -> Path:
    shutil.copytree(stopped[0], tmp_path, dirs_exist_ok=True)
    assert last_checkpoint(tmp_path)["global_step"] == 16
    return tmp_path


def test_a_stop_mid_epoch_continues_to_the_weights_of_a_run_never_stopped(data_dir, tmp_path, stopped, uninterrupted):
    root = copy_of(stopped, tmp_path)
    resumed = run_train("fit", *argv(data_dir, root, RECORD, *WORKER, "--ckpt_path", "last"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "dataloader is not resumable" not in resumed.stderr  # Lightning's warning for a mid-epoch checkpoint
    before, after = samples_of_epoch(root, 1, 2, "_stopped"), samples_of_epoch(root, 1, 2)
    assert (len(before), len(after)) == (600, 400)
    assert sorted(before + after) == list(range(TRAIN_SIZE - VAL_SIZE))  # every sample of epoch 1, once
    final = last_checkpoint(root)
    assert final["global_step"] == uninterrupted["global_step"] == 20
    assert max_difference(final["state_dict"], uninterrupted["state_dict"]) == 0  # exactly the same weights
    assert [path.name for path in (root / "SeqNet-mnist").iterdir()] == ["version_0"]  # continued in its folder
    assert scalars(root / CHECKPOINTS.parent)["val/acc"] == uninterrupted["val/acc"]  # one curve, as if never stopped


def test_a_stop_inside_an_accumulated_step_continues_to_the_weights_of_a_run_never_stopped(data_dir, tmp_path):
    """Plain SGD, 3 batches a step (10 batches an epoch: steps end after batches 3, 6, 9 and 10), a check after
    every step, SIGTERM to rank 1 after the fifth batch, inside the second step: the stop waits for that step, whose
    gradients a checkpoint could not hold. The run never stopped is one process with the same global batch."""
    sgd = ("--model.optimizer", "torch.optim.SGD", "--model.optimizer.lr", "0.1", "--model.one_cycle", "false")
    accumulate = ("--trainer.accumulate_grad_batches", "3", "--fault_guard.every_n_steps", "1", *sgd)
    one_process = {"devices": 1, "batch_size": 100, "max_epochs": 1}  # the same global batch, in this process
    never_stopped = run_in_process("fit", *argv(data_dir, tmp_path / "never", *accumulate, **one_process))
    assert never_stopped.returncode == 0, never_stopped.stderr[-3000:]
    sigterm = ("--trainer.callbacks+=tests.helpers.SigtermMidWindow", "--trainer.callbacks.epoch", "0")
    stopped = run_train("fit", *argv(data_dir, tmp_path / "stopped", *accumulate, *sigterm, max_epochs=1))
    assert stopped.returncode == -signal.SIGTERM, stopped.stderr[-3000:]
    assert "Stopped by SIGTERM in epoch 0, after step 2;" in stopped.stdout + stopped.stderr  # not after batch 5
    resumed = run_train("fit", *argv(data_dir, tmp_path / "stopped", *accumulate, "--ckpt_path", "last", max_epochs=1))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    final, expected = last_checkpoint(tmp_path / "stopped"), last_checkpoint(tmp_path / "never")
    assert final["global_step"] == expected["global_step"] == 4
    assert max_difference(final["state_dict"], expected["state_dict"]) < 1e-4


def test_sigterm_while_the_other_rank_waits_in_a_collective_stops_both_at_the_epoch_end(data_dir, tmp_path):
    """Lightning's own handler broadcasts from inside the signal handler; here it met the other rank's metric sync
    and both waited for each other until the 30-minute timeout (so this run would outlast `timeout`)."""
    instrument = "--trainer.callbacks+=tests.helpers.SigtermWhileOthersWait"
    result = run_train("fit", *argv(data_dir, tmp_path, instrument), "--trainer.max_epochs", "3", timeout=120)
    assert result.returncode == -signal.SIGTERM, result.stderr[-3000:]
    assert "Stopped by SIGTERM in epoch 0, at its end;" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert last_checkpoint(tmp_path)["global_step"] == 10  # saved at the end of the epoch, before stopping
    # and the epoch's best by val/acc, which Lightning would have saved after the hook that stopped the run
    assert sorted(path.name for path in (tmp_path / CHECKPOINTS).iterdir()) == ["epoch=0-step=10.ckpt", "last.ckpt"]


def test_a_stop_due_at_an_epochs_last_step_waits_for_its_validation(data_dir, tmp_path):
    """The check after the epoch's last step stopped the run before the epoch's validation: its checkpoint counted
    the epoch as done, and the continued run never validated it (nor saved its best checkpoint)."""
    sigterm = ("--trainer.callbacks+=tests.helpers.SigtermAfterStep", "--trainer.callbacks.step", "13")
    result = run_train("fit", *argv(data_dir, tmp_path, *sigterm, "--fault_guard.every_n_steps", "10", devices=1))
    assert result.returncode == -signal.SIGTERM, result.stderr[-3000:]  # 20 steps an epoch on one process
    assert "Stopped by SIGTERM in epoch 0, at its end;" in result.stdout + result.stderr
    assert sorted(path.name for path in (tmp_path / CHECKPOINTS).iterdir()) == ["epoch=0-step=20.ckpt", "last.ckpt"]


def test_a_stopped_run_continues_on_another_number_of_processes_with_the_same_global_batch(
    data_dir, tmp_path, stopped, uninterrupted
):
    """On one process, which runs in this one (`run_in_process`); on more, by a node that joins an elastic job
    (tests/test_elastic.py)."""
    root = copy_of(stopped, tmp_path)
    resumed = run_in_process("fit", *argv(data_dir, root, RECORD, "--ckpt_path", "last", devices=1))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    output = resumed.stdout + resumed.stderr
    assert "Continuing a run of 2 processes on 1: per-device batch 50 -> 100" in output
    assert "Global batch 100 = 100 per device x 1 processes" in output
    before, after = samples_of_epoch(root, 1, 2, "_stopped"), samples_of_epoch(root, 1, 1)
    assert sorted(before + after) == list(range(TRAIN_SIZE - VAL_SIZE))  # the rest of epoch 1, each sample once
    final = last_checkpoint(root)
    assert final["global_step"] == 20
    assert (
        max_difference(final["state_dict"], uninterrupted["state_dict"]) < 1e-5
    )  # float rounding of another number of processes


def test_a_global_batch_that_the_new_processes_cannot_share_ends_in_one_line(data_dir, tmp_path, stopped):
    root = copy_of(stopped, tmp_path)
    resumed = run_train("fit", *argv(data_dir, root, "--ckpt_path", "last", devices=3))
    assert resumed.returncode == 1
    lines = [line for line in resumed.stderr.splitlines() if line.startswith("error")]
    assert len(lines) == 1, (
        resumed.stderr
    )  # every rank meets it; the first to get there speaks (app/command_line/speaking.py)
    assert re.match(r"error( \(rank \d\))?: the checkpoint's run took global batches of 100 samples", lines[0])
    assert "continue it on 1, 2, 4, 5" in lines[0] and "Traceback" not in resumed.stderr


def test_a_checkpoint_every_few_minutes_lets_a_killed_run_continue_exactly(data_dir, tmp_path, uninterrupted):
    """With `--timed_checkpoint.train_time_interval 0:00:00`, last.ckpt is written after every step; rank 0 is
    SIGKILLed (no handler runs) at a batch of epoch 1, and the run continues from the step before."""
    every_step = ("--timed_checkpoint.train_time_interval", "0:00:00")
    kill = ("--trainer.callbacks+=tests.helpers.KillRankOnce", "--trainer.callbacks.rank", "0")
    killed = run_train("fit", *argv(data_dir, tmp_path, *every_step, *kill))
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert last_checkpoint(tmp_path)["global_step"] == 12  # epoch 1's second step, the last one finished

    resumed = run_train("fit", *argv(data_dir, tmp_path, *every_step, "--ckpt_path", "last"))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert max_difference(last_checkpoint(tmp_path)["state_dict"], uninterrupted["state_dict"]) == 0


# 2. The disk fills up


@pytest.fixture
def small_disk(tmp_path: Path):
    """A 3 MB file system (tmpfs) where the tests run as root, or None: one checkpoint fits, not two."""
    folder = tmp_path / "small_disk"
    folder.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        yield None
        return
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(folder)], capture_output=True)
    if mounted.returncode != 0:
        yield None
        return
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)])


def test_a_full_disk_ends_the_run_in_one_line_and_keeps_the_last_checkpoint(data_dir, tmp_path, small_disk):
    if small_disk is not None:
        folder, fill = small_disk, ()
    else:  # simulated: every flush to the disk fails with ENOSPC after epoch 0
        folder, fill = tmp_path / "checkpoints", ("--trainer.callbacks+=tests.helpers.NoSpaceAfterEpoch",)
    args = argv(data_dir, tmp_path, "--last_checkpoint.dirpath", str(folder), *fill, devices=1, batch_size=100)
    result = run_train("fit", *args, "--trainer.max_epochs", "3")
    assert result.returncode == 1, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert lines[0].startswith(f"error: cannot save the checkpoint last.ckpt: no space left in {folder}")
    assert f" train.py fit --ckpt_path {tmp_path / 'SeqNet-mnist' / 'version_0'} (" in lines[0]  # the run
    assert sorted(path.name for path in folder.iterdir()) == ["last.ckpt"]  # no partial file left behind
    assert torch.load(folder / "last.ckpt", weights_only=True)["global_step"] == 10  # epoch 0's, intact

    # A save that a SIGKILL or a power cut interrupted leaves a partial file; the next run removes it.
    (folder / ".last.ckpt.partial").write_bytes(b"the first bytes of a checkpoint")
    resumed = run_in_process("fit", *args[: -len(fill) or None], "--ckpt_path", "last", "--trainer.max_epochs", "1")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert sorted(path.name for path in folder.iterdir()) == ["last.ckpt"]


def test_a_fault_guard_in_a_trainer_of_ones_own_stops_at_its_check_and_leaves_the_handlers_as_they_were(tmp_path):
    """Without train.py's command, which catches the stop signals from the meeting to its end (`catch_stop_signals`),
    the guard catches them for the stage alone: recorded, acted on at the check, and the handlers put back."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

    class SigtermAfterTheFirstStep(Callback):
        def on_train_batch_end(self, trainer: Trainer, *args) -> None:
            if trainer.global_step == 1:
                assert callable(signal.getsignal(signal.SIGTERM))  # else its default action would end pytest
                signal.raise_signal(signal.SIGTERM)

    trainer = Trainer(
        accelerator="cpu", devices=1, max_steps=6, limit_val_batches=0, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
        callbacks=[SigtermAfterTheFirstStep(), FaultGuard(every_n_steps=2)],
    )  # fmt: skip
    with pytest.raises(StoppedBySignal):
        trainer.fit(BoringModel())
    assert trainer.global_step == 2  # recorded after step 1, acted on at the check after step 2
    assert {signum: signal.getsignal(signum) for signum in before} == before
