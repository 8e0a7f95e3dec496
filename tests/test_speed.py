"""The training loop reads no tensor back to the host between logging steps: on a GPU each such read (`.item()`,
`bool(tensor)`, `.cpu()`, ...) would wait for the device to finish, once per step."""

import json
import sys
from collections import Counter

import pytest

from tests.count_host_reads import CALL, STEP
from tests.helpers import run_command, small_run

# The project's code that runs at every training step (benchmarks/step.py times the step they are in); a new one, or
# work of the project's own that one of these calls, makes the test below fail until it is measured and added here.
PER_STEP_HOOKS = {
    "graceful_stop.py:on_train_batch_end",  # the loss's flag kept on the device for the check every 50 steps
    "graceful_stop.py:on_train_batch_start",  # whether a stop was asked before the step (the Timer's comes in it)
    "graceful_stop.py:<lambda>",  # what stands for Lightning's SIGTERM broadcast before every step
    "stall_watchdog.py:on_train_batch_end",  # a batch done, for the watchdog's thread
    "dashboard.py:on_train_batch_end",  # the speed, measured on logging steps
    "global_batch.py:on_train_batch_start",  # the global batch line at the first step
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

    Lightning itself reads a flag back before every step under DDP (whether rank 0 got SIGTERM): GracefulStop stands
    in for it, and its processes compare theirs every `--stop.every_n_steps` (50) steps and at the epoch's last batch
    and end: not in steps 6 to 15 here.
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
