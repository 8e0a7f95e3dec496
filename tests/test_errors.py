"""Every mistake a user can make ends in one line and a non-zero exit, with no traceback and nothing lost.

One group of tests per kind of mistake (the README's error table lists them). Each kind has a real `train.py` run,
with two processes where processes are involved; the many cases of a kind go through `main()` in this process,
which is the same code without the start-up of a new interpreter.
"""

import functools
import json
import re
import shlex
import signal
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from app.command_line.errors import PEER_LOST_MESSAGE, blame_option
from app.command_line.speaking import short_traceback
from app.main import main
from tests.helpers import ends_in_error, run_command, run_in_process, run_train, scalars, small_run
from tests.synthetic import write_idx

# Two processes, unless a test says otherwise.
one_run = functools.partial(small_run, devices=2)


def error_line(argv: list[str]) -> str:
    """Run `train.py ARGV` in this process; the one line it ends with (on standard error, exit status 1)."""
    with ends_in_error() as said:
        main(argv)
    message = said.line
    assert isinstance(message, str) and message.startswith("error: "), message
    assert "\n" not in message and "Traceback" not in message
    return message


def assert_one_error_line(result, *words: str) -> str:
    """A real run ended with status 1 and one `error:` line from one process, with `words` in it. Where every rank
    meets the mistake, the first to get there speaks for the job: `error (rank 1): ` from a rank other than 0."""
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and re.match(r"error( \(rank \d+\))?: ", lines[0]), result.stderr[-3000:]
    assert lines == [result.stderr.strip().splitlines()[-1]]
    for word in words:
        assert word in lines[0]
    return lines[0]


# 1. Checkpoint paths and files


def bad_checkpoint(kind: str, folder: Path, good: Path) -> Path:
    """A file (or folder) of the given kind where a checkpoint should be."""
    path = folder / f"{kind}.ckpt"
    if kind == "folder":
        path.mkdir()
    elif kind == "empty":
        path.touch()
    elif kind == "truncated":
        path.write_bytes(good.read_bytes()[:50_000])
    elif kind == "text":
        path.write_text("epoch: 3\nweights: somewhere else\n")
    elif kind == "image":
        path.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(200))
    elif kind == "tensor":
        torch.save(torch.zeros(3), path)
    elif kind == "state_dict_only":
        torch.save(torch.load(good, weights_only=True)["state_dict"], path)
    elif kind == "other_zip":
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("notes.txt", "not a checkpoint")
    return path


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("missing", "no such file"),
        ("folder", "is a folder, not a checkpoint file"),
        ("empty", "is empty (0 bytes)"),
        ("truncated", "is truncated or corrupt"),
        ("text", "is not a checkpoint"),
        ("image", "is not a checkpoint"),
        ("tensor", "is no Lightning checkpoint"),
        ("state_dict_only", "is no Lightning checkpoint"),
        ("other_zip", "is truncated or corrupt"),
    ],
)
@pytest.mark.parametrize("subcommand", ["test", "fit", "predict", "export"])
def test_a_bad_checkpoint_file_ends_in_one_line(checkpoint, data_dir, tmp_path, kind, words, subcommand):
    path = bad_checkpoint(kind, tmp_path, checkpoint[0])
    if subcommand == "export":
        argv = ["export", "--ckpt_path", str(path), "--format", "torchscript", "--output", str(tmp_path / "m.pt")]
    else:
        argv = [subcommand, "--ckpt_path", str(path), "--data.data_dir", str(data_dir), "--trainer.accelerator", "cpu"]
    message = error_line(argv)
    assert f"--ckpt_path {path}" in message and words in message
    assert "could run code" not in message


def test_a_truncated_checkpoint_ends_in_one_line_from_a_real_run(checkpoint, data_dir, tmp_path):
    path = bad_checkpoint("truncated", tmp_path, checkpoint[0])
    result = run_train("test", *one_run(data_dir, tmp_path, "--ckpt_path", str(path)), timeout=120)
    assert_one_error_line(result, f"--ckpt_path {path} is truncated or corrupt", "another checkpoint")


@pytest.mark.parametrize("subcommand", ["test", "fit"])
def test_a_checkpoint_of_another_model_than_model_names_is_refused(checkpoint, data_dir, tmp_path, subcommand):
    """A fit of two processes, from a real run; a test of one, in this process."""
    devices, runner = (2, run_train) if subcommand == "fit" else (1, run_in_process)
    argv = one_run(data_dir, tmp_path, "--model", "ConvNet", "--ckpt_path", str(checkpoint[0]), devices=devices)
    result = runner(subcommand, *argv)
    assert_one_error_line(result, "holds a SeqNet, but --model names ConvNet", "leave --model out")
    assert not (tmp_path / "ConvNet-mnist").exists()


