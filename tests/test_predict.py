"""`train.py predict`: one CSV row per input, the same for any number of processes, also for a folder of images."""

import csv
import os
import re
import shlex
import shutil
import signal
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw, ImageOps

from datamodules.images import mnist_pixels
from models import SeqNet
from tests.conftest import TEST_SIZE
from tests.helpers import one_error_line, run_command, run_in_process, run_job, run_train, small_run
from tests.synthetic import read_idx_images

COMMON = ("--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false")


def predict(checkpoint: Path, output: Path, *args: str, devices: int = 1):
    """`train.py predict` of the checkpoint into `output`: in this process on one device (`run_in_process`)."""
    argv = ("predict", "--ckpt_path", str(checkpoint), "--devices", str(devices), "--predictions.path", str(output))
    argv += (*COMMON, "--trainer.default_root_dir", str(output.parent / "runs"), *args)
    return run_in_process(*argv) if devices == 1 else run_job(devices, *argv, folder=output.parent / "logs")


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as file:
        return list(csv.DictReader(file))


def test_the_test_set_gives_a_csv_of_every_image_once_in_order(checkpoint, tmp_path):
    best, test_accuracy = checkpoint
    output = tmp_path / "predictions.csv"
    result = predict(best, output)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().splitlines()[-1] == f"Predictions: {output}"
    rows = read_csv(output)
    assert list(rows[0]) == ["index", "prediction", "class_name", "probability", "target"]
    assert [int(row["index"]) for row in rows] == list(range(TEST_SIZE))  # every test image once, in order
    assert all(row["class_name"] == row["prediction"] and 0 < float(row["probability"]) <= 1 for row in rows)
    correct = sum(row["prediction"] == row["target"] for row in rows)
    assert correct / len(rows) == pytest.approx(test_accuracy, abs=1e-6)
    assert not list(tmp_path.glob(".predictions*"))  # nothing but the CSV is written


def test_test_and_predict_of_a_runs_checkpoint_on_two_processes_write_beside_that_run_without_warnings(
    checkpoint, tmp_path
):
    """The predictions of two processes are those of one, row for row."""
    best, _ = checkpoint
    run = tmp_path / "runs" / "SeqNet-mnist" / "version_0"
    shutil.copytree(best.parents[1], run)
    for stage in ("test", "predict"):  # what other tests wrote beside the run before it was copied
        shutil.rmtree(run / stage, ignore_errors=True)
    for subcommand, last_line in [
        ("test", f"Logs: {run / 'test' / 'version_0'}"),
        ("predict", f"Predictions: {run / 'predict' / 'version_0' / 'predictions.csv'}"),
    ]:
        argv = (subcommand, "--ckpt_path", str(run / "checkpoints" / best.name), "--devices", "2", *COMMON)
        result = run_job(2, *argv, "--trainer.default_root_dir", str(tmp_path / "runs"), folder=tmp_path / subcommand)
        assert result.returncode == 0, result.stderr[-3000:]
        lines = result.stdout.strip().splitlines()
        assert lines[-1] == last_line, lines[-3:]  # the last line says where
        if subcommand == "test":  # the dashboard of the run's logs and its test's
            assert lines[-2].startswith("Dashboard: ") and lines[-2].endswith(f" --logdir {run}"), lines[-3:]
        assert "dirpath has changed" not in result.stderr
        said = f"--ckpt_path {run / 'checkpoints' / best.name} (step "
        assert said in result.stdout + result.stderr  # which weights, once, in this program's words
    assert list((run / "test" / "version_0").glob("events.out.tfevents.*"))
    assert [path.name for path in (run / "predict").iterdir()] == ["version_0"]  # rank 1 claimed none
    assert [path.name for path in run.parent.iterdir()] == ["version_0"]  # no new run folder
    one_process = tmp_path / "one_process.csv"
    result = predict(best, one_process)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (run / "predict" / "version_0" / "predictions.csv").read_text() == one_process.read_text()


