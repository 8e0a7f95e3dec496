"""A run's life, as a researcher lives it: runs started at once, continued, extended, changed, predicted twice, with
nothing lost or mixed up. Runs of one process run in the test's process (`run_in_process`); runs that are about
processes (several at once, a stop by a signal) and those of a model of the tests' own are real runs of train.py."""

import hashlib
import multiprocessing
import os
import re
import shutil
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
import yaml

from app.errors import UserError
from app.invocation import train_py
from app.run.continuation import changes_between
from app.run.folder import RunFolder, read_record, write_record
from tests.helpers import Run, TrainJob, run_in_process, run_train, small_run

TINY = ("--model", "tests.tiny_net.TinyNet")  # a model with a setting of its own: --model.width (real runs only)


def one_process(data_dir: Path, root: Path, *args: str, **settings) -> list[str]:
    return small_run(data_dir, root, *args, **{"devices": 1, **settings})


def folder_hashes(folder: Path) -> dict[str, str]:
    """Every file under `folder` and the hash of its bytes: a folder left "byte for byte as it was"."""
    return {
        str(p.relative_to(folder)): hashlib.sha1(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


def last_checkpoint(run: Path) -> dict:
    return torch.load(run / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=True)


def one_error_line(result) -> str:
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(errors) == 1, result.stderr[-3000:]
    return errors[0]


# 1. A run owns its folder


def _claim(parent: str, start: multiprocessing.Barrier, claimed: multiprocessing.Queue) -> None:
    start.wait()  # every process lists the folder and claims at the same moment
    claimed.put(RunFolder(Path(parent)).claim().name)


def test_runs_that_claim_a_folder_at_the_same_moment_get_one_each(tmp_path):
    context = multiprocessing.get_context("fork")
    start, claimed = context.Barrier(8), context.Queue()
    processes = [context.Process(target=_claim, args=(str(tmp_path), start, claimed)) for _ in range(8)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=60)
    names = sorted(claimed.get(timeout=5) for _ in processes)
    assert names == sorted(f"version_{n}" for n in range(8))


def _hold(run: str, held: multiprocessing.Event, done: multiprocessing.Event) -> None:
    RunFolder(None, Path(run)).take()
    held.set()
    done.wait(60)


def test_a_run_held_by_another_process_is_refused_until_that_process_ends(tmp_path):
    run = tmp_path / "version_0"
    run.mkdir()
    context = multiprocessing.get_context("fork")  # a second process holding the run, without an interpreter's start
    held, done = context.Event(), context.Event()
    holder = context.Process(target=_hold, args=(str(run), held, done))
    holder.start()
    try:
        assert held.wait(30), "the other process did not take the run"
        with pytest.raises(UserError) as refused:
            RunFolder(tmp_path, run).take()
        assert str(refused.value) == (
            f"{run} is being trained by another process right now (it holds the run's lock). Wait for it to end, or"
            " start a new run."
        )
    finally:
        done.set()
        holder.join(30)
        holder.kill()
    RunFolder(tmp_path, run).take()  # the lock went with the process that held it


def test_three_runs_started_at_once_in_one_folder_get_three_folders_each_with_its_own_settings(data_dir, tmp_path):
    def fit(lr: str) -> Run:
        return run_train("fit", *one_process(data_dir, tmp_path), "--model.optimizer.lr", lr)

    with ThreadPoolExecutor(3) as at_once:
        runs = list(at_once.map(fit, ("0.001", "0.002", "0.003")))
    for run in runs:
        assert run.returncode == 0, run.stderr[-3000:]
    folders = sorted((tmp_path / "SeqNet-mnist").iterdir())
    assert [folder.name for folder in folders] == ["version_0", "version_1", "version_2"]
    learning_rates = set()
    for folder in folders:
        recorded = yaml.safe_load((folder / "config.yaml").read_text())["model"]["init_args"]["optimizer"]
        trained = last_checkpoint(folder)["hyper_parameters"]["optimizer"]
        assert recorded["init_args"]["lr"] == trained["init_args"]["lr"]
        learning_rates.add(recorded["init_args"]["lr"])
    assert learning_rates == {0.001, 0.002, 0.003}


# 2. Continuing a run continues that run, with what the command changes said in one line


@pytest.fixture(scope="module")
def adadelta_run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SeqNet trained for one epoch with Adadelta and a constant learning rate, as the CNN tutorial does."""
    root = tmp_path_factory.mktemp("adadelta")
    recipe = ("--model.optimizer", "Adadelta", "--model.optimizer.lr", "0.5", "--model.one_cycle", "false")
    result = run_in_process("fit", *one_process(data_dir, root, *recipe))
    assert result.returncode == 0, result.stderr[-3000:]
    return root


@pytest.fixture(scope="module")
def tiny_run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A TinyNet, a model with a setting of its own (`--model.width 8`), trained for one epoch."""
    root = tmp_path_factory.mktemp("tiny")
    result = run_train("fit", *one_process(data_dir, root, *TINY))
    assert result.returncode == 0, result.stderr[-3000:]
    return root


def copy_of(root: Path, tmp_path: Path) -> Path:
    shutil.copytree(root, tmp_path, dirs_exist_ok=True)
    (run,) = (folder / "version_0" for folder in tmp_path.glob("*-mnist"))
    return run


def test_a_run_continued_with_another_optimizer_and_more_epochs_goes_on_in_its_folder(data_dir, tmp_path, adadelta_run):
    run = copy_of(adadelta_run, tmp_path)
    started = (run / "config.yaml").read_text()
    # The README's second line: the model and the dataset named, the optimizer left to its default (Adam), and more
    # epochs: Adam cannot take Adadelta's state (KeyError: 'betas' before), so it starts afresh.
    args = ("--model.optimizer", "Adam", "--trainer.max_epochs", "2", "--ckpt_path", "last")
    result = run_in_process("fit", *one_process(data_dir, tmp_path, *args))
    assert result.returncode == 0, result.stderr[-3000:]
    output = result.stdout + result.stderr
    said = [line for line in output.splitlines() if line.startswith("--ckpt_path last: continuing")]
    assert said == [
        f"--ckpt_path last: continuing {run}, from checkpoints/last.ckpt (step 20, epoch 0); changed:"
        " --trainer.max_epochs 1 -> 2, --model.optimizer Adadelta -> Adam (lr 0.5)."
    ]
    assert "Continuing at step 20: Adam starts afresh (the checkpoint's state does not fit it)" in output
    assert [folder.name for folder in run.parent.iterdir()] == ["version_0"]
    assert (run / "config.yaml").read_text() == started  # the record of how it was started stays
    continued = (run / "config-continued-1.yaml").read_text()
    assert continued.startswith(f"# Continued {run}, from checkpoints/last.ckpt (step 20, epoch 0)\n# Changed: ")
    assert yaml.safe_load(continued)["model"]["init_args"]["optimizer"]["class_path"] == "torch.optim.Adam"
    final = last_checkpoint(run)
    assert final["global_step"] == 40
    assert "exp_avg" in final["optimizer_states"][0]["state"][0]  # Adam's state now
    # Another learning rate (Adam took Adadelta's 0.5): Adam keeps its moments, and trains with the new rate.
    args = ("--model.optimizer.lr", "0.02", "--trainer.max_epochs", "3", "--ckpt_path", "last")
    result = run_in_process("fit", *one_process(data_dir, tmp_path, *args))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "changed: --trainer.max_epochs 2 -> 3, --model.optimizer.lr 0.5 -> 0.02." in result.stderr
    assert "Continuing at step 40: Adam keeps its state and takes the command's settings" in result.stderr
    assert last_checkpoint(run)["optimizer_states"][0]["param_groups"][0]["lr"] == 0.02
    # A switch that shapes the state (AMSGrad keeps one more moment): a KeyError before; now Adam starts afresh.
    args = ("--model.optimizer.amsgrad", "true", "--trainer.max_epochs", "4", "--ckpt_path", "last")
    result = run_in_process("fit", *one_process(data_dir, tmp_path, *args))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Continuing at step 60: Adam starts afresh (the checkpoint's state does not fit it)" in result.stderr
    assert "max_exp_avg_sq" in last_checkpoint(run)["optimizer_states"][0]["state"][0]


def test_a_run_continued_with_another_batch_size_says_how_many_steps_it_will_take(data_dir, tmp_path, adadelta_run):
    """Epoch 0 took 20 steps of 50 images; epoch 1 takes 10 of 100: 30 in the run. The start counted every epoch at
    today's size (20), where the run then ended at another step."""
    run = copy_of(adadelta_run, tmp_path)
    args = ("--data.batch_size", "100", "--trainer.max_epochs", "2", "--ckpt_path", "last")
    result = run_in_process("fit", *one_process(data_dir, tmp_path, *args))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "; 10 optimizer steps per epoch, 30 in the run." in result.stdout + result.stderr
    assert last_checkpoint(run)["global_step"] == 30


def test_a_run_of_one_batch_an_epoch_says_so(data_dir, tmp_path):
    """`--trainer.limit_train_batches 1` is one batch (1.0 would be all of them): the start said 21 in the run."""
    args = ("--trainer.limit_train_batches", "1", "--trainer.max_epochs", "2", "--model.one_cycle", "false")
    result = run_in_process("fit", *one_process(data_dir, tmp_path, *args))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "; 1 optimizer steps per epoch, 2 in the run." in result.stdout
    assert last_checkpoint(tmp_path / "SeqNet-mnist" / "version_0")["global_step"] == 2


@pytest.mark.parametrize("named", ["moved, relative", "a link to it", "moved to another version"])
def test_a_run_named_by_another_spelling_of_its_folder_keeps_its_best_checkpoint(
    data_dir, tmp_path, adadelta_run, monkeypatch, named
):
    """Moved, and named relative to the working folder, or through a link, or moved to another `version_N`:
    Lightning compares the checkpoint folder as text, so it dropped the best score (the next epoch, no better,
    became the best) and kept the old folder's best file, which names another run's file (tested after the fit)."""
    run = copy_of(adadelta_run, tmp_path)
    if named == "moved to another version":
        run = run.rename(run.with_name("version_3"))
    monkeypatch.chdir(tmp_path)
    given = run.relative_to(tmp_path)
    if named == "a link to it":
        (tmp_path / "link").symlink_to(given)
        given = Path("link")
    args = ("--ckpt_path", str(given), "--trainer.max_epochs", "2")
    result = run_in_process(*one_process(data_dir, None, *args, "--model.optimizer.lr", "0"))  # epoch 1 = epoch 0
    assert result.returncode == 0, result.stderr[-3000:]
    (best,) = re.findall(r"^Best checkpoint: (.+)$", result.stdout + result.stderr, re.MULTILINE)
    assert Path(best).resolve() == run / "checkpoints" / "epoch=0-step=20.ckpt"
    assert sorted(path.name for path in (run / "checkpoints").iterdir()) == ["epoch=0-step=20.ckpt", "last.ckpt"]


def test_a_print_config_file_that_leaves_the_normalisation_null_changes_nothing(data_dir, tmp_path, adadelta_run):
    """`--print_config` writes `pixel_mean: null` (taken from the data): the weights' own were used, but the line
    said "changed: --model.pixel_mean 0.1307 -> null"."""
    run = copy_of(adadelta_run, tmp_path)
    config = tmp_path / "printed.yaml"
    config.write_text("model:\n  class_path: models.SeqNet\n  init_args:\n    pixel_mean: null\n    pixel_std: null\n")
    result = run_in_process("test", "--config", str(config), *one_process(data_dir, None, "--ckpt_path", str(run)))
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("--ckpt_path")]
    assert said == [f"--ckpt_path {run}: {run}, from checkpoints/last.ckpt (step 20, epoch 0)."], said


def test_a_continued_run_whose_best_checkpoint_was_removed_keeps_its_training_and_says_so(
    data_dir, tmp_path, adadelta_run
):
    """Checkpoints are removed to free a disk: the test after the fit failed to load the best one, a bug's
    FileNotFoundError, after all the training."""
    run = copy_of(adadelta_run, tmp_path)
    (run / "checkpoints" / "epoch=0-step=20.ckpt").unlink()
    args = ("--ckpt_path", str(run), "--trainer.max_epochs", "2", "--model.optimizer.lr", "0")  # no better epoch
    result = run_in_process(*one_process(data_dir, None, *args))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: the run's best checkpoint, {run / 'checkpoints' / 'epoch=0-step=20.ckpt'}, is not there (removed after"
        " it was saved, or on another node's disk): there is no test after this fit. The training is kept; test its"
        f" last checkpoint with: {train_py()} test --ckpt_path {run}"
    )
    assert torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)["epoch"] == 1


