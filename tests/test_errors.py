"""Every mistake a user can make ends in one line and a non-zero exit, with no traceback and nothing lost.

One group of tests per kind of mistake (the README's error table lists them). Each kind has a real `train.py` run,
with two processes where processes are involved; the many cases of a kind go through `main()` in this process,
which is the same code without the start-up of a new interpreter.
"""

import functools
import json
import re
import shlex
import shutil
import signal
import struct
import zipfile
from pathlib import Path

import pytest
import torch

from app.command_line.errors import PEER_LOST_MESSAGE, blame_option
from app.command_line.speaking import short_traceback
from app.main import main
from tests.helpers import (
    assert_one_error_line,
    error_line,
    run_command,
    run_in_process,
    run_train,
    scalars,
    small_run,
)
from tests.synthetic import write_idx

# Two processes, unless a test says otherwise.
one_run = functools.partial(small_run, devices=2)


# 1. Checkpoint paths and files


def bad_checkpoint(kind: str, folder: Path, good: Path) -> Path:
    """A file (or folder) of the given kind where a checkpoint should be."""
    path = folder / f"{kind}.ckpt"
    if kind == "folder":
        path.mkdir()
    elif kind == "folder_of_runs":  # `runs/SeqNet-mnist`: the runs of a model, not one run
        for number in (2, 10):  # named newest first
            (path / f"version_{number}" / "checkpoints").mkdir(parents=True)
            shutil.copy(good, path / f"version_{number}" / "checkpoints" / "last.ckpt")
        (path / "version_11").mkdir()  # no checkpoint: not named
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
    elif kind == "no_settings":  # a Lightning checkpoint edited by hand, or of a module that saves no settings
        saved = torch.load(good, weights_only=True)
        del saved["hyper_parameters"]
        torch.save(saved, path)
    elif kind == "state_dict_only":
        torch.save(torch.load(good, weights_only=True)["state_dict"], path)
    elif kind == "torchscript":  # what `train.py export --format torchscript` writes
        torch.jit.save(torch.jit.trace(torch.nn.Linear(2, 2), torch.zeros(1, 2)), str(path))
    elif kind == "other_zip":
        with zipfile.ZipFile(path, "w") as archive:
            archive.writestr("notes.txt", "not a checkpoint")
    return path


BAD_CHECKPOINTS = {
    "missing": "no such file",
    "folder": "is a folder, not a checkpoint file or a run's folder. Give a checkpoint file, or last.",
    "folder_of_runs": "It holds version_10, version_2: give one of them, or last.",
    "empty": "is empty (0 bytes)",
    "truncated": "is truncated or corrupt",
    "text": "is not a checkpoint",
    "image": "is not a checkpoint",
    "tensor": "is no Lightning checkpoint",
    "state_dict_only": "is no Lightning checkpoint",
    "no_settings": "holds no model settings (hyper_parameters)",
    "other_zip": "is truncated or corrupt",
    "torchscript": "is a TorchScript model (`train.py export` writes them), not a checkpoint: give the checkpoint",
}


# Every kind where a checkpoint is read for a run (`test`; `fit` and `predict` read it the same way:
# app/run/continuation.py) and for `export`, which reads it on its own.
@pytest.mark.parametrize(
    ("kind", "subcommand"),
    [(kind, subcommand) for kind in BAD_CHECKPOINTS for subcommand in ("test", "export")]
    + [
        (kind, subcommand) for kind in ("missing", "folder_of_runs", "no_settings") for subcommand in ("fit", "predict")
    ],
)
def test_a_bad_checkpoint_file_ends_in_one_line(checkpoint, data_dir, tmp_path, kind, subcommand):
    path, words = bad_checkpoint(kind, tmp_path, checkpoint[0]), BAD_CHECKPOINTS[kind]
    if subcommand == "export":
        argv = ["export", "--ckpt_path", str(path), "--format", "torchscript", "--output", str(tmp_path / "m.pt")]
    else:
        argv = [subcommand, "--ckpt_path", str(path), "--data.data_dir", str(data_dir), "--trainer.accelerator", "cpu"]
    message = error_line(argv)
    assert f"--ckpt_path {path}" in message and words in message
    assert "could run code" not in message