def test_weights_that_do_not_fit_the_model_are_refused(checkpoint, data_dir, tmp_path):
    """A checkpoint of the same class whose weights have other shapes: from an older version of the network, say."""
    saved = torch.load(checkpoint[0], weights_only=True)
    saved["state_dict"] = {name: torch.zeros(3) for name in saved["state_dict"]}
    other = tmp_path / "other.ckpt"
    torch.save(saved, other)
    argv = ["test", "--ckpt_path", str(other), "--data.data_dir", str(data_dir), "--devices", "1"]
    message = error_line([*argv, "--trainer.default_root_dir", str(tmp_path)])
    assert message == (  # found before the run, named by tensor and shape, whole
        f"error: --ckpt_path {other} does not fit SeqNet as this code builds it (net.1.weight is [3] there but"
        " [200, 784] in the model, and 5 more). Give a checkpoint of this model."
    )


# 2. Values the parser accepts but torch, Lightning or the model reject later


def test_an_optimizer_value_torch_rejects_names_the_option_from_one_process(data_dir, tmp_path):
    result = run_train(*one_run(data_dir, tmp_path, "--model.optimizer.lr", "-1"), timeout=120)
    assert_one_error_line(result, "--model.optimizer.lr -1.0: Invalid learning rate", "Give --model.optimizer.lr")


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--model.optimizer.betas", "[2, 0.5]"], "--model.optimizer.betas [2.0, 0.5]"),
        (["--model.optimizer", "SGD", "--model.optimizer.momentum", "-1"], "--model.optimizer.momentum -1.0"),
        (["--model.optimizer.weight_decay", "-0.1"], "--model.optimizer.weight_decay -0.1"),
        (["--model.lr_scheduler", "StepLR", "--model.lr_scheduler.step_size", "0"], "--model.lr_scheduler.step_size 0"),
        (
            ["--model.lr_scheduler", "CosineAnnealingLR", "--model.lr_scheduler.T_max", "0"],
            "--model.lr_scheduler.T_max 0",
        ),
        (["--trainer.accumulate_grad_batches", "0"], "--trainer.accumulate_grad_batches 0"),
        (["--trainer.check_val_every_n_epoch", "0"], "--trainer.check_val_every_n_epoch 0"),
        (["--trainer.val_check_interval", "5000"], "--trainer.val_check_interval 5000"),
        (["--trainer.max_epochs", "-5"], "--trainer.max_epochs -5"),
        (["--trainer.limit_train_batches", "1.5"], "--trainer.limit_train_batches 1.5"),
        (["--trainer.num_nodes", "0"], "--trainer.num_nodes 0"),
        (["--trainer.strategy", "nope"], "--trainer.strategy nope"),
        (["--trainer.accelerator", "tpuu"], "--trainer.accelerator tpuu"),
        (["--trainer.gradient_clip_algorithm", "sideways"], "--trainer.gradient_clip_algorithm sideways"),
        (["--checkpoint.save_top_k", "-2"], "--checkpoint.save_top_k -2"),
        (["--checkpoint.monitor", "val/nope"], "--checkpoint.monitor val/nope"),
        (["--seed_everything", "-1"], "--seed_everything -1"),
        (["--devices", "x"], "--trainer.devices x"),  # Lightning's message names `devices`, not the value
        (["--devices", "0,1"], "--trainer.devices 0,1"),
    ],
)
def test_a_value_rejected_after_parsing_names_the_option(data_dir, tmp_path, args, named):
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGHUP)}
    message = error_line(list(one_run(data_dir, tmp_path, *args, devices=1)))
    assert message.startswith(f"error: {named}: ")
    assert f"Give {named.split()[0]} another value" in message
    # A stage that failed puts back the signal handlers it replaced (Lightning calls `on_exception`, not `teardown`).
    assert {signum: signal.getsignal(signum) for signum in handlers} == handlers


def test_a_message_that_names_no_option_stays_the_librarys_own(data_dir, tmp_path):
    message = error_line(list(one_run(data_dir, tmp_path, "--trainer.max_time", "00:xx:00", devices=1)))
    assert message == (
        "error: `Timer(duration='00:xx:00')` is not a valid duration. Expected a string in the format DD:HH:MM:SS."
    )


def raise_from(function, *args):
    try:
        function(*args)
    except Exception as error:  # noqa: BLE001 (the error is the result)
        return error
    raise AssertionError("no error")


