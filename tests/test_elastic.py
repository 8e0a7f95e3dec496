"""When the cluster changes under the job (docs/multinode.md, "Elastic"): an elastic torchrun job of two nodes on this
machine (scripts/local_cluster.sh, NNODES=1:2) that loses a node mid-epoch finishes on the other; one that a node
joins grows; a PyTorchJob's pods, played as processes with the operator's variables, continue after a pod is
killed. Each ends within 1e-4 of an uninterrupted run with the same global batch (plain SGD, deterministic, CPU)."""

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.helpers import (
    REPO,
    WAIT_S,
    TrainJob,
    free_port,
    local_cluster_command,
    max_difference,
    run_local_cluster,
    run_train,
    scalars,
    small_run,
    wait_for,
)

pytestmark = pytest.mark.slow  # long multi-process runs: `make test-fast` leaves them out

LAST = Path("SeqNet-mnist") / "version_0" / "checkpoints" / "last.ckpt"
SGD = ("--model.optimizer", "SGD", "--model.optimizer.lr", "0.05", "--model.one_cycle", "false")
ELASTIC = {"NNODES": "1:2"}


def args(data_dir: Path, root: Path, *more: str, batch_size: int = 50, every_s: str = "0") -> list[str]:
    """Two epochs of 10 steps of a global batch of 100, deterministic, plain SGD, the fault guard's check every 2 steps
    and last.ckpt at each (`every_s`: after that many seconds); no --devices or --num_nodes: the launcher's."""
    every_step = ("--fault_guard.checkpoint_every_s", every_s, "--fault_guard.every_n_steps", "2")
    deterministic = ("--trainer.deterministic", "true")
    return small_run(data_dir, root, *deterministic, *SGD, *every_step, *more, max_epochs=2, batch_size=batch_size)


def final_weights(root: Path) -> dict[str, torch.Tensor]:
    return torch.load(root / LAST, map_location="cpu", weights_only=True)["state_dict"]


@pytest.fixture(scope="module")
def uninterrupted(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """The final weights of the same run in two processes that nothing interrupted."""
    root = tmp_path_factory.mktemp("uninterrupted")
    result = run_train("fit", *args(data_dir, root, "--devices", "2"))
    assert result.returncode == 0, result.stderr[-3000:]
    return final_weights(root)


@pytest.mark.parametrize(
    ("kill_step", "every_s", "from_step"),
    [(13, "0", 12), (1, "60", 0)],
    ids=["in epoch 1, last.ckpt at every check", "at the first step, last.ckpt every minute (a restartable default)"],
)
def test_a_node_lost_leaves_the_other_to_finish_the_run(
    data_dir, tmp_path, uninterrupted, kill_step, every_s, from_step
):
    kill = ("--trainer.callbacks+=tests.helpers.KillNodeOnce", "--trainer.callbacks.rank", "1")
    job = args(
        data_dir, tmp_path, "--ckpt_path", "last", *kill, "--trainer.callbacks.step", str(kill_step), every_s=every_s
    )
    result = run_local_cluster(2, 1, *job, launcher="torchrun", max_restarts=2, env=ELASTIC, timeout=240)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]  # node 0's: the job finished there

    assert (tmp_path / "node-killed").exists()
    assert [path.name for path in (tmp_path / "SeqNet-mnist").iterdir()] == ["version_0"]  # the same run continued
    assert output.count("--ckpt_path last: nothing to continue") == 1  # the first attempt only
    assert len(scalars(tmp_path / LAST.parents[1])["val/acc"]) == 2  # one curve: epoch 0, then 1 after the restart
    lost = f"Node lost: continuing on 1 node(s) of 2 from step {from_step} (torchrun restarted the job; 2 -> 1"
    assert lost in output, output[-4000:]
    assert (
        "Continuing a run of 2 processes on 1: per-device batch 50 -> 100, to keep the global batch of 100." in output
    )
    assert output.count("Finished: test/acc") == 1
    assert max_difference(final_weights(tmp_path), uninterrupted) < 1e-4


