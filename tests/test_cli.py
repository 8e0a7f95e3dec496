"""train.py's command line, in this process: the defaults, what --ckpt_path names, and one line per mistake."""

import fcntl
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
import torch
import yaml
from lightning.pytorch import Callback
from lightning.pytorch.strategies import SingleDeviceStrategy

from app.launch import busy_cores
from app.plugins import RendezvousDDPStrategy
from app.settings import command_line
from tests.helpers import max_difference, one_error_line, run_in_process, small_run
from tests.test_checkpoint_io import Code
from train import TrainCLI


@pytest.fixture
def run(checkpoint, tmp_path) -> Path:
    """A copy of the session's trained run, `<tmp_path>/runs/SeqNet-mnist/version_0`, its best checkpoint as last."""
    best, _ = checkpoint
    run = tmp_path / "runs" / "SeqNet-mnist" / "version_0"
    shutil.copytree(best.parents[1], run, ignore=shutil.ignore_patterns("test", "predict", "validate"))
    shutil.copy(best, run / "checkpoints" / "last.ckpt")
    return run


def error(*args: str) -> str:
    """The one line `train.py ARGS` ends with."""
    return one_error_line(run_in_process(*args))


def test_the_defaults_are_seqnet_on_fashion_mnist_with_ddp_and_the_shortcuts_stand_for_the_trainers_options():
    printed = run_in_process("--devices", "2", "--num_nodes=3", "--print_config")
    assert printed.returncode == 0, printed.stderr[-2000:]
    config = yaml.safe_load(printed.stdout)
    assert config["model"]["class_path"] == "models.SeqNet" and config["data"]["dataset"] == "fashion_mnist"
    assert config["trainer"]["strategy"] == "auto" and config["trainer"]["max_epochs"] == 10
    assert (config["trainer"]["devices"], config["trainer"]["num_nodes"], config["seed_everything"]) == ("2", 3, 42)
    assert config["checkpoint"]["monitor"] == "val/acc" and config["last_checkpoint"]["filename"] == "last"


