"""`scripts/train.sbatch` on a real SLURM cluster of one machine (`scripts/local_slurm.sh`), CPU, gloo.

Opt-in: it runs where Debian's `slurm-wlm` and `munge` are installed and the tests run as root
(`apt-get install slurm-wlm munge`), and is skipped, saying so, elsewhere.
"""

import os
import re
import shutil
import signal
import subprocess
import sys

import pytest
import torch

from tests.helpers import REPO, free_port, scalars, small_run, wait_for

pytestmark = pytest.mark.slow
DAEMONS = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scancel", "scontrol")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A running one-machine SLURM cluster; returns the environment that points SLURM's commands at it."""
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    if missing or os.geteuid() != 0:
        pytest.skip(f"needs root and SLURM ({' '.join(missing) or 'root'} missing): apt-get install slurm-wlm munge")
    folder = tmp_path_factory.mktemp("slurm")
    env = {**os.environ, "SLURMCTLD_PORT": str(free_port()), "SLURMD_PORT": str(free_port())}
    started = subprocess.run(["scripts/local_slurm.sh", "start", folder], cwd=REPO, env=env, capture_output=True)
    try:
        assert started.returncode == 0, started.stderr
        yield {**env, "SLURM_CONF": str(folder / "slurm.conf")}
    finally:
        subprocess.run(["scripts/local_slurm.sh", "stop", folder], cwd=REPO)


def slurm_command(env: dict[str, str], *command: str) -> str:
    return subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout.strip()


def submit(env: dict[str, str], tmp_path, train_args: list[str]) -> str:
    """scripts/train.sbatch as a job of two tasks on one node, its output in `tmp_path/job.out`; the job's id."""
    batch = ["sbatch", "--parsable", "--nodes", "1", "--ntasks-per-node", "2", "--chdir", str(REPO)]
    return slurm_command(env, *batch, "--output", str(tmp_path / "job.out"), "scripts/train.sbatch", *train_args)


def test_a_two_task_job_requeued_on_its_preemption_signal_finishes_from_its_checkpoint(data_dir, tmp_path, slurm):
    env = {**slurm, "PYTHON": sys.executable, "RUNS": str(tmp_path)}
    train_args = small_run(data_dir, None, max_epochs=12)  # scripts/train.sbatch writes under $RUNS
    job_id = submit(env, tmp_path, train_args)
    job_state = ["squeue", "--noheader", "--jobs", job_id, "--format", "%T"]
    run_dir = tmp_path / f"slurm-{job_id}" / "SeqNet-mnist" / "version_0"
    last = run_dir / "checkpoints" / "last.ckpt"
    try:
        wait_for(last.exists, 120, "the end of the first epoch")
        # What SLURM sends 90 s before the time limit (--signal=SIGUSR1@90 in the script): every task stops at one
        # step, saving last.ckpt, and global rank 0 asks SLURM to requeue the job.
        slurm_command(env, "scancel", "--signal=USR1", job_id)
        wait_for(lambda: slurm_command(env, *job_state) == "PENDING", 60, "the requeue")
        # SLURM starts it again once the first run's credential expired: 10 s here (local_slurm.sh), 2 minutes by
        # default; started sooner, it would kill it ("Job credential revoked")
        wait_for(lambda: slurm_command(env, *job_state) == "", 240, "the end of the requeued job")
    finally:
        subprocess.run(["scancel", job_id], env=env)
    output = (tmp_path / "job.out").read_text()

    assert f"Job {job_id}, start 1" in output and f"Job {job_id}, start 2" in output
    assert "Stopped by SLURM's requeue signal in epoch " in output and "SLURM was asked to requeue the job" in output
    assert output.count("--ckpt_path last: continuing ") == 1
    ranks = sorted(re.findall(r"GLOBAL_RANK: (\d), MEMBER: \d/(\d)", output))
    assert ranks == [("0", "2"), ("0", "2"), ("1", "2"), ("1", "2")]  # two tasks, twice

    assert [path.name for path in run_dir.parent.iterdir()] == ["version_0"]  # the requeued job continued the run
    assert torch.load(last, map_location="cpu", weights_only=True)["epoch"] == 11
    # 12 epochs, each validated once, but for the epoch whose end the signal caught: when it lands after the
    # epoch's validation ran and before its figures were logged, Lightning resumes at the epoch's end and does not
    # validate it again.
    assert len(scalars(run_dir)["val/acc"]) >= 11
    assert output.count("Finished: test/acc") == 1


def test_a_frozen_task_is_named_and_the_job_ends(data_dir, tmp_path, slurm):
    env = {**slurm, "PYTHON": sys.executable, "RUNS": str(tmp_path)}
    options = ("--watchdog.timeout", "5", "--trainer.callbacks+=tests.instruments.RecordPid")
    train_args = small_run(data_dir, None, *options, max_epochs=100)
    job_id = submit(env, tmp_path, train_args)
    root = tmp_path / f"slurm-{job_id}"
    last = root / "SeqNet-mnist" / "version_0" / "checkpoints" / "last.ckpt"
    try:
        wait_for(lambda: last.exists() and (root / "pids" / "rank1").exists(), 120, "the end of the first epoch")
        os.kill(int((root / "pids" / "rank1").read_text()), signal.SIGSTOP)
        wait_for(lambda: slurm_command(env, "squeue", "--noheader", "--jobs", job_id) == "", 60, "the job's end")
        left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout
    finally:
        subprocess.run(["scancel", "--signal=KILL", job_id], env=env)
    output = (tmp_path / "job.out").read_text()
    named = re.search(r"^Global rank 1 \(pid \d+ on .*\) gave no sign of life for 5 s", output, re.MULTILINE)
    assert named, output[-3000:]
    assert "error: a process of the job stopped answering, so the job ends;" in output
    assert left == ""
    assert torch.load(last, map_location="cpu", weights_only=True)["state_dict"]  # intact
