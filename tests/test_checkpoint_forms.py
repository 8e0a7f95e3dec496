"""One checkpoint, one answer: `test`, `validate`, `predict` and `export` of one checkpoint give the same figures,
predictions and model whether it is named as its file, as its run's folder or as `last`, on any number of processes.

The run's `config.yaml` holds no normalisation (it is taken from the data when fitting starts): a model built from
it, and not from the checkpoint's own settings, evaluated its weights on unnormalised pixels."""

import shutil
from pathlib import Path

import pytest
import torch
import yaml

from app.main import main
from tests.helpers import ends_in_error, run_in_process, run_train, scalars

COMMON = ("--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false", "--data.val_size", "200")


@pytest.fixture(scope="module")
def run(checkpoint, tmp_path_factory) -> Path:
    """A copy of the session's trained run, alone in a root of its own: `last` there is its last.ckpt. Its record
    says that it trained without evaluating (`--trainer.limit_val_batches 0`, and the same of test and predict):
    settings of how that run trained, which an evaluation of its weights must not take."""
    best, _ = checkpoint
    run = tmp_path_factory.mktemp("forms") / "runs" / "SeqNet-mnist" / "version_0"
    shutil.copytree(best.parents[1], run, ignore=shutil.ignore_patterns("test", "predict", "validate"))
    record = yaml.safe_load((run / "config.yaml").read_text())
    record["trainer"].update({f"limit_{stage}_batches": 0 for stage in ("val", "test", "predict")})
    (run / "config.yaml").write_text(yaml.safe_dump(record))
    return run


def forms(run: Path, devices: int = 2) -> dict[str, tuple[str, ...]]:
    """Each way of naming the run's last checkpoint, with the options it needs, and the processes it runs on: the
    file on one, the others on `devices`."""
    root = ("--trainer.default_root_dir", str(run.parents[1]))
    last = ("--ckpt_path", "last", "--model", "SeqNet", "--data.dataset", "mnist")
    return {
        "file": ("--ckpt_path", str(run / "checkpoints" / "last.ckpt"), *root, "--devices", "1"),
        "run folder": ("--ckpt_path", str(run), *root, "--devices", str(devices)),
        "last": (*last, *root, "--devices", str(devices)),
    }


def finished_line(output: str) -> str:
    (line,) = [line for line in output.splitlines() if line.startswith("Finished:")]
    return line


@pytest.mark.parametrize(("stage", "devices"), [("test", 2), ("validate", 1), ("predict", 1)])
def test_each_way_of_naming_a_checkpoint_gives_the_same_figures(run, data_dir, tmp_path, stage, devices):
    """The forms on two processes once (test); the other stages read the checkpoint in the same way, in one process,
    which runs in this one (`run_in_process`)."""
    answers = {}
    for form, argv in forms(run, devices).items():
        predictions = ("--predictions.path", str(tmp_path / f"{form}.csv")) if stage == "predict" else ()
        runner = run_in_process if form == "file" or devices == 1 else run_train
        result = runner(stage, "--data.data_dir", str(data_dir), *COMMON, *argv, *predictions)
        assert result.returncode == 0, f"{form}: {result.stderr[-3000:]}"
        output = result.stdout + result.stderr
        answers[form] = (tmp_path / f"{form}.csv").read_text() if stage == "predict" else finished_line(output)
    assert answers["run folder"] == answers["file"]
    assert answers["last"] == answers["file"]


def test_each_way_of_naming_a_checkpoint_exports_the_same_model(run, tmp_path, capsys):
    exported = {}
    for form, argv in forms(run).items():
        options = argv[: argv.index("--devices")]  # export runs in one process
        output = tmp_path / f"{form}.onnx"
        main(["export", *options, "--format", "onnx", "--output", str(output)])
        assert capsys.readouterr().out.strip().splitlines()[-1] == f"Exported: {output}"
        exported[form] = output.read_bytes()
    assert exported["run folder"] == exported["file"]
    assert exported["last"] == exported["file"]


@pytest.mark.parametrize("stage", ["test", "validate", "predict"])
def test_an_evaluation_without_a_checkpoint_is_refused_in_one_line(data_dir, tmp_path, stage):
    with ends_in_error() as said:
        main([stage, "--data.data_dir", str(data_dir), *COMMON, "--trainer.default_root_dir", str(tmp_path)])
    needs = f"error: {stage} needs trained weights: without --ckpt_path it would evaluate an untrained model."
    assert said.line == (
        f"{needs} {tmp_path / 'SeqNet-fashion_mnist'} holds no trained run: add --ckpt_path with a checkpoint file, or"
        " train first."
    )
    assert not list(tmp_path.iterdir())  # nothing written


