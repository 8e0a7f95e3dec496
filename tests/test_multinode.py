"""Several "nodes" of train.py on this machine (scripts/local_cluster.sh): 2 nodes x 2 devices, CPU, gloo."""

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TEST_SIZE, TRAIN_SIZE
from tests.helpers import NO_NETWORK, REPO, SMALL_RUN, free_port, run_local_cluster, scalars, small_run, wait_for

pytestmark = pytest.mark.slow  # long multi-process runs: `make test-fast` leaves them out

VAL_SIZE = SMALL_RUN["--data.val_size"]
# How long the processes wait for each other.
TIMEOUT_5S = ("--trainer.strategy", "DDPStrategy", "--trainer.strategy.timeout", "0:00:05")


def common(data_dir: Path, root: Path) -> list[str]:
    return small_run(data_dir, root, accelerator=None)  # local_cluster.sh gives each node its --devices


def train_command(data_dir: Path, root: Path, *args: str) -> list[str]:
    return [sys.executable, "train.py", *common(data_dir, root), "--trainer.accelerator", "cpu", *args]


@pytest.mark.parametrize("launcher", ["lightning", "torchrun"])
def test_two_nodes_of_two_devices_train_as_one_job(data_dir, tmp_path, launcher):
    result = run_local_cluster(
        2, 2, *common(data_dir, tmp_path), "--trainer.callbacks+=tests.helpers.RecordTrainSamples", launcher=launcher
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    assert "terminate called" not in output

    ranks = sorted(re.findall(r"GLOBAL_RANK: (\d), MEMBER: \d/(\d)", output))
    assert ranks == [("0", "4"), ("1", "4"), ("2", "4"), ("3", "4")]
    assert output.count("Global batch 200 = 50 per device x 4 processes") == 1

    shards = [json.loads((tmp_path / "samples" / f"rank{rank}_epoch0.json").read_text()) for rank in range(4)]
    train_size = TRAIN_SIZE - VAL_SIZE
    assert [len(shard) for shard in shards] == [train_size // 4] * 4
    assert sorted(sum(shards, [])) == list(range(train_size))

    (run_dir,) = (tmp_path / "SeqNet-mnist").iterdir()  # global rank 0 alone made a run folder
    writer_pids = {re.search(r"\.(\d+)\.\d+$", p.name).group(1) for p in run_dir.glob("events.out.tfevents.*")}
    assert len(writer_pids) == 1
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir())[-1] == "last.ckpt"
    assert len(scalars(run_dir)["test/acc"]) == 1
    assert output.count("Finished: test/acc") == 1  # reported once, by global rank 0


def test_two_hosts_with_their_own_addresses_find_each_other(data_dir, tmp_path, two_hosts):
    """Gloo would advertise 127.0.0.1 on these hosts; train.py picks the interface that routes to MASTER_ADDR."""
    env = {**os.environ, "MASTER_ADDR": "10.99.0.1", "MASTER_PORT": "29712", "PYTHONUNBUFFERED": "1"}
    env = {key: value for key, value in env.items() if not key.endswith("_SOCKET_IFNAME")}
    nodes = []
    for rank, host in enumerate(two_hosts):
        command = [
            "ip",
            "netns",
            "exec",
            host,
            *train_command(data_dir, tmp_path, "--devices", "1", "--num_nodes", "2"),
        ]
        nodes.append(
            subprocess.Popen(
                command, cwd=REPO, env={**env, "NODE_RANK": str(rank)}, text=True, start_new_session=True,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            )
        )  # fmt: skip
    try:
        outputs = [node.communicate(timeout=180)[0] for node in nodes]
    finally:
        for node in nodes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGKILL)
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    assert f"Reaching MASTER_ADDR through {two_hosts[0]}v" in outputs[0]
    assert f"Reaching MASTER_ADDR through {two_hosts[1]}v" in outputs[1]
    assert "Finished: test/acc" in outputs[0]


def test_predict_on_nodes_without_a_shared_folder_writes_every_row_on_node_0(checkpoint, tmp_path):
    """Each "node" runs in a folder of its own, as on cloud machines without a shared filesystem: the rows of node 1
    reach node 0 through the process group, and node 1 writes nothing."""
    best, _ = checkpoint
    command = [sys.executable, str(REPO / "train.py"), "predict", "--ckpt_path", str(best), "--devices", "1"]
    command += ["--num_nodes", "2", "--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false"]
    command += ["--predictions.path", "predictions.csv", "--trainer.default_root_dir", "runs"]
    env = {**os.environ, **NO_NETWORK, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    nodes = []
    for rank in range(2):
        (tmp_path / f"node{rank}").mkdir()
        nodes.append(
            subprocess.Popen(
                command,
                cwd=tmp_path / f"node{rank}",
                env={**env, "NODE_RANK": str(rank)},
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        )
    try:
        outputs = [node.communicate(timeout=180) for node in nodes]
    finally:
        for node in nodes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGKILL)
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][1][-2000:] + outputs[1][1][-2000:]
    with (tmp_path / "node0" / "predictions.csv").open() as rows:
        indices = [int(line.split(",")[0]) for line in list(rows)[1:]]
    assert indices == list(range(TEST_SIZE))  # every test image once, in order, from both nodes
    assert not list((tmp_path / "node1").glob("*predictions*")) and not list((tmp_path / "node1").glob(".*"))


# A node of the local cluster as a shell: it says that SIGTERM reached it, and ends by it.
NODE = """#!/usr/bin/env bash
trap 'echo "node $NODE_RANK: TERM"; trap - TERM; kill -TERM $$' TERM
touch "$NODES_READY/$NODE_RANK"
sleep 60 & wait $!
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_of_the_local_cluster_reaches_every_node(tmp_path, signum):
    """Each node is a session of its own, which a terminal's Ctrl-C does not reach: the script stops them by SIGTERM,
    as a cluster stops its nodes, each of which then stops at one step and keeps it (tests/test_faults.py). It killed
    them, and the run kept nothing. Here a node is a stand-in that says that SIGTERM reached it."""
    (node := tmp_path / "python").write_text(NODE)
    node.chmod(0o755)
    env = {**os.environ, "PYTHON": str(node), "MASTER_PORT": str(free_port()), "NODES_READY": str(tmp_path)}
    script = subprocess.Popen(
        ["scripts/local_cluster.sh", "2", "1", "--"], cwd=REPO, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(lambda: {"0", "1"} <= {path.name for path in tmp_path.iterdir()}, 30, "both nodes to start", 0.05)
        script.send_signal(signum)  # the script alone, as Ctrl-C in its terminal
        output, _ = script.communicate(timeout=30)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(script.pid, signal.SIGKILL)
    assert sorted(output.split("\n")[:2]) == ["node 0: TERM", "node 1: TERM"], output
    assert script.returncode == 128 + signum