def test_a_bug_that_happens_to_show_a_value_the_user_set_is_not_blamed_on_the_option():
    """A coincidence of values is no evidence: the error keeps its traceback (blame_option gives None)."""
    index_error = raise_from(lambda: torch.zeros(10)[10])  # "index 10 is out of bounds ... with size 10"
    assert "10" in str(index_error)
    assert blame_option(index_error, {"--trainer.max_epochs": 10}) is None
    collective = raise_from(lambda: (_ for _ in ()).throw(RuntimeError("NCCL error: unhandled system error, rank 2")))
    assert blame_option(collective, {"--trainer.devices": 2}) is None
    zero = raise_from(lambda: 1 // 0)
    assert blame_option(zero, {"--trainer.log_every_n_steps": 0}) is None  # not raised by what takes that option
    lr_error = raise_from(torch.optim.Adam, [torch.zeros(1, requires_grad=True)], -1.0)
    line = blame_option(lr_error, {"--model.optimizer.lr": -1.0, "--trainer.max_epochs": 3})
    assert line.startswith("--model.optimizer.lr -1.0: Invalid learning rate: -1.0. Give --model.optimizer.lr")


def test_every_error_keeps_its_traceback_with_train_traceback_1(data_dir, tmp_path):
    args = one_run(data_dir, tmp_path, "--model.optimizer.lr", "-1", devices=1)
    result = run_train(*args, timeout=120, env={"TRAIN_TRACEBACK": "1"})
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr and "ValueError: Invalid learning rate" in result.stderr
    plain = run_in_process(*args)
    assert "TRAIN_TRACEBACK=1" in assert_one_error_line(plain, "--model.optimizer.lr -1.0")


@pytest.mark.parametrize("rank", ["null", pytest.param("1", marks=pytest.mark.slow)])
def test_a_bug_is_one_short_traceback_from_one_process(data_dir, tmp_path, rank):
    """A bug on every rank (null) or on rank 1 alone: its traceback once, from the process that failed first, with
    the frames of Lightning summed up and the frame that raised it shown; no line from the rank that lost its peer."""
    failing = ("--trainer.callbacks+=tests.helpers.FailOnRank", f"--trainer.callbacks.rank={rank}")
    assert_one_short_traceback(run_train(*one_run(data_dir, tmp_path, *failing)))


def test_a_rank_that_fails_while_rank_0_waits_for_it_ends_the_job(data_dir, tmp_path):
    """On NCCL a collective waits for a lost process until the process-group timeout (30 minutes). A process that
    failed waits for the first process to end (app/job/children.py) only so long; then it ends, and Lightning's watch
    ends the first one. Here rank 0 waits in a callback, as it would in such a collective. The failed process has
    said why, once; Lightning names it as it ends the job."""
    failing = ("--trainer.callbacks+=tests.helpers.FailOnRank", "--trainer.callbacks.rank=1")
    waiting = ("--trainer.callbacks+=tests.helpers.WaitOnRank0",)
    result = run_train(*one_run(data_dir, tmp_path, *failing, *waiting))
    assert_one_short_traceback(result, status=-signal.SIGKILL)
    assert "planned failure on rank 1" in result.stderr
    assert "terminated with code 1. Forcefully terminating all other processes" in result.stderr


def test_a_rank_that_fails_once_rank_0_has_spoken_says_nothing(data_dir, tmp_path):
    """Global rank 0 holds the job's store: it ends only once the others have reported, so that one failing a moment
    after it has spoken still learns that it has, and says nothing."""
    failing = ("--trainer.callbacks+=tests.helpers.FailOnceRank0Spoke",)
    result = run_train(*one_run(data_dir, tmp_path, *failing))
    assert_one_short_traceback(result)
    assert "planned failure on rank 0" in result.stderr and "planned failure on rank 1" not in result.stderr


def assert_one_short_traceback(result, status: int = 1) -> None:
    assert result.returncode == status, result.stderr[-3000:]
    error_lines = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(error_lines) == 1 and "an unexpected RuntimeError" in error_lines[0], result.stderr[-3000:]
    assert "TRAIN_TRACEBACK=1" in error_lines[0]
    lightnings = "Forcefully terminating all other processes"  # Lightning's line as it ends the job, if it does
    traceback_text = "".join(
        line for line in result.stderr.split(error_lines[0], 1)[1].splitlines(True) if lightnings not in line
    )
    assert traceback_text.count("Traceback (most recent call last)") == 1
    assert "frames in lightning" in traceback_text and 'tests/helpers.py", line' in traceback_text
    assert len(traceback_text.strip().splitlines()) < 20, traceback_text
    assert traceback_text.strip().splitlines()[-1].startswith("RuntimeError: planned failure on rank ")
    assert PEER_LOST_MESSAGE not in result.stderr and "[rank0]" not in result.stderr and "[rank1]" not in result.stderr


def test_a_short_traceback_sums_up_library_frames_and_keeps_the_cause():
    def parse(text: str) -> None:
        try:
            json.loads(text)  # raises two frames down, in the standard library's json
        except json.JSONDecodeError as error:
            raise ValueError("the settings are not JSON") from error

    text = short_traceback(raise_from(parse, "{"))
    assert text.count("Traceback (most recent call last)") == 2
    assert "frames in python" in text and 'json/decoder.py", line' in text  # the frame that raised stays
    assert "json/__init__.py" not in text
    assert "direct cause of the following exception" in text
    assert text.splitlines()[-1] == "ValueError: the settings are not JSON"
    assert text.index("JSONDecodeError") < text.index("direct cause")


@pytest.mark.parametrize(
    ("args", "what_lightning_does"),
    [
        (["--trainer.log_every_n_steps", "0"], "logs no step"),
        (["--trainer.limit_train_batches", "0"], "trains no step"),
        (["--trainer.enable_checkpointing", "false"], "saves no checkpoint"),
    ],
)
def test_values_lightning_accepts_keep_lightnings_meaning(data_dir, tmp_path, args, what_lightning_does):
    main(list(one_run(data_dir, tmp_path, *args, devices=1, max_epochs=2)))
    (run,) = (tmp_path / "SeqNet-mnist").iterdir()
    logged = scalars(run)
    assert "test/acc" in logged  # the run went through to the test
    if what_lightning_does == "logs no step":
        assert "train/loss" not in logged and "workload/samples_per_s" not in logged and "val/acc" in logged
    elif what_lightning_does == "trains no step":
        assert "train/loss" not in logged and not list(run.rglob("*.ckpt"))
    else:
        assert len(logged["val/acc"]) == 2 and not list(run.rglob("*.ckpt"))


# 3. Parser messages


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--model", "ResNet"], ["--model ResNet: no such class", "models.base.ImageClassifier (ConvNet, SeqNet)"]),
        (["--model.optimizer", "Adamm"], ["--model.optimizer Adamm: no such class", "torch.optim", "Adam"]),
        (["--model.lr_scheduler", "Nope"], ["no such class", "LRScheduler", "ConstantLR"]),
        (["--trainer.callbacks+=Nope"], ["--trainer.callbacks Nope: no such class", "Callback"]),
        (["--model.optimizer.momentum", "0.9"], ["torch.optim.Adam takes no argument 'momentum'", "--model.optimizer"]),
        (["--model", "ConvNet", "--model.dropout", "0.5"], ["models.ConvNet takes no argument 'dropout'"]),
        (["--model.optimzer.lr", "0.1"], ["--model.optimzer.lr: models.SeqNet takes no argument 'optimzer'"]),
        (["--model.optimizer.init_argss.lr", "3"], ["--model.optimizer.init_argss.lr: torch.optim.Adam takes no"]),
        (["--model.lr_scheduler.gamma", "0.5"], ["--model.lr_scheduler.gamma: --model.lr_scheduler names no class"]),
        (
            ["--trainer.callbacks+=LearningRateMonitor", "--trainer.callbacks.logging_intervall", "step"],
            ["lightning.pytorch.callbacks.LearningRateMonitor takes no argument 'logging_intervall'"],
        ),
        (["--model.optimizer.lr", "fast"], ["--model.optimizer.lr fast: expected a number"]),
        (["--trainer.max_epochs", "many"], ["--trainer.max_epochs many: expected an integer"]),
        (["--data.batch_size", "-5"], ["--data.batch_size -5: expected a positive integer"]),
        (["--data.dataset", "cifar10"], ["--data.dataset cifar10: expected one of mnist, fashion_mnist"]),
        (["--data.dataset", "mnist", "--data.dataset=cifar10"], ["--data.dataset cifar10: expected one of mnist"]),
        (["--data.batch_size", "8", "--data.batch_size", "-5"], ["--data.batch_size -5: expected a positive"]),
        (["--data.batch_size", "-5", "--data.batch_size", "8"], ["--data.batch_size -5: expected a positive"]),
        (["--data.dataset=cifar10", "--data.dataset", "mnist"], ["--data.dataset cifar10: expected one of mnist"]),
        (["--data.batch_size", "x", "--data.batch_size", "0"], ["--data.batch_size x: expected a positive integer"]),
        (["--data.batch_size", "10", "--data.batch_size", "0"], ["--data.batch_size 0: expected a positive integer"]),
        (["--model.optimizer.betas", "[0.9,x]"], ["--model.optimizer.betas [0.9,x]: expected a number"]),
        (["--model.optimizer.lr", "fast", "--model.optimizer.lr", "0.1"], ["--model.optimizer.lr fast: expected"]),
        (["--model.optimizer", "Adamm", "--model.optimizer", "Adam"], ["--model.optimizer Adamm: no such class"]),
        (["--data.dataset", "mnist", "test", "--ckpt_path", "last"], ["test: a subcommand comes first", "py test"]),
        (
            ["fit", "--data.dataset", "mnist", "validate"],
            ["validate: a command takes one subcommand, and this one has fit"],
        ),
        (["--trainer.precision", "17"], ["--trainer.precision 17: expected one of", "16-mixed"]),
        (["--model.one_cycle", "maybe"], ["--model.one_cycle maybe: expected true or false"]),
        # A size the network cannot be built with, said by the model, not as a bug
        (["--model", "ConvNet", "--model.kernel_sizes", "[27, 3]"], ["--model.kernel_sizes [27, 3] leave no pixel"]),
        (["--model", "ConvNet", "--model.channels", "[24, 0]"], ["--model.channels [24, 0]: expected a positive"]),
        (["--model.optimizer.betas", "3"], ["--model.optimizer.betas 3: expected a list"]),
        (["--model.lr_scheduler", "StepLR"], ["StepLR needs --model.lr_scheduler.step_size"]),
        (["--model.lr_scheduler", "ReduceLROnPlateau"], ["several classes have that name", "torch.optim.lr_scheduler"]),
        # A class's argument with a bad value: said of the class named, not of the others jsonargparse tried
        (
            ["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.patience", "x"],
            ["error: --trainer.callbacks.patience x: expected an integer"],
        ),
        (
            ["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.patienc", "3"],
            ["error: --trainer.callbacks.patienc: lightning.pytorch.callbacks.EarlyStopping takes no argument"],
        ),
        (["--model", "nope.Nope"], ["--model nope.Nope: no such class", "ConvNet, SeqNet"]),
        (["--model.optimizer", "torch.optim.Nope"], ["--model.optimizer torch.optim.Nope: no such class"]),
        (["--model.optimizer.betas", "[3]"], ["--model.optimizer.betas [3]: expected a list of 2 values"]),
        (["--data.dataset="], ["error: --data.dataset '': expected one of mnist, fashion_mnist."]),
        (["--data.dataset", "'x'"], ["error: --data.dataset 'x': expected one of mnist, fashion_mnist."]),
        # An option typed without its value: that option, not the one argparse names (`--model`)
        (["--model.optimizer.lr"], ["error: --model.optimizer.lr: a value is missing after it."]),
        (["--model.optimizer.lr", "--data.batch_size", "8"], ["error: --model.optimizer.lr: a value is missing"]),
        (
            ["--trainer.callbacks+=EarlyStopping", "--trainer.callbacks.monitor"],
            ["error: --trainer.callbacks.monitor: a value is missing after it."],
        ),
        (["-c"], ["error: -c: a value is missing after it."]),
        # An argument of an option whose value is no class
        (
            ["--trainer.strategy", "ddp", "--trainer.strategy.timeout", "x"],
            ["error: --trainer.strategy.timeout: --trainer.strategy ddp names no class, so it takes no arguments"],
        ),
        (
            ["--trainer.logger", "false", "--trainer.logger.save_dir", "x"],
            ["error: --trainer.logger.save_dir: --trainer.logger false names no class"],
        ),
        (
            ["--trainer.strategy", "DDPStrategy", "--trainer.strategy.timeout", "x"],
            ["error: --trainer.strategy.timeout x: expected a duration such as 0:30:00"],
        ),
        (["--model.optimizer.weight_decay", "-1", "--model.optimizer.lr"], ["error: --model.optimizer.lr: a value is"]),
    ],
)
def test_a_parser_error_says_its_deepest_cause_in_under_300_characters(args, words):
    message = error_line(args)
    assert len(message) < 300, message
    assert "Union" not in message and "NestedArg" not in message and "Namespace(" not in message
    for word in words:
        assert word in message