def test_help_describes_this_program_every_subcommand_and_what_its_ckpt_path_means():
    top = run_in_process("--help")
    assert top.returncode == 0 and "(required)" not in top.stdout
    for subcommand in ("(none)", "fit", "validate", "test", "predict", "export"):
        assert f"\n  {subcommand} " in top.stdout, subcommand
    helps = {name: run_in_process(name, "--help").stdout for name in ("fit", "validate", "test", "predict")}
    for option in ("--stop.every_n_steps", "--watchdog.timeout", "--trainer.devices", "--data.predict_dir"):
        assert option in helps["fit"], option
    assert "The run to continue, in its folder and with its settings: last" in " ".join(helps["fit"].split())
    for name, text in helps.items():
        text = " ".join(text.split())
        assert text.count("last (the newest run of this --model and --data.dataset") == 1, name
        assert '"hpc"' not in text and "registry:" not in text and "If None and the model instance" not in text, name
        assert "make sure you never run on your " not in text and "Useful to " not in text, name  # cut sentences
    assert "The trained weights (required: what to predict): last" in " ".join(helps["predict"].split())


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (
            ["--trainer.max_epoch", "3"],
            "error: --trainer.max_epoch: no such option; did you mean --trainer.max_epochs?",
        ),
        (["--epochs", "3"], "error: --epochs: no such option; did you mean --trainer.max_epochs?"),
        (["--lr", "0.1"], "error: --lr: no such option; did you mean --model.optimizer.lr?"),
        (["--frobnicate", "1"], "error: --frobnicate: no such option. train.py fit --help lists every option."),
        (  # a folder named like a subcommand is no subcommand
            ["--trainer.default_root_dir", "test", "--frobnicate", "1"],
            "error: --frobnicate: no such option. train.py fit --help lists every option.",
        ),
        (["--model.widht", "3"], "error: --model.widht: no such option"),
        (
            ["--trainer.gpus", "2"],
            "error: --trainer.gpus is an option of Lightning 1.x; today: --trainer.devices N with"
            " --trainer.accelerator gpu.",
        ),
        (["--trainer.resume_from_checkpoint", "x"], "today: --ckpt_path"),
        (["--trainer.max_epochs", "abc"], "error: --trainer.max_epochs abc: Expected a <class 'int'>"),
        (["--model.optimizer.lr", "abc"], "error: --model.optimizer.lr abc: Expected a <class 'float'>"),
        (["--data.batch_size", "0"], "error: --data.batch_size 0: Not of type PositiveInt: 0 does not conform to"),
        (["--data.dataset", "cifar"], "expected one of mnist, fashion_mnist"),
        (["--trainer.max_epochs"], "error: argument --trainer.max_epochs: expected one argument"),
        (["--trainer.check_val_every_n_epoch", "0"], "error: --trainer.check_val_every_n_epoch 0: must be 1 or more."),
        (["--seed_everything", "-1"], "error: --seed_everything -1: must be from 0 to 4294967295."),
        (["--model", "Convnet"], "error: --model Convnet: no such model; did you mean ConvNet? Known: ConvNet, SeqNet"),
        (["--model", "MyNet"], "error: --model MyNet: no such model. Known: ConvNet, SeqNet (a subclass of"),
        (["--model.optimizer", "Adamw"], "error: --model.optimizer Adamw: no such optimizer; did you mean AdamW?"),
        (["--model.optimizer", "NoSuchOpt"], "no such optimizer. Known: ASGD, Adadelta, "),
        (["--model.lr_scheduler", "Steplr"], "no such learning-rate scheduler; did you mean StepLR? Known:"),
        (["--learning_rate", "0.1"], "error: --learning_rate: no such option; did you mean --model.optimizer.lr?"),
        (["--num_epochs", "3"], "error: --num_epochs: no such option; did you mean --trainer.max_epochs?"),
        (["--output_dir", "x"], "error: --output_dir: no such option; did you mean --trainer.default_root_dir?"),
    ],
)
def test_a_mistake_on_the_command_line_is_one_line_with_its_deepest_cause(args, line):
    assert line in error(*args)


@pytest.mark.parametrize(
    ("args", "line"),
    [  # what torch, Lightning or the project's classes say of the user's values, as they are built, before training
        (["--model.optimizer.lr", "-1"], "error: --model.optimizer.lr -1.0: Invalid learning rate: -1.0"),
        (["--model.optimizer.betas", "[2,3]"], "error: --model.optimizer.betas [2.0, 3.0]: Invalid beta parameter"),
        (["--devices", "-1"], "error: --trainer.devices -1: `devices` selected with `CPUAccelerator` should be an int"),
        (["--checkpoint.mode", "bad"], "error: --checkpoint.mode bad: `mode` can be min, max but got bad"),
        (["--last_checkpoint.save_top_k", "-5"], "error: --last_checkpoint.save_top_k -5: Invalid value for save"),
        (["--model.weights", "no/such.ckpt"], "error: --model.weights no/such.ckpt: no such file. Give a checkpoint"),
        (
            ["--trainer.plugins", "lightning.pytorch.plugins.environments.KubeflowEnvironment"],
            "error: --trainer.plugins KubeflowEnvironment: WORLD_SIZE is not set. The Training Operator sets it",
        ),
        (["--model.pixel_mean", "0.5"], "error: --model.pixel_mean 0.5 --model.pixel_std None: pixel_mean and"),
        (["--model", "ConvNet", "--model.kernel_sizes", "[13,13]"], "error: --model.kernel_sizes [13, 13]: kernel_"),
        (
            ["--trainer.sync_batchnorm", "true"],
            "error: --trainer.sync_batchnorm true needs GPUs (torch's SyncBatchNorm",
        ),
        (
            ["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor=a", "--trainer.callbacks.mode=x"],
            "error: --trainer.callbacks EarlyStopping: `mode` can be min, max, got x",
        ),
    ],
)
def test_a_value_a_class_refuses_as_it_is_built_is_one_line_naming_the_option_before_anything(args, line, tmp_path):
    assert line in error(*args, "--trainer.accelerator", "cpu", "--trainer.default_root_dir", str(tmp_path))
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("option", "raised"),
    [
        ("--trainer.callbacks+=tests.instruments.BrokenAtBuild", "the table of intervals is empty"),
        ("--model=tests.tiny_net.BrokenNet", "the table of layers is empty"),
    ],
)
def test_a_bug_of_a_class_the_settings_name_keeps_its_traceback(option, raised, tmp_path):
    """A ValueError that names none of the values given is the class's own: no line blames an option."""
    result = run_in_process(option, "--trainer.default_root_dir", str(tmp_path))
    assert result.returncode == 1
    assert "Traceback" in result.stderr and f"ValueError: {raised}" in result.stderr
    assert "error: --" not in result.stderr


