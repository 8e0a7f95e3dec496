"""The two networks: the tutorials' sizes, raw pixels in, that each learns under a real (single-process) Trainer,
and that a checkpoint alone classifies raw pixels."""

import ast
import re
import shutil

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from lightning.pytorch import Callback, Trainer
from torch import nn

from datamodules import MNISTDataModule
from datamodules.mnist import DATASETS
from models import ConvNet, SeqNet
from models.base import NormalisationUnknown
from tests.helpers import REPO, run_in_process, run_train, small_run
from tests.synthetic import read_idx_images, read_idx_labels


@pytest.mark.parametrize(("model_class", "parameters"), [(SeqNet, 199_210), (ConvNet, 225_226)])
def test_networks_have_the_tutorials_sizes_and_output_ten_logits(model_class, parameters):
    model = model_class(pixel_mean=0.5, pixel_std=0.25)
    assert sum(p.numel() for p in model.parameters()) == parameters
    assert model(torch.zeros(4, 28, 28, dtype=torch.uint8)).shape == (4, 10)  # raw pixels, as the IDX files hold


def test_convnet_of_the_fast_gpu_recipe_has_the_records_sizes_and_outputs_ten_logits():
    """configs/convnet_fast_gpu.yaml: tuomaso/train_mnist_fast's net (conv 1->24 5x5, conv 24->32 3x3, 800 -> 256 -> 10,
    no BatchNorm)."""
    sizes = {"channels": (24, 32), "kernel_sizes": (5, 3), "hidden": 256, "batch_norm": False}
    model = ConvNet(**sizes, pixel_mean=0.5, pixel_std=0.25)
    assert sum(p.numel() for p in model.parameters()) == 624 + 6_944 + 205_056 + 2_570
    assert not any(isinstance(layer, nn.BatchNorm2d) for layer in model.modules())
    assert model(torch.zeros(4, 28, 28, dtype=torch.uint8)).shape == (4, 10)


@pytest.mark.parametrize("model_class", [SeqNet, ConvNet])
def test_a_network_in_double_precision_takes_raw_pixels_too(model_class):
    """`--trainer.precision 64`: Lightning makes the weights float64; the pixels follow them."""
    model = model_class(pixel_mean=0.5, pixel_std=0.25).double()
    assert model(torch.zeros(2, 28, 28, dtype=torch.uint8)).dtype == torch.float64


def test_a_network_that_knows_no_normalisation_refuses_to_compute():
    with pytest.raises(NormalisationUnknown, match="neither trained nor loaded from a checkpoint"):
        SeqNet()(torch.zeros(2, 28, 28, dtype=torch.uint8))


def test_seqnet_has_no_log_softmax_inside_and_uses_sigmoid():
    layers = [type(layer) for layer in SeqNet().net]
    assert nn.LogSoftmax not in layers
    assert layers.count(nn.Sigmoid) == 2


def quiet_trainer(root, **settings) -> Trainer:
    """One process on the CPU, writing nothing: no logger, checkpoints, progress bar or model summary."""
    quiet = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    return Trainer(accelerator="cpu", devices=1, default_root_dir=root, **quiet, **settings)


@pytest.mark.parametrize(("model_class", "dataset"), [(SeqNet, "mnist"), (ConvNet, "fashion_mnist")])
def test_model_learns_the_synthetic_task_normalising_with_its_datasets_statistics(
    data_dir, tmp_path, model_class, dataset
):
    datamodule = MNISTDataModule(dataset=dataset, data_dir=str(data_dir), val_size=200, batch_size=50)
    trainer = quiet_trainer(tmp_path, max_epochs=2)
    model = model_class()
    trainer.fit(model, datamodule=datamodule)
    _dataset_class, mean, std = DATASETS[dataset]
    assert (model.hparams.pixel_mean, model.hparams.pixel_std) == (mean, std)
    (results,) = trainer.test(model, datamodule=datamodule, verbose=False)
    assert results["test/acc"] >= 0.85  # chance is 0.1, the best possible about 0.95