def test_a_folder_of_images_is_predicted_file_by_file_and_a_broken_file_is_named(checkpoint, data_dir, tmp_path):
    best, _ = checkpoint
    images = tmp_path / "images"
    images.mkdir()
    dark_background = read_idx_images(data_dir / "MNIST" / "raw" / "t10k-images-idx3-ubyte")[:3].copy()
    dark_background[:, :3], dark_background[:, -3:], dark_background[:, :, :3], dark_background[:, :, -3:] = 0, 0, 0, 0
    for index, image in enumerate(dark_background):  # light strokes on black, 28x28, as the dataset stores them
        Image.fromarray(image).save(images / f"a{index}.png")
    scan = ImageOps.invert(Image.fromarray(dark_background[0])).resize((84, 84)).convert("RGB")  # dark on white
    scan.save(images / "b_scan.jpg", quality=95)
    (images / "c_broken.png").write_bytes(b"not an image")
    (images / os.fsdecode(b"d_caf\xe9.png")).write_bytes((images / "a0.png").read_bytes())  # Latin-1, an old zip's
    output = tmp_path / "folder.csv"
    result = predict(best, output, "--data.predict_dir", str(images), devices=2)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("c_broken.png") == 1  # one warning, from one process
    rows = read_csv(output)
    assert list(rows[0]) == ["file", "prediction", "class_name", "probability"]
    assert [row["file"] for row in rows] == ["a0.png", "a1.png", "a2.png", "b_scan.jpg", "d_caf\\xe9.png"]
    assert rows[4]["prediction"] == rows[0]["prediction"]
    model = SeqNet.load_from_checkpoint(best, map_location="cpu").eval()
    with torch.no_grad():
        expected = model(torch.from_numpy(dark_background)).argmax(dim=1).tolist()
    assert [int(row["prediction"]) for row in rows[:3]] == expected


def test_a_digit_drawn_small_on_a_page_becomes_a_digit_as_mnist_made_them(tmp_path):
    """MNIST's recipe: the strokes' bounding box fitted into 20x20, their centre of mass on the centre of 28x28;
    the page's margins and its light background gone."""
    page = Image.new("L", (600, 400), 235)  # a light grey page
    ImageDraw.Draw(page).rectangle((40, 300, 70, 380), fill=20)  # a dark stroke, 31 x 81, in a corner
    page.save(tmp_path / "page.jpg", quality=90)
    digit = mnist_pixels(tmp_path / "page.jpg").astype(float)
    assert digit.shape == (28, 28) and digit[0].max() == 0  # light strokes on black
    rows, columns = np.nonzero(digit > 0.3 * digit.max())
    assert rows.max() - rows.min() + 1 == 20 and columns.max() - columns.min() + 1 in (7, 8)  # 81 -> 20, 31 -> 7.7
    mass = digit.sum()
    centre = ((np.indices(digit.shape)[0] * digit).sum() / mass, (np.indices(digit.shape)[1] * digit).sum() / mass)
    assert abs(centre[0] - 14) <= 0.5 and abs(centre[1] - 14) <= 0.5


def test_a_picture_of_28x28_is_taken_as_the_datasets_store_theirs(data_dir, tmp_path):
    original = read_idx_images(data_dir / "MNIST" / "raw" / "t10k-images-idx3-ubyte")[0].copy()
    original[:3], original[-3:], original[:, :3], original[:, -3:] = 0, 0, 0, 0
    ImageOps.invert(Image.fromarray(original)).save(tmp_path / "scan.png")  # dark on light: inverted back
    assert (mnist_pixels(tmp_path / "scan.png") == original).all()


