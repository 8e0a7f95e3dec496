"""What train.py's command line settles that Lightning leaves open: a whole number of batches read as batches, what
--ckpt_path means here, the names of Lightning 1.x, the parser's error as one line, and the values Lightning takes
unchecked."""

import os
from collections.abc import Iterable

import torch
from lightning.pytorch import Trainer as LightningTrainer
from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser
from lightning.pytorch.plugins import CheckpointIO
from lightning.pytorch.strategies import StrategyRegistry

from app.console import UserError
from app.errors import OLDER_VALUES
from app.launch import launcher_shape, settle_shape
from app.plugins import AtomicCheckpointIO

HELP = """usage: train.py [fit | validate | test | predict | export] [OPTIONS]

Train an image classifier on MNIST or FashionMNIST with PyTorch Lightning: DDP on every visible GPU, or in one
process on a machine without one (--devices N: N processes).

subcommands:
  (none)    fit, then test the best checkpoint (fit's options)
  fit       train a new run, or continue one (--ckpt_path last, a run's folder, or a checkpoint file)
  validate  the validation figures of trained weights (--ckpt_path)
  test      the test figures of trained weights (--ckpt_path)
  predict   a CSV of the classes predicted for the test set or your own pictures (--data.predict_dir)
  export    ONNX or TorchScript of trained weights (--ckpt_path, --format, --output)
train.py SUBCOMMAND --help lists its options. --devices and --num_nodes stand for --trainer.devices and
--trainer.num_nodes, anywhere on the line; --config FILE reads options from a YAML file.

examples:
  python train.py --model ConvNet --data.dataset mnist --devices 2
  python train.py --model ConvNet --data.dataset mnist --ckpt_path last      # continue the newest such run
  python train.py test --ckpt_path runs/ConvNet-mnist/version_0              # a run's folder, last, or a file
  python train.py export --ckpt_path CKPT --format onnx --output model.onnx
"""


def command_line(args: list[str], subcommands: Iterable[str]) -> tuple[list[str], str | None]:
    """LightningCLI's arguments for `train.py ARGS`, and the subcommand named: `--devices N` and `--num_nodes N`
    anywhere are the Trainer's options; where no subcommand follows the options LightningCLI takes
    before one (`--config FILE`), `fit` goes in front (fit, then test)."""
    shortcuts, rest, tokens = [], [], iter(args)
    for token in tokens:
        name, given, value = token.partition("=")
        shortcuts += [name, value if given else next(tokens, "")] if name in ("--devices", "--num_nodes") else []
        rest += [] if name in ("--devices", "--num_nodes") else [token]
    at = 0
    while at < len(rest) and rest[at].partition("=")[0] in ("-c", "--config"):
        at += 1 if "=" in rest[at] else 2
    named = rest[at] if at < len(rest) and rest[at] in subcommands else None
    trainer = [f"--trainer.{name[2:]}={value}" for name, value in zip(shortcuts[::2], shortcuts[1::2], strict=True)]
    return (rest if named else ["fit", *rest]) + trainer, named


class Trainer(LightningTrainer):
    """Lightning's Trainer: a whole number given to a `limit_*_batches` option is a number of batches.

    `limit_*_batches` and `overfit_batches` take a whole number from the command line as a number of batches, as
    `Trainer(limit_val_batches=1)` does (annotated `int | float`, the parser made `--trainer.limit_val_batches 1` the
    fraction 1.0: every batch)."""

    def __init__(
        self,
        *args,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        overfit_batches: int | float = 0.0,
        **kwargs,
    ) -> None:
        limits = {
            "limit_train_batches": limit_train_batches,
            "limit_val_batches": limit_val_batches,
            "limit_test_batches": limit_test_batches,
            "limit_predict_batches": limit_predict_batches,
        }
        super().__init__(*args, **limits, overfit_batches=overfit_batches, **kwargs)


# What --ckpt_path means here (docs/run-folder.md), in place of Lightning's text for `Trainer.fit(ckpt_path=...)`: to
# fit, and to evaluate (validate, test, predict).
FIT_CKPT_PATH = (
    "The run to continue, in its folder and with its settings: last (the newest run of this --model and"
    " --data.dataset under --trainer.default_root_dir; a new run if there is none), a run's folder"
    " (runs/SeqNet-mnist/version_0), or a checkpoint file (a new run from its weights and step). None: a new run."
)
EVALUATED_CKPT_PATH = (
    "The trained weights (required: what to {}): last (the newest run of this --model and --data.dataset under"
    " --trainer.default_root_dir), a run's folder (runs/SeqNet-mnist/version_0: its checkpoints/last.ckpt), or a"
    " checkpoint file."
)


