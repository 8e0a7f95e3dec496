"""`train.py export`: a trained model as one file that runs without this repository, in ONNX or TorchScript.

    python train.py export --ckpt_path CKPT --format onnx --output model.onnx
    python train.py export --ckpt_path CKPT --format torchscript --output model.pt
    python train.py export --ckpt_path last --model ConvNet --data.dataset mnist --format onnx --output model.onnx

CKPT is a checkpoint file or a run's folder; `last` is the newest run of `--model` on `--data.dataset` under
`--trainer.default_root_dir`, as for `test --ckpt_path last`. The exported model takes raw images as the IDX files
hold them, a uint8 tensor (N, 28, 28) for any N, and returns logits (N, 10): the dataset's normalisation is inside
it. The ONNX file names the classes in its metadata (`class_names`, a JSON list; `dataset`).
"""

import argparse
import io
import json
import shlex
import sys
import warnings
from pathlib import Path

import torch

from app.console import UserError, here, runnable
from app.plugins.checkpoint_io import write_whole
from app.runs import run_name
from app.start import find_start
from datamodules.mnist import DATASETS, DatasetName, MNISTDataModule
from models import ImageClassifier, model_names

EXAMPLE = torch.zeros(2, 28, 28, dtype=torch.uint8)  # a batch of raw images to trace the model with


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UserError(f"{message}. Usage: {self.usage}")


def export(argv: list[str]) -> int:
    """Write the file `argv` (export's options) asks for, and say where: exit status 0."""
    train = shlex.join([runnable(Path(sys.executable)), here(Path(__file__).parents[1] / "train.py")])
    usage = f"{train} export --ckpt_path CKPT --format onnx|torchscript --output FILE"
    parser = _Parser(
        prog=f"{train} export",
        usage=usage,
        description=__doc__.replace("python train.py", train),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--ckpt_path", required=True, help="a checkpoint written by train.py, a run's folder, or last")
    parser.add_argument("--format", required=True, choices=("onnx", "torchscript"))
    parser.add_argument("--output", required=True, help="the file to write (never over an existing one)")
    parser.add_argument("--model", help="with last: the model of the run (default: SeqNet)")
    parser.add_argument("--data.dataset", dest="dataset", type=DatasetName, help="with last: its dataset")
    parser.add_argument("--trainer.default_root_dir", dest="root", default="runs", help="with last: the runs' root")
    parser.add_argument("--weights_only", choices=("true", "false"), default="true", help="false: load code too")
    args = parser.parse_args(argv)
    output = Path(args.output)
    if args.output.endswith("/") or output.is_dir():
        suggested = shlex.quote(str(output / "model.onnx"))
        raise UserError(f"--output {args.output} names a folder: give the file to write (--output {suggested}).")
    if output.exists() or output.is_symlink():
        raise UserError(f"--output {output} exists already: give another file name, or remove it first.")
    runs = Path(args.root) / run_name(args.model or "SeqNet", args.dataset or "fashion_mnist")
    weights_only = args.weights_only == "true"
    start = find_start(args.ckpt_path, "export", runs, weights_only)
    if start is None:
        raise UserError(f"--ckpt_path {args.ckpt_path}: export reads a checkpoint file, a run's folder, or last.")
    saved = (start.contents.get("hyper_parameters") or {}).get("_class_path", "").rsplit(".", 1)[-1]
    model_class = next((cls for cls in _subclasses() if cls.__name__ == saved), None)
    if model_class is None:
        raise UserError(f"--ckpt_path {start.checkpoint} holds no model of train.py ({', '.join(model_names())}).")
    dataset = (start.contents.get("datamodule_hyper_parameters") or {}).get("dataset", args.dataset)
    for option, given, theirs, what in (
        ("--model", args.model, saved, "a"),
        ("--data.dataset", args.dataset, dataset, "a model trained on"),
    ):
        if given is not None and given.rsplit(".", 1)[-1] != theirs:
            raise UserError(
                f"--ckpt_path {start.checkpoint} holds {what} {theirs}, but {option} names {given}: leave {option} out"
                f" (the checkpoint's is used), or give a checkpoint of {given}."
            )
    if dataset is None:
        raise UserError(
            f"--ckpt_path {start.checkpoint} does not say which dataset it was trained on: give it with"
            f" --data.dataset ({' or '.join(DATASETS)})."
        )
    model = model_class.load_from_checkpoint(start.checkpoint, map_location="cpu", weights_only=weights_only).eval()
    model.hparams.channels_last = False  # a memory layout for training kernels; nothing an exported graph keeps
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        if args.format == "torchscript":
            with warnings.catch_warnings():  # torch and Lightning deprecate TorchScript; it was asked for
                warnings.simplefilter("ignore")
                traced = model.to_torchscript(method="trace", example_inputs=EXAMPLE)
                write_whole(output, lambda file: torch.jit.save(traced, file), over=False)
        else:
            _write_onnx(model, output, MNISTDataModule(dataset=dataset).class_names, dataset)
    except OSError as error:
        raise UserError(f"--output {output}: cannot write there ({error.strerror}). Choose another path.") from error
    print(f"Exported: {output}")
    return 0


def _subclasses(base: type = ImageClassifier) -> list[type]:
    return [base, *(cls for sub in base.__subclasses__() for cls in _subclasses(sub))]


def _write_onnx(model: ImageClassifier, output: Path, class_names: list[str], dataset: str) -> None:
    try:
        import onnx  # noqa: PLC0415 (an extra: pip install -e '.[export]')
    except ImportError as error:
        raise UserError("--format onnx needs the onnx package: pip install -e '.[export]'.") from error
    exported = io.BytesIO()
    axes = {"images": {0: "batch"}, "logits": {0: "batch"}}
    model.to_onnx(exported, EXAMPLE, input_names=["images"], output_names=["logits"], dynamic_axes=axes, dynamo=False)
    graph = onnx.load_from_string(exported.getvalue())
    for key, value in {"class_names": json.dumps(class_names), "dataset": dataset}.items():
        graph.metadata_props.add(key=key, value=value)
    write_whole(output, lambda file: file.write(graph.SerializeToString()), over=False)