@pytest.mark.parametrize("depth", ["16-bit", "12-bit", "float"])
@pytest.mark.parametrize("side", [84, 28])
def test_a_picture_of_more_than_8_bits_is_read_as_its_8_bit_copy(data_dir, tmp_path, depth, side):
    """Pillow clipped every value above 255 to white: of a 16-bit scan (dark strokes on paper) only the darkest
    pixels were left, and a float picture (0 to 1) was blank. A 12-bit picture (saved as 16-bit PNG) was taken for
    a 16-bit one: nearly black, "nothing drawn", or a wrong digit."""
    digit = read_idx_images(data_dir / "MNIST" / "raw" / "t10k-images-idx3-ubyte")[0]
    page = np.kron(255 - digit, np.ones((side // 28, side // 28), dtype=np.uint8))  # dark on light
    Image.fromarray(page).save(tmp_path / "8-bit.png")
    if depth == "float":
        Image.fromarray(page.astype(np.float32) / 255).save(tmp_path / "deep.tif")
    else:
        white = 65535 if depth == "16-bit" else 4095
        Image.fromarray(np.uint16(np.round(page / 255 * white))).save(tmp_path / "deep.png")
    (deep,) = tmp_path.glob("deep.*")
    assert Image.open(deep).mode != "L"
    assert (mnist_pixels(deep) == mnist_pixels(tmp_path / "8-bit.png")).all()


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (None, "no such folder"),
        ("file", "is a file, not a folder"),
        ("folder", "holds no picture to predict (each file was skipped, as said above)"),
        ("one picture", "holds 1 picture(s) to predict, fewer than the 2 processes that would share them"),
        ("subfolders", "holds no picture to predict (its subfolders are not searched)"),
        ("''", "--data.predict_dir '': an empty value names no folder"),  # an unset $DIR: not the working folder
    ],
)
def test_a_folder_without_images_ends_in_one_line(checkpoint, data_dir, tmp_path, make, words):
    """Or with fewer pictures than processes, where Lightning's sampler failed an assertion ("a bug")."""
    best, _ = checkpoint
    folder = tmp_path / "mine"
    if make == "file":
        folder.write_text("a file, not a folder")
    if make in ("folder", "one picture"):
        folder.mkdir()
        (folder / "notes.txt").write_text("no picture here")
    digit = Image.fromarray(read_idx_images(data_dir / "MNIST" / "raw" / "t10k-images-idx3-ubyte")[0])
    if make == "one picture":
        digit.save(folder / "digit.png")
    if make == "subfolders":
        (folder / "7").mkdir(parents=True)  # pictures sorted by class, as in torchvision's ImageFolder
        digit.save(folder / "7" / "a.png")
    devices = 2 if make == "one picture" else 1
    named = "" if make == "''" else str(folder)
    result = predict(best, tmp_path / "p.csv", "--data.predict_dir", named, devices=devices)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    last_line = result.stderr.strip().splitlines()[-1]
    assert re.match(r"error( \(rank \d on .+\))?: --data.predict_dir", last_line) and words in last_line, last_line
    if make == "folder":  # the skipped file said in a line of the program's, not in a Python warning
        assert "that are no readable image: notes.txt" in result.stdout and "notes.txt" not in result.stderr


def test_a_folder_of_pictures_is_predicted_without_the_datasets_files(checkpoint, data_dir, tmp_path):
    """On a machine with a checkpoint and pictures but not the dataset: it asked for the dataset, which it never reads
    (and a machine online downloaded it)."""
    best, _ = checkpoint
    pictures, empty = tmp_path / "mine", tmp_path / "no data"
    pictures.mkdir()
    empty.mkdir()
    Image.fromarray(read_idx_images(data_dir / "MNIST" / "raw" / "t10k-images-idx3-ubyte")[0]).save(pictures / "7.png")
    result = predict(best, tmp_path / "p.csv", "--data.predict_dir", str(pictures), "--data.data_dir", str(empty))
    assert result.returncode == 0, result.stderr[-3000:]
    assert [row["file"] for row in read_csv(tmp_path / "p.csv")] == ["7.png"]
    assert not list(empty.iterdir())


def test_a_predict_with_another_dataset_than_the_checkpoints_is_refused(checkpoint, data_dir, tmp_path):
    """Its class names would have labelled the answers: MNIST's digits called pullovers."""
    best, _ = checkpoint
    argv = ("predict", "--ckpt_path", str(best), *COMMON, "--data.data_dir", str(data_dir))
    message = one_error_line(
        run_in_process(*argv, "--data.dataset", "FashionMNIST", "--trainer.default_root_dir", str(tmp_path))
    )
    assert message == (
        f"error: --data.dataset fashion_mnist: --ckpt_path {best} was trained with --data.dataset mnist, which its"
        " weights need. Leave --data.dataset out (the checkpoint's is used)."
    )
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("subcommand", "signum"),
    [("test", signal.SIGTERM), ("predict", signal.SIGTERM), ("test", signal.SIGHUP), ("predict", signal.SIGINT)],
)
def test_a_stop_signal_during_an_evaluation_stops_it_at_once_by_that_signal(checkpoint, tmp_path, subcommand, signum):
    best, _ = checkpoint
    stop = (
        "--trainer.callbacks+=tests.instruments.SignalAt",
        "--trainer.callbacks.signum",
        str(int(signum)),
        "--trainer.callbacks.step",
        "-2",
    )
    argv = (subcommand, "--ckpt_path", str(best), *COMMON, "--trainer.default_root_dir", str(tmp_path), *stop)
    result = run_train(*argv)
    assert result.returncode == -signum, result.stderr[-3000:]  # 143, 129, 130 in a shell
    assert "Finished" not in result.stderr and "Predictions:" not in result.stderr
    assert "KeyboardInterrupt" not in result.stdout + result.stderr  # Lightning's own line too: one line
    assert "Traceback" not in result.stderr
    assert f"the {subcommand} was cut short and keeps nothing." in result.stdout
    (again,) = [line.removeprefix("Run it again with: ") for line in result.stdout.splitlines() if "again with" in line]
    assert shlex.split(again)[1:] == ["train.py", *argv]  # the same command, quoted for a shell
    assert not [path for path in tmp_path.rglob("*") if path.is_file()]  # its folder taken back: no empty figures