@pytest.mark.parametrize(("cycle_momentum", "first_betas"), [(True, [0.95, 0.9, 0.85]), (False, [0.7, 0.7, 0.7])])
def test_the_one_cycle_schedule_cycles_adams_first_beta_unless_told_to_keep_the_optimizers(
    data_dir, tmp_path, cycle_momentum, first_betas
):
    """configs/convnet_fast_gpu.yaml gives Adam betas (0.7, 0.9); the schedule would replace the first with its own."""
    seen = []

    class Betas(Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            seen.append(round(trainer.optimizers[0].param_groups[0]["betas"][0], 4))

    trainer = quiet_trainer(tmp_path, max_steps=10, limit_val_batches=0, callbacks=[Betas()])
    adam = lambda params: torch.optim.Adam(params, lr=0.01, betas=(0.7, 0.9))  # noqa: E731
    model = SeqNet(optimizer=adam, cycle_momentum=cycle_momentum)
    trainer.fit(model, datamodule=MNISTDataModule(dataset="mnist", data_dir=str(data_dir), val_size=200, batch_size=50))
    assert seen[:3] == first_betas
    assert trainer.optimizers[0].param_groups[0]["betas"][1] == 0.9


def synthetic_test_set(data_dir) -> tuple[torch.Tensor, torch.Tensor]:
    """The synthetic MNIST test images as the IDX file holds them, and their labels."""
    raw = data_dir / "MNIST" / "raw"
    images = torch.from_numpy(read_idx_images(raw / "t10k-images-idx3-ubyte").copy())
    return images, torch.from_numpy(read_idx_labels(raw / "t10k-labels-idx1-ubyte").astype(np.int64))


def by_hand(model: SeqNet, images: torch.Tensor) -> torch.Tensor:
    """The network's logits for images normalised with MNIST's statistics, outside the model."""
    _dataset_class, mean, std = DATASETS["mnist"]
    with torch.no_grad():
        return model.net((images.unsqueeze(1).float() / 255 - mean) / std)


def test_a_checkpoint_alone_classifies_raw_pixels_as_the_run_did(checkpoint, data_dir):
    """No datamodule: the statistics come with the weights."""
    best, test_accuracy = checkpoint
    model = SeqNet.load_from_checkpoint(best, map_location="cpu", weights_only=True).eval()
    images, labels = synthetic_test_set(data_dir)
    with torch.no_grad():
        logits = model(images)
    assert torch.allclose(logits, by_hand(model, images), atol=1e-5)
    accuracy = (logits.argmax(dim=1) == labels).double().mean().item()
    assert accuracy == pytest.approx(test_accuracy, abs=1e-6)  # what `test` logged, as a model file on its own


def test_testing_a_checkpoint_from_the_command_line_normalises_with_the_checkpoints_statistics(checkpoint, data_dir):
    """`test --ckpt_path` builds the model from the command line, then loads the weights: the statistics the
    weights were trained with must come from the checkpoint too (LightningCLI restores its hyperparameters)."""
    best, _test_accuracy = checkpoint
    images, labels = synthetic_test_set(data_dir)
    model = SeqNet.load_from_checkpoint(best, map_location="cpu").eval()
    expected_loss = F.cross_entropy(by_hand(model, images), labels).item()
    result = run_in_process(
        "test", "--ckpt_path", str(best), "--data.data_dir", str(data_dir), "--trainer.accelerator", "cpu"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    finished = re.search(r"Finished: test/acc \S+  test/loss (\S+)", result.stdout + result.stderr)
    assert finished is not None and float(finished.group(1)) == pytest.approx(expected_loss, abs=1e-4)


TINYNET = '''"""A model added by a user: one file, nothing else edited."""

from torch import nn

from models.base import ImageClassifier


class TinyNet(ImageClassifier):
    def __init__(self, width: int = 8, **kwargs) -> None:
        super().__init__(**kwargs)
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(28 * 28, width), nn.ReLU(), nn.Linear(width, 10))
'''


def test_a_model_added_as_a_file_under_models_trains_as_model_name(data_dir, tmp_path):
    """models/__init__.py imports every module of its folder: a copy of the program with models/tinynet.py added
    trains `--model TinyNet` and lists it in --help."""
    program = tmp_path / "program"
    for part in ("app", "datamodules", "models", "train.py"):
        copy = shutil.copytree if (REPO / part).is_dir() else shutil.copy
        copy(REPO / part, program / part)
    (program / "models" / "tinynet.py").write_text(TINYNET)
    (program / "models" / "draft.py").write_text("class Draft(ImageClassifier\n")  # a file not finished yet
    args = small_run(data_dir, tmp_path / "runs", "--model", "TinyNet", model=None)
    result = run_train(*args, "--model.width", "4", "--trainer.limit_train_batches", "2", timeout=120, cwd=program)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (tmp_path / "runs" / "TinyNet-mnist" / "version_0" / "checkpoints" / "last.ckpt").is_file()
    listed = run_train("fit", "--help", timeout=60, cwd=program)
    assert "models.tinynet.TinyNet" in listed.stdout
    (said,) = [line for line in listed.stderr.splitlines() if "draft.py" in line]  # one line, no traceback
    assert said.startswith("models/draft.py could not be imported (SyntaxError: ") and "Traceback" not in listed.stderr


def test_the_models_and_the_data_import_nothing_of_app():
    """The centre is plain Lightning (docs/architecture.md): what models/ and datamodules/ import, app/ is not."""
    for path in sorted(p for folder in ("models", "datamodules") for p in (REPO / folder).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                assert all(name.split(".")[0] != "app" for name in names), f"{path.relative_to(REPO)}: {names}"
