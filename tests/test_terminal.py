"""What a user sees on a terminal: the program's lines stand below the progress bar, a Ctrl-C while the libraries
load ends the program quietly, and one in a shell loop stops the loop. Real processes."""

import os
import shlex
import signal
import subprocess
import sys

import pytest

from tests.helpers import NO_NETWORK, REPO, run_command, small_run

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("instrument", "said"),
    [
        (
            ("SignalAt", "--trainer.callbacks.step", "3"),
            ["Stopped by SIGTERM in epoch 0, after step 3; ", "Continue with: "],
        ),
        (("DivergeInEpoch", "--trainer.callbacks.epoch", "0"), ["error: the training loss became NaN or infinite "]),
    ],
)
def test_what_a_stop_or_an_error_says_stands_below_the_progress_bar(data_dir, tmp_path, instrument, said):
    """Standard output and error on one terminal: each line said starts a line, and no bar is drawn again below."""
    name, *options = instrument
    args = small_run(data_dir, tmp_path, f"--trainer.callbacks+=tests.instruments.{name}", *options, devices=1)
    args[args.index("--trainer.enable_progress_bar") + 1] = "true"
    command = shlex.join([sys.executable, "train.py", "--stop.every_n_steps", "1", *args])
    result = run_command(["bash", "-c", f"{command} 2>&1"])
    assert "it/s" in result.stdout  # the bar was drawn
    screen = [line.rsplit("\r", 1)[-1] for line in result.stdout.replace("\r\n", "\n").split("\n")]  # as it stays
    lines = [line for line in screen if line.strip()]
    assert [line for line in lines if line.startswith(tuple(said))] == lines[-len(said) :], lines[-4:]


def test_a_ctrl_c_while_the_libraries_load_ends_the_program_quietly_by_it():
    """A Ctrl-C in the first seconds, as torch is imported (`-X importtime` says when): no traceback."""
    process = subprocess.Popen(
        [sys.executable, "-X", "importtime", "train.py", "--help"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **NO_NETWORK},
    )
    try:
        for line in process.stderr:
            if line.rstrip().endswith(("torch._utils", "torch.version")):  # inside torch's import
                process.send_signal(signal.SIGINT)
                break
        rest = process.stderr.read()
        assert process.wait(timeout=60) == -signal.SIGINT
    finally:
        process.kill()
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, rest[-2000:]


def test_ctrl_c_in_a_shell_loop_stops_the_loop(data_dir, tmp_path):
    """A terminal's Ctrl-C reaches every process of the foreground group, the shell's too: bash ends the loop only if
    the program ends by SIGINT (an exit status of 1 would run the next command)."""
    press = (
        "--trainer.callbacks+=tests.instruments.SignalAt",
        "--trainer.callbacks.signum",
        "2",
        "--trainer.callbacks.step",
        "3",
        "--trainer.callbacks.group",
        "true",
    )
    train = shlex.join([sys.executable, "train.py", *small_run(data_dir, tmp_path, *press, devices=2)])
    loop = f"for run in 1 2; do echo run $run; {train}; done; echo after the loop"
    result = run_command(["bash", "-c", loop])
    assert result.returncode == -signal.SIGINT, result.stdout[-2000:]
    assert "run 1" in result.stdout and "run 2" not in result.stdout and "after the loop" not in result.stdout
    assert "Stopped by SIGINT (Ctrl-C) in epoch 0" in result.stdout