def test_a_bad_value_in_a_config_file_is_named_as_the_configs_beside_a_good_one_on_the_command_line(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("data:\n  batch_size: 0\n")
    message = error_line(["--config", str(config), "--data.batch_size", "8"])
    assert "--data.batch_size 0 (from a config file): expected a positive integer" in message


def test_a_config_file_naming_an_unknown_class_says_where_the_choices_come_from(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("model:\n  class_path: models.ResNet\n")
    message = error_line(["--config", str(config)])
    assert "--model models.ResNet (from a config file): no such class" in message and len(message) < 300


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (  # a value of a class's arguments in a config file: said as that value, not as the class around it
            "model:\n  class_path: models.SeqNet\n  init_args:\n    optimizer:\n      class_path: torch.optim.Adam\n"
            "      init_args:\n        lr: fast\n",
            "--model.optimizer.lr fast (from a config file): expected a number.",
        ),
        (
            "trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.EarlyStopping\n      init_args:\n"
            "        monitor: val/acc\n        patience: x\n",
            "--trainer.callbacks.patience x (from a config file): expected an integer.",
        ),
        (
            "model:\n  class_path: models.SeqNet\n  init_args:\n    optimizer:\n      class_path: torch.optim.Nope\n",
            "--model.optimizer torch.optim.Nope (from a config file): no such class.",
        ),
    ],
    ids=["an optimizer's learning rate", "a callback's argument", "a class inside a class"],
)
def test_a_bad_argument_of_a_class_in_a_config_file_names_that_argument_and_value(tmp_path, config, words):
    path = tmp_path / "config.yaml"
    path.write_text(config)
    assert words in error_line(["--config", str(path)])