def test_an_evaluation_without_a_checkpoint_names_the_runs_it_can_evaluate(run, data_dir):
    """The runs under the root are of SeqNet on MNIST; the command names FashionMNIST."""
    root = run.parents[1]
    with ends_in_error() as said:
        main(["test", "--data.data_dir", str(data_dir), *COMMON, "--trainer.default_root_dir", str(root)])
    assert said.line.endswith(
        f"{root / 'SeqNet-fashion_mnist'} holds no trained run: add --model SeqNet --data.dataset mnist"
        " --ckpt_path last"
    )
    with ends_in_error() as said:
        main(["test", "--data.dataset", "mnist", *COMMON, "--trainer.default_root_dir", str(root)])
    assert said.line.endswith(
        f"Add --ckpt_path last (the latest run in {root / 'SeqNet-mnist'}), a run's folder, or a checkpoint file."
    )


def test_last_of_a_model_without_runs_names_the_runs_there_are(run, tmp_path):
    """`export --ckpt_path last` with the defaults (SeqNet on FashionMNIST) where the runs are of SeqNet on MNIST."""
    root = run.parents[1]
    with ends_in_error() as said:
        main(
            [
                "export",
                "--ckpt_path",
                "last",
                "--trainer.default_root_dir",
                str(root),
                "--format",
                "onnx",
                "--output",
                str(tmp_path / "m"),
            ]
        )
    assert said.line == (
        f"error: --ckpt_path last: no run under {root / 'SeqNet-fashion_mnist'} holds a last checkpoint. Runs of other"
        " models or data are named with --model SeqNet --data.dataset mnist, or give --ckpt_path a run's folder or a"
        " checkpoint file."
    )


def test_after_a_fit_the_summary_holds_the_figures_of_the_weights_it_tested(data_dir, tmp_path):
    """The best checkpoint by the highest val/loss is the first epoch's (the loss falls): the summary's val/loss is
    that epoch's, the score the tested weights were chosen by, not the last validation's; its test figures are
    those `test` gives for that checkpoint. A ModelCheckpoint of the user's, keeping the lowest val/loss (the last
    epoch's), stands first among the callbacks: it does not take the place of the best checkpoint."""
    worst = ("--checkpoint.monitor", "val/loss", "--checkpoint.mode", "max", "--trainer.max_epochs", "2")
    users = ("--trainer.callbacks+=ModelCheckpoint", "--trainer.callbacks.monitor", "val/loss")
    worst += (*users, "--trainer.callbacks.filename", "users-{epoch}")
    limits = (
        "--trainer.limit_train_batches",
        "5",
        "--trainer.limit_val_batches",
        "2",
        "--trainer.limit_test_batches",
        "2",
    )
    argv = ("--data.data_dir", str(data_dir), "--data.dataset", "mnist", *COMMON, *limits)
    fit = run_in_process(*argv, *worst, "--trainer.default_root_dir", str(tmp_path))
    assert fit.returncode == 0, fit.stderr[-3000:]
    (run,) = (tmp_path / "SeqNet-mnist").iterdir()
    first, last = scalars(run)["val/loss"]
    assert first > last  # else the check below would not tell the epochs apart
    summary = finished_line(fit.stdout + fit.stderr)
    assert summary.endswith(f"val/loss {first:.4f}") and "val/acc" not in summary
    (best,) = (run / "checkpoints").glob("epoch=0-*.ckpt")
    assert f"Best checkpoint: {best}" in fit.stdout + fit.stderr
    tested = run_in_process("test", *argv, "--ckpt_path", str(best), "--trainer.default_root_dir", str(tmp_path))
    assert summary.startswith(finished_line(tested.stdout + tested.stderr))


