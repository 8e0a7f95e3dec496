"""Jobs that lose a node and go on: an elastic torchrun job on this machine (scripts/local_cluster.sh) that loses a
node finishes on the other, one that a node joins grows, a PyTorchJob's killed pod continues when the operator
restarts the pods; each ends at the weights of a job never interrupted."""

import contextlib
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import NO_NETWORK, REPO, free_port, max_difference, run_command, scalars, small_run, wait_for
from tests.test_multinode import ELASTIC, LAST, cluster, final, pods

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def uninterrupted(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("uninterrupted")
    result = run_command(
        [sys.executable, "train.py", "fit", *small_run(data_dir, root, *ELASTIC, devices=2, max_epochs=2)]
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return final(root)["state_dict"]


def test_an_elastic_job_that_loses_a_node_finishes_on_the_other(data_dir, tmp_path, uninterrupted):
    kill = ("--trainer.callbacks+=tests.instruments.KillNodeOnce", "--trainer.callbacks.step", "13")
    args = small_run(data_dir, tmp_path, *ELASTIC, *kill, max_epochs=2)
    result = cluster(2, 1, *args, launcher="torchrun", env={"NNODES": "1:2", "MAX_RESTARTS": "2"})
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    assert (tmp_path / "node-killed").exists() and [p.name for p in (tmp_path / "SeqNet-mnist").iterdir()] == [
        "version_0"
    ]
    assert (
        "Continuing a run of 2 processes on 1: per-device batch 50 -> 100, to keep the global batch of 100." in output
    )
    assert output.count("Finished: test/acc") == 1 and len(scalars(tmp_path / LAST.parents[1])["val/acc"]) == 2
    assert max_difference(final(tmp_path)["state_dict"], uninterrupted) < 1e-4


def test_an_elastic_job_that_a_node_joins_grows(data_dir, tmp_path, uninterrupted):
    port, env = str(free_port()), {"NNODES": "1:2", "MAX_RESTARTS": "1", "LAUNCHER": "torchrun"}
    env = {**os.environ, **NO_NETWORK, **env, "MASTER_PORT": port, "PYTHON": sys.executable, "PYTHONUNBUFFERED": "1"}
    hold = ("--trainer.callbacks+=tests.instruments.HoldUntilStopped", "--trainer.callbacks.step", "13")
    command = [
        "scripts/local_cluster.sh",
        "1",
        "1",
        "--",
        *small_run(data_dir, tmp_path, *ELASTIC, *hold, max_epochs=2, batch_size=100),
    ]
    nodes = [
        subprocess.Popen(
            command,
            cwd=REPO,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
    ]
    try:
        wait_for(lambda: (tmp_path / "held").exists() or nodes[0].poll() is not None, 120, "node 0 to reach step 13")
        nodes.append(
            subprocess.Popen(
                command,
                cwd=REPO,
                env={**env, "FIRST_NODE": "1"},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )
        outputs = [node.communicate(timeout=240)[0] for node in nodes]
    finally:
        for node in nodes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(node.pid, signal.SIGKILL)
    assert [node.returncode for node in nodes] == [0, 0], outputs[0][-3000:]
    assert "Stopped by SIGTERM in epoch 1, after step 14;" in outputs[0]  # torchrun stopped it for the new node
    assert "Continuing a run of 1 process on 2: per-device batch 100 -> 50" in "".join(outputs)
    assert max_difference(final(tmp_path)["state_dict"], uninterrupted) < 1e-4


def test_a_pytorchjob_whose_pod_is_killed_continues_when_the_operator_restarts_its_pods(
    data_dir, tmp_path, uninterrupted
):
    """One process a pod, with the Training Operator's variables; pod 1 is killed in epoch 1, pod 0 loses it; the
    operator starts both again (restartPolicy: OnFailure), and the run goes on from its last checkpoint."""
    port = str(free_port())

    def operator(node):
        return {
            "WORLD_SIZE": "2",
            "RANK": str(node),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
            "KUBERNETES_PORT": "tcp://10.96.0.1:443",
        }

    kubeflow = ("--trainer.plugins", "lightning.pytorch.plugins.environments.KubeflowEnvironment")
    args = small_run(data_dir, tmp_path, *ELASTIC, *kubeflow, max_epochs=2)
    kill = (
        "--trainer.callbacks+=tests.instruments.KillNodeOnce",
        "--trainer.callbacks.step",
        "13",
        "--trainer.callbacks.node",
        "false",
    )
    (status_0, out_0), (status_1, _) = pods([*args, *kill], operator, [sys.executable, "train.py"])
    assert status_1 == -signal.SIGKILL and status_0 == 1, out_0[-3000:]
    assert "error: lost the connection to another process of the job" in out_0
    (status_0, out_0), (status_1, _) = pods(args, operator, [sys.executable, "train.py"])
    assert status_0 == status_1 == 0, out_0[-3000:]
    assert re.search(r"--ckpt_path last: continuing \S+version_0, from checkpoints/last\.ckpt \(step 1[0-9]", out_0)
    assert max_difference(final(tmp_path)["state_dict"], uninterrupted) < 1e-4
