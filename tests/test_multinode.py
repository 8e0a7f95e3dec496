"""Several "nodes" of train.py on this machine, real processes of every launcher: Lightning's and torchrun under
scripts/local_cluster.sh (an elastic torchrun job: test_elastic.py), a Kubeflow TrainJob's and a PyTorchJob's pods
played with their operators' variables, and two hosts in network namespaces."""

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import TRAIN_SIZE
from tests.helpers import (
    NO_NETWORK,
    REPO,
    free_port,
    left_behind,
    run_command,
    small_run,
)

pytestmark = pytest.mark.slow

LAST = Path("SeqNet-mnist") / "version_0" / "checkpoints" / "last.ckpt"
TORCHRUN = str(Path(sys.executable).parent / "torchrun")


def cluster(nodes: int, devices: int, *args: str, launcher: str = "lightning", env: dict | None = None, timeout=240):
    """`scripts/local_cluster.sh NODES DEVICES -- ARGS`."""
    variables = {"LAUNCHER": launcher, "PYTHON": sys.executable, **(env or {})}
    return run_command(["scripts/local_cluster.sh", str(nodes), str(devices), "--", *args], timeout, variables)


def final(root: Path) -> dict:
    return torch.load(root / LAST, map_location="cpu", weights_only=True)


@pytest.mark.parametrize(("launcher", "devices"), [("lightning", 2), ("torchrun", 1)])
def test_the_nodes_of_a_job_train_one_run_each_sample_once(data_dir, tmp_path, launcher, devices):
    record = "--trainer.callbacks+=tests.instruments.RecordTrainSamples"
    result = cluster(2, devices, *small_run(data_dir, tmp_path, record, accelerator=None), launcher=launcher)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-3000:]
    processes = 2 * devices
    assert output.count(f"Global batch {50 * processes} = 50 per device x {processes} processes") == 1
    seen = [json.loads(path.read_text()) for path in (tmp_path / "samples").glob("rank*_epoch0.json")]
    assert len(seen) == processes and sorted(sum(seen, [])) == list(range(TRAIN_SIZE - 200))
    assert [p.name for p in (tmp_path / "SeqNet-mnist").iterdir()] == ["version_0"]  # one run, by global rank 0
    assert output.count("Finished: test/acc") == 1 and "terminate called" not in output


# The elastic cases: two epochs of 10 steps of a global batch of 100, deterministic plain SGD, a check and a save
# every 2 steps; no --devices or --num_nodes: torchrun's.
ELASTIC = (
    "--trainer.deterministic",
    "true",
    "--model.optimizer",
    "SGD",
    "--model.optimizer.lr",
    "0.05",
    "--stop.every_n_steps",
    "2",
    "--stop.save_every_s",
    "0",
    "--ckpt_path",
    "last",
)


def torch_plugin(port: str):
    """The variables the Kubeflow Trainer's torch plugin sets for each of two nodes of a process each (torchrun's)."""
    return lambda node: {
        "PET_NNODES": "2",
        "PET_NPROC_PER_NODE": "1",
        "PET_NODE_RANK": str(node),
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": port,
    }


