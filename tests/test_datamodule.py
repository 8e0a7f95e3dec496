"""The datamodule on small synthetic IDX files: splits, normalisation, batching and clear errors."""

import re
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from lightning.pytorch import Trainer
from PIL import Image, ImageDraw
from torchvision.datasets import MNIST, FashionMNIST

from datamodules import DataError, MNISTDataModule
from tests.conftest import TEST_SIZE, TRAIN_SIZE
from tests.helpers import lines_said, run_command

DATASETS = [("mnist", 0.1307, 0.3081), ("fashion_mnist", 0.2860, 0.3530)]


def fitted(data_dir: Path, val_size: int = 200, **kwargs) -> MNISTDataModule:
    datamodule = MNISTDataModule(data_dir=str(data_dir), val_size=val_size, **kwargs)
    datamodule.prepare_data()
    datamodule.setup("fit")
    return datamodule


@pytest.mark.parametrize("dataset", ["mnist", "fashion_mnist"])
def test_splits_hold_out_validation_from_train_and_use_the_official_test_set(data_dir, dataset):
    datamodule = fitted(data_dir, dataset=dataset)
    datamodule.setup("test")
    train, val = datamodule.train_set.tensors[0], datamodule.val_set.tensors[0]
    assert (len(train), len(val), len(datamodule.test_set)) == (TRAIN_SIZE - 200, 200, TEST_SIZE)
    train_images = {image.numpy().tobytes() for image in train}
    assert not any(image.numpy().tobytes() in train_images for image in val)


def test_split_is_the_same_for_every_instance_and_changes_with_its_seed(data_dir):
    first, second = fitted(data_dir), fitted(data_dir)
    assert torch.equal(first.val_set.tensors[0], second.val_set.tensors[0])
    reseeded = fitted(data_dir, val_split_seed=1)
    assert not torch.equal(first.val_set.tensors[0], reseeded.val_set.tensors[0])


@pytest.mark.parametrize(("dataset", "mean", "std"), DATASETS)
def test_batches_travel_as_uint8_and_name_the_dataset_statistics(data_dir, dataset, mean, std):
    datamodule = fitted(data_dir, dataset=dataset, batch_size=32)
    images, targets = next(iter(datamodule.train_dataloader()))
    assert images.dtype == torch.uint8 and images.shape == (32, 28, 28)
    assert targets.dtype == torch.int64 and targets.shape == (32,)
    assert (datamodule.mean, datamodule.std) == (mean, std)  # what the model normalises with (tests/test_models.py)


def test_evaluation_takes_its_own_larger_batches(data_dir):
    datamodule = fitted(data_dir, batch_size=32)  # eval_batch_size defaults to 1000
    assert len(next(iter(datamodule.train_dataloader()))[0]) == 32
    assert len(next(iter(datamodule.val_dataloader()))[0]) == len(datamodule.val_set)  # 200 in one batch
    assert [len(images) for images, _ in fitted(data_dir, eval_batch_size=100).val_dataloader()] == [100, 100]


def test_a_batch_is_the_samples_of_its_indices(data_dir):
    dataset = fitted(data_dir).train_set
    images, targets = dataset.__getitems__([5, 0, 7])
    for row, index in enumerate([5, 0, 7]):
        assert torch.equal(images[row], dataset[index][0]) and targets[row] == dataset[index][1]


DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]


@pytest.mark.parametrize("accelerator", DEVICES)
def test_data_on_device_gives_the_same_batches_already_on_the_training_device(data_dir, accelerator):
    host, on_device = fitted(data_dir, batch_size=50), fitted(data_dir, batch_size=50, on_device=True)
    for datamodule in (host, on_device):
        datamodule.trainer = Trainer(accelerator=accelerator, devices=1, logger=False)
    device = on_device.trainer.strategy.root_device
    torch.manual_seed(0)
    host_batches = list(host.train_dataloader())
    torch.manual_seed(0)
    device_batches = list(on_device.train_dataloader())
    assert len(device_batches) == len(host_batches) == (TRAIN_SIZE - 200) // 50
    for (images, targets), (host_images, host_targets) in zip(device_batches, host_batches, strict=True):
        assert images.device == targets.device == device
        assert torch.equal(images.cpu(), host_images) and torch.equal(targets.cpu(), host_targets)
    assert on_device.val_set.tensors[0].device.type == "cpu"  # the dashboard's samples stay in host memory