def test_a_run_extended_by_epochs_plans_its_one_cycle_schedule_again_and_a_second_continuation_keeps_it(
    data_dir, tmp_path
):
    result = run_in_process("fit", *one_process(data_dir, tmp_path, max_epochs=1))  # 20 steps of 50 samples
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "SeqNet-mnist" / "version_0"
    # Two more epochs, of 40 steps of 25 samples: "Tried to step 21 times" before.
    extended = run_in_process(
        "fit", *one_process(data_dir, tmp_path, "--ckpt_path", "last", max_epochs=3, batch_size=25)
    )
    assert extended.returncode == 0, extended.stderr[-3000:]
    output = extended.stdout + extended.stderr
    assert "changed: --trainer.max_epochs 1 -> 3, --data.batch_size 50 -> 25." in output
    assert "the one-cycle schedule is planned over 100 steps (it was 20), from here, peaking at learning rate 0.01" in (
        output
    )
    final = last_checkpoint(run)
    schedule, group = final["lr_schedulers"][0], final["optimizer_states"][0]["param_groups"][0]
    assert final["global_step"] == schedule["total_steps"] == schedule["last_epoch"] == 100  # the cycle, whole
    assert group["lr"] < group["max_lr"] / 1000  # annealed to its end
    # Continued again, unchanged: the run's newest settings (3 epochs) are the defaults; nothing is said changed.
    again = run_in_process(
        "fit", *one_process(data_dir, tmp_path, "--ckpt_path", "last", max_epochs=None, batch_size=None)
    )
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"--ckpt_path last: continuing {run}, from checkpoints/last.ckpt (step 100, epoch 2)." in again.stderr
    assert sorted(path.name for path in run.glob("config*.yaml")) == [
        "config-continued-1.yaml",
        "config-continued-2.yaml",
        "config.yaml",
    ]


