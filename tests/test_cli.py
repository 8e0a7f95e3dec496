"""train.py's command line: shortcuts, the default fit-then-test, config round trips and one-line errors."""

import functools
import http.server
import logging
import re
import sys
import threading
from pathlib import Path

import pytest
import torch
import yaml

from app.invocation import train_py
from app.main import main, parse_command
from tests.helpers import ends_in_error, run_command, run_in_process, run_train, small_run

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    ("argv", "args", "test_after_fit"),
    [
        ([], ["fit"], True),
        (["--devices", "4", "--num_nodes", "2"], ["fit", "--trainer.devices=4", "--trainer.num_nodes=2"], True),
        (["--devices=3", "--model", "ConvNet"], ["fit", "--model", "ConvNet", "--trainer.devices=3"], True),
        (
            ["test", "--ckpt_path", "x.ckpt", "--devices", "3"],
            ["test", "--ckpt_path", "x.ckpt", "--trainer.devices=3"],
            False,
        ),
        (["--devices", "2", "validate"], ["validate", "--trainer.devices=2"], False),
        (["--config", "c.yaml", "--devices", "2"], ["fit", "--config", "c.yaml", "--trainer.devices=2"], True),
        (["--config", "c.yaml", "test"], ["--config", "c.yaml", "test"], False),
        (["--trainer.default_root_dir", "test"], ["fit", "--trainer.default_root_dir", "test"], True),
        (["--help"], ["--help"], False),
    ],
)
def test_command_line_becomes_lightning_cli_arguments(argv, args, test_after_fit):
    assert parse_command(argv) == (args, test_after_fit)


def print_config(capsys, *argv: str) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        main([*argv, "--print_config"])
    assert exit_info.value.code in (None, 0)
    return yaml.safe_load(capsys.readouterr().out)


def test_overrides_and_shortcuts_reach_the_config_and_round_trip(capsys, tmp_path):
    config = print_config(
        capsys,
        *("--model", "ConvNet", "--data.dataset", "mnist", "--trainer.max_epochs", "3"),
        *("--model.optimizer", "Adadelta", "--model.optimizer.lr", "0.1", "--devices", "4", "--num_nodes", "2"),
    )
    assert config["model"]["class_path"] == "models.ConvNet"
    assert config["model"]["init_args"]["optimizer"]["class_path"] == "torch.optim.Adadelta"
    assert config["model"]["init_args"]["optimizer"]["init_args"]["lr"] == 0.1
    assert config["data"]["dataset"] == "mnist"
    assert (str(config["trainer"]["devices"]), config["trainer"]["num_nodes"]) == ("4", 2)
    assert (config["trainer"]["strategy"], config["trainer"]["max_epochs"]) == ("ddp", 3)

    saved = tmp_path / "config.yaml"
    saved.write_text(yaml.safe_dump(config))
    assert print_config(capsys, "--config", str(saved)) == config


def test_a_whole_number_of_batches_is_batches_and_a_fraction_a_fraction(capsys, tmp_path):
    """As `Trainer(limit_val_batches=1)` in Python: one batch, not 1.0 (all of them)."""
    options = ("limit_train_batches", "limit_val_batches", "limit_test_batches", "limit_predict_batches")
    given = [f"--trainer.{option}={value}" for option, value in zip(options, ("1", "3", "0.25", "1.0"), strict=True)]
    trainer = print_config(capsys, *given, "--trainer.overfit_batches", "2")["trainer"]
    assert [trainer[option] for option in options] == [1, 3, 0.25, 1.0]
    assert [type(trainer[option]) for option in (*options, "overfit_batches")] == [int, int, float, float, int]
    config = tmp_path / "smoke.yaml"
    config.write_text("trainer:\n  limit_val_batches: 2\n")
    assert isinstance(print_config(capsys, "--config", str(config))["trainer"]["limit_val_batches"], int)


@pytest.mark.parametrize("spelled", ["MNIST", "FashionMNIST", "fashion-mnist"])
def test_a_dataset_is_named_in_any_case(capsys, tmp_path, spelled):
    expected = "mnist" if spelled.lower() == "mnist" else "fashion_mnist"
    assert print_config(capsys, "--data.dataset", spelled)["data"]["dataset"] == expected
    config = tmp_path / "data.yaml"
    config.write_text(f"data:\n  dataset: {spelled}\n")
    assert print_config(capsys, "--config", str(config))["data"]["dataset"] == expected


