"""`train.py export`: ONNX and TorchScript files that take raw pixels and give the checkpoint's logits."""

import json
import os
import sys
from pathlib import Path

import numpy as np
import onnxruntime
import pytest
import torch

from models import SeqNet
from tests.helpers import one_error_line, run_in_process
from tests.synthetic import read_idx_images


def export(capsys, checkpoint: Path, export_format: str, output: Path) -> None:
    result = run_in_process(
        "export", "--ckpt_path", str(checkpoint), "--format", export_format, "--output", str(output)
    )
    assert result.returncode == 0 and result.stdout.strip().splitlines()[-1] == f"Exported: {output}", result.stderr


def checkpoint_logits(checkpoint: Path, images: np.ndarray) -> np.ndarray:
    model = SeqNet.load_from_checkpoint(checkpoint, map_location="cpu").eval()
    with torch.no_grad():
        return model(torch.from_numpy(images)).numpy()


@pytest.mark.parametrize("export_format", ["onnx", "torchscript"])
def test_exported_model_takes_pixels_and_gives_the_checkpoints_logits(
    checkpoint, data_dir, tmp_path, capsys, export_format
):
    best, _ = checkpoint
    output = tmp_path / f"model.{export_format}"
    export(capsys, best, export_format, output)
    images = read_idx_images(data_dir / "MNIST" / "raw" / "t10k-images-idx3-ubyte")[:300].copy()
    expected = checkpoint_logits(best, images)
    if export_format == "onnx":
        session = onnxruntime.InferenceSession(str(output))
        run = lambda batch: session.run(None, {"images": batch})[0]  # noqa: E731
        metadata = session.get_modelmeta().custom_metadata_map
        assert json.loads(metadata["class_names"]) == [str(k) for k in range(10)] and metadata["dataset"] == "mnist"
    else:
        loaded = torch.jit.load(str(output))
        run = lambda batch: loaded(torch.from_numpy(batch)).detach().numpy()  # noqa: E731
    one_by_one = np.concatenate([run(images[i : i + 1]) for i in range(len(images))])
    in_batches = np.concatenate([run(images[i : i + 256]) for i in range(0, len(images), 256)])
    for logits in (one_by_one, in_batches):
        assert logits.shape == (300, 10)
        assert np.abs(logits - expected).max() < 1e-4
        assert (logits.argmax(axis=1) == expected.argmax(axis=1)).all()


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"--format": "tflite"}, "argument --format: invalid choice: 'tflite'"),
        ({"--ckpt_path": "no/such.ckpt"}, "--ckpt_path no/such.ckpt: no such file"),
        ({"--output": "a_file/model.onnx"}, "cannot write there"),
        ({"--output": None}, "required: --output"),
        ({"--output": "a_file"}, "--output a_file exists already: give another file name, or remove it first."),
        ({"--output": "new/"}, "--output new/ names a folder: give the file to write (--output new/model.onnx)."),
        ({"--model": "ConvNet"}, "holds a SeqNet, but --model names ConvNet: leave --model out"),  # as test does
        ({"--data.dataset": "FashionMNIST"}, "holds a model trained on mnist, but --data.dataset names fashion_mnist"),
    ],
)
def test_bad_export_arguments_end_in_one_line(checkpoint, tmp_path, monkeypatch, change, words):
    best, _ = checkpoint
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("a file, not a folder")
    options = {"--ckpt_path": str(best), "--format": "onnx", "--output": "model.onnx", **change}
    argv = [item for name, value in options.items() if value is not None for item in (name, value)]
    one_error_line(run_in_process("export", *argv), words)
    assert not (tmp_path / "model.onnx").exists() and not (tmp_path / "new").exists()


def test_onnx_without_its_package_says_which_extra_to_install(checkpoint, tmp_path, monkeypatch):
    best, _ = checkpoint
    monkeypatch.setitem(sys.modules, "onnx", None)  # as if not installed
    result = run_in_process(
        "export", "--ckpt_path", str(best), "--format", "onnx", "--output", str(tmp_path / "m.onnx")
    )
    assert one_error_line(result) == "error: --format onnx needs the onnx package: pip install -e '.[export]'."


@pytest.mark.parametrize("export_format", ["onnx", "torchscript"])
def test_an_export_cut_short_leaves_no_file_and_runs_again(checkpoint, tmp_path, monkeypatch, capsys, export_format):
    """It left a 0-byte or half file, which the next export refused to overwrite ("exists already"): here the
    write fails once its bytes are out, as a full disk or a stop would."""
    best, _ = checkpoint
    output = tmp_path / f"model.{export_format}"

    def cut_short(descriptor: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", cut_short)
    run_in_process("export", "--ckpt_path", str(best), "--format", export_format, "--output", str(output))
    assert list(tmp_path.iterdir()) == []
    monkeypatch.undo()
    export(capsys, best, export_format, output)


def test_a_checkpoint_that_does_not_name_its_dataset_is_exported_with_the_one_given(checkpoint, tmp_path):
    """A checkpoint of a user's own Lightning code holds no data settings: its classes were FashionMNIST's, a guess."""
    best, _ = checkpoint
    contents = torch.load(best, weights_only=True)
    del contents["datamodule_hyper_parameters"]
    torch.save(contents, tmp_path / "own.ckpt")
    argv = ["export", "--ckpt_path", str(tmp_path / "own.ckpt"), "--format", "onnx", "--output", str(tmp_path / "m")]
    assert one_error_line(run_in_process(*argv)).endswith(
        "does not say which dataset it was trained on: give it with --data.dataset (mnist or fashion_mnist)."
    )
    assert run_in_process(*argv, "--data.dataset", "mnist").returncode == 0
    metadata = onnxruntime.InferenceSession(str(tmp_path / "m")).get_modelmeta().custom_metadata_map
    assert metadata["dataset"] == "mnist"