def test_a_changed_model_setting_is_named_in_one_line_and_the_run_stays_as_it_was(data_dir, tmp_path, tiny_run):
    run = copy_of(tiny_run, tmp_path)
    before = folder_hashes(run)
    result = run_train("fit", *one_process(data_dir, tmp_path, *TINY, "--model.width", "16", "--ckpt_path", "last"))
    line = one_error_line(result)
    assert line == (
        f"error: --model.width 16 does not fit the run it continues: {run} was built with --model.width 8. A run"
        " continues with the model and data it was started with: leave --model.width out (the run's settings,"
        f" {run / 'config.yaml'}, are the defaults), or train a new run without --ckpt_path."
    )
    assert folder_hashes(run) == before  # byte for byte
    # The same weights tested as a checkpoint file: the setting that makes them not fit is named, not a size
    # mismatch cut mid-word.
    checkpoint = run / "checkpoints" / "last.ckpt"
    test = ("test", "--ckpt_path", str(checkpoint))
    result = run_train(*test, *one_process(data_dir, tmp_path, "--model.width", "16", model=None))
    assert one_error_line(result) == (
        f"error: --ckpt_path {checkpoint} holds the weights of another TinyNet than --model.width 16 (the"
        " checkpoint's: 8) builds. Leave --model.width out: the checkpoint's settings are the defaults."
    )
    assert folder_hashes(run) == before
    # The run's folder names the model: its own setting is taken without --model (a SeqNet has none).
    result = run_train(
        "fit", "--ckpt_path", str(run), *one_process(data_dir, tmp_path, "--model.width", "16", model=None)
    )
    assert one_error_line(result).startswith(f"error: --model.width 16 does not fit the run it continues: {run} was")
    assert folder_hashes(run) == before


