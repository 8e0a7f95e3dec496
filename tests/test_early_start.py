"""train.py starts the other processes of its node before it imports torch (app/job/early_start.py): they import at
the same time, and a mistake is still said once, by one process, with nothing left waiting."""

import os
import re
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from app.job.early_start import processes_asked_for
from tests.helpers import REPO, left_behind, run_command, run_train, small_run

FAIL_IN_RANK_1 = ["--trainer.callbacks+=tests.helpers.FailToBuildOnLocalRank"]
# Installed in every process of a run (PYTHONPATH): the process the user started may import torch only once the
# process of local rank 1 has started, which it then must have done already; else, after 20 s, it says it could not.
SITECUSTOMIZE = """\
import importlib.abc, os, sys, time
from pathlib import Path
MARKS = Path(os.environ["TEST_MARKS"])
(MARKS / f"started-{os.environ.get('LOCAL_RANK', 'launcher')}").touch()

class TorchAfterRank1(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            deadline = time.monotonic() + 20
            while not (MARKS / "started-1").exists() and time.monotonic() < deadline:
                time.sleep(0.01)
            (MARKS / ("torch-after-rank-1" if (MARKS / "started-1").exists() else "torch-before-rank-1")).touch()
        return None

if "LOCAL_RANK" not in os.environ:
    sys.meta_path.insert(0, TorchAfterRank1())
"""


def test_the_other_processes_start_before_the_first_imports_torch(data_dir, tmp_path):
    """In a real `python train.py` (the counts that start them, from the command line or a config file: below)."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (tmp_path / "marks").mkdir()
    env = {"PYTHONPATH": str(tmp_path / "site"), "TEST_MARKS": str(tmp_path / "marks")}
    result = run_command([sys.executable, "train.py", *small_run(data_dir, tmp_path / "runs", devices=2)], 240, env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(path.name for path in (tmp_path / "marks").iterdir()) == [
        "started-1",
        "started-launcher",
        "torch-after-rank-1",
    ]
    assert "Finished: test/acc" in result.stdout + result.stderr  # Lightning logs it to standard error


def test_a_mistake_only_another_process_makes_before_the_meeting_is_said_once_and_ends_the_job(data_dir, tmp_path):
    result = run_train(*small_run(data_dir, tmp_path / "runs", *FAIL_IN_RANK_1, devices=2), timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and errors[0].startswith("error (rank 1): --trainer.callbacks "), result.stderr[-3000:]
    assert "planned mistake in local rank 1 alone" in errors[0]
    assert "Traceback" not in result.stderr


def test_another_process_killed_before_the_meeting_is_named_and_ends_the_job(data_dir, tmp_path):
    killed = [f"{FAIL_IN_RANK_1[0]}", "--trainer.callbacks.kill=true"]
    result = run_train(*small_run(data_dir, tmp_path / "runs", *killed, devices=2), timeout=120)
    assert result.returncode == 1, result.stderr[-3000:]
    last_line = result.stderr.strip().splitlines()[-1]
    assert re.fullmatch(
        r"error: the process of local rank 1 \(pid \d+\) ended with exit status -9 \(killed by signal 9\) before"
        r" the processes of the job met\.",
        last_line,
    ), result.stderr[-3000:]


# Installed in every process of a run (PYTHONPATH): the process of local rank 1 says in a file (with its pid) that it
# is about to import torch, and stalls there for a minute, as a slow start would.
RANK_1_WAITS = """\
import importlib.abc, os, signal, sys
from pathlib import Path
MARKS = Path(os.environ["TEST_MARKS"])

class WaitBeforeTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch":
            sys.meta_path.remove(self)
            (MARKS / "pid").write_text(str(os.getpid()))
            (MARKS / "pid").rename(MARKS / "rank-1-waits")  # whole when it appears
            signal.pause()  # until the test's Ctrl-C (its timeout ends the job otherwise)
        return None

if os.environ.get("LOCAL_RANK") == "1":
    sys.meta_path.insert(0, WaitBeforeTorch())
