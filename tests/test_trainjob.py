"""A Kubeflow Trainer TrainJob (docs/kubernetes.md) played on one machine: each of its two "nodes" (the pods of the
TrainJob's JobSet) runs the TrainJob's command, `torchrun train.py ...`, with exactly the variables that the
`torch-distributed` runtime's torch plugin sets (kubeflow/trainer, pkg/runtime/framework/plugins/torch/torch.go,
`EnforceMLPolicy`): PET_NNODES (`numNodes`), PET_NPROC_PER_NODE (`numProcPerNode`: a number, or `auto`),
PET_NODE_RANK (the node's Job completion index), PET_MASTER_ADDR (`<trainjob>-node-0-0.<trainjob>`, the first node's
pod; here 127.0.0.1) and PET_MASTER_PORT (29500; here a free port, since tests run side by side). torchrun reads
each as its option of the same name (`--nnodes`, `--nproc-per-node`, ...)."""

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from torch.distributed.run import determine_local_world_size

from tests.helpers import NO_NETWORK, REPO, free_port, left_behind, small_run

pytestmark = pytest.mark.slow  # long multi-process runs: `make test-fast` leaves them out

TORCHRUN = str(Path(sys.executable).parent / "torchrun")  # the command a TrainJob's container runs


def play_a_trainjob(
    nproc_per_node: str, args: list[str], nodes: int = 2, last_node_args: tuple[str, ...] = (), timeout: float = 240
) -> list[tuple[int, str]]:
    """Each node's exit status and output, once every node has ended (at most `timeout` s); nothing may be left
    running. `last_node_args`: more arguments for the last node alone, as when its pod's command was edited."""
    port, pods = str(free_port()), []
    for node_rank in range(nodes):
        plugin = {
            "PET_NNODES": str(nodes),
            "PET_NPROC_PER_NODE": nproc_per_node,
            "PET_NODE_RANK": str(node_rank),
            "PET_MASTER_ADDR": "127.0.0.1",
            "PET_MASTER_PORT": port,
        }
        env = {**os.environ, **NO_NETWORK, **plugin, "PYTHONUNBUFFERED": "1"}
        node_args = [*args, *(last_node_args if node_rank == nodes - 1 else ())]
        pods.append(
            subprocess.Popen(
                [TORCHRUN, "train.py", *node_args], cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT, start_new_session=True,
            )
        )  # fmt: skip
    try:
        outputs = [pod.communicate(timeout=timeout)[0] for pod in pods]
        left = [left_behind(session=pod.pid) for pod in pods]
    finally:
        for pod in pods:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pod.pid, signal.SIGKILL)
            pod.wait()
    assert left == [""] * nodes, left
    return [(pod.returncode, output) for pod, output in zip(pods, outputs, strict=True)]


def test_a_trainjobs_nodes_train_one_run_with_the_processes_the_plugin_sets(data_dir, tmp_path):
    """No --devices or --num_nodes: train.py takes torchrun's, here `auto` (on a machine without a GPU: a process per
    core, as torchrun counts them; a number of processes is read the same way, and the tests below give 1)."""
    (status_0, output_0), (status_1, output_1) = play_a_trainjob("auto", small_run(data_dir, tmp_path))
    assert status_0 == 0 and status_1 == 0, output_0[-3000:] + output_1[-3000:]
    processes = 2 * determine_local_world_size("auto")
    assert f" x {processes} processes x 1 accumulated" in output_0, output_0[-3000:]  # the global batch's line
    assert "Finished: test/acc" in output_0
    run = tmp_path / "SeqNet-mnist" / "version_0"
    assert [path.name for path in run.parent.iterdir()] == ["version_0"]  # one run, written by global rank 0
    assert (run / "checkpoints" / "last.ckpt").is_file()


def test_a_command_line_that_contradicts_the_plugins_variables_ends_in_one_line(data_dir, tmp_path):
    """`--devices 2` where the TrainJob gives each node one process: one line for the whole job, before any process
    trains, and nothing written."""
    nodes = play_a_trainjob("1", small_run(data_dir, tmp_path, devices=2))
    assert all(status != 0 for status, _output in nodes), nodes
    said = [line for _status, output in nodes for line in output.splitlines() if line.startswith("error")]
    assert len(said) == 1, "".join(output[-3000:] for _status, output in nodes)  # from the process that failed first
    assert said[0].endswith(
        ": --devices 2: torchrun started 2 node(s) x 1 process(es). Leave --devices and --num_nodes out (the"
        " launcher's are used), or make them match it."
    ), said
    assert not (tmp_path / "SeqNet-mnist").exists()


def test_a_node_whose_process_fails_before_the_meeting_ends_the_whole_job_in_one_line(data_dir, tmp_path):
    """The other node's process, waiting to meet it, ends too, quietly, where it would have waited for the
    process-group timeout (30 minutes): torchrun's agent holds the job's store, where the failed process said so."""
    missing = tmp_path / "not-there"
    nodes = play_a_trainjob(
        "1", small_run(data_dir, tmp_path), last_node_args=("--data.data_dir", str(missing)), timeout=60
    )
    assert all(status != 0 for status, _output in nodes), nodes
    said = [line for _status, output in nodes for line in output.splitlines() if line.startswith("error")]
    assert len(said) == 1 and said[0].startswith("error (rank 1): MNIST is not in"), said
    assert not (tmp_path / "SeqNet-mnist").exists()