def test_a_mistake_found_once_the_processes_met_leaves_no_folder_and_the_run_as_it_was(
    data_dir, tmp_path, adadelta_run
):
    run = copy_of(adadelta_run, tmp_path)
    before = folder_hashes(run)
    mistake = ("--model.optimizer.lr", "-1")  # torch refuses it when the optimizer is made, after the meeting
    continued = run_in_process("fit", *one_process(data_dir, tmp_path, *mistake, "--ckpt_path", "last"))
    assert one_error_line(continued).startswith("error: --model.optimizer.lr -1.0: Invalid learning rate: -1.0.")
    assert folder_hashes(run) == before  # no record that the next continuation would take as the run's settings
    new = run_in_process("fit", *one_process(data_dir, tmp_path / "new", *mistake))
    assert one_error_line(new).startswith("error: --model.optimizer.lr -1.0: Invalid learning rate: -1.0.")
    assert not list((tmp_path / "new").rglob("version_*"))  # a run that never trained leaves no folder


def test_a_run_stopped_in_an_epoch_finishes_it_with_batches_of_the_same_size(data_dir, tmp_path):
    stop = ("--trainer.callbacks+=tests.helpers.SigtermAfterStep", "--trainer.callbacks.step", "5")
    stopped = run_train("fit", *one_process(data_dir, tmp_path, *stop, "--fault_guard.every_n_steps", "4"))
    assert stopped.returncode == -signal.SIGTERM, stopped.stderr[-3000:]
    run = tmp_path / "SeqNet-mnist" / "version_0"
    before = folder_hashes(run)
    smaller = run_in_process("fit", *one_process(data_dir, tmp_path, "--ckpt_path", "last", batch_size=25))
    assert one_error_line(smaller) == (
        "error: the run stopped in the middle of epoch 0, whose batches took 50 samples over all processes; it"
        " finishes that epoch with batches of as many (25 x 1 now). Finish it first (--trainer.max_epochs 1, with"
        " --data.batch_size 50 on 1 process(es)), then change the batch."
    )
    assert folder_hashes(run) == before
    # Accumulating two batches per step keeps the batches: the epoch goes on, the schedule ends with the run.
    more = ("--ckpt_path", "last", "--trainer.accumulate_grad_batches", "2")
    continued = run_in_process("fit", *one_process(data_dir, tmp_path, *more, max_epochs=2))
    assert continued.returncode == 0, continued.stderr[-3000:]
    final = last_checkpoint(run)
    schedule = final["lr_schedulers"][0]
    assert final["global_step"] == schedule["total_steps"] == schedule["last_epoch"] == 8 + 6 + 10