def test_beside_a_config_file_a_typed_value_is_said_as_typed(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("trainer:\n  max_epochs: 1\n")
    message = error_line(["--config", str(path), "--model.optimizer", '{"class_path": "torch.optim.Nope"}'])
    assert 'error: --model.optimizer {"class_path": "torch.optim.Nope"}: no such class.' in message
    missing = error_line(["--model.optimizer.lr", "-c", str(path)])  # a short option after it
    assert missing == "error: --model.optimizer.lr: a value is missing after it."


def test_a_parser_error_from_a_real_run_is_one_short_line(data_dir, tmp_path):
    result = run_train(*one_run(data_dir, tmp_path, "--model.optimizer", "Adamm"), timeout=60)
    line = assert_one_error_line(result, "--model.optimizer Adamm: no such class")
    assert len(line) < 300


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("accelerator", ["gpu", "cuda"])
def test_a_gpu_asked_for_on_a_machine_without_one_is_the_first_and_only_line(data_dir, tmp_path, accelerator):
    """`gpu` from a real run of two processes, `cuda` in this process."""
    devices = 2 if accelerator == "gpu" else 1
    args = [arg if arg != "cpu" else accelerator for arg in one_run(data_dir, tmp_path, devices=devices)]
    result = run_train(*args, timeout=60) if accelerator == "gpu" else run_in_process(*args)
    line = assert_one_error_line(result, f"--trainer.accelerator {accelerator}: this machine has no", "give cpu.")
    assert (result.stdout + result.stderr).strip() == line
    assert "!." not in line and ".." not in line


@pytest.mark.parametrize(
    ("devices", "args", "needs"),
    [
        (1, [], ["a CUDA GPU (--trainer.accelerator gpu)"]),
        (
            1,
            ["--trainer.accumulate_grad_batches", "2", "--trainer.precision", "bf16-mixed"],
            ["a CUDA GPU", "float32 (--trainer.precision 32-true)", "no gradient accumulation"],
        ),
        (1, ["--model", "ConvNet", "--model.compile", "true"], ["a CUDA GPU", "and no --model.compile"]),
        (2, [], ["a CUDA GPU", "one process (--trainer.devices 1 --trainer.num_nodes 1)"]),  # before the launch
    ],
)
def test_a_cuda_graph_where_one_cannot_train_says_all_it_needs_before_anything_is_written(
    data_dir, tmp_path, devices, args, needs
):
    message = error_line(list(one_run(data_dir, tmp_path, "--model.cuda_graph", "true", *args, devices=devices)))
    assert message.startswith("error: --model.cuda_graph true needs ")
    assert all(need in message for need in needs), message
    assert message.endswith("Give those, or --model.cuda_graph false.")
    assert not list(tmp_path.rglob("version_*"))


# 4. Files the program reads


def spoil(raw: Path, kind: str) -> None:
    """Make the training files of `raw` invalid in the way `kind` names."""
    images, labels = raw / "train-images-idx3-ubyte", raw / "train-labels-idx1-ubyte"
    count = int.from_bytes(labels.read_bytes()[4:8], "big")
    if kind == "label_out_of_range":
        write_idx(labels, torch.full((count,), 12))
    elif kind == "not_28x28":
        write_idx(images, torch.zeros(count, 32, 32))
    elif kind == "fewer_labels":
        write_idx(labels, torch.zeros(count - 1))
    elif kind == "no_images":
        write_idx(images, torch.zeros(0, 28, 28))
        write_idx(labels, torch.zeros(0))
    elif kind == "trailing_bytes":
        images.write_bytes(images.read_bytes() + b"\0\0\0")
    elif kind == "wrong_magic":
        images.write_bytes(b"\0\0\x0a\x03" + images.read_bytes()[4:])
    elif kind == "labels_as_images":
        images.write_bytes(labels.read_bytes())
    elif kind == "float_pixels":
        pixels = torch.zeros(count, 28, 28).numpy().astype(">f4").tobytes()
        images.write_bytes(struct.pack(">I3I", 0x0D03, count, 28, 28) + pixels)
    elif kind == "text":
        images.write_text("these are not images")


def copy_of_the_data(data_dir: Path, folder: Path) -> Path:
    raw = folder / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for source in (data_dir / "MNIST" / "raw").iterdir():
        (raw / source.name).write_bytes(source.read_bytes())
    return raw


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("label_out_of_range", "labels must be 0 to 9, and one is 12"),
        ("not_28x28", "the images are 32x32 pixels, not 28x28"),
        ("fewer_labels", "images but"),
        ("no_images", "are corrupt or truncated"),
        ("trailing_bytes", "are corrupt or truncated"),
        ("wrong_magic", "are corrupt or truncated"),
        ("labels_as_images", "are corrupt or truncated"),
        ("float_pixels", "are corrupt or truncated"),
        ("text", "are corrupt or truncated"),
    ],
)
def test_invalid_data_files_end_in_one_line_when_loaded(data_dir, tmp_path, kind, words):
    spoil(copy_of_the_data(data_dir, tmp_path / "data"), kind)
    message = error_line(list(one_run(tmp_path / "data", tmp_path, devices=1)))
    assert f"The train files in {tmp_path / 'data' / 'MNIST' / 'raw'}" in message and words in message
    assert "Delete them and download or copy them again." in message