def test_a_node_that_joins_later_makes_the_job_grow(data_dir, tmp_path, uninterrupted):
    port = str(free_port())
    env = {
        **os.environ,
        **ELASTIC,
        "LAUNCHER": "torchrun",
        "MASTER_PORT": port,
        "MAX_RESTARTS": "1",
        "PYTHON": sys.executable,
        "PYTHONUNBUFFERED": "1",
    }
    hold = ("--trainer.callbacks+=tests.helpers.HoldUntilStopped", "--trainer.callbacks.step", "13")
    job = args(data_dir, tmp_path, "--ckpt_path", "last", *hold, batch_size=100)  # 1 node: the global batch of 100
    first = subprocess.Popen(
        local_cluster_command(1, 1, *job), cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, start_new_session=True,
    )  # fmt: skip
    joiner = None
    try:
        wait_for(lambda: (tmp_path / "held").exists() or first.poll() is not None, WAIT_S, "node 0 to reach step 13")
        assert first.poll() is None, first.communicate()[0][-4000:]
        joiner = subprocess.Popen(
            local_cluster_command(1, 1, *job), cwd=REPO, env={**env, "FIRST_NODE": "1"}, stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        output, _ = first.communicate(timeout=240)
        joined, _ = joiner.communicate(timeout=60)
    finally:
        for process in (first, joiner):
            if process is not None:
                os.killpg(process.pid, signal.SIGKILL) if process.poll() is None else None
    assert first.returncode == 0, output[-4000:]
    assert joiner.returncode == 0, joined[-4000:]
    assert "Stopped by SIGTERM in epoch 1, after step 14;" in output  # torchrun stopped it for the new node
    restarted_job = output + joined  # its global rank 0 speaks: torchrun's new round may place it on either node
    assert "Node(s) joined: continuing on 2 nodes (1 before) from step 14" in restarted_job
    assert "Continuing a run of 1 processes on 2: per-device batch 100 -> 50" in restarted_job
    assert max_difference(final_weights(tmp_path), uninterrupted) < 1e-4


def test_a_pytorchjob_whose_pod_is_killed_continues_when_the_operator_restarts_the_pods(
    data_dir, tmp_path, uninterrupted
):
    """One process per pod, with the variables the Training Operator sets (WORLD_SIZE, RANK, MASTER_ADDR,
    MASTER_PORT) and Lightning's KubeflowEnvironment; no --devices or --num_nodes. Pod 1 is killed in epoch 1; pod 0
    fails quickly; the operator restarts both (restartPolicy: OnFailure), and the run continues from last.ckpt."""
    kubeflow = ("--trainer.plugins", "lightning.pytorch.plugins.environments.KubeflowEnvironment")
    job = args(data_dir, tmp_path, "--ckpt_path", "last", *kubeflow)
    kill = ("--trainer.callbacks+=tests.helpers.KillRankOnce", "--trainer.callbacks.rank", "1")

    def pods(*extra: str) -> list[tuple[int, str]]:
        """Both pods' exit statuses and output."""
        port, started = str(free_port()), []
        for rank in range(2):
            variables = {"WORLD_SIZE": "2", "RANK": str(rank), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
            env = {**os.environ, **variables, "KUBERNETES_PORT": "tcp://10.96.0.1:443", "PYTHONUNBUFFERED": "1"}
            output = tmp_path / f"pod{rank}-{len(extra)}.log"
            started.append((TrainJob(*job, *extra, output=output, env=env), output))
        try:
            for pod, _ in started:
                pod.wait(120)
            return [(pod.returncode, output.read_text()) for pod, output in started]
        finally:
            for pod, _ in started:
                pod.kill()

    (pod0, out0), (pod1, out1) = pods(*kill)
    assert pod1 == -signal.SIGKILL and pod0 == 1, out0[-3000:]
    assert "another process of the job stopped or failed" in out0

    (pod0, out0), (pod1, out1) = pods()  # the operator's restart: the same pods, the same variables
    assert pod0 == 0 and pod1 == 0, out0[-3000:] + out1[-3000:]
    assert re.search(
        r"--ckpt_path last: continuing \S+version_0, from checkpoints/last\.ckpt \(step 1[0-9], epoch 1\)", out0
    )
    assert max_difference(final_weights(tmp_path), uninterrupted) < 1e-4