def test_a_continuation_that_fails_before_its_first_step_leaves_the_run_as_it_was(data_dir, tmp_path, adadelta_run):
    run = copy_of(adadelta_run, tmp_path)
    before = folder_hashes(run)
    fails = ("--trainer.callbacks+=tests.helpers.FailOnRank", "--ckpt_path", "last", "--trainer.max_epochs", "2")
    result = run_in_process("fit", *one_process(data_dir, tmp_path, *fails))
    assert result.returncode == 1 and "planned failure on rank 0" in result.stderr, result.stderr[-3000:]
    assert folder_hashes(run) == before  # no record of a continuation that never trained, no event file


def test_a_run_being_trained_is_not_continued_by_a_second_process(data_dir, tmp_path):
    argv = ["fit", *one_process(data_dir, tmp_path, max_epochs=1000)]
    first = TrainJob(*argv, output=tmp_path / "first.out")
    try:
        last = tmp_path / "SeqNet-mnist" / "version_0" / "checkpoints" / "last.ckpt"
        deadline = time.monotonic() + 120
        while not last.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert last.exists(), "the first run saved no checkpoint"
        kept = [last, *last.parents[1].glob("config*.yaml"), *last.parents[1].glob("events.out.tfevents.*")]
        second = run_in_process("fit", *one_process(data_dir, tmp_path, "--ckpt_path", "last", max_epochs=1000))
        assert all(path.exists() for path in kept), "the refused process removed files of the run"
    finally:
        first.kill()
    assert one_error_line(second) == (
        f"error: {last.parents[1]} is being trained by another process right now (it holds the run's lock). Wait"
        " for it to end, or start a new run."
    )


def test_a_logger_of_the_users_cannot_continue_a_run_in_its_folder(data_dir, tmp_path, adadelta_run):
    run = copy_of(adadelta_run, tmp_path)
    logger = ("--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", str(tmp_path / "csv"))
    result = run_in_process("fit", *one_process(data_dir, tmp_path, "--ckpt_path", "last", *logger))
    assert one_error_line(result) == (
        f"error: --ckpt_path last continues {run} in its folder, where --trainer.logger would not write: leave"
        " --trainer.logger out to continue the run, or start a new run from its weights with --ckpt_path"
        f" {run / 'checkpoints' / 'last.ckpt'}."
    )