@pytest.mark.parametrize(("dataset", "folder"), [("mnist", "MNIST"), ("fashion_mnist", "FashionMNIST")])
def test_missing_files_that_cannot_be_downloaded_name_the_folder_and_the_files(tmp_path, monkeypatch, dataset, folder):
    for dataset_class in (MNIST, FashionMNIST):  # a mirror where nothing answers: the download fails at once
        monkeypatch.setattr(dataset_class, "mirrors", ["http://127.0.0.1:9/"])
    datamodule = MNISTDataModule(dataset=dataset, data_dir=str(tmp_path))
    with pytest.raises(DataError) as error:
        datamodule.prepare_data()
    message = str(error.value)
    assert str(tmp_path / folder / "raw") in message
    for name in (
        "train-images-idx3-ubyte",
        "train-labels-idx1-ubyte",
        "t10k-images-idx3-ubyte",
        "t10k-labels-idx1-ubyte",
    ):
        assert name in message
    assert "\n" not in message


@pytest.mark.parametrize("name", ["train-images-idx3-ubyte", "train-labels-idx1-ubyte"])
def test_truncated_files_are_reported_as_corrupt(data_dir, tmp_path, name):
    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for source in (data_dir / "MNIST" / "raw").iterdir():
        (raw / source.name).write_bytes(source.read_bytes())
    (raw / name).write_bytes((raw / name).read_bytes()[:1000])
    with pytest.raises(DataError, match="corrupt or truncated"):
        fitted(tmp_path, dataset="mnist")


@pytest.mark.parametrize("wrong", [-3, 12])
def test_a_label_out_of_range_is_named_by_its_value(data_dir, wrong):
    # IDX label files hold unsigned bytes; a folder of labelled tensors or another reader may not.
    targets = torch.tensor([0, 9, wrong, 5])
    with pytest.raises(DataError, match=f"labels must be 0 to 9, and one is {wrong}\\."):
        MNISTDataModule(data_dir=str(data_dir))._check_contents("train", torch.zeros(4, 28, 28), targets)


@pytest.mark.parametrize("seed", [2**64, -(2**63) - 1])
def test_a_split_seed_torch_cannot_take_is_refused(data_dir, seed):
    """It was torch's "Overflow when unpacking long long", with a traceback."""
    with pytest.raises(DataError, match=f"^--data.val_split_seed {seed}: must be from"):
        fitted(data_dir, val_split_seed=seed)
    fitted(data_dir, val_split_seed=2**64 - 1)


def test_a_validation_set_as_large_as_the_training_file_is_refused(data_dir):
    with pytest.raises(DataError, match="val_size"):
        fitted(data_dir, val_size=TRAIN_SIZE)


def test_the_training_loader_draws_from_the_epoch_the_fit_is_at(data_dir):
    """Lightning sets the epoch after making the loader's iterator: a loader with workers, continued from an epoch's
    end, drew its first batches in epoch 0's order (a run of `--trainer.limit_train_batches`: the rest of it)."""
    datamodule = fitted(data_dir)
    datamodule.trainer = Trainer(accelerator="cpu", devices=1, logger=False)
    datamodule.trainer.fit_loop.epoch_progress.current.processed = 3  # as restored from the checkpoint of epoch 2
    assert datamodule.train_dataloader().sampler.epoch == 3


def test_an_evaluation_set_smaller_than_the_processes_is_refused_in_one_line(data_dir):
    """Lightning's sampler failed an assertion ("a bug") on the rank left without an image."""
    datamodule = fitted(data_dir, val_size=2)
    datamodule.trainer = Trainer(accelerator="cpu", devices=3, strategy="ddp", logger=False)  # not launched
    with pytest.raises(DataError, match=r"^--data.val_size 2: the validation set holds 2 image\(s\), fewer than the 3"):
        datamodule.val_dataloader()


# The checkpoint of a run of 1 process with batches of 64 (the global batch), stopped at an epoch's end or inside one.
AT_THE_END = {"global_batch_size": 64, "world_size": 1, "batch_size": 64, "inside_an_epoch": False}
INSIDE = {**AT_THE_END, "inside_an_epoch": True}


@pytest.mark.parametrize(
    ("state", "world_size", "chosen", "batch_size"),
    [
        (AT_THE_END, 2, False, 32),  # another number of processes: the global batch stays
        (AT_THE_END, 2, True, 64),  # unless the command chose a batch size: it stays
        (INSIDE, 2, False, 32),  # inside an epoch: the samples of one batch over all processes stay 64
        (AT_THE_END, 1, True, 64),
    ],
)
def test_a_continued_run_keeps_its_global_batch_unless_a_batch_size_is_chosen(
    data_dir, state, world_size, chosen, batch_size
):
    datamodule = MNISTDataModule(data_dir=str(data_dir), batch_size=64)
    assert datamodule.batch_size_to_continue(state, world_size, 1, chosen, epoch=0) == batch_size


