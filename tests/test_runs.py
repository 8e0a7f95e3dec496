"""RunLogger's folders: claimed once, held while a command runs, taken back when it kept nothing; and what
`--ckpt_path` finds."""

import fcntl
import multiprocessing
import os
from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback

from app.console import UserError
from app.runs import RunLogger, next_record, records
from app.start import find_start
from tests.helpers import run_in_process, small_run


def _claim(root: str, go, out) -> None:
    go.wait()
    out.put(RunLogger(root, "SeqNet-mnist").version)


def test_runs_that_claim_a_folder_at_the_same_moment_get_one_each(tmp_path):
    forks = multiprocessing.get_context("fork")
    go, out = forks.Event(), forks.Queue()
    processes = [forks.Process(target=_claim, args=(str(tmp_path), go, out)) for _ in range(6)]
    for process in processes:
        process.start()
    go.set()
    claimed = sorted(out.get(timeout=60) for _ in processes)
    for process in processes:
        process.join(60)
    assert claimed == list(range(6))
    assert sorted(p.name for p in (tmp_path / "SeqNet-mnist").iterdir()) == [f"version_{n}" for n in range(6)]


def test_a_command_that_kept_nothing_takes_its_writing_back_and_one_that_kept_a_checkpoint_stays(tmp_path):
    failed = RunLogger(str(tmp_path / "runs"), "SeqNet-mnist")
    failed.log_hyperparams({"lr": 0.01})  # writes its event file
    failed.finalize("failed")
    assert not (tmp_path / "runs").exists()  # and the folders the claim made

    kept = RunLogger(str(tmp_path / "runs"), "SeqNet-mnist")
    folder = Path(kept.log_dir)
    (folder / "checkpoints").mkdir()
    torch.save({}, folder / "checkpoints" / "last.ckpt")
    kept.finalize("failed")
    assert folder.is_dir()

    continued = RunLogger(str(tmp_path / "runs"), "SeqNet-mnist", version=folder.name)
    assert continued.log_dir == str(folder)
    before = sorted(folder.rglob("*"))
    (folder / "config-continued-1.yaml").write_text("")
    continued.log_hyperparams({"lr": 0.02})
    continued.finalize("failed")
    assert sorted(folder.rglob("*")) == before


def test_records_are_never_written_over(tmp_path):
    run = tmp_path / "version_0"
    run.mkdir()
    assert next_record(None) == next_record(run) == "config.yaml"
    for name in ("config.yaml", "config-continued-1.yaml", "config-continued-2.yaml"):
        (run / name).write_text("a: 1\n")
    assert next_record(run) == "config-continued-3.yaml"
    assert [p.name for p in records(run)] == ["config.yaml", "config-continued-1.yaml", "config-continued-2.yaml"]


def test_last_is_the_newest_run_that_holds_a_last_checkpoint(checkpoint, tmp_path):
    best, _ = checkpoint
    runs = tmp_path / "SeqNet-mnist"
    for number, saved in ((0, True), (1, True), (2, False)):
        (runs / f"version_{number}" / "checkpoints").mkdir(parents=True)
        shape = "  devices: 4\n  num_nodes: 2\n  accelerator: gpu\n"  # where it ran: not where it runs now
        shape += "  plugins:\n    class_path: lightning.pytorch.plugins.environments.KubeflowEnvironment\n"  # (a pod's)
        (runs / f"version_{number}" / "config.yaml").write_text(f"trainer:\n  max_epochs: 1\n{shape}")
        if saved:
            (runs / f"version_{number}" / "checkpoints" / "last.ckpt").write_bytes(best.read_bytes())
    start = find_start("last", "fit", runs)
    assert start.run == runs / "version_1" and start.continues and start.settings == {"trainer": {"max_epochs": 1}}
    assert find_start("last", "test", runs).settings["model"]["class_path"] == "models.SeqNet"  # the weights' own
    assert find_start(str(runs / "version_0"), "fit", runs).run == runs / "version_0"
    assert find_start("last", "fit", tmp_path / "none") is None  # nothing to continue: a new run
    many = tmp_path / "many"
    for number in range(12):
        (many / f"version_{number}" / "checkpoints").mkdir(parents=True)
        (many / f"version_{number}" / "checkpoints" / "last.ckpt").write_bytes(b"")
    with pytest.raises(UserError, match="it holds the runs version_9, version_10, version_11: give one of them"):
        find_start(str(many), "test", many)  # the newest, by their numbers
    (runs / "version_1" / "config.yaml").write_text("- not: settings\n")
    with pytest.raises(UserError, match="config.yaml is damaged"):
        find_start("last", "fit", runs)


def test_two_predicts_of_one_checkpoint_keep_both_and_a_file_named_is_never_written_over(checkpoint, data_dir):
    best, _ = checkpoint
    root = best.parents[3]
    args = ("predict", *small_run(data_dir, root), "--ckpt_path", str(best))
    first, second = run_in_process(*args), run_in_process(*args)
    assert first.returncode == second.returncode == 0, first.stderr[-2000:]
    written = [
        line.removeprefix("Predictions: ")
        for r in (first, second)
        for line in r.stdout.splitlines()
        if line.startswith("Predictions: ")
    ]
    assert len(set(written)) == 2 and Path(written[0]).read_text() == Path(written[1]).read_text()
    named = run_in_process(*args, "--predictions.path", written[0])
    assert named.returncode == 1 and f"{written[0]} exists already" in named.stderr


class TryTheLock(Callback):
    """At each stage's start, whether another process could take the run's lock: `<root>/<stage>` holds the answer."""

    def _try(self, trainer, stage: str) -> None:
        folder = trainer.logger.folder
        held = os.open(folder, os.O_RDONLY)
        try:
            fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
            free = True
        except BlockingIOError:
            free = False
        finally:
            os.close(held)
        Path(trainer.default_root_dir, stage).write_text(str(free))

    def on_train_start(self, trainer, pl_module) -> None:
        self._try(trainer, "fit")

    def on_test_start(self, trainer, pl_module) -> None:
        self._try(trainer, "test")


def test_the_run_is_held_while_the_fit_runs_and_while_the_test_after_it_runs(data_dir, tmp_path):
    result = run_in_process(*small_run(data_dir, tmp_path, "--trainer.callbacks+=tests.test_runs.TryTheLock"))
    assert result.returncode == 0, result.stderr[-2000:]
    assert [(tmp_path / stage).read_text() for stage in ("fit", "test")] == ["False", "False"]