def test_the_subcommand_is_found_after_the_config_and_an_options_value_is_no_subcommand(tmp_path):
    """`--config=FILE fit` is LightningCLI's (a config of the subcommands' sections); a value named like a subcommand
    is a value; one process trains without a process group, two with the rendezvous."""
    config = tmp_path / "nested.yaml"
    config.write_text("fit:\n  trainer:\n    max_epochs: 3\n")
    for args in (["--config=" + str(config), "fit"], ["--config", str(config), "fit"]):
        printed = run_in_process(*args, "--print_config")
        assert printed.returncode == 0 and yaml.safe_load(printed.stdout)["trainer"]["max_epochs"] == 3, printed.stderr
    (tmp_path / "flat.yaml").write_text("trainer:\n  max_epochs: 3\n")  # a subcommand's own: after it
    assert error(f"--config={tmp_path / 'flat.yaml'}", "fit") == (
        f"error: --trainer.max_epochs (in {tmp_path / 'flat.yaml'}): a --config before the subcommand holds each"
        " subcommand's settings under its name (fit:); give this file after it: train.py fit --config FILE."
    )
    (tmp_path / "printed.yaml").write_text("model:\n  class_path: models.SeqNet\n  init_args:\n    one_cycle: false\n")
    assert error(f"--config={tmp_path / 'printed.yaml'}", "fit").startswith(  # as --print_config writes a class
        f"error: --model.one_cycle (in {tmp_path / 'printed.yaml'}): a --config before the subcommand holds each"
    )
    assert error("--trainer.max_epochs", "1", "test") == (
        "error: test after options: the subcommand goes first (train.py test OPTIONS)."
    )
    assert command_line(["--trainer.default_root_dir", "fit", "--devices=2"], ["fit", "test"]) == (
        ["fit", "--trainer.default_root_dir", "fit", "--trainer.devices=2"],
        None,
    )
    built = {}
    for devices in (1, 2):  # the Trainer each builds, kept before it fits
        with mock.patch.object(
            TrainCLI, "before_fit", lambda cli, n=devices: built.update({n: cli.trainer}) or sys.exit()
        ):
            run_in_process("fit", "--devices", str(devices), "--trainer.accelerator", "cpu")
    assert type(built[1].strategy) is SingleDeviceStrategy and type(built[2].strategy) is RendezvousDDPStrategy


def test_a_piece_turned_off_by_its_own_option_is_not_in_the_trainer(tmp_path):
    """Off means absent: no handler, no thread, no hook of a piece whose option turned it off."""
    built = {}
    off = ("--stop.every_n_steps=0", "--watchdog.timeout=0", "--dashboard.every_n_steps=0", "--trainer.logger=false")
    for given in ((), off):
        with mock.patch.object(
            TrainCLI, "before_fit", lambda cli, n=given: built.update({n: cli.trainer}) or sys.exit()
        ):
            run_in_process("fit", "--trainer.accelerator", "cpu", "--trainer.default_root_dir", str(tmp_path), *given)
    names = {given: {type(callback).__name__ for callback in trainer.callbacks} for given, trainer in built.items()}
    pieces = {"GracefulStop", "StallWatchdog", "Dashboard", "LearningRateMonitor"}
    assert pieces <= names[()] and not pieces & names[off]