def test_labels_out_of_range_stop_a_real_run_before_training(data_dir, tmp_path):
    spoil(copy_of_the_data(data_dir, tmp_path / "data"), "label_out_of_range")
    result = run_train(*one_run(tmp_path / "data", tmp_path), timeout=120)
    assert_one_error_line(result, "labels must be 0 to 9, and one is 12")
    assert "Global batch" not in result.stdout  # training never started


# 5. Folders the program writes


@pytest.mark.parametrize(
    "option", ["--trainer.default_root_dir", "--checkpoint.dirpath", "--last_checkpoint.dirpath", "--predictions.path"]
)
def test_a_folder_that_cannot_be_written_ends_in_one_line_before_the_run(checkpoint, data_dir, tmp_path, option):
    in_the_way = tmp_path / "a_file"
    in_the_way.write_text("a file where a folder is needed")
    target = in_the_way / "runs"
    subcommand = ["predict", "--ckpt_path", str(checkpoint[0])] if option == "--predictions.path" else []
    message = error_line([*subcommand, *one_run(data_dir, tmp_path / "ok", option, str(target), devices=1)])
    assert f"{option} " in message and "cannot write there" in message and "Choose a folder you can write to" in message


def test_an_unwritable_run_folder_stops_a_real_run_at_once(data_dir, tmp_path):
    in_the_way = tmp_path / "a_file"
    in_the_way.write_text("a file where a folder is needed")
    result = run_train(*one_run(data_dir, in_the_way / "runs"), timeout=60)
    assert_one_error_line(result, f"--trainer.default_root_dir {in_the_way / 'runs'}: cannot write there")