@pytest.mark.slow  # real processes: the newest environment only (CI's time)
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


@pytest.mark.parametrize(
    "command",
    [["fit"], ["test"], ["predict"], ["export", "--format", "onnx", "--output", "model.onnx"]],
    ids=["fit", "test", "predict", "export"],
)
def test_an_empty_ckpt_path_says_so_in_one_line(data_dir, tmp_path, command):
    """`--ckpt_path "$CKPT"` with the variable unset: Lightning took '' for a file ("found no path for the best
    weights", a traceback), and export for the current folder ("--ckpt_path . is a folder")."""
    place = (
        []
        if command[0] == "export"
        else ["--data.data_dir", str(data_dir), "--trainer.default_root_dir", str(tmp_path)]
    )
    message = error_line([*command, "--ckpt_path", "", *place])
    assert message == "error: --ckpt_path '': an empty value names no checkpoint. Give last, a run's folder or a file."
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("subcommand", ["fit", "test"])
def test_ckpt_path_best_in_a_new_process_says_what_to_give_instead(data_dir, tmp_path, subcommand):
    """Lightning's `best` is the best checkpoint of a fit earlier in the same process: for `test` it said that
    "`ModelCheckpoint` is not configured to save the best model", which is false."""
    place = ["--data.data_dir", str(data_dir), "--trainer.default_root_dir", str(tmp_path)]
    message = error_line([subcommand, "--ckpt_path", "best", *place])
    assert message.startswith("error: --ckpt_path best names the best checkpoint of a fit earlier in the same")
    assert message.endswith("give the file a fit's 'Best checkpoint:' line names, a run's folder, or last.")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("subcommand", ["fit", "test"])
def test_a_checkpoint_of_a_class_this_program_no_longer_has_is_not_sent_round_in_a_circle(
    checkpoint, data_dir, tmp_path, subcommand
):
    """Its settings name a model class that is gone: "start a new run from its weights: --ckpt_path" the same file
    was the command just refused."""
    saved = torch.load(checkpoint[0], weights_only=True)
    saved["hyper_parameters"]["_class_path"] = "models.Gone"
    gone = tmp_path / "gone.ckpt"
    torch.save(saved, gone)
    place = ["--data.data_dir", str(data_dir), "--trainer.default_root_dir", str(tmp_path / "runs")]
    message = error_line([subcommand, "--ckpt_path", str(gone), *place])
    assert f"the settings of {gone} do not fit this program now: --model models.Gone: no such class." in message
    assert "Evaluate or continue it with the version of this program that wrote it." in message
    assert "from its weights" not in message and not (tmp_path / "runs").exists()


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
        # Lightning's message names `limit_val_batches` too, as advice: the option whose value it shows is the one
        (
            ["--trainer.val_check_interval", "500", "--trainer.limit_val_batches", "2"],
            "--trainer.val_check_interval 500",
        ),
        (
            ["--trainer.val_check_interval", "0"],
            "--trainer.val_check_interval 0",
        ),  # refused before the run: Lightning divided by it
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


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--model.pixel_mean", "0.5"], "--model.pixel_mean and --model.pixel_std go together"),
        (["--model.pixel_std", "0"], "--model.pixel_mean and --model.pixel_std go together"),
        (["--model.pixel_mean", "0.1", "--model.pixel_std", "-1"], "--model.pixel_mean 0.1 --model.pixel_std -1.0: a"),
    ],
)
def test_a_normalisation_the_model_cannot_use_ends_in_one_line_before_anything_is_written(
    data_dir, tmp_path, args, said
):
    """The mean alone was a traceback (NormalisationUnknown); the deviation alone was replaced by the dataset's while
    the run's records said it was used; a deviation of 0 made a loss of NaN, said as too high a learning rate."""
    message = error_line(list(one_run(data_dir, tmp_path, *args, devices=1)))
    assert message.startswith(f"error: {said}"), message
    assert not tmp_path.joinpath("SeqNet-mnist").exists()


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (
            ["--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.save_top_k", "-1"],
            "--trainer.callbacks ModelCheckpoint has the settings of --last_checkpoint ({'monitor': None,",
        ),
        (["--timed_checkpoint.every_n_epochs", "1"], "--timed_checkpoint has the settings of --last_checkpoint ("),
    ],
    ids=["a checkpoint callback of the user's", "two of this program's"],
)
def test_two_callbacks_whose_states_a_checkpoint_cannot_tell_apart_are_named_before_anything_is_written(
    data_dir, tmp_path, args, said
):
    """Lightning's own check was "an unexpected RuntimeError" with a traceback."""
    message = error_line(list(one_run(data_dir, tmp_path, *args, devices=1)))
    assert message.startswith(f"error: {said}"), message
    assert message.endswith(
        "cannot keep the state of both in a checkpoint: give one of them other settings, or leave it out."
    )
    assert not tmp_path.joinpath("SeqNet-mnist").exists()


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


