"""`train.py export`: a trained model as one file that runs without this repository, in ONNX or TorchScript.

    python train.py export --ckpt_path CKPT --format onnx --output model.onnx
    python train.py export --ckpt_path CKPT --format torchscript --output model.pt

The exported model takes raw images as the IDX files hold them, a uint8 tensor (N, 28, 28) for any N, and returns
logits (N, 10): the dataset's normalisation is inside it, so a user feeds pixels and nothing else. The ONNX file
names the classes in its metadata (`class_names`, a JSON list; `dataset`).
"""

import argparse
import json
import warnings
from pathlib import Path

import torch
from torch import Tensor, nn

from app.checkpoints import read_checkpoint
from datamodules.mnist import DATASETS, MNISTDataModule, normalise
from models import ConvNet, ImageClassifier, SeqNet

MODELS = {"models.SeqNet": SeqNet, "models.ConvNet": ConvNet}
FORMATS = ("onnx", "torchscript")


class ExportError(RuntimeError):
    """What the user asked for cannot be exported; the message says why and what to do."""


class RawImageClassifier(nn.Module):
    """uint8 images (N, 28, 28) -> logits (N, 10), with the datamodule's normalisation as the first step."""

    def __init__(self, network: nn.Module, mean: float, std: float) -> None:
        super().__init__()
        self.network = network
        self.mean, self.std = mean, std

    def forward(self, images: Tensor) -> Tensor:
        return self.network(normalise(images, self.mean, self.std))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise ExportError(f"{message}. Usage: {USAGE}")


USAGE = "python train.py export --ckpt_path CKPT --format onnx|torchscript --output FILE"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = _Parser(prog="train.py export", usage=USAGE, description=__doc__)
    parser.add_argument("--ckpt_path", required=True, help="a checkpoint written by train.py")
    parser.add_argument("--format", required=True, help="onnx or torchscript")
    parser.add_argument("--output", required=True, help="the file to write")
    args = parser.parse_args(argv)
    if args.format not in FORMATS:
        raise ExportError(f"--format {args.format}: unknown format; choose onnx or torchscript.")
    return args


def load(checkpoint_path: Path) -> tuple[RawImageClassifier, list[str], str]:
    """The checkpoint's network wrapped for raw pixels, the class names and the dataset's name."""
    checkpoint = read_checkpoint(checkpoint_path)
    model_class = MODELS.get(checkpoint.get("hyper_parameters", {}).get("_class_path"))
    if model_class is None:
        raise ExportError(f"--ckpt_path {checkpoint_path}: not a checkpoint of train.py's SeqNet or ConvNet.")
    model: ImageClassifier = model_class.load_from_checkpoint(checkpoint_path, map_location="cpu", weights_only=True)
    dataset = checkpoint.get("datamodule_hyper_parameters", {}).get("dataset", "fashion_mnist")
    _dataset_class, mean, std = DATASETS[dataset]
    network = model.net.to(memory_format=torch.contiguous_format).eval()
    return RawImageClassifier(network, mean, std).eval(), MNISTDataModule(dataset=dataset).class_names, dataset


def export(args: argparse.Namespace) -> Path:
    model, class_names, dataset = load(Path(args.ckpt_path))
    output = Path(args.output)
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        if args.format == "torchscript":
            with warnings.catch_warnings():  # torch 2.9+ calls TorchScript deprecated; it is what was asked for
                warnings.filterwarnings("ignore", category=FutureWarning, message=r"`torch\.jit")
                torch.jit.save(torch.jit.script(model), str(output))
        else:
            write_onnx(model, output, class_names, dataset)
    except OSError as error:
        raise ExportError(
            f"--output {output}: cannot write there ({error.strerror}). Choose a writable path."
        ) from error
    return output


def write_onnx(model: RawImageClassifier, output: Path, class_names: list[str], dataset: str) -> None:
    try:
        import onnx
    except ImportError as error:
        raise ExportError("--format onnx needs the onnx package: pip install -e '.[export]'.") from error
    example = torch.zeros(2, 28, 28, dtype=torch.uint8)
    axes = {"images": {0: "batch"}, "logits": {0: "batch"}}
    with open(output, "wb") as file:  # an unwritable path fails here, before the export's work
        torch.onnx.export(
            model, (example,), file, input_names=["images"], output_names=["logits"], dynamic_axes=axes, dynamo=False
        )
    graph = onnx.load(str(output))
    for key, value in {"class_names": json.dumps(class_names), "dataset": dataset}.items():
        graph.metadata_props.add(key=key, value=value)
    onnx.save(graph, str(output))
