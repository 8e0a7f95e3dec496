"""Real DDP runs of train.py on CPU: two processes on the gloo backend, small synthetic data."""

import json
import re
import shutil
import sys
from pathlib import Path

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.plugins.hparams import plugin_data_pb2

from app.run.tensorboard import HPARAMS_METRICS
from tests.conftest import TRAIN_SIZE
from tests.helpers import SMALL_RUN, run_command, run_train, scalars, small_run

VAL_SIZE = SMALL_RUN["--data.val_size"]
COMMON = ("--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false")


@pytest.fixture(scope="module")
def fit_run(data_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """One `python train.py --devices 2 ...` (fit, then test), shared by the tests of this module: a fresh
    interpreter, not a preloaded fork (tests/preloaded.py), so that rank 0 shuts down as a user's run does."""
    root = tmp_path_factory.mktemp("runs")
    options = ("--trainer.log_every_n_steps", "2", "--trainer.callbacks+=tests.helpers.RecordTrainSamples")
    argv = small_run(data_dir, root, *options, devices=2, max_epochs=3)
    result = run_command([sys.executable, "train.py", *argv], timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "terminate called" not in result.stderr  # no rank aborted at exit (gloo's threads, freed too late)
    return root, result


def run_dir(root: Path) -> Path:
    (version,) = (root / "SeqNet-mnist").iterdir()
    return version


def test_ddp_run_learns_the_task(fit_run):
    root, _result = fit_run
    test_acc = scalars(run_dir(root))["test/acc"]
    assert len(test_acc) == 1
    assert 0.85 <= test_acc[0] < 1  # chance is 0.1; 5% of the labels are wrong


def test_two_ranks_see_every_training_sample_exactly_once_per_epoch(fit_run):
    root, _result = fit_run
    train_size = TRAIN_SIZE - VAL_SIZE
    orders = []
    for epoch in (0, 1):
        shards = [json.loads((root / "samples" / f"rank{rank}_epoch{epoch}.json").read_text()) for rank in (0, 1)]
        assert [len(shard) for shard in shards] == [train_size // 2, train_size // 2]
        assert sorted(shards[0] + shards[1]) == list(range(train_size))
        orders.append(shards)
    assert orders[0] != orders[1]  # the sampler reshuffles every epoch (Lightning calls set_epoch)


def test_tensorboard_has_the_documented_scalars(fit_run):
    root, _result = fit_run
    tags = set(scalars(run_dir(root)))
    assert {"train/loss", "train/acc", "val/loss", "val/acc", "test/loss", "test/acc", "workload/epoch"} <= tags
    assert any(tag.startswith("workload/lr-") for tag in tags), tags
    assert {"workload/global_batch_size", "workload/world_size", "workload/steps_per_epoch"} <= tags
    assert scalars(run_dir(root))["workload/global_batch_size"] == [100.0]


def test_hparams_tab_names_real_metrics_not_the_placeholder(fit_run):
    root, _result = fit_run
    metric_tags, hparams = set(), set()
    for event_file in run_dir(root).glob("events.out.tfevents.*"):
        for event in EventFileLoader(str(event_file)).Load():
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name != "hparams":
                    continue
                data = plugin_data_pb2.HParamsPluginData.FromString(value.metadata.plugin_data.content)
                metric_tags |= {info.name.tag for info in data.experiment.metric_infos}
                hparams |= set(data.session_start_info.hparams)
    assert metric_tags == set(HPARAMS_METRICS)
    assert {"data/dataset", "data/batch_size", "model/class_path", "model/optimizer/lr", "trainer/devices"} <= hparams
    assert "hp_metric" not in scalars(run_dir(root))
    # and hparams.yaml, which Lightning reads back with `hparams_file=`, holds plain values (not Python objects)
    assert yaml.safe_load((run_dir(root) / "hparams.yaml").read_text())["data"]["dataset"] == "mnist"


def test_only_rank_zero_writes_logs_and_checkpoints(fit_run):
    root, result = fit_run
    version = run_dir(root)  # one version folder: rank 1 made none
    assert [p.name for p in (root / "SeqNet-mnist").iterdir()] == ["version_0"]
    writer_pids = {re.search(r"\.(\d+)\.\d+$", p.name).group(1) for p in version.glob("events.out.tfevents.*")}
    # The process started by the user is rank 0; Lightning's launcher started rank 1.
    assert writer_pids == {str(result.pid)}
    checkpoints = sorted(p.name for p in (version / "checkpoints").iterdir())
    assert len(checkpoints) == 2 and "last.ckpt" in checkpoints, checkpoints
    assert (version / "config.yaml").is_file()
    assert result.stdout.count("test/acc") == 1  # the test table, printed once


def loose_copy(checkpoint: Path, folder: Path) -> Path:
    """The checkpoint outside its run folder: evaluating it logs into `<root>/SeqNet-mnist/test/version_N`."""
    return Path(shutil.copy(checkpoint, folder / checkpoint.name))


def test_test_subcommand_evaluates_a_checkpoint_with_its_own_data_settings_on_any_number_of_processes(
    fit_run, tmp_path
):
    """No --data options but the batch size: dataset, folder and split come from the checkpoint. 301 test images: 3
    processes get uneven shares (100, 100, 101), which Lightning's default sampler would pad to 101 each, counting 2
    images twice; the figures are those of the test after the fit, on 2 processes, in batches of another size."""
    root, _result = fit_run
    best = loose_copy(next(p for p in (run_dir(root) / "checkpoints").iterdir() if p.name != "last.ckpt"), tmp_path)
    result = run_train(
        *("test", "--ckpt_path", str(best), "--devices", "3", "--data.eval_batch_size", "40"),
        *("--trainer.default_root_dir", str(tmp_path), *COMMON),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (evaluation,) = (tmp_path / "SeqNet-mnist" / "test").iterdir()  # a folder of its own: test/version_0
    figures, after_fit = scalars(evaluation), scalars(run_dir(root))
    assert figures["test/acc"] == after_fit["test/acc"] and figures["test/acc"][0] < 1
    assert abs(figures["test/loss"][0] - after_fit["test/loss"][0]) < 1e-6
    assert "train/loss" not in figures  # no training happened


def test_the_steps_printed_are_the_steps_taken_when_accumulation_leaves_a_remainder(data_dir, tmp_path):
    """10 batches per rank and epoch, accumulated by 3: Lightning steps after batches 3, 6, 9 and on the last one."""
    options = ("--trainer.accumulate_grad_batches", "3", "--trainer.limit_val_batches", "0")
    result = run_train(*small_run(data_dir, tmp_path, *options, devices=2, max_epochs=2))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Global batch 300 = 50 per device x 2 processes x 3 accumulated" in result.stdout + result.stderr
    assert "4 optimizer steps per epoch, 8 in the run." in result.stdout + result.stderr
    last = torch.load(tmp_path / "SeqNet-mnist" / "version_0" / "checkpoints" / "last.ckpt", weights_only=False)
    assert last["global_step"] == 8
    assert scalars(tmp_path / "SeqNet-mnist" / "version_0")["workload/steps_per_epoch"] == [4.0]