def test_default_optimizer_is_the_fused_adam_also_with_another_learning_rate(capsys):
    optimizer = print_config(capsys, "--model.optimizer.lr", "0.02")["model"]["init_args"]["optimizer"]
    assert optimizer["class_path"] == "torch.optim.Adam"
    assert (optimizer["init_args"]["lr"], optimizer["init_args"]["fused"]) == (0.02, True)


def test_defaults_are_seqnet_on_fashion_mnist_with_ddp(capsys):
    config = print_config(capsys)
    assert config["model"]["class_path"] == "models.SeqNet"
    assert config["data"]["dataset"] == "fashion_mnist"
    assert (config["trainer"]["strategy"], config["trainer"]["accelerator"]) == ("ddp", "auto")
    assert config["checkpoint"]["monitor"] == "val/acc"


@pytest.mark.parametrize(
    ("config_file", "model", "optimizer", "lr", "dataset", "batch_size", "max_epochs"),
    [
        ("seqnet_fashion_mnist.yaml", "models.SeqNet", "torch.optim.Adam", 0.01, "fashion_mnist", 100, 10),
        ("convnet_mnist.yaml", "models.ConvNet", "torch.optim.Adadelta", 0.01, "mnist", 64, 5),
        ("convnet_fast_gpu.yaml", "models.ConvNet", "torch.optim.Adam", 0.02, "mnist", 512, 2),
    ],
)
def test_the_recipes_of_configs_load(capsys, config_file, model, optimizer, lr, dataset, batch_size, max_epochs):
    config = print_config(capsys, "--config", str(REPO / "configs" / config_file), "--devices", "2")
    model_config = config["model"]
    assert model_config["class_path"] == model
    assert model_config["init_args"]["optimizer"]["class_path"] == optimizer
    assert model_config["init_args"]["optimizer"]["init_args"]["lr"] == lr
    assert (config["data"]["dataset"], config["data"]["batch_size"]) == (dataset, batch_size)
    assert (config["trainer"]["max_epochs"], str(config["trainer"]["devices"])) == (max_epochs, "2")


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--data.dataset", "cifar10"], "data.dataset"),
        (["--model", "ResNet"], "model"),
        (["--data.batch_size", "-5"], "batch_size"),
        (["--trainer.max_epochs", "many"], "max_epochs"),
        (["--config", "README.md"], "config"),
        (["--config", "no/such/file.yaml"], "does not exist"),
        (["--data.on_device", "true", "--data.num_workers", "2"], "--data.num_workers 0"),
    ],
)
def test_bad_arguments_end_in_one_line_and_a_non_zero_exit(argv, expected):
    with ends_in_error() as said:
        main(argv)
    message = said.line
    assert isinstance(message, str) and message.startswith("error: ")
    assert expected in message and "\n" not in message


def test_testing_the_last_checkpoint_of_no_run_ends_in_one_line(data_dir, tmp_path):
    argv = ["test", "--ckpt_path", "last", "--data.dataset", "mnist", "--data.data_dir", str(data_dir)]
    with ends_in_error() as said:
        main([*argv, "--trainer.default_root_dir", str(tmp_path), "--trainer.accelerator", "cpu", "--devices", "1"])
    message = said.line
    assert message.startswith("error: --ckpt_path last: no run under") and "\n" not in message
    assert message.endswith(
        "holds a last checkpoint. Train first, or give --ckpt_path a run's folder or a checkpoint file."
    )


