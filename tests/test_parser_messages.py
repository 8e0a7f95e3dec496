"""Parser messages: a mistake on the command line or in a config file is one line that names the option as the user
typed it and its deepest cause, in under 300 characters (app/command_line/parser_messages.py; the other kinds of
mistake: tests/test_errors.py)."""

import functools

import pytest
import torch

from tests.helpers import assert_one_error_line, error_line, run_in_process, run_train, small_run

# Two processes, unless a test says otherwise.
one_run = functools.partial(small_run, devices=2)


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


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ("model:\n  class_path: models.SeqNet\n    init_args: {}\n", "line 3: not valid YAML (mapping values are not"),
        ("trainer:\n  max_epochs: 1\n trainer2: 3\n", "line 3: not valid YAML (while parsing a block mapping"),
        ("# nothing but a comment\n", "is empty. Put settings there"),
        ("hello\n", "holds `hello`, not settings. Put settings there"),
        ("- 1\n- 2\n", "holds `- 1 - 2`, not settings. Put settings there"),
        (b"PK\x03\x04\x80\xff", "is not a text file: give a YAML file of settings"),
        ("modle:\n  class_path: models.ConvNet\n", "--modle (from CONFIG): no such option; did you mean --model?"),
    ],
    ids=["not YAML", "badly indented", "empty", "a word", "a list", "a checkpoint", "a misspelt section"],
)
def test_a_config_file_that_cannot_be_read_or_sets_no_option_is_named(tmp_path, config, words):
    """jsonargparse said `in "<unicode string>"`, "Unexpected config:" with nothing or the file's YAML after it, or
    "Subcommand 'fit' does not accept option 'modle.class_path'", naming no file; a file that is no text was "an
    unexpected UnicodeDecodeError"."""
    path = tmp_path / "mine.yaml"
    path.write_bytes(config if isinstance(config, bytes) else config.encode())
    for command in (["fit", "-c", str(path)], ["--config", str(path)]):
        message = error_line(command)
        assert words.replace("CONFIG", str(path)) in message
        assert str(path) in message and "<unicode string>" not in message


def test_of_several_config_files_the_one_that_sets_a_misspelt_option_is_named(tmp_path):
    (tmp_path / "a.yaml").write_text("trainer:\n  max_epochs: 1\n")
    (tmp_path / "b.yaml").write_text("trainer:\n  max_epoch: 3\n")
    message = error_line(["fit", "-c", str(tmp_path / "a.yaml"), "-c", str(tmp_path / "b.yaml")])
    said = f"--trainer.max_epoch (from {tmp_path / 'b.yaml'}): no such option; did you mean --trainer.max_epochs?"
    assert message == f"error: {said}"


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