def test_an_unknown_option_of_a_config_file_names_the_file(tmp_path):
    config = tmp_path / "mine.yaml"
    config.write_text("trainer:\n  max_epoch: 3\n")
    assert error("--config", str(config)) == (
        f"error: --trainer.max_epoch (in {config}): no such option; did you mean --trainer.max_epochs?"
    )


def test_a_config_file_of_lightning_1_is_answered_with_todays_names(tmp_path):
    config = tmp_path / "old.yaml"
    config.write_text("trainer:\n  gpus: 2\n")
    assert f"error: in {config}: --trainer.gpus is an option of Lightning 1.x; today: --trainer.devices N" in error(
        "--config", str(config)
    )
    # What Lightning 1.9's --print_config wrote: every stale name at once, with today's way to say it
    config.write_text("trainer:\n  max_epochs: 2\n  ipus: null\n  replace_sampler_ddp: true\n  amp_backend: native\n")
    line = error("--config", str(config), "--checkpoint.period", "2")
    assert f"in {config}: --trainer.ipus, --trainer.replace_sampler_ddp, --trainer.amp_backend are options" in line
    assert "--trainer.replace_sampler_ddp → --trainer.use_distributed_sampler;" in line
    assert "--checkpoint.period → --checkpoint.every_n_epochs" in line
    assert "--trainer.accelerator ddp: Lightning 1.x's name; today: --trainer.strategy ddp." in error(
        "--trainer.accelerator", "ddp"
    )
    assert "--trainer.strategy ddp_sharded: Lightning 1.x's name; today: --trainer.strategy fsdp." in error(
        "--trainer.strategy", "ddp_sharded"
    )


def test_a_config_of_an_earlier_version_of_this_program_names_every_key_that_went_and_its_file(tmp_path, run, data_dir):
    config = tmp_path / "before.yaml"  # what the program wrote before 2026-11-28
    config.write_text(
        "fault_guard:\n  stall_timeout: 120\ntimed_checkpoint:\n  train_time_interval: null\n"
        "dashboard:\n  num_images: 16\n  log_graph: true\n"
    )
    line = error("--config", str(config))
    named, today = line.removeprefix(f"error: in {config}: ").split(" are options of an earlier train.py; today: ")
    assert sorted(named.split(", ")) == [
        "--dashboard.num_images",
        "--fault_guard.stall_timeout",
        "--timed_checkpoint.train_time_interval",
    ]
    assert (
        "--fault_guard.stall_timeout → --watchdog.timeout" in today
        and "--timed_checkpoint.train_time_interval →" in today
    )
    assert "--dashboard.num_images → nothing: the grid of validation samples went" in today
    # A run's record of the version before: a key it asked for is refused, named; what held the defaults is dropped
    record = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(record + "fault_guard:\n  stall_timeout: 120\n")
    assert error(*small_run(data_dir, run.parents[1]), "--ckpt_path", str(run)) == (
        f"error: {run / 'config.yaml'} holds options of an earlier train.py: --fault_guard.stall_timeout 120 →"
        f" --watchdog.timeout. Put today's in {run / 'config.yaml'}, then run it."
    )
    (run / "config.yaml").write_text(record + "predictions:\n  path: null\nfault_guard:\n  every_n_steps: 50\n")
    two_of_two = (*small_run(data_dir, run.parents[1], max_epochs=2), "--trainer.limit_train_batches", "2")
    passed = error(*two_of_two, "--ckpt_path", str(run))  # (a schedule that cannot span the steps already taken)
    assert re.search(
        r"the run is at step \d+, past the 4 steps its one-cycle schedule would span: give it more", passed
    )
    continued = run_in_process(*small_run(data_dir, run.parents[1], max_epochs=2), "--ckpt_path", str(run))
    assert continued.returncode == 0 and "continuing" in continued.stdout, continued.stderr[-2000:]


