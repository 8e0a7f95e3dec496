"""The training loop reads no tensor back to the host between logging steps: on a GPU each such read (`.item()`,
`bool(tensor)`, `.cpu()`, ...) would wait for the device to finish, once per step."""

import json
import sys
from collections import Counter

import pytest
from lightning.pytorch import Callback
from lightning.pytorch.callbacks import ModelCheckpoint, ProgressBar

from app.command_line.train_cli import BATCH_HOOKS, PROGRESS_BAR_EVERY_N_STEPS, TrainCLI
from app.job.process_group import close_process_group
from app.run.predictions import PredictionWriter
from tests.count_host_reads import CALL, STEP
from tests.helpers import run_command, small_run

# The project's code that runs at every training step (benchmarks/host_step.py has what each costs); a new one, or
# work of the project's own that one of these calls, makes the test below fail until it is measured and added here.
PER_STEP_HOOKS = {
    "fault_guard.py:on_train_batch_end",  # the loss kept for the check every 50 steps
    "fault_guard.py:<lambda>",  # what stands for Lightning's SIGTERM broadcast before every step: nothing
    "dashboard.py:on_train_batch_end",  # the speed, measured on logging steps
    "global_batch.py:on_train_batch_start",  # the global batch line at the first step
    "replan.py:on_train_batch_start",  # a continued run's schedule, at its first step
    "folder.py:on_train_batch_start",  # the run has started: a stop now keeps its folder
}


def host_reads_of_a_fit(out_dir, argv: list[str], steps: int) -> dict[str, list[str]]:
    """Run `train.py fit ARGV` and return, for each rank, where each read of a tensor value happened, and which of
    the project's functions its main thread called in the first `steps` optimizer steps."""
    out_dir.mkdir()
    command = [sys.executable, "tests/count_host_reads.py", str(out_dir), "fit", *argv]
    run = run_command(command, timeout=240, env={"COUNT_CALLS_UNTIL_STEP": str(steps)})
    assert run.returncode == 0, run.stderr[-3000:]
    return {path.stem: json.loads(path.read_text()) for path in sorted(out_dir.glob("rank*.json"))}


@pytest.mark.slow  # a run of 2 processes: `make test-fast` leaves it out
@pytest.mark.timeout(600)
def test_training_steps_between_logging_steps_read_nothing_from_the_device(data_dir, tmp_path):
    """Under DDP, on every rank: reads at setup and teardown are fine; none in the steps between logging steps.

    Lightning itself reads a flag back before every step under DDP (whether rank 0 got SIGTERM); train.py's ranks
    compare theirs every `--fault_guard.every_n_steps` (50) steps and at the epoch's end: not in steps 6 to 15 here.
    """
    quiet = ("--trainer.limit_val_batches", "0", "--trainer.log_every_n_steps", "1000")
    argv = small_run(data_dir, tmp_path, *quiet, model="ConvNet", batch_size=10, devices=2)
    # one epoch is 50 steps on each of the 2 ranks: the run stays in the first epoch
    reads = host_reads_of_a_fit(tmp_path / "reads", [*argv, "--trainer.max_steps", "15"], steps=15)
    assert list(reads) == ["rank0", "rank1"]
    for rank, events in reads.items():
        steps = [index for index, event in enumerate(events) if event == STEP]
        assert len(steps) == 15, f"{rank}: {len(steps)} optimizer steps"
        between = [event for event in events[steps[4] : steps[14]] if event != STEP and not event.startswith(CALL)]
        assert not between, f"{rank}: reads in steps 6 to 15: {Counter(between).most_common(5)}"
        # The project's own per-step work: these hooks, once a step each, and nothing they call of the project's
        calls = Counter(event.removeprefix(CALL) for event in events[steps[4] : steps[14]] if event.startswith(CALL))
        assert set(calls) <= PER_STEP_HOOKS and max(calls.values()) <= 10, f"{rank}: {calls.most_common()}"


@pytest.mark.parametrize(
    ("options", "refresh_rate", "checkpoints"),
    [
        ((), PROGRESS_BAR_EVERY_N_STEPS, 3),
        (("--trainer.callbacks+=TQDMProgressBar", "--trainer.callbacks.refresh_rate", "1"), 1, 3),
        (("--trainer.callbacks", "TQDMProgressBar", "--trainer.callbacks.refresh_rate", "2"), 2, 3),
        (("--trainer.enable_progress_bar", "false", "--trainer.enable_checkpointing", "false"), None, 0),
    ],
    ids=["defaults", "a progress bar of the user's", "one callback, not a list", "bar and checkpoints off"],
)
def test_a_fit_calls_no_callback_that_has_nothing_to_do(data_dir, tmp_path, options, refresh_rate, checkpoints):
    """Lightning calls every callback at every hook of every step (benchmarks/host_step.py): the prediction writer is
    left out of a fit, no callback is called at a batch's hook it leaves empty, and the progress bar refreshes every
    few steps, unless the user gives their own."""
    shown = {"enable_progress_bar": None}  # SMALL_RUN's "false" left out
    argv = small_run(data_dir, tmp_path, *options, "--trainer.limit_train_batches", "2", **shown)
    try:
        trainer = TrainCLI(["fit", *argv, "--trainer.profiler", "simple"]).trainer
    finally:
        close_process_group()  # as app/main.py does after a command: the other tests of this worker start without one
    callbacks = trainer.callbacks
    # No callback is called at a hook of a batch that its class leaves as Lightning's empty one
    by_name = {f"[Callback]{callback.state_key}": callback for callback in callbacks}
    called = [action.rpartition(".") for action in trainer.profiler.recorded_durations]
    empty = [
        f"{name}.{hook}"
        for name, _, hook in called
        if name in by_name and hook in BATCH_HOOKS and getattr(type(by_name[name]), hook) is getattr(Callback, hook)
    ]
    assert not empty, empty
    training_hooks = ("on_train_batch_start", "on_train_batch_end")
    overridden = {  # and every callback that has work to do at a training batch is called there
        f"[Callback]{callback.state_key}.{hook}"
        for callback in callbacks
        for hook in training_hooks
        if getattr(type(callback), hook) is not getattr(Callback, hook)
    }
    assert overridden and overridden <= set(trainer.profiler.recorded_durations), overridden
    bars = [callback for callback in callbacks if isinstance(callback, ProgressBar)]
    assert [bar.refresh_rate for bar in bars] == ([refresh_rate] if refresh_rate else [])
    assert sum(isinstance(callback, ModelCheckpoint) for callback in callbacks) == checkpoints
    assert not any(isinstance(callback, PredictionWriter) for callback in callbacks)