def test_predictions_path_may_name_a_folder(checkpoint, data_dir, tmp_path):
    argv = ["predict", "--ckpt_path", str(checkpoint[0]), "--predictions.path", str(tmp_path)]
    main([*argv, "--data.data_dir", str(data_dir), "--devices", "1", "--trainer.default_root_dir", str(tmp_path)])
    assert (tmp_path / "predictions.csv").is_file()


# 6. Training that diverges


def saved_step(root: Path) -> int:
    last = root / "SeqNet-mnist" / "version_0" / "checkpoints" / "last.ckpt"
    return torch.load(last, map_location="cpu", weights_only=True)["global_step"]


@pytest.mark.slow
def test_a_diverging_loss_stops_every_rank_at_one_step_and_keeps_the_last_good_checkpoint(data_dir, tmp_path):
    options = ("--model.one_cycle", "false", "--fault_guard.every_n_steps", "4")
    argv = one_run(data_dir, tmp_path, *options, max_epochs=3)
    result = run_train(*argv, "--trainer.callbacks+=tests.helpers.DivergeInEpoch", "--trainer.callbacks.epoch", "1")
    line = assert_one_error_line(result, "the training loss became NaN or infinite by step", "(epoch 1)")
    assert (
        "lower the learning rate (--model.optimizer.lr" in line
        and "keeps the weights from before the divergence" in line
    )
    assert saved_step(tmp_path) == 10  # epoch 0's last.ckpt, not overwritten with diverged weights
    last = tmp_path / "SeqNet-mnist" / "version_0" / "checkpoints" / "last.ckpt"
    assert all(weights.isfinite().all() for weights in torch.load(last, weights_only=True)["state_dict"].values())


# 7. Ctrl-C