class OpensAFile:
    """Unpickled, it creates the file `path`: a stand-in for a checkpoint that runs code when loaded."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return open, (str(self.path), "w")


def test_a_checkpoint_that_would_run_code_is_refused_in_one_line(data_dir, tmp_path, monkeypatch):
    """Served over HTTP, where Lightning would otherwise load it with `weights_only=False`."""
    marker = tmp_path / "code_ran"
    torch.save({"state_dict": {}, "payload": OpensAFile(marker)}, tmp_path / "evil.ckpt")
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch_home"))  # where torch.hub keeps downloads
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{server.server_address[1]}/evil.ckpt"
        argv = ["test", "--ckpt_path", url, "--data.dataset", "mnist", "--data.data_dir", str(data_dir)]
        try:
            with ends_in_error() as said:
                main([*argv, "--trainer.default_root_dir", str(tmp_path), "--trainer.accelerator", "cpu"])
        finally:
            server.shutdown()
    message = said.line.splitlines()[-1]  # after the test server's own log lines
    assert message.startswith(f"error: refused to load --ckpt_path {url}") and "--weights_only false" in message
    assert "\n" not in message
    assert not marker.exists()


def test_missing_data_offline_ends_in_one_line_without_traceback(tmp_path):
    result = run_train("--data.data_dir", str(tmp_path), "--trainer.accelerator", "cpu", "--devices", "2", timeout=120)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith("error: FashionMNIST is not in") and "t10k-labels-idx1-ubyte" in last_line


def test_truncated_data_ends_in_one_line_without_traceback(data_dir, tmp_path):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for source in (data_dir / "MNIST" / "raw").iterdir():
        (raw / source.name).write_bytes(source.read_bytes()[:2000])
    argv = (
        "--data.dataset",
        "mnist",
        "--data.data_dir",
        str(tmp_path),
        "--trainer.accelerator",
        "cpu",
        "--devices",
        "2",
    )
    result = run_train(*argv, timeout=120)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "corrupt or truncated" in result.stderr.strip().splitlines()[-1]


def test_a_run_of_one_process_says_what_concerns_its_user(data_dir, tmp_path):
    """No banner of a process group of one, no rows of metric objects in the model summary before the network."""
    result = run_train(*small_run(data_dir, tmp_path, "--trainer.limit_train_batches", "2", devices=1))
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    for noise in ("MEMBER: 1/1", "Starting with 1 processes", "Trainer already configured", "MulticlassAccuracy"):
        assert noise not in output, noise
    assert re.search(r"0 \| net +\| Sequential", output), output[-3000:]  # the network is the summary's first row


def test_runs_without_a_logger_and_says_the_batch_it_takes(data_dir, tmp_path):
    """A batch larger than the training set is the training set: the start said "Global batch 5000"."""
    argv = ("--trainer.logger", "false", "--data.data_dir", str(data_dir), "--data.val_size", "200")
    argv += ("--data.batch_size", "5000")  # of the 1000 training images
    result = run_in_process(*argv, "--trainer.max_epochs", "1", "--trainer.default_root_dir", str(tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Global batch 1000 = 1000 per device x 1 processes x 1 accumulated;" in result.stdout + result.stderr
    assert "test/acc" in result.stdout
    assert not list(tmp_path.rglob("events.out.tfevents.*"))
    if not torch.cuda.is_available():  # the default, devices="auto", is one process on a CPU; the start says so
        assert "Training in 1 process on the CPU" in result.stderr and "--devices N trains with DDP" in result.stderr


@pytest.mark.slow
def test_a_second_run_into_the_same_folder_gets_its_own_version(data_dir, tmp_path):
    argv = ("--data.data_dir", str(data_dir), "--data.val_size", "200", "--trainer.max_epochs", "1")
    argv += ("--trainer.accelerator", "cpu", "--devices", "1")  # one process: this one (`run_in_process`)
    for _ in range(2):
        result = run_in_process(*argv, "--trainer.default_root_dir", str(tmp_path))
        assert result.returncode == 0, result.stderr[-2000:]
    versions = sorted(p.name for p in (tmp_path / "SeqNet-fashion_mnist").iterdir())
    assert versions == ["version_0", "version_1"]
    assert all((tmp_path / "SeqNet-fashion_mnist" / v / "config.yaml").is_file() for v in versions)


def test_a_config_file_with_a_tag_that_would_run_code_is_refused_naming_the_file(tmp_path):
    config = tmp_path / "shared.yaml"
    config.write_text(f"trainer:\n  max_epochs: !!python/object/apply:os.system [touch {tmp_path}/pwned]\n")
    (tmp_path / "fine.yaml").write_text("data:\n  batch_size: 32\n")
    with ends_in_error() as said:
        main(["--config", str(tmp_path / "fine.yaml"), "--config", str(config)])
    assert said.line.startswith(
        f"error: --config {config}, line 2: the tag !!python/object/apply:os.system is refused: a config holds plain"
    )
    assert not (tmp_path / "pwned").exists()


def test_help_says_what_the_program_does_with_examples(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["--help"])
    assert exit_info.value.code in (None, 0)
    help_text = capsys.readouterr().out
    assert "Train an image classifier on MNIST or FashionMNIST" in help_text
    assert "--model names it: ConvNet, SeqNet." in help_text  # every ImageClassifier of models/
    assert help_text.count(f"  {train_py()} ") >= 2  # the examples, as they run here
    assert "fit,validate,test,predict" in help_text.replace(" ", "")
    assert f"{train_py()} export --help" in help_text  # the subcommand LightningCLI does not know


def test_export_help_keeps_its_examples_on_their_lines(capsys):
    with pytest.raises(SystemExit):
        main(["export", "--help"])
    lines = capsys.readouterr().out.splitlines()
    assert f"    {train_py()} export --ckpt_path CKPT --format onnx --output model.onnx" in lines


@pytest.mark.parametrize(
    ("argv", "meant"),
    [
        (["--lr", "0.1"], "--model.optimizer.lr"),  # the one option whose last part it is
        (["--epochs", "3"], "--trainer.max_epochs"),  # what other scripts call it
        (["--batch_size", "32"], "--data.batch_size"),
        (["--data.datset", "mnist"], "--data.dataset"),  # a typo: the nearest name
        (["--trainer.max_epoch", "3"], "--trainer.max_epochs"),  # not taken for it: whole names only
        (["test", "--val_size", "100"], "--data.val_size"),
        (["--ckpt", "x.ckpt"], "--ckpt_path"),  # the one option it starts
    ],
)
def test_a_guessed_option_is_pointed_at_the_one_it_most_likely_meant(argv, meant):
    with ends_in_error() as said:
        main(argv)
    assert said.line == f"error: {argv[-2]}: no such option; did you mean {meant}?"


def test_an_unknown_option_with_no_likely_meaning_says_where_every_option_is_listed():
    with ends_in_error() as said:
        main(["--frobnicate", "1"])
    assert said.line == (
        f"error: unrecognized arguments: --frobnicate 1. `{train_py()} fit --help` lists every option."
    )


def test_a_logger_thread_that_sends_at_exit_gets_to_send(data_dir, tmp_path):
    sent = tmp_path / "sent.txt"
    argv = ("--data.data_dir", str(data_dir), "--data.val_size", "200", "--trainer.max_epochs", "1")
    callback = ("--trainer.callbacks+=tests.helpers.SendsAtExit", "--trainer.callbacks.path", str(sent))
    result = run_train(*argv, *callback, "--trainer.default_root_dir", str(tmp_path), timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert sent.read_text() == "sent"


AT_EXIT = """\
import os
from app.command_line.quiet import silence_the_shutdown
silence_the_shutdown()

class WritesAtShutdown:  # freed as the interpreter shuts down, after every exit handler
    def __del__(self):
        os.write(2, b"nanobind: leaked 4 instances!\\n - leaked instance 0x1 of type t\\n")
        os.write(2, b"terminate called without an active exception\\n")

kept = WritesAtShutdown()
print("the last line")
"""


def test_the_shutdown_drops_nanobinds_leak_report_and_keeps_every_other_message():
    result = run_command([sys.executable, "-c", AT_EXIT], timeout=60)
    assert result.returncode == 0 and result.stdout == "the last line\n"
    assert result.stderr == "terminate called without an active exception\n"


def test_the_banner_of_a_process_group_is_silenced_for_one_process_only():
    from app.command_line.quiet import _DropLines

    one = _DropLines("MEMBER: 1/1", at_end=True)
    assert [one.filter(logging.makeLogRecord({"msg": f"GLOBAL_RANK: 0, MEMBER: 1/{n}"})) for n in (1, 10, 16)] == [
        False,
        True,
        True,
    ]