"""


@pytest.mark.parametrize("pressed_in", ["every process", "rank 1 alone"])
def test_ctrl_c_while_the_first_process_waits_for_the_others_stops_the_job_with_status_130(
    data_dir, tmp_path, pressed_in
):
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(RANK_1_WAITS)
    marks = tmp_path / "marks"
    marks.mkdir()
    marker = str(tmp_path / "runs")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "TEST_MARKS": str(marks), "PYTHONUNBUFFERED": "1"}
    run = subprocess.Popen(
        [sys.executable, "train.py", *small_run(data_dir, marker, devices=2)], cwd=REPO, env=env, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        seen = []
        for line in run.stdout:  # the first process waits for rank 1 in init_process_group
            seen.append(line)
            if line.startswith("Initializing distributed: GLOBAL_RANK: 0"):
                break
        deadline = time.monotonic() + 60
        while not (marks / "rank-1-waits").exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert (marks / "rank-1-waits").exists(), "".join(seen)[-3000:]
        if pressed_in == "every process":
            os.killpg(run.pid, signal.SIGINT)  # as a terminal does on Ctrl-C
        else:  # the first process, in init_process_group, learns it only from rank 1's end
            os.kill(int((marks / "rank-1-waits").read_text()), signal.SIGINT)
        output = "".join(seen) + run.communicate(timeout=60)[0]
        left = left_behind(marker=marker)
    finally:
        run.kill()
    assert run.returncode == 128 + signal.SIGINT, output[-3000:]
    assert "error" not in output and "Traceback" not in output, output[-3000:]
    assert left == ""


ROOT_CONFIG = """\
fit:
  trainer:
    devices: 3
"""


@pytest.mark.parametrize(
    ("argv", "environment", "processes"),
    [
        (["--devices", "2"], {}, 2),
        (["--devices=4", "--num_nodes", "2"], {}, 4),
        (["--devices", "2", "--num_nodes", "two"], {}, 1),  # LightningCLI says what is wrong with it
        (["fit", "--model", "ConvNet", "--trainer.devices", "3"], {}, 3),
        (["test", "--trainer.devices=2", "--trainer.strategy", "ddp", "--trainer.strategy.timeout", "0:10:00"], {}, 2),
        (["--config", "{config}", "--devices", "2"], {}, 2),  # the command line after the file wins
        (["--config", "{root_config}", "fit"], {}, 3),  # a config before the subcommand: a section per subcommand
        (["--config", "{saved}"], {}, 2),  # a run's config.yaml: every Trainer setting, plugins null included
        (["--devices", "2", "--config", "{config}"], {}, 2),  # the shortcut stands for an option at the end
        # Counts only torch can make, launchers and strategies that start processes their own way: Lightning does.
        (["--devices", "auto"], {}, 1),
        (["--devices", "-1"], {}, 1),
        (["--devices", "[0,1]"], {}, 1),
        (["--devices", "2", "--trainer.strategy", "ddp_spawn"], {}, 1),
        (["--devices", "2", "--trainer.strategy.start_method", "spawn"], {}, 1),
        (["--devices", "2", "--trainer.accelerator", "tpu"], {}, 1),
        (["--devices", "2", "--trainer.plugins", "SLURMEnvironment"], {}, 1),
        (["--devices", "2"], {"LOCAL_RANK": "0"}, 1),  # Lightning's launcher or torchrun started this process
        (["--devices", "2"], {"TORCHELASTIC_RUN_ID": "job"}, 1),
        (["--devices", "2"], {"SLURM_NTASKS": "2"}, 1),
        (["--devices", "2", "--help"], {}, 1),
        (["fit", "--devices", "2", "--print_config"], {}, 1),
        (["export", "--devices", "2"], {}, 1),
        (["--config", "{missing}", "--devices", "2"], {}, 1),  # LightningCLI says what is wrong with it
        (["test", "--ckpt_path", "{missing}", "--devices", "3"], {}, 1),  # the first process says it, alone
        (["test", "--ckpt_path", "{saved}", "--devices", "3"], {}, 3),
        (["--ckpt_path", "last", "--devices", "3"], {}, 3),
    ],
)
def test_the_processes_started_early_are_the_ones_the_command_line_asks_for(
    argv, environment, processes, tmp_path, monkeypatch
):
    files = {"config": tmp_path / "one.yaml", "root_config": tmp_path / "root.yaml", "missing": tmp_path / "no.yaml"}
    files["saved"] = tmp_path / "config.yaml"
    files["saved"].write_text("trainer:\n  accelerator: auto\n  strategy: ddp\n  devices: 2\n  plugins: null\n")
    files["config"].write_text("trainer:\n  devices: 1\n  max_epochs: 2\n")
    files["root_config"].write_text(textwrap.dedent(ROOT_CONFIG))
    for name in ("LOCAL_RANK", "RANK", "TORCHELASTIC_RUN_ID", "SLURM_NTASKS"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    assert processes_asked_for([arg.format(**files) for arg in argv])[0] == processes
