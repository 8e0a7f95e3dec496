"""The two networks: the tutorials' sizes, and that each learns under a real (single-process) Trainer."""

import pytest
import torch
from lightning.pytorch import Trainer
from torch import nn

from datamodules import MNISTDataModule
from models import ConvNet, SeqNet


@pytest.mark.parametrize(("model_class", "parameters"), [(SeqNet, 199_210), (ConvNet, 225_226)])
def test_networks_have_the_tutorials_sizes_and_output_ten_logits(model_class, parameters):
    model = model_class()
    assert sum(p.numel() for p in model.parameters()) == parameters
    assert model(torch.zeros(4, 1, 28, 28)).shape == (4, 10)


def test_seqnet_has_no_log_softmax_inside_and_uses_sigmoid():
    layers = [type(layer) for layer in SeqNet().net]
    assert nn.LogSoftmax not in layers
    assert layers.count(nn.Sigmoid) == 2


@pytest.mark.parametrize("model_class", [SeqNet, ConvNet])
def test_model_learns_the_synthetic_task(data_dir, tmp_path, model_class):
    datamodule = MNISTDataModule(dataset="mnist", data_dir=str(data_dir), val_size=200, batch_size=50)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        default_root_dir=tmp_path,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = model_class()
    trainer.fit(model, datamodule=datamodule)
    (results,) = trainer.test(model, datamodule=datamodule, verbose=False)
    assert results["test/acc"] >= 0.85  # chance is 0.1, the best possible about 0.95
