"""A stopped run continues exactly: every sample once per epoch, and the weights of a run never stopped, also on
another number of processes (the global batch kept) and inside a step that accumulates gradients; and a run extended
by epochs plans its one-cycle schedule again. Jobs of processes the test starts itself, as Lightning's launcher
starts them, each running train.py's `main`."""

import json
import signal
from pathlib import Path

import pytest
import torch

from tests.helpers import ended, job, max_difference, scalars, small_run

pytestmark = pytest.mark.slow

LAST = Path("SeqNet-mnist") / "version_0" / "checkpoints" / "last.ckpt"
RECORD = "--trainer.callbacks+=tests.instruments.RecordTrainSamples"


def _train(rank: int, args: list[str]) -> None:
    from train import main  # noqa: PLC0415

    main(args)


def train(data_dir: Path, root: Path, processes: int, *more: str, batch_size: int = 50) -> list[int]:
    """Two epochs of 20 batches of 50 a process (or `batch_size`), deterministic, checked every 2 steps."""
    args = small_run(
        data_dir,
        root,
        "--trainer.deterministic",
        "true",
        "--stop.every_n_steps",
        "2",
        RECORD,
        *more,
        devices=processes,
        max_epochs=2,
        batch_size=batch_size,
    )
    return ended(job(_train, processes, args, folder=root))


def final(root: Path) -> dict:
    return torch.load(root / LAST, map_location="cpu", weights_only=True)


def samples(root: Path, epoch: int, processes: int) -> list[int]:
    """Every sample the processes were given in `epoch`, over a stop and its continuation."""
    seen = []
    for path in sorted((root / "samples").glob(f"rank*_epoch{epoch}*.json")):
        seen += json.loads(path.read_text())
    return sorted(seen)


@pytest.fixture(scope="module")
def uninterrupted(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("uninterrupted")
    assert train(data_dir, root, 2) == [0, 0]
    return final(root)["state_dict"]


@pytest.mark.parametrize("processes_after", [2, 1, 4])
def test_a_stop_mid_epoch_continues_to_the_weights_of_a_run_never_stopped(
    data_dir, tmp_path, uninterrupted, processes_after
):
    stop = (
        "--trainer.callbacks+=tests.instruments.SignalAt",
        "--trainer.callbacks.rank",
        "1",
        "--trainer.callbacks.step",
        "15",
    )
    assert train(data_dir, tmp_path, 2, *stop) == [-signal.SIGTERM] * 2
    assert final(tmp_path)["global_step"] == 16  # the next check, in epoch 1 (10 steps an epoch)
    said = (tmp_path / "rank0.log").read_text()
    assert f"Stopped by SIGTERM in epoch 1, after step 16; {tmp_path / LAST} holds that step." in said
    assert f"--ckpt_path {tmp_path / LAST.parents[1]} --devices 2" in said  # how to continue
    batch = 100 // processes_after  # the global batch of 100 kept
    assert train(data_dir, tmp_path, processes_after, "--ckpt_path", "last", batch_size=batch) == [0] * processes_after
    assert final(tmp_path)["global_step"] == 20  # the continued run, in the same folder
    assert max_difference(final(tmp_path)["state_dict"], uninterrupted) < 1e-5
    assert samples(tmp_path, 1, 2) == list(range(1000))  # every sample once, over the stop
    assert len(scalars(tmp_path / LAST.parents[1])["val/acc"]) == 2  # one curve over both commands


def test_a_stop_inside_an_accumulated_step_continues_from_the_steps_start(data_dir, tmp_path, uninterrupted):
    """Two batches of 25 a step: the signal comes after the first of a step's two; the check comes at a step's end."""
    accumulate = ("--trainer.accumulate_grad_batches", "2")
    stop = ("--trainer.callbacks+=tests.instruments.SignalAt", "--trainer.callbacks.step", "13")
    assert train(data_dir, tmp_path, 2, *accumulate, *stop, batch_size=25) == [-signal.SIGTERM] * 2
    assert final(tmp_path)["global_step"] == 14
    assert train(data_dir, tmp_path, 2, *accumulate, "--ckpt_path", "last", batch_size=25) == [0, 0]
    assert max_difference(final(tmp_path)["state_dict"], uninterrupted) < 1e-5
    assert samples(tmp_path, 1, 2) == list(range(1000))


@pytest.mark.parametrize(("batch", "accumulate", "step"), [(15, 1, 15), (27, 2, 14), (10, 1, 10)])
def test_a_run_stopped_by_its_time_budget_mid_epoch_continues_from_the_next_sample(
    data_dir, tmp_path, uninterrupted, batch, accumulate, step
):
    """A chain of jobs: each link trains for --trainer.max_time, then the same command continues with a budget of its
    own (not what is left of the first, which is spent). The budget spent inside an accumulated step (batch 27 of 2
    a step) stops at the step's end; at an epoch's last step, the validation and its best checkpoint follow."""
    budget = ("--trainer.max_time", "00:00:00:04", "--trainer.accumulate_grad_batches", str(accumulate))
    spent = ("--trainer.callbacks+=tests.instruments.BudgetSpentAt", "--trainer.callbacks.batch", str(batch))
    assert train(data_dir, tmp_path, 2, *budget, *spent, batch_size=50 // accumulate) == [0, 0]
    assert final(tmp_path)["global_step"] == step  # mid-epoch 1 (10 steps an epoch)
    said = (tmp_path / "rank0.log").read_text()
    ends = f"ends the fit in epoch {(step - 1) // 10}, after step {step}; {tmp_path / LAST} holds"
    assert f"The time budget (max_time) {ends}" in said
    assert "Finished: test/acc" in said  # the test of the best checkpoint follows, as after any fit
    kept = final(tmp_path)["callbacks"]  # what the checkpoints kept after that step: the fit's last validation's
    assert not [key for key in kept if key.startswith("Timer")]  # the next link's budget is its own
    (best,) = [state for key, state in kept.items() if key.startswith("ModelCheckpoint{'monitor': 'val/acc'")]
    assert sorted(best["best_k_models"]) == sorted(str(p) for p in (tmp_path / LAST).parent.glob("epoch*.ckpt"))
    assert best["best_model_path"] in best["best_k_models"]
    assert train(data_dir, tmp_path, 2, *budget, "--ckpt_path", "last", batch_size=50 // accumulate) == [0, 0]
    assert final(tmp_path)["global_step"] == 20
    assert max_difference(final(tmp_path)["state_dict"], uninterrupted) < 1e-5
    assert samples(tmp_path, 1, 2) == list(range(1000))  # every sample of the epoch it stopped in, once


def test_a_finished_run_extended_by_epochs_plans_its_one_cycle_schedule_again(data_dir, tmp_path):
    assert train(data_dir, tmp_path, 1) == [0]
    assert train(data_dir, tmp_path, 1, "--ckpt_path", "last", "--trainer.max_epochs", "3") == [0]
    said = (tmp_path / "rank0.log").read_text()
    assert f"--ckpt_path last: continuing {tmp_path / LAST.parents[1]}, from checkpoints/last.ckpt (step 40" in said
    assert (
        "Continuing at step 40: the one-cycle schedule is planned over 60 steps, peaking at learning rate 0.01." in said
    )
    assert final(tmp_path)["global_step"] == 60
    assert (
        final(tmp_path)["optimizer_states"][0]["param_groups"][0]["lr"] < 1e-4
    )  # the cycle ends with the run (peak 0.01)