def test_an_evaluation_without_weights_or_with_none_to_name_is_refused(tmp_path):
    root = ("--trainer.default_root_dir", str(tmp_path))
    assert "error: test needs trained weights: add --ckpt_path last" in error("test", *root)
    for name in ("", "best", "hpc", "registry", "registry:my-model:latest"):  # Lightning's, of other programs
        line = f"--ckpt_path {name or repr('')} names no checkpoint this program keeps: give a checkpoint file, a run's"
        assert line in error("validate", "--ckpt_path", name, *root)
    assert f"--ckpt_path last: no run in {tmp_path / 'SeqNet-fashion_mnist'} holds a last checkpoint" in error(
        "predict", "--ckpt_path", "last", *root
    )
    assert "no such file" in error("test", "--ckpt_path", str(tmp_path / "none.ckpt"), *root)
    assert "no such file" in error("test", "--ckpt_path", str(tmp_path / "registry_old.ckpt"), *root)  # a path
    assert not any(tmp_path.iterdir())


def test_one_checkpoint_gives_one_answer_however_it_is_named(checkpoint, run, data_dir):
    _best, test_acc = checkpoint
    figures = []
    for named in (str(run / "checkpoints" / "last.ckpt"), "last", str(run)):
        result = run_in_process("test", *small_run(data_dir, run.parents[1]), "--ckpt_path", named)
        assert result.returncode == 0, result.stderr[-2000:]
        figures.append(next(line for line in result.stdout.splitlines() if line.startswith("Finished:")))
    assert len(set(figures)) == 1 and f"test/acc {test_acc:.4f}" in figures[0]
    assert sorted(p.name for p in (run / "test").iterdir()) == ["version_0", "version_1", "version_2"]


def test_a_continued_run_keeps_its_network_optimizer_and_data_and_says_how_to_start_anew(run, data_dir):
    before = sorted(run.rglob("*"))
    for option, value in (("--model.optimizer.lr", "0.02"), ("--data.val_size", "100"), ("--model", "ConvNet")):
        line = error(*small_run(data_dir, run.parents[1]), "--ckpt_path", str(run), option, value)
        assert line.startswith(f"error: {option} ") and f"--ckpt_path {run} was trained with {option} " in line, line
        assert f"start a new run from its weights (--model.weights {run / 'checkpoints' / 'last.ckpt'})" in line
    assert sorted(run.rglob("*")) == before