def test_a_run_recorded_before_its_model_gained_an_argument_continues_where_the_default_rebuilds_it(
    data_dir, tmp_path, adadelta_run
):
    """A run of an earlier version of this program holds no `cycle_momentum` (added since, default true) in its record
    or its checkpoint: continued, the argument at its default is no change of the model; another value is."""
    run = copy_of(adadelta_run, tmp_path)
    record = yaml.safe_load((run / "config.yaml").read_text())
    del record["model"]["init_args"]["cycle_momentum"]
    (run / "config.yaml").write_text(yaml.safe_dump(record))
    for path in (run / "checkpoints").glob("*.ckpt"):
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
        del checkpoint["hyper_parameters"]["cycle_momentum"]
        torch.save(checkpoint, path)
    args = ("--trainer.max_epochs", "2", "--ckpt_path", "last")
    result = run_in_process("fit", *one_process(data_dir, tmp_path, *args))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "changed: --trainer.max_epochs 1 -> 2." in result.stderr
    before = {"model": {"class_path": "models.ConvNet", "init_args": {"one_cycle": True}}}
    sizes = {"channels": [32, 64], "kernel_sizes": (3, 3), "hidden": 128, "batch_norm": True, "cycle_momentum": True}
    after = {"model": {"class_path": "models.ConvNet", "init_args": {"one_cycle": True, **sizes}}}
    assert changes_between(before, after) == []
    after["model"]["init_args"] |= {"channels": [24, 32], "cycle_momentum": False}
    assert list(map(str, changes_between(before, after))) == [
        "--model.channels null -> [24, 32]",
        "--model.cycle_momentum null -> false",
    ]


def test_what_a_command_changes_is_each_option_once_and_a_new_class_without_its_arguments():
    before = {
        "trainer": {"max_epochs": 1, "devices": "auto"},
        "model": {
            "class_path": "models.ConvNet",
            "init_args": {"optimizer": {"class_path": "torch.optim.Adadelta", "init_args": {"rho": 0.9}}},
        },
        "ckpt_path": None,
    }
    after = {
        "trainer": {"max_epochs": 3, "devices": "auto"},
        "model": {
            "class_path": "models.ConvNet",
            "init_args": {"optimizer": {"class_path": "torch.optim.Adam", "init_args": {"betas": [0.9, 0.999]}}},
        },
        "ckpt_path": "last",
    }
    assert list(map(str, changes_between(before, after))) == [
        "--trainer.max_epochs 1 -> 3",
        "--model.optimizer Adadelta -> Adam",  # its arguments are not listed; a learning rate would be
    ]


# 3. Outputs never overwrite outputs


def test_two_predicts_of_one_checkpoint_keep_both_and_an_explicit_file_is_never_overwritten(
    checkpoint, data_dir, tmp_path
):
    best, _ = checkpoint
    run = tmp_path / "runs" / "SeqNet-mnist" / "version_0"
    shutil.copytree(best.parents[1], run)
    argv = ("predict", "--ckpt_path", str(run / "checkpoints" / best.name), "--data.data_dir", str(data_dir))
    argv += ("--trainer.accelerator", "cpu")
    written = []
    for _ in range(2):
        result = run_in_process(*argv)
        assert result.returncode == 0, result.stderr[-3000:]
        last_line = (result.stdout + result.stderr).strip().splitlines()[-1]
        assert last_line.startswith("Predictions: ")
        written.append(Path(last_line.removeprefix("Predictions: ")))
    assert written[0] != written[1] and all(path.parents[1] == run / "predict" for path in written)
    assert written[0].read_bytes() == written[1].read_bytes()  # the first is still there, whole
    mine = tmp_path / "mine.csv"
    mine.write_text("an earlier file\n")
    refused = run_in_process(*argv, "--predictions.path", str(mine))
    assert one_error_line(refused).startswith(f"error: --predictions.path {mine}: {mine} exists already")
    assert mine.read_text() == "an earlier file\n"


