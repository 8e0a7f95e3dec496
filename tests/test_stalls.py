"""When a process of a DDP job stops answering (real gloo runs of train.py on CPU, SIGSTOP): it is named, under
Lightning's launcher and torchrun, and the job ends; a slow one is left alone. (The heartbeats'
cases a real run meets only by chance are in tests/test_heartbeats.py.)"""

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, TrainJob, left_behind, run_train
from tests.test_faults import CHECKPOINTS, STALL_TIMEOUT, argv, last_checkpoint

pytestmark = pytest.mark.slow  # long multi-process runs: `make test-fast` leaves them out


def wait_for_files(*paths: Path, process: subprocess.Popen | TrainJob, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not all(path.exists() for path in paths):
        assert process.poll() is None, "the job ended before it got going"
        assert time.monotonic() < deadline, f"no {paths} after {timeout} s"
        time.sleep(0.1)


def freeze_and_wait(job: subprocess.Popen | TrainJob, root: Path, frozen_rank: int, ranks: int):
    """SIGSTOP global rank `frozen_rank` of the job once an epoch is done, and wait for the job to end. Returns its
    exit status, its output and what was left of it (`left_behind`); the job must end within 90 s of the freeze."""
    try:
        pids = [root / "pids" / f"rank{rank}" for rank in range(ranks)]
        wait_for_files(*pids, root / CHECKPOINTS / "last.ckpt", process=job)  # an epoch is done: mid-training
        os.kill(int((root / "pids" / f"rank{frozen_rank}").read_text()), signal.SIGSTOP)
        output, _ = job.communicate(timeout=90)
        return job.returncode, output, left_behind(session=job.pid, marker=str(root))
    finally:
        subprocess.run(["pkill", "-KILL", "-f", str(root)])  # stopped processes die of SIGKILL too
        job.kill()


def assert_named_and_ended(output: str, rank: int) -> None:
    said = "\n".join(line for line in output.splitlines() if not line.startswith(("frame #", "Exception raised")))
    named = [line for line in output.splitlines() if line.startswith(f"Global rank {rank} (pid ")]
    assert len(named) == 1 and "frozen, or its host hung or lost the network" in named[0], said[-6000:]
    silent_for = int(re.search(r"for (\d+) s: frozen", named[0]).group(1))  # as the program measured it
    assert silent_for >= int(STALL_TIMEOUT[1]), named[0]  # never before --fault_guard.stall_timeout
    errors = [line for line in output.splitlines() if line.startswith("error")]
    assert errors and errors[0].startswith("error: a process of the job stopped answering"), output[-3000:]
    assert "holds the last saved step; continue with: " in errors[0] and " --ckpt_path " in errors[0]


def test_a_frozen_process_is_named_and_the_job_ends(data_dir, tmp_path):
    pid = "--trainer.callbacks+=tests.helpers.RecordPid"
    args = [*argv(data_dir, tmp_path, pid, *STALL_TIMEOUT), "--trainer.max_epochs", "100"]
    job = TrainJob(*args, output=tmp_path / "output")
    status, output, left = freeze_and_wait(job, tmp_path, frozen_rank=1, ranks=2)
    assert status == 1, output[-3000:]
    assert_named_and_ended(output, 1)
    assert left == ""  # the frozen one too
    assert last_checkpoint(tmp_path)["state_dict"]  # intact: it loads


@pytest.mark.parametrize("launcher", ["lightning", "torchrun"])
def test_a_frozen_global_rank_0_is_named_and_every_node_ends(data_dir, tmp_path, launcher):
    """Two nodes of one process each (scripts/local_cluster.sh). Under Lightning's launcher global rank 0 also holds
    the job's store, so the other node hears nothing at all from it."""
    pid = "--trainer.callbacks+=tests.helpers.RecordPid"
    args = [*argv(data_dir, tmp_path, pid, *STALL_TIMEOUT, devices=1), "--trainer.max_epochs", "100"]
    env = {**os.environ, "LAUNCHER": launcher, "PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"}
    job = subprocess.Popen(
        ["scripts/local_cluster.sh", "2", "1", "--", *args], cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    status, output, left = freeze_and_wait(job, tmp_path, frozen_rank=0, ranks=2)
    assert status != 0, output[-3000:]
    assert_named_and_ended(output, 0)
    assert left == ""


def test_a_slow_validation_on_one_rank_is_not_taken_for_a_stall(data_dir, tmp_path):
    slow = ("--trainer.callbacks+=tests.helpers.SlowValidation", "--trainer.callbacks.seconds", "7")  # > 5 s
    result = run_train("fit", *argv(data_dir, tmp_path, *slow, *STALL_TIMEOUT), "--trainer.max_epochs", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "stopped answering" not in result.stdout + result.stderr


def test_processes_that_no_longer_meet_in_the_same_collective_are_named_and_the_job_ends(data_dir, tmp_path):
    """Rank 1 trains a second epoch while rank 0 has gone on to the test: both alive, both waiting for ever."""
    more = ("--trainer.callbacks+=tests.helpers.MoreEpochsOnRank", "--trainer.callbacks.rank", "1")
    started = time.monotonic()
    result = run_train(*argv(data_dir, tmp_path, *more, *STALL_TIMEOUT), "--trainer.max_epochs", "1", timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    (named,) = [line for line in output.splitlines() if line.startswith("The processes of the job wait")]
    assert re.search(r"global rank 0 \(pid \d+ on .+\) is in test, epoch 1, step 10;", named), named
    assert re.search(r"global rank 1 \(pid \d+ on .+\) is in fit \(train\), epoch 1, step 1[01]\.$", named), named
    errors = [line for line in output.splitlines() if line.startswith("error")]
    assert errors[0].startswith("error: the processes of the job no longer meet in the same collective"), errors
    assert time.monotonic() - started < 60  # within the stall timeout of the wait, not torch's 30 minutes