@pytest.mark.parametrize(
    ("state", "world_size", "chosen_batch", "words"),
    [
        (AT_THE_END, 3, None, "global batches of 64 samples, which 3 processes x 1 accumulated batches cannot share"),
        (INSIDE, 1, 32, "the run stopped in the middle of epoch 0, whose batches took 64 samples over all processes"),
        (INSIDE, 2, 64, "it finishes that epoch with batches of as many (64 x 2 now)"),
    ],
)
def test_a_continued_run_that_cannot_keep_its_batches_is_refused_in_one_line(
    data_dir, state, world_size, chosen_batch, words
):
    datamodule = MNISTDataModule(data_dir=str(data_dir), batch_size=chosen_batch or 64)
    with pytest.raises(DataError, match=re.escape(words)):
        datamodule.batch_size_to_continue(state, world_size, 1, chosen_batch is not None, epoch=0)


def test_a_picture_too_large_to_decode_safely_is_skipped_with_a_line_that_names_it(tmp_path, monkeypatch):
    """Pillow refuses to decode a picture of more than twice `Image.MAX_IMAGE_PIXELS` (a decompression bomb: a small
    file that would fill the memory) and warns above it; both are skipped, the others predicted."""
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)  # 89 million by default: the test's pictures stay small
    Image.new("L", (10, 12), 255).save(tmp_path / "large.png")  # 120 pixels: Pillow would warn
    Image.new("L", (30, 30), 255).save(tmp_path / "larger.png")  # 900: Pillow refuses
    small = Image.new("L", (8, 8), 255)
    ImageDraw.Draw(small).line((4, 1, 4, 6), fill=0)  # a stroke: a picture with something on it
    small.save(tmp_path / "small.png")
    datamodule = MNISTDataModule(predict_dir=str(tmp_path))
    with lines_said() as said:
        datamodule.setup("predict")
    assert re.search(r"Skipped 2 picture\(s\) of .* decompression bombs\): large\.png, larger\.png", "\n".join(said))
    assert [path.name for path in datamodule.predict_files] == ["small.png"]


def test_a_blank_picture_is_skipped_and_one_with_a_transparent_background_is_read(tmp_path):
    """A page with nothing drawn on it (its JPEG-like noise aside) would get a class that means nothing; black strokes
    on a transparent background (a canvas's export) would vanish in grayscale without their transparency."""
    noise = np.random.default_rng(0).normal(250, 3, (100, 100))
    Image.fromarray(np.uint8(np.clip(noise, 0, 255))).save(tmp_path / "blank.png")
    canvas = Image.new("RGBA", (200, 200), (0, 0, 0, 0))
    ImageDraw.Draw(canvas).line((100, 30, 100, 170), fill=(0, 0, 0, 255), width=12)
    canvas.save(tmp_path / "canvas.png")
    datamodule = MNISTDataModule(predict_dir=str(tmp_path))
    with lines_said() as said:
        datamodule.setup("predict")
    assert re.search(r"Skipped 1 picture\(s\) of .* with nothing drawn on them: blank\.png", "\n".join(said))
    assert [path.name for path in datamodule.predict_files] == ["canvas.png"]
    assert datamodule.predict_set.tensors[0][0].max() == 255  # the stroke, light on black


def test_a_program_that_ends_while_a_loader_is_iterating_ends_at_once(data_dir):
    """The loader's workers ignore SIGTERM (a stop is the training process's to make), the signal with which Python's
    own exit ends them: without the datamodule's exit handler this program would never end."""
    program = f"""from datamodules import MNISTDataModule
datamodule = MNISTDataModule(data_dir={str(data_dir)!r}, val_size=200, num_workers=1)
datamodule.prepare_data()
datamodule.setup("fit")
batches = iter(datamodule.train_dataloader())
print(len(next(batches)[0]), "images from a worker, and the worker left running")"""
    run = run_command([sys.executable, "-c", program], timeout=60)
    assert (run.returncode, run.stdout) == (0, "64 images from a worker, and the worker left running\n"), run.stderr
    assert "Traceback" not in run.stderr, run.stderr  # torch's "DataLoader worker (pid N) is killed by signal"
