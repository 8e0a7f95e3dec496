"""The start and the end of a DDP job (real gloo runs of train.py on CPU): a node waiting for the others says what
for and goes on when they come, a stop while the processes wait to meet ends the job at once, and a process that
fails after the work is done fails the job."""

import os
import re
import signal
import socket
import subprocess
import sys
import threading

import pytest

from app.job import rendezvous
from tests.helpers import REPO, TrainJob, free_port, left_behind, run_train, wait_for
from tests.test_faults import argv

pytestmark = pytest.mark.slow  # long multi-process runs: `make test-fast` leaves them out


# 1. The processes wait to meet, and say what for


def test_a_node_waiting_for_the_others_says_so_and_goes_on_when_they_come(data_dir, tmp_path):
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "PYTHONUNBUFFERED": "1"}
    args = [*argv(data_dir, tmp_path, devices=1), "--num_nodes", "2", "--trainer.max_epochs", "1"]
    nodes = [
        subprocess.Popen(
            [sys.executable, "train.py", *args], cwd=REPO, env={**env, "NODE_RANK": "0"}, text=True,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
        )
    ]  # fmt: skip
    try:
        seen = []
        for line in nodes[0].stdout:  # node 0 alone: it waits, and says so
            seen.append(line)
            if line.startswith("Node 0 has waited"):
                break
        assert seen and seen[-1].startswith("Node 0 has waited"), "".join(seen)[-3000:]
        assert f"at 127.0.0.1:{env['MASTER_PORT']} for the 2 processes of the job (2 node(s) x 1)" in seen[-1]
        assert "a node not started yet" in seen[-1]

        late = run_train(*args, timeout=120, env={**env, "NODE_RANK": "1"})
        first_output = "".join(seen) + nodes[0].communicate(timeout=60)[0]
    finally:
        for node in nodes:
            node.kill()
    assert late.returncode == 0 and nodes[0].returncode == 0, first_output[-3000:] + late.stderr[-3000:]
    assert "All 2 processes of the job have met" in first_output, first_output[-3000:]
    assert "Finished: test/acc" in first_output, first_output[-3000:]


def test_a_node_whose_port_another_program_holds_says_that_it_waits(monkeypatch, capsys):
    """In-process: a client of the job's store waits without end at a port another program holds (it never answers),
    and the shape check, in the watch that also says the wait, made the node wait in silence."""
    said: list[str] = []

    def notice_said() -> bool:
        said.append(capsys.readouterr().out)
        return "Node 1 has waited" in "".join(said)

    class Stopped(Exception):
        """The wait ends here: no process group in this test."""

    watches_before = set(threading.enumerate())
    with socket.create_server(("127.0.0.1", 0)) as another_program:  # accepts, never answers
        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("MASTER_PORT", str(another_program.getsockname()[1]))
        monkeypatch.setattr(rendezvous, "FIRST_NOTICE_S", 0)
        monkeypatch.setattr(rendezvous, "SHAPE_SAID_WAIT_S", 0.1)
        with pytest.raises(Stopped), rendezvous.announce_rendezvous(2, 2, node_rank=1, local_rank=0):
            wait_for(notice_said, timeout=20, what="the notice of the wait")
            raise Stopped
    assert "another program holding that port" in "".join(said)
    for watch in set(threading.enumerate()) - watches_before:  # its client fails once that program has closed
        watch.join(timeout=30)
        assert not watch.is_alive()


@pytest.mark.parametrize(
    ("stop", "statuses"),
    [(signal.SIGINT, {-signal.SIGINT}), (signal.SIGTERM, {-signal.SIGTERM})],
    ids=["Ctrl-C", "SIGTERM"],
)
def test_a_stop_while_the_processes_wait_for_a_node_that_never_comes_ends_the_job_at_once(
    data_dir, tmp_path, stop, statuses
):
    """Node 0's two processes wait inside `init_process_group` for node 1, which is never started: Python's handler
    of Ctrl-C cannot run there, and the wait lasts up to the process-group timeout (30 minutes). Either signal ends
    them by its default action (app/job/rendezvous.py: Meeting), as a shell reports it (130, 143)."""
    port = free_port()
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    args = [*argv(data_dir, tmp_path, devices=2), "--num_nodes", "2"]
    job = TrainJob("fit", *args, output=tmp_path / "output", env=env)
    try:
        # Node 0 says that it waits (app/job/rendezvous.py); its other process waits there too, or still imports
        wait_for(
            lambda: job.output.exists() and "Node 0 has waited" in job.output.read_text(),
            timeout=120,
            what="node 0 to say that it waits",
            every=0.2,
        )
        os.killpg(job.pid, stop)  # as a terminal does on Ctrl-C, or a scheduler
        output = job.communicate(timeout=30)[0]
        left = left_behind(session=job.pid, marker=str(tmp_path))
    finally:
        job.kill()
    assert job.returncode in statuses, output[-3000:]
    assert "error" not in output and "Traceback" not in output, output[-3000:]
    assert left == ""
    assert not list(tmp_path.rglob("version_*"))  # the run's folder is claimed once the processes have met


# 2. A process that fails after the others have finished fails the job


def test_a_process_that_fails_before_the_meeting_ends_the_job_and_is_named(data_dir, tmp_path):
    """A process Lightning's launcher started fails while the first process waits for it to meet: it says its own
    line and ends at once (nothing to wait for), and Lightning's watch ends the first process, naming it. (One
    killed there is named by Lightning's line alone.)"""
    failing = ("--trainer.callbacks+=tests.helpers.FailToBuildOnLocalRank",)
    result = run_train("fit", *argv(data_dir, tmp_path, *failing, max_epochs=1), timeout=120)
    assert result.returncode == -signal.SIGKILL, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
    # One line, from that process (jsonargparse's message around it: the callback fails while it is parsed)
    assert len(errors) == 1 and errors[0].startswith("error (rank 1): "), result.stderr[-3000:]
    assert "planned mistake in local rank 1 alone" in errors[0]
    assert "terminated with code 1. Forcefully terminating all other processes" in result.stderr
    assert not list(tmp_path.rglob("version_*"))  # nothing written: the run's folder comes once they have met


@pytest.mark.parametrize(("abort", "ended"), [("true", str(-signal.SIGABRT)), ("false", "3")])
def test_a_process_that_fails_at_exit_after_training_fails_the_job_and_is_named(data_dir, tmp_path, abort, ended):
    """The first process waits for those Lightning's launcher started (app/job/children.py): one that fails as it
    ends, once the work is done, fails the job, and is named: by the first process, or by Lightning's watch where it
    looks first (every 5 s), which then kills the first process (137)."""
    at_exit = ("--trainer.callbacks+=tests.helpers.FailAtExit", "--trainer.callbacks.abort", abort)
    result = run_train("fit", *argv(data_dir, tmp_path, *at_exit, max_epochs=1))
    assert result.returncode in (1, -signal.SIGKILL), result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
    lightnings = f"terminated with code {ended}. Forcefully terminating all other processes"
    named = len(errors) == 1 and re.fullmatch(
        rf"error: the process of local rank 1 \(pid \d+\) ended with exit status {re.escape(ended)} after this"
        r" process's work was done, so the job failed\.",
        errors[0],
    )
    assert named or (result.returncode == -signal.SIGKILL and lightnings in result.stderr), result.stderr[-3000:]