@pytest.mark.slow
def test_a_stop_during_the_test_after_a_fit_prints_the_command_that_tests_the_best_checkpoint(data_dir, tmp_path):
    stop = ("--trainer.callbacks+=tests.instruments.SignalAt", "--trainer.callbacks.step", "-2")
    stopped = run_train(*small_run(data_dir, tmp_path, *stop, devices=1))
    assert stopped.returncode == -signal.SIGTERM and "the test was cut short" in stopped.stdout, stopped.stderr[-3000:]
    (best,) = (tmp_path / "SeqNet-mnist" / "version_0" / "checkpoints").glob("epoch=*.ckpt")
    (command,) = [line.removeprefix("Continue with: ") for line in stopped.stdout.splitlines() if "Continue" in line]
    where = ["--devices", "1", "--trainer.accelerator", "cpu"]  # where it ran, as given
    assert shlex.split(command)[1:] == ["train.py", "test", "--ckpt_path", str(best), *where]
    tested = run_command([*shlex.split(command), *small_run(data_dir, tmp_path)])
    assert tested.returncode == 0 and "Finished: test/acc" in tested.stdout, tested.stderr[-3000:]


@pytest.mark.slow
def test_a_stop_as_the_fit_ends_prints_the_command_that_continues_the_run_to_its_test(data_dir, tmp_path):
    """A signal after the fit's last check: its work is kept, and what is left (the test) is the run continued."""
    stop = ("--trainer.callbacks+=tests.instruments.SignalAt", "--trainer.callbacks.step", "-3")
    stopped = run_train(*small_run(data_dir, tmp_path, *stop, devices=1))
    assert stopped.returncode == -signal.SIGTERM, stopped.stderr[-3000:]
    run = tmp_path / "SeqNet-mnist" / "version_0"
    assert f"Stopped by SIGTERM as the fit ended; {run / 'checkpoints' / 'last.ckpt'} holds its end." in stopped.stdout
    (command,) = [line.removeprefix("Continue with: ") for line in stopped.stdout.splitlines() if "Continue" in line]
    assert shlex.split(command)[1:] == [
        "train.py",
        "--ckpt_path",
        str(run),
        "--devices",
        "1",
        "--trainer.accelerator",
        "cpu",
    ]
    continued = run_command([*shlex.split(command), "--trainer.callbacks=[]"])  # (without the signal again)
    assert continued.returncode == 0 and "Finished: test/acc" in continued.stdout, continued.stderr[-3000:]