@pytest.mark.slow
def test_ctrl_c_stops_every_rank_at_one_step_with_status_130_and_says_how_to_continue(data_dir, tmp_path):
    """Ctrl-C reaches the DataLoader workers too (a worker each), which leave the stop to their training process."""
    argv = one_run(data_dir, tmp_path, "--fault_guard.every_n_steps", "4", "--data.num_workers", "1", max_epochs=2)
    ctrl_c = ("--trainer.callbacks+=tests.helpers.CtrlCAfterStep", "--trainer.callbacks.step", "13")
    result = run_train(*argv, *ctrl_c, timeout=120)
    assert result.returncode == -signal.SIGINT, result.stderr[-3000:]  # ended by the signal: 130 in a shell
    assert "Traceback" not in result.stderr and "KeyboardInterrupt" not in result.stderr
    output = result.stdout + result.stderr
    assert "Stopped by SIGINT (Ctrl-C) in epoch 1, after step 16;" in output
    assert saved_step(tmp_path) == 16  # saved where every rank stopped
    # The command it prints continues this very run (its model, data and root), run as printed where it ran
    (printed,) = re.findall(r"holds that step; continue with: (.+)$", output, re.MULTILINE)
    run = tmp_path / "SeqNet-mnist" / "version_0"
    assert printed.endswith(f" train.py --ckpt_path {run} --devices 2"), printed
    continued = run_command(shlex.split(printed), timeout=120)
    assert continued.returncode == 0, continued.stderr[-3000:]
    assert f"continuing {run}, from checkpoints/last.ckpt (step 16, epoch 1)." in continued.stdout + continued.stderr
    assert saved_step(tmp_path) == 20 and [path.name for path in run.parent.iterdir()] == ["version_0"]


@pytest.mark.slow
def test_ctrl_c_in_one_process_without_a_process_group_stops_where_it_is_checked(data_dir, tmp_path):
    """`--trainer.strategy auto` on one device: no process group, so the processes never "meet"; Ctrl-C is
    FaultGuard's all the same, also when the check comes seconds later (a slow validation first)."""
    argv = one_run(data_dir, tmp_path, "--fault_guard.every_n_steps", "1000", "--trainer.strategy", "auto", devices=1)
    slow = ("--trainer.callbacks+=tests.helpers.SlowValidation", "--trainer.callbacks.seconds", "2")
    ctrl_c = ("--trainer.callbacks+=tests.helpers.CtrlCAfterStep", "--trainer.callbacks.step", "13")
    result = run_train(*argv, *slow, *ctrl_c, "--trainer.max_epochs", "3", timeout=120)
    assert result.returncode == -signal.SIGINT, result.stderr[-3000:]  # ended by the signal: 130 in a shell
    assert "Stopped by SIGINT (Ctrl-C) in epoch 0, at its end;" in result.stdout + result.stderr
    assert saved_step(tmp_path) == 20


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_with_status_130(data_dir, tmp_path):
    argv = one_run(data_dir, tmp_path, "--fault_guard.every_n_steps", "1000", max_epochs=50)
    presses = ("--trainer.callbacks+=tests.helpers.CtrlCAfterStep", "--trainer.callbacks.presses", "2")
    result = run_train(*argv, *presses, "--trainer.callbacks.step", "3", timeout=120)
    assert result.returncode == -signal.SIGINT, result.stderr[-3000:]  # ended by the signal: 130 in a shell
    assert "Traceback" not in result.stderr
    output = result.stdout + result.stderr
    # The first press alone stops at the epoch's end, saying so: the second must not wait for it.
    assert "Stopped by SIGINT" not in output and "Finished" not in output
    assert not (tmp_path / "SeqNet-mnist" / "version_0" / "checkpoints" / "last.ckpt").exists()  # no save at step 3


# 8. Durable checkpoints


def test_checkpoints_reach_the_disk_before_and_after_their_rename(data_dir, tmp_path):
    argv = one_run(data_dir, tmp_path, "--trainer.callbacks+=tests.helpers.RecordDurableWrites", devices=1)
    result = run_in_process("fit", *argv)
    assert result.returncode == 0, result.stderr[-3000:]
    events = json.loads((tmp_path / "durable_writes.json").read_text())
    folder = tmp_path / "SeqNet-mnist" / "version_0" / "checkpoints"
    partial, last = str(folder / ".last.ckpt.partial"), str(folder / "last.ckpt")
    renamed = events.index(["rename", partial, last])
    assert ["fsync", partial] in events[:renamed]  # the data first
    assert ["fsync", str(folder)] in events[renamed + 1 :]  # then the folder entry that names it


def test_a_checkpoint_that_is_not_there_lists_those_of_its_folder(checkpoint, data_dir):
    best, _ = checkpoint
    missing = best.parent / "best.ckpt"
    message = error_line(["test", "--ckpt_path", str(missing), "--data.data_dir", str(data_dir)])
    there = ", ".join(sorted(path.name for path in best.parent.glob("*.ckpt")))
    assert message == f"error: --ckpt_path {missing}: no such file. {best.parent} holds {there}: give one of them."
