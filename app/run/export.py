"""`train.py export`: a trained model as one file that runs without this repository, in ONNX or TorchScript.

    python train.py export --ckpt_path CKPT --format onnx --output model.onnx
    python train.py export --ckpt_path CKPT --format torchscript --output model.pt
    python train.py export --ckpt_path last --model ConvNet --data.dataset mnist --format onnx --output model.onnx

CKPT is a checkpoint file or a run's folder (its last checkpoint); `last` is the latest run of `--model` on
`--data.dataset` under `--trainer.default_root_dir`, as for `test --ckpt_path last`.

The exported model takes raw images as the IDX files hold them, a uint8 tensor (N, 28, 28) for any N, and returns
logits (N, 10): the dataset's normalisation is inside it, so a user feeds pixels and nothing else. The ONNX file
names the classes in its metadata (`class_names`, a JSON list; `dataset`).
"""

import argparse
import io
import json
import warnings
from pathlib import Path

import torch

from app.invocation import train_py
from app.run.checkpoints import read_checkpoint, saved_model_class, write_whole
from app.run.continuation import another_than_the_checkpoints, find_start
from app.run.folder import DEFAULT_ROOT, run_name
from datamodules.mnist import DATASETS, DatasetName, MNISTDataModule
from models import ImageClassifier, model_names

FORMATS = ("onnx", "torchscript")
EXAMPLE = torch.zeros(2, 28, 28, dtype=torch.uint8)  # a batch of raw images, to trace the model with


class ExportError(RuntimeError):
    """What the user asked for cannot be exported; the message says why and what to do."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise ExportError(f"{message}. Usage: {usage()}")


def usage() -> str:
    return f"{train_py()} export --ckpt_path CKPT --format onnx|torchscript --output FILE"


def parse(argv: list[str]) -> argparse.Namespace:
    parser = _Parser(
        prog=f"{train_py()} export",
        usage=usage(),
        description=__doc__.replace("python train.py", train_py()),
        formatter_class=argparse.RawDescriptionHelpFormatter,  # the examples, each on its line
    )
    parser.add_argument("--ckpt_path", required=True, help="a checkpoint written by train.py, a run's folder, or last")
    parser.add_argument("--format", required=True, help="onnx or torchscript")
    parser.add_argument("--output", required=True, help="the file to write")
    # What `--ckpt_path last` looks for, with train.py's names and defaults; given with a checkpoint, they must be its
    parser.add_argument("--model", help="the model of the run last finds (default: SeqNet)")
    parser.add_argument("--data.dataset", dest="dataset", type=DatasetName, help="its dataset (default: fashion_mnist)")
    parser.add_argument("--trainer.default_root_dir", dest="root", default=DEFAULT_ROOT, help="with last: its root")
    args = parser.parse_args(argv)
    if args.format not in FORMATS:
        raise ExportError(f"--format {args.format}: unknown format; choose onnx or torchscript.")
    return args


def load(checkpoint_path: Path, dataset_given: str | None = None) -> tuple[ImageClassifier, list[str], str]:
    """The checkpoint's model (it normalises raw pixels itself), the class names and the dataset's name: the
    checkpoint's, or `dataset_given` where it holds none (a checkpoint of a user's own Lightning code)."""
    checkpoint = read_checkpoint(checkpoint_path)
    model_class = saved_model_class(checkpoint)
    if model_class is None:
        raise ExportError(
            f"--ckpt_path {checkpoint_path}: not a checkpoint of one of train.py's models ({', '.join(model_names())})."
        )
    model = model_class.load_from_checkpoint(checkpoint_path, map_location="cpu", weights_only=True)
    model.hparams.channels_last = False  # a memory layout for training kernels; nothing an exported graph keeps
    dataset = (checkpoint.get("datamodule_hyper_parameters") or {}).get("dataset", dataset_given)
    if dataset is None:  # its class names would be a guess
        raise ExportError(
            f"--ckpt_path {checkpoint_path} does not say which dataset its model was trained on: give it with"
            f" --data.dataset ({' or '.join(DATASETS)})."
        )
    return model.eval(), MNISTDataModule(dataset=dataset).class_names, dataset


def checkpoint_named(args: argparse.Namespace) -> Path:
    """The file `--ckpt_path` names, found as `test` finds it: `last`, a run's folder, or a file."""
    runs = Path(args.root) / run_name(args.model or "SeqNet", args.dataset or "fashion_mnist")
    start = find_start(args.ckpt_path, "export", runs, Path(args.root))
    return Path(args.ckpt_path) if start is None else start.checkpoint


def export(args: argparse.Namespace) -> Path:
    output = Path(args.output)
    if args.output.endswith("/") or output.is_dir():  # Path drops the slash: a file of the folder's name was written
        file = output / ("model.pt" if args.format == "torchscript" else "model.onnx")
        raise ExportError(f"--output {args.output} names a folder: give the file to write ({file}).")
    if output.exists() or output.is_symlink():  # nothing this program writes overwrites an earlier output
        raise ExportError(f"--output {output} exists already: give another file name, or remove it first.")
    model, class_names, dataset = load(checkpoint_named(args), args.dataset)
    for option, given, saved, what in (
        ("--model", args.model, type(model).__name__, "a"),
        ("--data.dataset", args.dataset, dataset, "a model trained on"),
    ):
        if given is not None and given.rsplit(".", 1)[-1] != saved:  # the export would be of the checkpoint's
            raise ExportError(another_than_the_checkpoints(args.ckpt_path, f"{what} {saved}", option, given))
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        if args.format == "torchscript":
            with warnings.catch_warnings():  # torch 2.9+ and Lightning 2.7+ deprecate TorchScript; it was asked for
                warnings.filterwarnings("ignore", message=r".*(`torch\.jit|to_torchscript)")
                traced = model.to_torchscript(method="trace", example_inputs=EXAMPLE)
                write_whole(output, lambda file: torch.jit.save(traced, file))  # a stop leaves no half file behind
        else:
            write_onnx(model, output, class_names, dataset)
    except OSError as error:
        raise ExportError(
            f"--output {output}: cannot write there ({error.strerror}). Choose a writable path."
        ) from error
    return output


def write_onnx(model: ImageClassifier, output: Path, class_names: list[str], dataset: str) -> None:
    try:
        import onnx
    except ImportError as error:
        raise ExportError("--format onnx needs the onnx package: pip install -e '.[export]'.") from error
    axes = {"images": {0: "batch"}, "logits": {0: "batch"}}
    exported = io.BytesIO()
    model.to_onnx(exported, EXAMPLE, input_names=["images"], output_names=["logits"], dynamic_axes=axes, dynamo=False)
    graph = onnx.load_from_string(exported.getvalue())
    for key, value in {"class_names": json.dumps(class_names), "dataset": dataset}.items():
        graph.metadata_props.add(key=key, value=value)
    write_whole(output, lambda file: file.write(graph.SerializeToString()))  # a stop leaves no half file behind