@pytest.mark.slow  # real processes: the newest environment only (CI's time)
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
        (["--trainer.limit_test_batches", "0"], "tests no batch"),
    ],
)
def test_values_lightning_accepts_keep_lightnings_meaning(data_dir, tmp_path, args, what_lightning_does):
    result = run_in_process(*one_run(data_dir, tmp_path, *args, devices=1, max_epochs=2))
    assert result.returncode == 0, result.stderr[-3000:]
    (run,) = (tmp_path / "SeqNet-mnist").iterdir()
    logged = scalars(run)
    if what_lightning_does == "trains no step":  # and no test after it: the figures of untrained weights
        assert "train/loss" not in logged and "test/acc" not in logged and not list(run.rglob("*.ckpt"))
        assert "No test: the fit took no training step" in result.stderr
        return
    if what_lightning_does == "tests no batch":  # said: the fit ended without a figure of the test, silently
        assert (
            "test/acc" not in logged and "No test: --trainer.limit_test_batches 0 runs no test batch." in result.stderr
        )
        return
    assert "test/acc" in logged  # the run went through to the test
    if what_lightning_does == "logs no step":
        assert "train/loss" not in logged and "workload/samples_per_s" not in logged and "val/acc" in logged
    else:
        assert len(logged["val/acc"]) == 2 and not list(run.rglob("*.ckpt"))


# 3. Files the program reads


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


@pytest.mark.slow  # a run with data-loading workers, as those of test_correctness.py and test_faults.py
def test_a_data_loading_worker_killed_for_want_of_memory_is_a_fault_in_one_line_not_a_bug(data_dir, tmp_path):
    kill = ("--data.num_workers", "1", "--trainer.callbacks+=tests.helpers.KillLoaderWorkers")
    result = run_train(*one_run(data_dir, tmp_path, *kill, devices=1), timeout=120)
    line = assert_one_error_line(result, "DataLoader worker (pid ", "is killed by signal", "out of memory")
    assert "a bug" not in line


# 4. Folders the program writes


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


# 5. Training that diverges


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


def test_an_error_in_training_stands_below_the_progress_bar_on_a_line_of_its_own(data_dir, tmp_path):
    """Lightning leaves a failed stage's progress bar open: the error line, on standard error, was printed after it,
    on the bar's line. The bars are closed first (and so end their line)."""
    argv = one_run(data_dir, tmp_path, "--fault_guard.every_n_steps", "4", max_epochs=3, devices=1)
    diverge = ("--trainer.callbacks+=tests.helpers.DivergeInEpoch", "--trainer.callbacks.epoch", "1")
    result = run_in_process(*argv, *diverge, "--trainer.enable_progress_bar", "true")
    assert result.returncode == 1 and "the training loss became NaN" in result.stderr, result.stderr[-2000:]
    assert "Epoch 1:" in result.stdout and result.stdout.endswith("\n"), repr(result.stdout[-300:])


# 6. Ctrl-C


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
    output = result.stdout + result.stderr
    # The wait for the validation is said as it starts: the stop comes seconds later
    waits = (
        "SIGINT (Ctrl-C): the run stops after this validation, at the end of epoch 0 or after step 1000, whichever"
        " comes first; Ctrl-C again stops at once, keeping what was saved before."
    )
    assert waits in output and output.index(waits) < output.index("Stopped by SIGINT"), output[-3000:]
    assert "Stopped by SIGINT (Ctrl-C) in epoch 0, at its end;" in output
    assert saved_step(tmp_path) == 20