def test_a_fit_without_a_test_sums_up_with_the_figure_of_the_checkpoint_it_names(data_dir, tmp_path):
    """`fit` alone: the summary's val/loss stood above the best checkpoint's name, but was the last validation's, the
    figure of other weights. The best by the highest val/loss is the first epoch's (the loss falls)."""
    worst = ("--checkpoint.monitor", "val/loss", "--checkpoint.mode", "max", "--trainer.max_epochs", "2")
    limits = ("--trainer.limit_train_batches", "5", "--trainer.limit_val_batches", "2")
    argv = ("--data.data_dir", str(data_dir), "--data.dataset", "mnist", *COMMON, *limits, *worst)
    fit = run_in_process("fit", *argv, "--trainer.default_root_dir", str(tmp_path))
    assert fit.returncode == 0, fit.stderr[-3000:]
    (run,) = (tmp_path / "SeqNet-mnist").iterdir()
    first, last = scalars(run)["val/loss"]
    assert first > last  # else the check below would not tell the epochs apart
    assert finished_line(fit.stdout + fit.stderr) == f"Finished: val/loss {first:.4f}"
    (best,) = (run / "checkpoints").glob("epoch=0-*.ckpt")
    assert f"Best checkpoint: {best}" in fit.stdout + fit.stderr


def test_a_fit_monitored_by_the_training_loss_sums_up_with_its_best_score(data_dir, tmp_path):
    """The summary names the monitor's figure whatever it is; it had none for `train/loss`."""
    monitor = ("--checkpoint.monitor", "train/loss", "--checkpoint.mode", "min", "--trainer.log_every_n_steps", "1")
    limits = ("--trainer.limit_train_batches", "5", "--trainer.limit_val_batches", "2")
    argv = ("--data.data_dir", str(data_dir), "--data.dataset", "mnist", *COMMON, *limits, *monitor)
    fit = run_in_process("fit", *argv, "--trainer.default_root_dir", str(tmp_path))
    assert fit.returncode == 0, fit.stderr[-3000:]
    (best,) = (tmp_path / "SeqNet-mnist" / "version_0" / "checkpoints").glob("epoch=*")
    states = torch.load(best, weights_only=True)["callbacks"].values()
    (score,) = {float(state["best_model_score"]) for state in states if state.get("monitor") == "train/loss"}
    assert finished_line(fit.stdout + fit.stderr) == f"Finished: train/loss {score:.4f}"


def test_an_evaluation_says_which_settings_differ_from_those_the_weights_were_trained_with(checkpoint, data_dir):
    """Another validation split may hold images the weights trained on: the command may ask for it, and is told."""
    best, _ = checkpoint
    argv = ("--data.data_dir", str(data_dir), *COMMON, "--data.val_split_seed", "3", "--ckpt_path", str(best))
    result = run_in_process("validate", *argv, "--trainer.limit_val_batches", "1")
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"--ckpt_path {best}: {best} (step " in result.stderr
    assert "); changed: --data.val_split_seed 0 -> 3." in result.stderr


@pytest.mark.parametrize(("stage", "form"), [("test", "file"), ("fit", "file"), ("fit", "run folder")])
def test_another_normalisation_than_the_weights_were_trained_with_is_refused(run, data_dir, tmp_path, stage, form):
    """It was replaced by the checkpoint's in silence, while the record of the command said it was used; continuing
    the run (whose config.yaml holds none: they came from the data) was refused as built "with null"."""
    named = run / "checkpoints" / "last.ckpt" if form == "file" else run
    argv = [stage, "--data.data_dir", str(data_dir), *COMMON, "--ckpt_path", str(named)]
    with ends_in_error() as said:
        main(
            [
                *argv,
                "--model.pixel_mean",
                "0.5",
                "--model.pixel_std",
                "0.5",
                "--trainer.default_root_dir",
                str(tmp_path),
            ]
        )
    assert not any(tmp_path.iterdir())
    assert said.line.startswith("error: --model.pixel_mean 0.5: the weights of --ckpt_path "), said.line
    assert said.line.endswith("which comes with them. Leave --model.pixel_mean out."), said.line


@pytest.mark.parametrize(("stage", "option"), [("test", "test"), ("validate", "val"), ("predict", "predict")])
def test_an_evaluation_of_no_batch_is_refused_before_anything_is_written(run, data_dir, tmp_path, stage, option):
    """It printed no figure (or `Predictions: None`) and left an empty folder."""
    argv = [stage, "--data.data_dir", str(data_dir), *COMMON, "--ckpt_path", str(run / "checkpoints" / "last.ckpt")]
    with ends_in_error() as said:
        main([*argv, f"--trainer.limit_{option}_batches", "0", "--trainer.default_root_dir", str(tmp_path)])
    assert said.line.startswith(f"error: --trainer.limit_{option}_batches 0: {stage} would run no batch."), said.line
    assert not any(tmp_path.iterdir())
