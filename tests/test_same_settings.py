"""Nodes started with different settings are named before training, in one line, under Lightning's launcher and
torchrun alike; settings that may differ per node (docs/multinode.md) are left alone. The line itself is tried
in-process."""

import shutil

import pytest

from app.command_line.same_settings import compared_settings, disagreement, program_digest
from tests.helpers import REPO, run_local_cluster, small_run

SEQNET = {"class_path": "models.SeqNet", "init_args": {"optimizer": {"class_path": "torch.optim.Adam"}}}


def settings(lr: float = 0.01, model: dict = SEQNET, **trainer) -> dict:
    model = {**model, "init_args": {"optimizer": {**model["init_args"]["optimizer"], "init_args": {"lr": lr}}}}
    return {
        "model": model,
        "data": {"dataset": "mnist", "data_dir": "data", "num_workers": 0, "batch_size": 64},
        "trainer": {"max_epochs": 10, "devices": 1, "default_root_dir": "runs", **trainer},
        "seed_everything": 42,
        "subcommand": "fit",
        "starts_from": None,
    }


def test_each_option_that_differs_is_named_with_its_value_on_each_node():
    line = disagreement({0: settings(), 1: settings(lr=0.5), 2: settings(max_epochs=2)})
    assert line == (
        "the nodes were started with different settings: --model.optimizer.lr is 0.01 on nodes 0, 2 and 0.5 on"
        " node 1; --trainer.max_epochs is 10 on nodes 0, 1 and 2 on node 2. Start every node with the same command"
        " line."
    )


def test_nodes_that_run_other_versions_of_the_program_are_named(tmp_path):
    """Another version of a model (another layer's size) failed in DDP's C++ check, "a bug"; another sampler's
    would have trained in silence. The same code at another path is the same program."""
    copies = [tmp_path / "node_0", tmp_path / "node_1"]
    for copy in copies:
        for path in [REPO / "train.py", *(REPO / "models").glob("*.py")]:
            (copy / path.relative_to(REPO)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(path, copy / path.relative_to(REPO))
    assert program_digest(copies[0]) == program_digest(copies[1])
    seqnet = copies[1] / "models" / "seqnet.py"
    seqnet.write_text(seqnet.read_text().replace("200", "100"))
    digests = [program_digest(copy) for copy in copies]
    line = disagreement({node: {**settings(), "program": digest} for node, digest in enumerate(digests)})
    assert line == (
        f"the nodes were started with different settings: the program's code (a digest of train.py, app/, models/ and"
        f" datamodules/) is {digests[0]} on node 0 and {digests[1]} on node 1. Start every node with the same version"
        " of the program and the same command line."
    )


def test_another_model_is_named_once_not_by_its_arguments():
    convnet = {**SEQNET, "class_path": "models.ConvNet"}
    assert "--model is SeqNet on node 0 and ConvNet on node 1." in disagreement(
        {0: settings(), 1: settings(model=convnet)}
    )


def test_the_subcommand_and_the_checkpoint_started_from_are_compared_too():
    """Alone: the options they bring with them (test's `--verbose`, the normalisation a checkpoint's weights were
    trained with) were listed as differences of their own."""
    node_1 = {**settings(), "subcommand": "test", "starts_from": "step 16", "verbose": True}
    node_1["model"] = {**node_1["model"], "init_args": {**node_1["model"]["init_args"], "pixel_mean": 0.1307}}
    assert disagreement({0: settings(), 1: node_1}) == (
        "the nodes were started with different settings: the subcommand is fit on node 0 and test on node 1; the"
        " checkpoint of --ckpt_path is null on node 0 and step 16 on node 1. Start every node with the same command"
        " line."
    )


def test_paths_loading_workers_and_the_launchers_shape_may_differ_per_node():
    node_1 = settings()
    node_1["data"].update(data_dir="/local/disk/data", num_workers=4)
    node_1["trainer"].update(devices=8, default_root_dir="/mnt/runs")
    assert compared_settings(settings()) == compared_settings(node_1)
    assert compared_settings(settings()) != compared_settings(settings(lr=0.5))


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["lightning", "torchrun"])
def test_nodes_started_with_different_settings_end_before_training_in_one_line(data_dir, tmp_path, launcher):
    root = tmp_path / "runs"
    node_1 = "--model.optimizer.lr 0.5 --trainer.max_epochs 2"  # each alone drifts apart, or hangs at the end
    argv = small_run(data_dir, root, accelerator=None, max_epochs=1)
    result = run_local_cluster(2, 1, *argv, launcher=launcher, env={"NODE_ARGS_1": node_1}, timeout=120)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    errors = [line for line in output.splitlines() if line.startswith("error")]
    assert len(errors) == 1 and errors[0].endswith(
        "the nodes were started with different settings: --trainer.max_epochs is 1 on node 0 and 2 on node 1;"
        " --model.optimizer.lr is 0.01 on node 0 and 0.5 on node 1. Start every node with the same command line."
    ), output[-3000:]
    assert "Epoch 0" not in output
    assert "Traceback" not in output or launcher == "torchrun"  # torchrun's agent reports a failed worker so
    assert not root.exists()  # nothing written


@pytest.mark.slow
def test_nodes_that_differ_only_in_per_node_settings_train_as_one_job(data_dir, tmp_path):
    local_copy = tmp_path / "node1-data"
    shutil.copytree(data_dir, local_copy)
    node_1 = f"--data.data_dir {local_copy} --data.num_workers 1"
    argv = small_run(data_dir, tmp_path / "runs", "--trainer.max_steps", "3", accelerator=None, max_epochs=1)
    result = run_local_cluster(2, 1, *argv, env={"NODE_ARGS_1": node_1}, timeout=120)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]


def test_arguments_of_the_same_class_that_differ_are_shown_whole_and_processes_named_where_nodes_cannot_be():
    callback = {"class_path": "tests.helpers.SlowValidation", "init_args": {"seconds": 1}}
    other = {**callback, "init_args": {"seconds": 7}}
    node_0, node_1 = settings(), settings()
    node_0["trainer"]["callbacks"], node_1["trainer"]["callbacks"] = [callback], [other]
    line = disagreement({0: node_0, 1: node_1}, "global rank")
    assert '"seconds": 1' in line and '"seconds": 7' in line and "on global rank 0 and " in line
