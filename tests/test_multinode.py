"""Several "nodes" of train.py on this machine (scripts/local_cluster.sh): 2 nodes x 2 devices, CPU, gloo."""

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import TEST_SIZE, TRAIN_SIZE
from tests.helpers import NO_NETWORK, REPO, SMALL_RUN, free_port, run_command, run_local_cluster, scalars, small_run

pytestmark = pytest.mark.slow  # long multi-process runs: `make test-fast` leaves them out

VAL_SIZE = SMALL_RUN["--data.val_size"]
# How long the processes wait for each other.
TIMEOUT_10S = ("--trainer.strategy", "DDPStrategy", "--trainer.strategy.timeout", "0:00:10")


def common(data_dir: Path, root: Path) -> list[str]:
    return small_run(data_dir, root, accelerator=None)  # local_cluster.sh gives each node its --devices


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


def test_a_failing_rank_ends_every_node_quickly(data_dir, tmp_path):
    marker = str(tmp_path)  # in every process's command line, to look for leftovers
    started = time.monotonic()
    result = run_local_cluster(
        2,
        2,
        *common(data_dir, tmp_path),
        "--trainer.callbacks+=tests.helpers.FailOnRank",
        "--trainer.callbacks.rank",
        "3",
    )
    assert result.returncode != 0
    assert time.monotonic() - started < 90
    assert "planned failure on rank 3" in result.stderr
    leftovers = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True, cwd=REPO).stdout
    assert leftovers == ""


def test_devices_that_do_not_match_the_launcher_stop_in_one_line(data_dir, tmp_path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    result = run_command([*torchrun, "train.py", *common(data_dir, tmp_path), "--devices", "3"], timeout=120)
    assert result.returncode != 0
    # Both ranks meet the mistake; the first to get there speaks for both (app/command_line/speaking.py), through the
    # agent's store.
    lines = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and lines[0].startswith(("error: ", "error (rank 1): ")), result.stderr
    assert "You set `devices=3` and `num_nodes=1`" in lines[0]
    assert "Make --devices and --num_nodes match the launcher." in lines[0]
    assert "ValueError" not in result.stderr  # no traceback of ours; torchrun adds its own failure report


def train_command(data_dir: Path, root: Path, *args: str) -> list[str]:
    return [sys.executable, "train.py", *common(data_dir, root), "--trainer.accelerator", "cpu", *args]


def test_a_port_in_use_ends_in_one_line_and_leaves_no_rank_behind(data_dir, tmp_path):
    marker = str(tmp_path)
    with socket.socket() as other_program:
        other_program.bind(("127.0.0.1", 0))
        other_program.listen()
        env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(other_program.getsockname()[1])}
        try:
            # No process-group kill here: rank 1 must end by itself when rank 0, its launcher, fails.
            result = subprocess.run(
                train_command(data_dir, tmp_path, "--devices", "2"),
                cwd=REPO,
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            leftovers = wait_for_no_process(marker, timeout=10)
        finally:
            subprocess.run(["pkill", "-KILL", "-f", marker])
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: ") and "address already in use" in last_line and "MASTER_PORT" in last_line
    assert leftovers == ""


def wait_for_no_process(marker: str, timeout: float) -> str:
    """The command lines of the processes whose command line holds `marker`, once none is left or at `timeout`."""
    deadline = time.monotonic() + timeout
    while (left := subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout) and (
        time.monotonic() < deadline
    ):
        time.sleep(0.1)
    return left


def test_a_node_that_never_comes_ends_in_one_line_after_the_timeout(data_dir, tmp_path):
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()), "NODE_RANK": "0"}
    node = train_command(data_dir, tmp_path, "--devices", "1", "--num_nodes", "2", *TIMEOUT_10S)
    started = time.monotonic()
    result = run_command(node, 120, env)
    assert result.returncode == 1
    assert 10 <= time.monotonic() - started < 60
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: ") and "1/2 clients joined" in last_line and "NODE_RANK" in last_line


