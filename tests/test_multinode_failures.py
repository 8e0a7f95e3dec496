"""When a multi-node job goes wrong (scripts/local_cluster.sh, torchrun, two network namespaces): a failing or killed
rank ends every node quickly, a node that never comes or an unreachable MASTER_ADDR ends in one line after the
timeout, a port in use in one line. (torchrun restarting a job from its last checkpoint: tests/test_elastic.py.)"""

import os
import signal
import socket
import subprocess
import sys
import time

import pytest
import torch

from tests.helpers import REPO, free_port, left_behind, run_command, run_local_cluster, run_train
from tests.test_multinode import TIMEOUT_5S, common, train_command

pytestmark = pytest.mark.slow  # long multi-process runs: `make test-fast` leaves them out


def test_a_failing_rank_ends_every_node_quickly(data_dir, tmp_path):
    marker = str(tmp_path)  # in every process's command line, to look for leftovers
    failing = ("--trainer.callbacks+=tests.helpers.FailOnRank", "--trainer.callbacks.rank", "1")
    # quickly: well before the process group's 30-minute timeout, or the helper fails the test
    result = run_local_cluster(2, 1, *common(data_dir, tmp_path), *failing, timeout=90)  # rank 1 on node 1
    assert result.returncode != 0
    assert "planned failure on rank 1" in result.stderr
    assert left_behind(marker=marker) == ""  # the nodes lead sessions of their own, which local_cluster.sh ends


@pytest.mark.parametrize(
    ("node_1", "shape_1"),
    [("--devices 2", "2 process(es) per node, 2 node(s)"), ("--num_nodes 3", "1 process(es) per node, 3 node(s)")],
)
def test_nodes_started_with_another_devices_or_num_nodes_end_in_one_line(data_dir, tmp_path, node_1, shape_1):
    """They waited for jobs of different sizes, or met in part, until the process-group timeout (30 minutes), saying
    that a node was not started: here within the helper's timeout."""
    result = run_local_cluster(2, 1, *common(data_dir, tmp_path), env={"NODE_ARGS_1": node_1}, timeout=90)
    assert result.returncode == 1
    lines = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert lines == [
        "error: the nodes were started with different --devices or --num_nodes: node 1 with"
        f" {shape_1}, node 0 with 1 process(es) per node, 2 node(s). Start every node with the same ones."
    ], result.stderr[-3000:]
    assert not (tmp_path / "SeqNet-mnist").exists()


def test_devices_that_do_not_match_the_launcher_stop_in_one_line(data_dir, tmp_path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    result = run_command([*torchrun, "train.py", *common(data_dir, tmp_path), "--devices", "3"], timeout=120)
    assert result.returncode != 0
    # Both ranks meet the mistake; the first to get there speaks for both (app/command_line/speaking.py), through the
    # agent's store.
    lines = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and lines[0].startswith(("error: ", "error (rank 1): ")), result.stderr
    assert lines[0].endswith(
        "--devices 3: torchrun started 1 node(s) x 2 process(es). Leave --devices and --num_nodes out (the launcher's"
        " are used), or make them match it."
    )
    assert "ValueError" not in result.stderr  # no traceback of ours; torchrun adds its own failure report


def test_a_port_in_use_ends_in_one_line_and_leaves_no_rank_behind(data_dir, tmp_path):
    with socket.socket() as other_program:
        other_program.bind(("127.0.0.1", 0))
        other_program.listen()
        env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(other_program.getsockname()[1])}
        # Rank 1 must end by itself when rank 0, which started it, fails: run_train fails the test if it is left.
        result = run_train(*train_command(data_dir, tmp_path, "--devices", "2")[2:], timeout=120, env=env)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: ") and "address already in use" in last_line and "MASTER_PORT" in last_line


def test_a_node_that_never_comes_ends_in_one_line_after_the_timeout(data_dir, tmp_path):
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "NODE_RANK": "0"}
    node = train_command(data_dir, tmp_path, "--devices", "1", "--num_nodes", "2", *TIMEOUT_5S)[2:]  # its arguments
    started = time.monotonic()
    result = run_train(*node, timeout=60, env=env)
    assert result.returncode == 1
    assert time.monotonic() - started >= 5  # the whole --trainer.strategy.timeout, not less
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: ") and "1/2 clients joined" in last_line and "NODE_RANK" in last_line


def test_a_killed_rank_ends_the_job_and_leaves_a_loadable_checkpoint(data_dir, tmp_path):
    argv = (*common(data_dir, tmp_path), "--trainer.max_epochs", "50", "--trainer.callbacks+=tests.helpers.RecordPid")
    command = ["scripts/local_cluster.sh", "2", "1", "--", *argv]  # rank 1 on node 1
    env = {**os.environ, "PYTHON": sys.executable}
    job = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    last = tmp_path / "SeqNet-mnist" / "version_0" / "checkpoints" / "last.ckpt"
    try:
        deadline = time.monotonic() + 120
        while not (last.exists() and (tmp_path / "pids" / "rank1").exists()):  # epoch 0 is done: mid-training
            assert job.poll() is None and time.monotonic() < deadline, "the job did not get going"
            time.sleep(0.2)
        os.kill(int((tmp_path / "pids" / "rank1").read_text()), signal.SIGKILL)
        job.wait(timeout=60)  # well before the process group's 30-minute timeout
        left = left_behind(marker=str(tmp_path))
    finally:
        subprocess.run(["pkill", "-KILL", "-f", str(tmp_path)])
        job.kill()
    assert job.returncode != 0
    assert left == ""
    checkpoint = torch.load(last, map_location="cpu", weights_only=True)  # intact: it loads, with its weights
    assert checkpoint["epoch"] >= 0 and checkpoint["state_dict"]


def test_an_unreachable_master_addr_ends_in_one_line_after_the_timeout(data_dir, tmp_path, two_hosts):
    env = {"MASTER_ADDR": "10.99.0.3", "MASTER_PORT": "29713", "NODE_RANK": "1"}  # no host has 10.99.0.3
    node = train_command(data_dir, tmp_path, "--devices", "1", "--num_nodes", "2", *TIMEOUT_5S)
    started = time.monotonic()
    result = run_command(["ip", "netns", "exec", two_hosts[1], *node], 60, env)
    assert result.returncode == 1
    assert time.monotonic() - started >= 5  # the whole --trainer.strategy.timeout, not less
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error (rank 1): ") and "(10.99.0.3, 29713)" in last_line and "MASTER_ADDR" in last_line
