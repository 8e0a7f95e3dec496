"""`python train.py` as a user runs it, real processes started by Lightning's launcher: how a job ends. A stop by a
signal ends it by that signal (a shell loop stops), a process that fails fails the job, a full disk and a diverged
loss are one line each; nothing is left running."""

import os
import re
import shlex
import signal
import subprocess
import sys

import pytest
import torch

from tests.helpers import (
    NO_NETWORK,
    REPO,
    free_port,
    left_behind,
    one_error_line,
    run_command,
    run_train,
    small_run,
)

pytestmark = pytest.mark.slow


def test_sigterm_stops_every_process_at_one_step_and_the_printed_command_continues_the_run(data_dir, tmp_path):
    tmp_path = tmp_path / "my runs"  # a path with a space: the printed command is quoted for a shell
    stop = (
        "--trainer.callbacks+=tests.instruments.SignalAt",
        "--trainer.callbacks.step",
        "3",
        "--trainer.callbacks.group",
        "true",
        "--stop.every_n_steps",
        "4",
    )
    stopped = run_train("fit", *small_run(data_dir, tmp_path, *stop, devices=2))  # (no test after it: shorter)
    assert stopped.returncode == -signal.SIGTERM, stopped.stderr[-3000:]
    run = tmp_path / "SeqNet-mnist" / "version_0"
    assert f"Stopped by SIGTERM in epoch 0, after step 4; {run / 'checkpoints' / 'last.ckpt'} holds that step." in (
        stopped.stdout
    )
    (command,) = [
        line.removeprefix("Continue with: ") for line in stopped.stdout.splitlines() if "Continue with" in line
    ]
    where = ["--devices", "2", "--trainer.accelerator", "cpu"]  # where it ran, as given
    assert shlex.split(command)[1:] == ["train.py", "fit", "--ckpt_path", str(run), *where], command
    continued = run_command(shlex.split(command))
    assert continued.returncode == 0, continued.stderr[-3000:]
    assert f"--ckpt_path {run}: continuing {run}, from checkpoints/last.ckpt (step 4, epoch 0)." in continued.stdout
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["global_step"] == 10


def test_sigterm_with_the_graceful_stop_off_ends_the_job_by_sigterm(data_dir, tmp_path):
    """Lightning's own stop (its SIGTERMException, a SystemExit without a status) still ends the job as the signal."""
    stop = ("--trainer.callbacks+=tests.instruments.SignalAt", "--trainer.callbacks.step=3", "--stop.every_n_steps=0")
    stopped = run_train(*small_run(data_dir, tmp_path, *stop))
    assert stopped.returncode == -signal.SIGTERM, stopped.stderr[-3000:]


def test_a_process_that_fails_after_the_others_finished_fails_the_job(data_dir, tmp_path):
    fails = "--trainer.callbacks+=tests.instruments.FailAtExit"
    result = run_train("fit", *small_run(data_dir, tmp_path, fails, devices=2))  # (no test after it: a shorter job)
    assert result.returncode == 1, result.stderr[-3000:]
    assert re.search(
        r"error: the process of local rank 1 \(pid \d+\) ended with status -6, after this one's work was"
        " done, so the job failed.",
        result.stderr,
    )
    assert "Finished: val/acc" in result.stdout


def test_a_full_disk_ends_the_run_in_one_line_keeping_the_last_checkpoint(data_dir, tmp_path):
    full = ("--trainer.callbacks+=tests.instruments.NoSpaceAfterEpoch", "--trainer.callbacks.epoch", "1")
    result = run_train(*small_run(data_dir, tmp_path, *full, devices=2, max_epochs=2))
    folder = tmp_path / "SeqNet-mnist" / "version_0" / "checkpoints"
    line = one_error_line(result, "error: cannot save the checkpoint ", f": no space left in {folder};")
    assert "still holds the previous save. Free space there, then continue the run (--ckpt_path last)." in line
    assert torch.load(folder / "last.ckpt", weights_only=True)["epoch"] == 0


def test_a_diverged_loss_ends_every_process_in_one_line(data_dir, tmp_path):
    result = run_train(
        *small_run(data_dir, tmp_path, "--trainer.callbacks+=tests.instruments.DivergeInEpoch", devices=2, max_epochs=2)
    )
    line = one_error_line(result, "error: the training loss became NaN or infinite by step")
    assert "lower the learning rate (now 0.01) and train again." in line


def test_the_program_ends_by_the_signal_that_stopped_it_before_the_processes_met(data_dir, tmp_path):
    """SIGTERM while a node waits for another: the signal's own action, and no folder."""
    env = {
        **os.environ,
        **NO_NETWORK,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "NODE_RANK": "0",
        "PYTHONUNBUFFERED": "1",
    }
    train = subprocess.Popen(
        [sys.executable, "train.py", *small_run(data_dir, tmp_path, "--num_nodes", "2")],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        for line in train.stdout:
            if "Initializing distributed" in line:
                train.send_signal(signal.SIGTERM)
                break
        assert train.wait(timeout=60) == -signal.SIGTERM
    finally:
        train.kill()  # (nothing left behind where the test fails)
    assert not (tmp_path / "SeqNet-mnist").exists()


def test_a_run_started_with_nohup_in_the_background_outlives_its_shell(data_dir, tmp_path):
    """`nohup python train.py ... &`, then the shell ends (a closed ssh session) once training has started: the run
    goes on to its end."""
    args = small_run(data_dir, tmp_path, "--trainer.callbacks+=tests.instruments.RecordPid", devices=1, max_epochs=1)
    started, out = tmp_path / "pids" / "rank0", tmp_path / "nohup.out"
    shell = f"nohup {shlex.join([sys.executable, 'train.py', *args])} > {out} 2>&1 & until [ -e {started} ]; do"
    shell += " sleep 0.1; done"
    env = {**os.environ, **NO_NETWORK}
    bash = subprocess.Popen(["bash", "-c", shell], cwd=REPO, env=env, start_new_session=True)
    assert bash.wait(timeout=120) == 0
    assert left_behind(bash.pid, timeout=120) == "", out.read_text()[-3000:]  # the run's session: it ended
    assert "Finished: test/acc" in out.read_text(), out.read_text()[-3000:]