def test_a_killed_rank_ends_the_job_and_leaves_a_loadable_checkpoint(data_dir, tmp_path):
    argv = (*common(data_dir, tmp_path), "--trainer.max_epochs", "50", "--trainer.callbacks+=tests.helpers.RecordPid")
    command = ["scripts/local_cluster.sh", "2", "2", "--", *argv]
    env = {**os.environ, "PYTHON": sys.executable}
    job = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    last = tmp_path / "SeqNet-mnist" / "version_0" / "checkpoints" / "last.ckpt"
    try:
        deadline = time.monotonic() + 120
        while not (last.exists() and (tmp_path / "pids" / "rank3").exists()):  # epoch 0 is done: mid-training
            assert job.poll() is None and time.monotonic() < deadline, "the job did not get going"
            time.sleep(0.2)
        killed = time.monotonic()
        os.kill(int((tmp_path / "pids" / "rank3").read_text()), signal.SIGKILL)
        job.wait(timeout=60)
        elapsed = time.monotonic() - killed
    finally:
        subprocess.run(["pkill", "-KILL", "-f", str(tmp_path)])
        job.kill()
    assert job.returncode != 0
    assert elapsed < 60
    assert subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True).stdout == b""
    checkpoint = torch.load(last, map_location="cpu", weights_only=True)  # intact: it loads, with its weights
    assert checkpoint["epoch"] >= 0 and checkpoint["state_dict"]


def test_torchrun_restarts_a_job_whose_rank_died_from_its_last_checkpoint(data_dir, tmp_path):
    kill = ("--trainer.callbacks+=tests.helpers.KillRankOnce", "--trainer.callbacks.rank", "3")
    args = (*common(data_dir, tmp_path), "--trainer.max_epochs", "3", "--ckpt_path", "last", *kill)
    result = run_local_cluster(2, 2, *args, launcher="torchrun", max_restarts=1)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]

    (run_dir,) = (tmp_path / "SeqNet-mnist").iterdir()  # the restarted job continued the same run
    last = run_dir / "checkpoints" / "last.ckpt"
    runs_of_model = tmp_path / "SeqNet-mnist"
    assert output.count(f"--ckpt_path last: nothing to continue in {runs_of_model}, starting a new run.") == 1
    assert output.count(f"--ckpt_path last: continuing {run_dir}, from checkpoints/last.ckpt (step ") == 1
    assert torch.load(last, map_location="cpu", weights_only=True)["epoch"] == 2
    assert len(scalars(run_dir)["val/acc"]) == 3  # epoch 0 from the first attempt, 1 and 2 after the restart
    assert output.count("Finished: test/acc") == 1


@pytest.fixture
def two_hosts():
    """Two network namespaces joined by a veth pair: hosts 10.99.0.1 and 10.99.0.2, each with its own loopback.

    Needs root and iproute2; the test is skipped, saying why, where they are missing.
    """
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("network namespaces need root and iproute2 (ip)")
    names = [f"lddp{os.getpid()}{side}" for side in "ab"]
    setup = [
        *(["ip", "netns", "add", name] for name in names),
        ["ip", "link", "add", f"{names[0]}v", "type", "veth", "peer", "name", f"{names[1]}v"],
        *(["ip", "link", "set", f"{name}v", "netns", name] for name in names),
        *(["ip", "-n", name, "addr", "add", f"10.99.0.{i + 1}/24", "dev", f"{name}v"] for i, name in enumerate(names)),
        *(["ip", "-n", name, "link", "set", device, "up"] for name in names for device in ("lo", f"{name}v")),
    ]
    try:
        for command in setup:
            made = subprocess.run(command, capture_output=True, text=True)
            if made.returncode != 0:
                pytest.skip(f"cannot make network namespaces here: {' '.join(command)}: {made.stderr.strip()}")
        yield names
    finally:
        for name in names:
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


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


def test_an_unreachable_master_addr_ends_in_one_line_after_the_timeout(data_dir, tmp_path, two_hosts):
    env = {"MASTER_ADDR": "10.99.0.3", "MASTER_PORT": "29713", "NODE_RANK": "1"}  # no host has 10.99.0.3
    node = train_command(data_dir, tmp_path, "--devices", "1", "--num_nodes", "2", *TIMEOUT_10S)
    started = time.monotonic()
    result = run_command(["ip", "netns", "exec", two_hosts[1], *node], 120, env)
    assert result.returncode == 1
    assert 10 <= time.monotonic() - started < 60
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error (rank 1): ") and "(10.99.0.3, 29713)" in last_line and "MASTER_ADDR" in last_line


def test_predict_on_nodes_without_a_shared_folder_writes_every_row_on_node_0(checkpoint, tmp_path):
    """Each "node" runs in a folder of its own, as on cloud machines without a shared filesystem: the rows of node 1
    reach node 0 through the process group, and node 1 writes nothing."""
    best, _ = checkpoint
    command = [sys.executable, str(REPO / "train.py"), "predict", "--ckpt_path", str(best), "--devices", "2"]
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
    assert indices == list(range(TEST_SIZE))  # every test image once, in order, from all 4 processes
    assert not list((tmp_path / "node1").glob("*predictions*")) and not list((tmp_path / "node1").glob(".*"))