def test_a_run_that_another_process_trains_is_refused_and_left_as_it_was(run, data_dir):
    before = sorted(run.rglob("*"))
    held = os.open(run, os.O_RDONLY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        line = error(*small_run(data_dir, run.parents[1]), "--ckpt_path", "last", "--trainer.max_epochs", "2")
    finally:
        os.close(held)
    assert (
        line == f"error: {run} is being trained by another process right now (it holds the run's lock): wait"
        " for it to end, or start a new run."
    )
    assert sorted(run.rglob("*")) == before


def test_a_new_run_from_a_checkpoints_weights_takes_them_and_trains_anew(checkpoint, data_dir, tmp_path):
    """With a learning rate of 0 the one step it takes leaves the weights it started from: the checkpoint's."""
    best, _ = checkpoint
    still = ("--model.optimizer.lr", "0", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1")
    result = run_in_process(*small_run(data_dir, tmp_path), "--model.weights", str(best), *still)
    assert result.returncode == 0, result.stderr[-2000:]
    (run,) = (tmp_path / "SeqNet-mnist").iterdir()
    trained = torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)
    assert trained["global_step"] == 1  # a new run, from step 0
    assert max_difference(trained["state_dict"], torch.load(best, weights_only=True)["state_dict"]) == 0


def test_a_run_from_weights_continues_and_is_tested_after_the_weights_file_is_gone(checkpoint, data_dir, tmp_path):
    """The weights a run started from are in its record, not needed again: its checkpoints have its own."""
    best, _ = checkpoint
    weights = tmp_path / "weights.ckpt"
    shutil.copy(best, weights)
    first = run_in_process(*small_run(data_dir, tmp_path), "--model.weights", str(weights))
    assert first.returncode == 0, first.stderr[-2000:]
    weights.unlink()
    (run,) = (tmp_path / "SeqNet-mnist").iterdir()
    more = run_in_process("fit", "--ckpt_path", str(run), "--trainer.max_epochs", "2")
    assert more.returncode == 0, more.stderr[-2000:]
    tested = run_in_process("test", "--ckpt_path", str(run))
    assert tested.returncode == 0, tested.stderr[-2000:]


def test_weights_a_new_run_cannot_start_from_are_one_line_before_anything(checkpoint, data_dir, tmp_path):
    """A file cut short, a file of another kind, another network's checkpoint: the user's file, said so, no folder."""
    best, _ = checkpoint
    (cut := tmp_path / "cut.ckpt").write_bytes(best.read_bytes()[:5000])
    (text := tmp_path / "notes.ckpt").write_text("not a checkpoint")
    torch.save(torch.load(best, weights_only=True)["state_dict"], bare := tmp_path / "state_dict.pt")
    torch.save(torch.zeros(3), tensor := tmp_path / "tensor.pt")
    for weights, more in ((cut, ()), (text, ()), (bare, ()), (tensor, ()), (best, ("--model", "ConvNet"))):
        line = error(*small_run(data_dir, tmp_path / "runs", *more, "--model.weights", str(weights)))
        assert line.startswith(f"error: --model.weights {weights}: "), line
        assert line.endswith(
            ("Give a checkpoint file, or leave it out.", "Give a checkpoint of such a ConvNet, or leave it out.")
        )
    assert "not the tensors of this ConvNet" in line and not (tmp_path / "runs").exists()


def test_a_subcommands_name_as_an_options_value_is_that_value(tmp_path):
    printed = run_in_process("--trainer.default_root_dir", "test", "--print_config")
    assert printed.returncode == 0, printed.stderr[-2000:]
    assert yaml.safe_load(printed.stdout)["trainer"]["default_root_dir"] == "test"  # a fit's, in the folder `test`


@pytest.mark.parametrize("what", ["a file", "a file for the model's folder", "another user's folder", "checkpoints"])
def test_a_folder_that_cannot_be_written_ends_in_one_line_before_anything(data_dir, tmp_path, what):
    """A team's shared runs/: the root, or the model's folder below it, is a file or another user's; or a given
    --checkpoint.dirpath lies below a file."""
    if os.geteuid() == 0 and what == "another user's folder":
        pytest.skip("root writes into any folder: the file cases stand for it here")
    root, more = tmp_path / "runs", []
    folder = root / "SeqNet-mnist"
    if what == "a file":
        root.write_text("")
    elif what == "another user's folder":
        folder.mkdir(parents=True)
        folder.chmod(0o500)
    elif what == "checkpoints":
        (tmp_path / "shared").write_text("")
        folder, more = (
            tmp_path / "shared" / "checkpoints",
            ["--checkpoint.dirpath", str(tmp_path / "shared" / "checkpoints")],
        )
    else:
        root.mkdir()
        folder.write_text("")
    before = sorted(tmp_path.rglob("*"))
    try:
        line = error(*small_run(data_dir, root), *more)
    finally:
        if folder.is_dir():
            folder.chmod(0o700)
    typed = f"--checkpoint.dirpath {folder}" if more else f"--trainer.default_root_dir {root}"  # as typed
    if what == "another user's folder":
        assert line.startswith(f"error: {typed}: cannot write {folder} (Permission denied)."), line
        assert line.endswith("Choose a folder you can write to, or ask its owner to let you."), line
    else:
        in_the_way = {"a file": root, "checkpoints": tmp_path / "shared"}.get(what, folder)
        assert (
            line
            == f"error: {typed}: {in_the_way} is a file, where a folder is needed. Move it, or choose another folder."
        )
    assert sorted(tmp_path.rglob("*")) == before  # nothing written


def test_a_bug_is_a_short_traceback_naming_its_raising_line(data_dir, tmp_path):
    result = run_in_process(*small_run(data_dir, tmp_path), "--trainer.callbacks+=tests.test_cli.Bug")
    assert result.returncode == 1
    first = result.stderr[result.stderr.index("error: ") :].splitlines()
    assert (
        first[0] == "error: an unexpected ZeroDivisionError, a bug rather than a mistake in the command; library"
        " frames are summed up (TRAIN_TRACEBACK=1 shows them all)."
    )
    assert any(line.startswith("  ... ") and "frame(s) in lightning" in line for line in first)
    assert 'tests/test_cli.py", line' in result.stderr and "return 1 / 0" in result.stderr
    assert not (tmp_path / "SeqNet-mnist").exists()  # a run that failed before it kept anything is taken back


class Bug(Callback):
    """A callback with a bug."""

    def setup(self, trainer, pl_module, stage) -> None:
        return 1 / 0


def test_a_run_without_a_logger_writes_no_run_folder_and_prints_no_dashboard(data_dir, tmp_path):
    result = run_in_process(*small_run(data_dir, tmp_path), "--trainer.logger", "false")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Dashboard" not in result.stdout and "Finished: test/acc" in result.stdout
    assert not (tmp_path / "SeqNet-mnist").exists()


def test_a_fast_dev_run_runs_and_prints_only_commands_that_can_be_followed(data_dir, tmp_path):
    result = run_in_process(*small_run(data_dir, tmp_path), "--trainer.fast_dev_run", "true")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "--logdir None" not in result.stdout + result.stderr and not Path(tmp_path, "SeqNet-mnist").exists()
    assert "Testing the weights as the fit left them: it saved no best checkpoint." in result.stdout
    assert "Finished: test/acc" in result.stdout  # Lightning's smoke test: every stage, the test too


def test_a_checkpoint_holding_code_is_refused_and_evaluated_with_weights_only_false(checkpoint, data_dir, tmp_path):
    best, _ = checkpoint
    trusted = tmp_path / "trusted.ckpt"
    torch.save({**torch.load(best, weights_only=True), "code": Code()}, trusted)
    line = error("validate", *small_run(data_dir, tmp_path), "--ckpt_path", str(trusted))
    assert line.endswith("If you trust where it comes from, add --weights_only false."), line
    result = run_in_process(
        "validate", *small_run(data_dir, tmp_path), "--ckpt_path", str(trusted), "--weights_only", "false"
    )
    assert result.returncode == 0 and "Finished: val/acc" in result.stdout, result.stderr[-2000:]


def test_a_process_alone_on_cores_other_work_keeps_busy_trains_with_one_thread(data_dir, tmp_path, monkeypatch):
    cores = os.cpu_count() or 1
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        assert busy_cores() >= 0.75 * cores  # measured while this process sleeps: the others' work
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    threads, one_step = (
        torch.get_num_threads(),
        ("--trainer.limit_train_batches", "1", "--trainer.limit_val_batches", "0"),
    )
    monkeypatch.delenv("OMP_NUM_THREADS")
    try:
        for busy, said in (
            (cores / 2 - 0.1, f"({cores} cores)"),
            (cores / 2, f"({cores} cores, {cores / 2:.1f} of them busy with other work: 1 thread)"),
        ):
            torch.set_num_threads(cores)
            monkeypatch.setattr("app.launch.busy_cores", lambda busy=busy: busy)  # an idle machine's or near, then not
            result = run_in_process("fit", *small_run(data_dir, tmp_path), *one_step)
            assert f"Training in 1 process on the CPU {said}: --devices N trains" in result.stdout, result.stdout
            assert torch.get_num_threads() == (cores if busy < cores / 2 else 1)
        torch.set_num_threads(cores)
        monkeypatch.setenv("OMP_NUM_THREADS", str(cores))  # the user's choice stays
        result = run_in_process("fit", *small_run(data_dir, tmp_path), *one_step)
        assert (
            f"Training in 1 process on the CPU ({cores} cores): " in result.stdout and torch.get_num_threads() == cores
        )
    finally:
        torch.set_num_threads(threads)