def test_a_test_with_an_explicit_root_writes_there_and_each_test_has_a_folder_of_its_own(
    checkpoint, data_dir, tmp_path
):
    best, _ = checkpoint
    argv = ("test", "--ckpt_path", str(best), "--data.data_dir", str(data_dir), "--trainer.accelerator", "cpu")
    for n in (0, 1):
        result = run_in_process(*argv, "--trainer.default_root_dir", str(tmp_path / "eval"))
        assert result.returncode == 0, result.stderr[-3000:]
        last_line = (result.stdout + result.stderr).strip().splitlines()[-1]
        assert last_line == f"Logs: {tmp_path / 'eval' / 'SeqNet-mnist' / 'test' / f'version_{n}'}"


# 4. Open-ended runs


def test_an_open_ended_run_trains_until_its_step_limit_and_says_what_its_learning_rate_does(data_dir, tmp_path):
    result = run_in_process("fit", *one_process(data_dir, tmp_path, "--trainer.max_steps", "15", max_epochs=-1))
    assert result.returncode == 0, result.stderr[-3000:]  # one-cycle over the 15 steps
    assert last_checkpoint(tmp_path / "SeqNet-mnist" / "version_0")["global_step"] == 15
    # Continued with no end in steps: the annealed one-cycle rate gives way to the command's, constant.
    endless = ("--ckpt_path", "last", "--trainer.max_steps", "-1", "--trainer.max_time", "00:00:00:03")
    endless = run_in_process("fit", *one_process(data_dir, tmp_path, *endless, max_epochs=-1))
    assert endless.returncode == 0, endless.stderr[-3000:]
    assert (
        "Continuing at step 15: Adam keeps its state and takes the command's settings; no learning-rate schedule"
        " from here: the rate stays at 0.01; the weights continue." in endless.stderr
    )
    assert (
        "learning rate 0.01, constant: the run's number of steps is open (--trainer.max_epochs -1 without"
        " --trainer.max_steps), so there is no one-cycle schedule to plan" in endless.stdout + endless.stderr
    )
    group = last_checkpoint(tmp_path / "SeqNet-mnist" / "version_0")["optimizer_states"][0]["param_groups"][0]
    assert group["lr"] == 0.01 and "max_lr" not in group


def test_a_record_is_written_whole_or_not_at_all_and_never_over_another(tmp_path, monkeypatch):
    record = tmp_path / "config.yaml"
    write_record(record, "model: SeqNet\n")
    with pytest.raises(FileExistsError):
        write_record(record, "model: ConvNet\n")
    assert record.read_text() == "model: SeqNet\n"

    def killed_while_writing(descriptor: int) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(os, "fsync", killed_while_writing)
    with pytest.raises(KeyboardInterrupt):
        write_record(tmp_path / "config-continued-1.yaml", "trainer: {}\n")
    assert not (tmp_path / "config-continued-1.yaml").exists()  # no half record for the next continuation to read
    assert sorted(path.name for path in tmp_path.iterdir()) == ["config.yaml"]  # and nothing else left


@pytest.mark.parametrize("damage", ["", "\x00\x81", "- a list\n"])
def test_a_record_that_holds_no_settings_is_named(tmp_path, damage):
    record = tmp_path / "config.yaml"
    record.write_bytes(damage.encode("latin-1"))
    with pytest.raises(UserError, match=f"^{re.escape(str(record))} is damaged \\("):
        read_record(record)


def test_a_damaged_record_is_one_line_naming_the_file(checkpoint, tmp_path, data_dir):
    best, _ = checkpoint
    run = tmp_path / "SeqNet-mnist" / "version_0"
    shutil.copytree(best.parents[1], run, ignore=shutil.ignore_patterns("test", "predict", "validate"))
    (run / "config.yaml").write_text("model:\n  class_path: models.SeqNet\n  init_args: {optimi")  # cut short
    before = folder_hashes(run)
    result = run_in_process("fit", *one_process(data_dir, tmp_path, "--ckpt_path", "last"))
    assert result.returncode == 1 and "Traceback" not in result.stderr
    last_line = result.stderr.strip().splitlines()[-1]
    assert last_line.startswith(f"error: {run / 'config.yaml'} is damaged ("), last_line
    assert folder_hashes(run) == before
