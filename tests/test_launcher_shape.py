"""The processes per node and the nodes a launcher started (app/job/launcher_shape.py), read from the variables that
torchrun, SLURM and a PyTorchJob set, and what the Trainer gets for the command's --devices and --num_nodes."""

import pytest
from lightning.pytorch.plugins.environments import KubeflowEnvironment

from app.errors import UserError
from app.job import launcher_shape as launcher_shape_module
from app.job.launcher_shape import LauncherShape, launcher_shape

TORCHRUN = {"TORCHELASTIC_RUN_ID": "job", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "6", "GROUP_WORLD_SIZE": "3"}
LAUNCHERS = ("TORCHELASTIC_RUN_ID", "SLURM_NTASKS", "SLURM_JOB_NAME", "PET_NNODES", "LOCAL_RANK", "RANK")


@pytest.fixture
def env(monkeypatch):
    for name in LAUNCHERS:
        monkeypatch.delenv(name, raising=False)

    def set_variables(variables: dict[str, str]) -> None:
        for name, value in variables.items():
            monkeypatch.setenv(name, value)

    return set_variables


def test_torchrun_gives_its_processes_per_node_and_nodes(env):
    env({**TORCHRUN, "TORCHELASTIC_MAX_RESTARTS": "0"})
    shape = launcher_shape(None)
    assert shape == LauncherShape("torchrun", devices=2, num_nodes=3)
    assert not shape.restartable


def test_torchrun_nodes_of_different_sizes_are_named_in_one_line(env):
    """`--nproc-per-node 1` on one node and 2 on the other: Lightning advised --devices and --num_nodes, which the
    user had not given, from each process."""
    env({**TORCHRUN, "LOCAL_WORLD_SIZE": "1", "WORLD_SIZE": "3", "GROUP_WORLD_SIZE": "2"})
    with pytest.raises(UserError) as error:
        launcher_shape(None)
    assert str(error.value) == (
        "torchrun started 1 process(es) on this node but 3 on its 2 nodes: give every node the same --nproc-per-node."
    )


@pytest.mark.parametrize(("nnodes", "elastic"), [("1:4", "1:4"), ("2:2", None), ("3", None)])
def test_an_elastic_torchrun_job_is_one_whose_nnodes_is_a_range(env, nnodes, elastic):
    env({**TORCHRUN, "PET_NNODES": nnodes})
    assert launcher_shape(None).elastic == elastic


@pytest.mark.parametrize(("restarts", "nnodes", "restartable"), [("3", "2", True), ("0", "1:2", False)])
def test_a_torchrun_job_that_restarts_after_a_failure_is_restartable(env, restarts, nnodes, restartable):
    env({**TORCHRUN, "TORCHELASTIC_MAX_RESTARTS": restarts, "PET_NNODES": nnodes})
    assert launcher_shape(None).restartable == restartable  # an elastic job without restarts ends at a loss


def test_slurm_gives_its_tasks_per_node_and_nodes(env):
    env({"SLURM_NTASKS": "8", "SLURM_NNODES": "2", "SLURM_JOB_NAME": "train"})
    assert launcher_shape(None) == LauncherShape("SLURM", devices=4, num_nodes=2)


def test_a_pytorchjob_is_one_process_per_pod(env):
    env({"WORLD_SIZE": "3", "RANK": "1", "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456"})
    assert launcher_shape(KubeflowEnvironment()) == LauncherShape("the PyTorchJob", devices=1, num_nodes=3)


def test_without_a_launcher_there_is_no_shape(env):
    assert launcher_shape(None) is None


FIXED = LauncherShape("torchrun", devices=2, num_nodes=3)
ELASTIC = LauncherShape("torchrun", devices=2, num_nodes=1, elastic="1:3", restarts=3)


@pytest.mark.parametrize("command", [("auto", 1), (None, None), (2, 1), ("2", "3"), ("-1", 3), ("auto", 3)])
def test_options_left_out_or_the_same_take_the_launchers(command):
    assert FIXED.settle(*command) == {"devices": 2, "num_nodes": 3}  # jsonargparse gives `--devices 2` as "2"


@pytest.mark.parametrize(("command", "options"), [(("4", 1), "--devices 4"), ((2, 2), "--num_nodes 2")])
def test_other_options_under_a_fixed_launch_are_refused_in_one_line(command, options):
    with pytest.raises(UserError) as error:
        FIXED.settle(*command)
    assert str(error.value) == (
        f"{options}: torchrun started 3 node(s) x 2 process(es). Leave --devices and --num_nodes out (the launcher's"
        " are used), or make them match it."
    )


def test_under_an_elastic_launch_the_launcher_wins_and_says_so(monkeypatch):
    said = []  # what rank 0 prints (Lightning's logger may not reach pytest's capture, by the order of imports)
    monkeypatch.setattr(launcher_shape_module, "rank_zero_info", said.append)
    assert ELASTIC.settle("2", 3) == {"devices": 2, "num_nodes": 1}
    line = "torchrun started 1 node(s) x 2 process(es) (an elastic job, --nnodes 1:3): training on those, not"
    assert said == [f"{line} --num_nodes 3."]


def test_gpu_indices_are_left_to_lightning():
    assert FIXED.settle([0, 1], 1) == {"devices": [0, 1], "num_nodes": 1}
    assert FIXED.settle("0,1", 1) == {"devices": "0,1", "num_nodes": 1}


@pytest.mark.parametrize(("shape", "given", "every_s"), [(ELASTIC, None, 60), (ELASTIC, 5, 5), (FIXED, None, None)])
def test_a_job_the_launcher_restarts_saves_last_ckpt_every_minute_unless_told_otherwise(shape, given, every_s):
    assert shape.checkpoint_every_s(given) == every_s