def pods(args, env_of, command: list[str], nodes: int = 2, timeout: float = 240) -> list[tuple[int, str]]:
    """Each pod's exit status and output: `command ARGS` (or `args(node)`) with `env_of(node)`'s variables; nothing
    is left behind."""
    started = []
    for node in range(nodes):
        env = {**os.environ, **NO_NETWORK, **env_of(node), "PYTHONUNBUFFERED": "1"}
        arguments = args(node) if callable(args) else args
        started.append(
            subprocess.Popen(
                [*command, *arguments],
                cwd=REPO,
                env=env,
                text=True,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    try:
        outputs = [pod.communicate(timeout=timeout)[0] for pod in started]
        assert all(left_behind(pod.pid) == "" for pod in started)
    finally:
        for pod in started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pod.pid, signal.SIGKILL)
    return [(pod.returncode, output) for pod, output in zip(started, outputs, strict=True)]


def test_a_trainjobs_nodes_train_one_run_with_the_processes_its_runtime_sets(data_dir, tmp_path):
    """The variables of the Kubeflow Trainer's torch plugin (PET_*, read by torchrun); `--devices 2`, which the
    TrainJob contradicts, gives way to what torchrun started, said in a line."""
    plugin = torch_plugin(str(free_port()))
    (status_0, out_0), (status_1, out_1) = pods(
        small_run(data_dir, tmp_path, devices=2), plugin, [TORCHRUN, "train.py"]
    )
    assert status_0 == status_1 == 0, out_0[-3000:] + out_1[-3000:]
    said = "torchrun started 2 node(s) x 1 process(es): training on those, not --devices 2 --num_nodes 1."
    assert said in out_0 and "Finished: test/acc" in out_0
    assert [p.name for p in (tmp_path / "SeqNet-mnist").iterdir()] == ["version_0"]


def test_a_node_whose_data_is_missing_says_so_and_the_job_ends_keeping_nothing(data_dir, tmp_path):
    """The node's process says what is missing, with its rank and host; the other loses it, and says so."""
    plugin = torch_plugin(str(free_port()))
    missing = tmp_path / "not-there"
    args = lambda node: small_run(missing if node else data_dir, tmp_path)  # noqa: E731
    (status_0, out_0), (status_1, out_1) = pods(args, plugin, [TORCHRUN, "train.py"], timeout=120)
    assert status_0 != 0 and status_1 != 0
    said = [[line for line in output.splitlines() if line.startswith("error")] for output in (out_1, out_0)]
    assert len(said[0]) == 1, said
    assert said[0][0].startswith(f"error (rank 1 on {socket.gethostname()}): MNIST is not in {missing}"), said
    assert said[1] == [
        "error: lost the connection to another process of the job, which ended first (its output says"
        " why; one killed by SIGKILL, for want of memory say, says nothing)."
    ], said
    assert not (tmp_path / "SeqNet-mnist").exists()


def test_two_hosts_with_their_own_addresses_find_each_other(data_dir, tmp_path, two_hosts):
    """Gloo would advertise 127.0.0.1 on these hosts; the rendezvous names the interface that reaches node 0."""
    env = {**os.environ, **NO_NETWORK, "MASTER_ADDR": "10.99.0.1", "MASTER_PORT": "29712", "PYTHONUNBUFFERED": "1"}
    env = {key: value for key, value in env.items() if not key.endswith("_SOCKET_IFNAME")}
    command = [sys.executable, "train.py", *small_run(data_dir, tmp_path, "--num_nodes", "2", devices=1)]
    nodes = [
        subprocess.Popen(
            ["ip", "netns", "exec", host, *command],
            cwd=REPO,
            env={**env, "NODE_RANK": str(rank)},
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for rank, host in enumerate(two_hosts)
    ]
    try:
        outputs = [node.communicate(timeout=180)[0] for node in nodes]
    finally:
        for node in nodes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGKILL)
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-2000:] + outputs[1][-2000:]
    for rank, host in enumerate(two_hosts):
        assert f"Reaching the first node (10.99.0.1) through {host}v" in outputs[rank]
    assert "Finished: test/acc" in outputs[0]


def test_nodes_given_different_devices_under_lightnings_launcher_end_at_once_leaving_nothing(data_dir, tmp_path):
    """Node 0 starts two processes, node 1 one: each node says so in one line and ends, node 0's second process with
    it (it was still importing, or waiting to meet), where they would wait for each other for half an hour."""
    port = str(free_port())
    env_of = lambda node: {"NODE_RANK": str(node), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}  # noqa: E731
    args = lambda node: small_run(data_dir, tmp_path, "--num_nodes", "2", devices=2 - node)  # noqa: E731
    (status_0, out_0), (status_1, out_1) = pods(args, env_of, [sys.executable, "train.py"], timeout=120)
    differ = "the nodes were started with different settings: --trainer.devices is 2 on node 0 and 1 on node 1."
    assert (status_0, status_1) == (1, 1), out_0[-2000:] + out_1[-2000:]
    assert [line for line in out_0.splitlines() if line.startswith("error")] == [
        f"error: {differ} Start every node with the same command line."
    ]
    assert [line for line in out_1.splitlines() if line.startswith("error")] == [
        f"error (node 1 on {socket.gethostname()}): {differ} Start every node with the same command line."
    ]
    assert not (tmp_path / "SeqNet-mnist").exists()