class Parser(LightningArgumentParser):
    """Lightning's parser, with this program's meaning of each subcommand's --ckpt_path in its help."""

    def add_method_arguments(self, class_type, method_name, *args, skip=None, **kwargs) -> list[str]:
        added = super().add_method_arguments(
            class_type, method_name, *args, skip={*(skip or ()), "ckpt_path"}, **kwargs
        )
        what = FIT_CKPT_PATH if method_name == "fit" else EVALUATED_CKPT_PATH.format(method_name)
        self.add_argument("--ckpt_path", type=str | None, default=None, help=what)
        return [*added, "ckpt_path"]


def on(pieces: list, trainer, logger) -> dict:
    """The Trainer's callbacks and plugins (`trainer`: its settings, built): its own, those of `pieces` that are on
    (off means absent: the checkpoints without `enable_checkpointing`, the learning rate's monitor without a logger, a
    piece whose own option turned it off: `every_n_steps` or a watchdog's `timeout` of 0), and whole checkpoint files
    (`AtomicCheckpointIO`) where no other checkpoint writer is given."""
    off = {ModelCheckpoint: trainer.enable_checkpointing is False, LearningRateMonitor: not logger}
    pieces = [piece for piece in pieces if not off.get(type(piece)) and getattr(piece, "timeout", 1) != 0]
    pieces = [piece for piece in pieces if getattr(piece, "every_n_steps", 1) != 0 or getattr(piece, "log_graph", 0)]
    callbacks, plugins = (
        [] if v is None else v if isinstance(v, list) else [v] for v in (trainer.callbacks, trainer.plugins)
    )
    plugins += [] if any(isinstance(plugin, CheckpointIO) for plugin in plugins) else [AtomicCheckpointIO()]
    return {"callbacks": [*callbacks, *pieces], "plugins": plugins}


def settle(config) -> None:
    """What a command's settings (`config`, parsed) leave open or Lightning takes unchecked: loading a checkpoint runs
    no code unless `--weights_only false` asks; a value Lightning would fail on later is refused (`check`); under a
    launcher, the processes are the ones it started (`settle_shape`)."""
    config.weights_only = config.get("weights_only") is not False
    check(dict(config.trainer), config.seed_everything)
    settle_shape(config.trainer, config.stop, kubeflow="KubeflowEnvironment" in str(config.trainer.plugins))


def check(trainer: dict, seed: object) -> None:
    """Refuse in one line what Lightning would take and fail on later, with a traceback: a count it divides by, a
    seed out of NumPy's range, a NODE_RANK outside the job."""
    for name in ("accumulate_grad_batches", "check_val_every_n_epoch", "val_check_interval"):
        value = trainer.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise UserError(f"--trainer.{name} {value}: must be 1 or more. Give --trainer.{name} another value.")
    if isinstance(seed, int) and not isinstance(seed, bool) and not 0 <= seed < 2**32:
        raise UserError(f"--seed_everything {seed}: must be from 0 to {2**32 - 1}. Give another value.")
    for name, known in (
        ("accelerator", ("auto", "gpu", *AcceleratorRegistry)),
        ("strategy", ("auto", *StrategyRegistry)),
    ):
        value = trainer.get(name)
        if isinstance(value, str) and value.lower() not in known:  # Lightning reads them in lower case
            older = OLDER_VALUES.get(value.lower())
            shown = sorted(k for k in known if "_find_unused" not in k and "_stage" not in k)  # the variants' bases
            more = " (and their variants)" if len(shown) < len(set(known)) else ""
            today = f"Lightning 1.x's name; today: {older}" if older else "no such name"
            raise UserError(f"--trainer.{name} {value}: {today}. Known: {', '.join(shown)}{more}.")
    accelerator = trainer.get("accelerator")
    if trainer.get("sync_batchnorm") and (
        accelerator == "cpu" or accelerator == "auto" and not torch.cuda.is_available()
    ):
        raise UserError("--trainer.sync_batchnorm true needs GPUs (torch's SyncBatchNorm has none for the CPU).")
    nodes, node_rank = trainer.get("num_nodes"), os.environ.get("NODE_RANK", "0")
    if isinstance(nodes, int) and nodes > 0 and node_rank not in map(str, range(nodes)) and launcher_shape() is None:
        raise UserError(
            f"NODE_RANK {node_rank}: each of the --num_nodes {nodes} nodes takes its own NODE_RANK, from 0"
            f" to {nodes - 1}."
        )