@pytest.mark.slow  # real processes: the newest environment only (CI's time)
def test_ctrl_c_in_the_sanity_check_stops_at_once_and_keeps_no_run(data_dir, tmp_path):
    """It was recorded as a stop of the training, which went on to the first check (50 steps) and kept a run."""
    sanity = ("--trainer.callbacks+=tests.helpers.CtrlCInSanityCheck", "--trainer.num_sanity_val_steps", "2")
    result = run_train(*one_run(data_dir, tmp_path, *sanity, devices=1), timeout=120)
    assert result.returncode == -signal.SIGINT, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "Stopped before the first training step: this command kept nothing." in output and "after step" not in output
    assert not (tmp_path / "SeqNet-mnist").exists()  # the run, and the folder made to hold it, taken back


@pytest.mark.slow  # real processes: the newest environment only (CI's time)
@pytest.mark.parametrize(
    ("signum", "alone", "devices"),
    [(signal.SIGHUP, "false", 1), (signal.SIGTERM, "true", 2)],
    ids=["SIGHUP to the process", "SIGTERM to rank 1 alone"],
)
def test_a_stop_signal_before_the_first_step_takes_the_new_run_back(data_dir, tmp_path, signum, alone, devices):
    """Before the fault guard's handlers (Lightning's setup, as the run's folder gets its first files), the signal's
    own action ended the processes in silence and left a half-written `version_N`. Every rank stops together."""
    instrument = ("--trainer.callbacks+=tests.helpers.SignalAt", "--trainer.callbacks.signum", str(int(signum)))
    instrument += ("--trainer.callbacks.alone", alone)
    result = run_train(*one_run(data_dir, tmp_path, *instrument, devices=devices), timeout=120)
    assert result.returncode == -signum, result.stderr[-3000:]
    assert "Stopped before the first training step: this command kept nothing." in result.stdout + result.stderr
    assert not (tmp_path / "SeqNet-mnist").exists()


@pytest.mark.slow  # real processes: the newest environment only (CI's time)
def test_a_stop_signal_after_the_last_check_of_the_fit_stops_the_test_after_it(data_dir, tmp_path):
    """SIGTERM to rank 1 alone as the fit's loops end, after their last check: it was recorded for a check that never
    came, and the test after the fit ran to its end (exit status 0). Every rank stops as the test starts."""
    instrument = ("--trainer.callbacks+=tests.helpers.SignalAt", "--trainer.callbacks.hook", "on_train_end")
    instrument += ("--trainer.callbacks.alone", "true")
    result = run_train(*one_run(data_dir, tmp_path, *instrument, devices=2), timeout=120)
    assert result.returncode == -signal.SIGTERM, result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert "Stopped in the test after training, which had finished; test " in output and "Finished" not in output


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
    # It said nothing: what is kept is said all the same
    assert (
        "Stopped at once by a second Ctrl-C; no checkpoint had been written, so there is nothing to continue from"
        in (output)
    )


# 7. Durable checkpoints


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


@pytest.mark.timeout(60)  # without the check it waited at the meeting
@pytest.mark.parametrize("node_rank", ["2", "abc"])
def test_a_node_rank_outside_the_job_ends_in_one_line_before_anything_is_written(
    data_dir, tmp_path, monkeypatch, node_rank
):
    """It was "a bug" (gloo's "rank < size", or int()'s ValueError) with a traceback, while node 0 waited."""
    monkeypatch.setenv("NODE_RANK", node_rank)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "9")  # nothing to meet: the command ends before the meeting
    result = run_in_process("fit", *one_run(data_dir, tmp_path, "--num_nodes", "2", devices=1))
    assert result.returncode == 1
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .endswith(f"NODE_RANK {node_rank}: each of the --num_nodes 2 nodes takes its own NODE_RANK, from 0 to 1.")
    ), result.stderr[-3000:]
    assert list(tmp_path.iterdir()) == []
