"""The command line of `train.py`: LightningCLI with this project's models, data and Trainer defaults."""

import os
import signal
import sys
from argparse import RawDescriptionHelpFormatter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from jsonargparse import DefaultHelpFormatter
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import Trainer
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from app.callbacks import GlobalBatchInfo, SigtermCheck
from app.checkpoint_io import AtomicCheckpointIO
from app.checkpoints import read_checkpoint
from app.dashboard import Dashboard
from app.errors import (
    OWN_ERRORS,
    RENDEZVOUS_ERRORS,
    USER_ERRORS,
    VALUE_ERRORS,
    UserError,
    blame_option,
    describe,
    exit_with_error,
    one_line,
    options_set,
)
from app.export import ExportError, export
from app.export import parse as parse_export_arguments
from app.folders import check_writable
from app.launch import choose_socket_interface
from app.logger import LogConfigCallback, TensorBoardLogger
from app.predictions import PredictionWriter
from app.quiet import silence_noise
from app.resume import latest_version, newest_checkpoint
from datamodules import MNISTDataModule
from models import ImageClassifier

DESCRIPTION = """\
Train SeqNet or ConvNet on MNIST or FashionMNIST with PyTorch Lightning, DDP on every visible device.
Without a subcommand it fits, then tests the best checkpoint; 'fit', 'validate', 'test' and 'predict' run one
stage. --devices and --num_nodes may stand anywhere, for --trainer.devices and --trainer.num_nodes.

  python train.py --model ConvNet --data.dataset mnist --devices 2
  python train.py test --ckpt_path runs/ConvNet-mnist/version_0/checkpoints/last.ckpt
  python train.py --model ConvNet --data.dataset mnist --ckpt_path last    # continue the latest such run

Every option: python train.py fit --help"""

SHORTCUTS = {"--devices": "--trainer.devices", "--num_nodes": "--trainer.num_nodes"}

TRAINER_DEFAULTS = {
    "strategy": "ddp",
    "accelerator": "auto",
    "devices": "auto",
    "max_epochs": 10,
    "default_root_dir": "runs",
    "callbacks": [GlobalBatchInfo()],
}


def parse_command(argv: list[str]) -> tuple[list[str], bool]:
    """Turn `train.py`'s command line into LightningCLI arguments, and say whether to test after fitting.

    With no subcommand the program fits and then tests, so `fit` is put in front. The shortcuts `--devices N`
    and `--num_nodes N` become `--trainer.devices N` and `--trainer.num_nodes N`, placed after the subcommand.
    """
    args, shortcuts = [], []
    tokens = iter(argv)
    for token in tokens:
        name, has_value, value = token.partition("=")
        if name in SHORTCUTS:
            shortcuts.append(f"{SHORTCUTS[name]}={value if has_value else next(tokens, '')}")
        else:
            args.append(token)
    test_after_fit = subcommand_of(args) is None and args[:1] not in (["-h"], ["--help"])
    if test_after_fit:
        args.insert(0, "fit")
    return args + shortcuts, test_after_fit


def subcommand_of(args: list[str]) -> str | None:
    """The subcommand `args` name where LightningCLI takes one (first, or after `--config FILE`), or None."""
    tokens = iter(args)
    for token in tokens:
        if token in ("-c", "--config"):
            next(tokens, None)
        elif not token.startswith(("--config=", "--print_config")):
            return token if token in LightningCLI.subcommands() else None
    return None


class HelpFormatter(RawDescriptionHelpFormatter, DefaultHelpFormatter):
    """jsonargparse's help, keeping the line breaks of DESCRIPTION."""


class TrainCLI(LightningCLI):
    """LightningCLI with the Trainer defaults of this project and a fit-then-test default command."""

    def __init__(self, args: list[str], test_after_fit: bool = False) -> None:
        self.test_after_fit = test_after_fit
        self.chosen_subcommand = subcommand_of(args)
        super().__init__(
            model_class=ImageClassifier,
            subclass_mode_model=True,
            datamodule_class=MNISTDataModule,
            trainer_defaults=TRAINER_DEFAULTS,
            seed_everything_default=42,
            auto_configure_optimizers=False,  # the models take their optimizer as a constructor argument
            save_config_callback=LogConfigCallback,
            # Each run logs into a new version folder; overwriting only matters when a user pins the version.
            save_config_kwargs={"overwrite": True},
            parser_kwargs={"exit_on_error": False, "description": DESCRIPTION, "formatter_class": HelpFormatter},
            args=args,
        )

    def subcommands(self) -> dict[str, set[str]]:
        """The subcommand this run asks for, alone: LightningCLI builds a parser for each subcommand it lists, in every
        process (0.37 s for all four under cProfile). All of them when none is named (`train.py --help`)."""
        every = LightningCLI.subcommands()
        return {self.chosen_subcommand: every[self.chosen_subcommand]} if self.chosen_subcommand else every

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults({"model": "models.SeqNet"})
        # Two checkpoint callbacks: the best by val/acc, and last.ckpt written after every epoch. One callback with
        # save_last=True would not do: since Lightning 2.6 it rewrites last.ckpt only when a new best is saved.
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.monitor": "val/acc", "checkpoint.mode": "max"})
        parser.add_lightning_class_args(ModelCheckpoint, "last_checkpoint")
        parser.set_defaults({"last_checkpoint.filename": "last", "last_checkpoint.enable_version_counter": False})
        parser.add_lightning_class_args(LearningRateMonitor, "lr_monitor")
        parser.add_lightning_class_args(Dashboard, "dashboard")
        parser.add_lightning_class_args(SigtermCheck, "sigterm_check")
        parser.add_lightning_class_args(PredictionWriter, "predictions")

    def parse_arguments(self, parser: LightningArgumentParser, args: list[str]) -> None:
        """Parse; with `--ckpt_path FILE` the checkpoint's model and data settings become the defaults.

        Lightning restores the model's hyperparameters from the checkpoint, but not the datamodule's, so
        `test --ckpt_path` would evaluate a MNIST model on FashionMNIST. Options given on the command line or in a
        config file still win over the checkpoint's, so the data can be read from another folder; a `--model` other
        than the checkpoint's is refused, since Lightning would silently replace it with the checkpoint's.
        """
        self._load_checkpoints_as_data_only()
        super().parse_arguments(parser, args)
        subcommand = self.config.get("subcommand")
        ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if (
            not ckpt_path
            or ckpt_path in ("last", "best", "hpc")
            or ckpt_path.startswith("registry")
            or "://" in ckpt_path
        ):
            return  # Lightning's own names, and remote files that Lightning loads itself
        checkpoint = read_checkpoint(ckpt_path)
        data_hparams = checkpoint.get("datamodule_hyper_parameters", {})
        data_hparams.pop("_instantiator", None)
        defaults = {f"data.{k}": v for k, v in data_hparams.items()}
        saved_model = checkpoint.get("hyper_parameters", {}).get("_class_path")
        if saved_model:
            defaults["model"] = saved_model
        self._subcommand_parsers[subcommand].set_defaults(defaults)
        super().parse_arguments(parser, args)
        chosen_model = self.config[subcommand].model.class_path
        if saved_model and chosen_model != saved_model:
            saved, chosen = saved_model.rsplit(".", 1)[-1], chosen_model.rsplit(".", 1)[-1]
            raise UserError(
                f"--ckpt_path {ckpt_path} holds a {saved}, but --model names {chosen}: leave --model out (the"
                f" checkpoint's model is used), or give a checkpoint of {chosen}."
            )

    def _set_seed(self) -> None:
        with self._errors_named_by_option():
            super()._set_seed()

    def instantiate_classes(self) -> None:
        with self._errors_named_by_option():
            super().instantiate_classes()

    def _run_subcommand(self, subcommand: str) -> None:
        with self._errors_named_by_option():
            super()._run_subcommand(subcommand)

    @contextmanager
    def _errors_named_by_option(self) -> Iterator[None]:
        """A value the parser accepted but torch, Lightning or the model rejected later (`--model.optimizer.lr -1`,
        `--trainer.log_every_n_steps 0`): one line that names the option, instead of a traceback from every rank.
        An error that no option the user set can explain is raised as it is."""
        try:
            yield
        except VALUE_ERRORS as error:
            if isinstance(error, OWN_ERRORS):
                raise
            subcommand = self.config.subcommand
            config, defaults = self.config[subcommand], self._subcommand_parsers[subcommand].get_defaults()
            if isinstance(error, RuntimeError) and "loading state_dict" in str(error):
                raise UserError(
                    f"--ckpt_path {config.ckpt_path} does not fit {config.model.class_path}: {one_line(error)[:150]}"
                    " Give a checkpoint of this model."
                ) from error
            line = blame_option(error, options_set(config, defaults))
            if line is None:
                raise
            raise UserError(line) from error

    def _load_checkpoints_as_data_only(self) -> None:
        """Default `--weights_only true`: loading a checkpoint cannot run code.

        Lightning's default (None) leaves files to torch, which loads them weights-only since torch 2.6, but
        unpickles anything from a URL. This program's checkpoints hold tensors and plain settings only, so they load
        either way; one that needs `--weights_only false` should come from a source one trusts.
        """
        for subparser in self._subcommand_parsers.values():
            if "--weights_only" in subparser._option_string_actions:  # a `weights_only` argument, Lightning >= 2.6
                subparser.set_defaults({"weights_only": True})

    def instantiate_trainer(self, **kwargs):
        """Give the Trainer this project's TensorBoard logger, in a folder named after model and dataset, and
        checkpoint files written atomically (unless --trainer.plugins says otherwise). When resuming, reuse the
        latest run's folder and start from its newest checkpoint (see `app/resume.py`)."""
        trainer_config = self._get(self.config_init, "trainer")
        root = Path(trainer_config["default_root_dir"] or ".")
        resuming = self._resuming()
        if trainer_config["plugins"] is None:
            kwargs["plugins"] = [AtomicCheckpointIO()]
        if trainer_config["logger"] in (None, True):
            run_name = f"{type(self.model).__name__}-{self.datamodule.hparams.dataset}"
            version = latest_version(root / run_name) if resuming else None
            kwargs["logger"] = TensorBoardLogger(save_dir=root, name=run_name, version=version)
        trainer = super().instantiate_trainer(**kwargs)
        if not trainer.loggers:  # --trainer.logger false: LearningRateMonitor would refuse to run without a logger
            trainer.callbacks = [c for c in trainer.callbacks if not isinstance(c, LearningRateMonitor)]
        if resuming:
            self._resume_from_newest_checkpoint(trainer, root)
        return trainer

    def _resuming(self) -> bool:
        return self.config_init[self.subcommand].get("ckpt_path") == "last"

    def _resume_from_newest_checkpoint(self, trainer: Trainer, root: Path) -> None:
        run_folder = Path(trainer.log_dir) if trainer.loggers else root
        folders = {Path(c.dirpath or run_folder / "checkpoints") for c in trainer.checkpoint_callbacks}
        checkpoint = newest_checkpoint(folders, root)
        if checkpoint is None and self.subcommand != "fit":
            raise FileNotFoundError(
                f"--ckpt_path last: no last checkpoint in {run_folder}. Train first, or give --ckpt_path FILE."
            )
        self.config_init[self.subcommand]["ckpt_path"] = str(checkpoint) if checkpoint else None
        if trainer.global_rank == 0:
            found = f"resuming from {checkpoint}" if checkpoint else f"nothing to resume in {root}, starting afresh"
            print(f"--ckpt_path last: {found}")

    def _check_data(self, *stages: str) -> None:
        """Download and decode the data now, before Lightning's launcher starts the other processes.

        A missing or corrupt file then stops the program with one message from one process. Only local rank 0
        does this (the launching process, or with torchrun/SLURM the first process of each node), as Lightning
        does with `prepare_data`; the other processes load the data in `setup`, after Lightning's barrier.
        """
        if self.trainer.local_rank != 0:
            return
        self.datamodule.prepare_data()
        for stage in stages:
            self.datamodule.setup(stage)

    def _check_sync_batchnorm(self) -> None:
        if self._get(self.config, "trainer.sync_batchnorm") and isinstance(self.trainer.accelerator, CPUAccelerator):
            raise MisconfigurationException(
                "--trainer.sync_batchnorm true needs GPUs: torch's SyncBatchNorm has no CPU implementation. On CPU,"
                " leave it off (each process then normalises with its own batch statistics)."
            )

    def _check_launcher(self) -> None:
        """Stop in one line when the launcher started other processes than --devices x --num_nodes asks for.

        Lightning checks this too, but only after the launch and with a traceback from every process.
        """
        environment = getattr(self.trainer.strategy, "cluster_environment", None)
        if environment is None:
            return
        try:
            environment.validate_settings(num_devices=self.trainer.num_devices, num_nodes=self.trainer.num_nodes)
        except ValueError as error:
            raise MisconfigurationException(f"{error} Make --devices and --num_nodes match the launcher.") from error

    def _check_output_folders(self) -> None:
        """Global rank 0 writes the logs, checkpoints and predictions: it checks their folders before the launch."""
        if self.trainer.global_rank != 0:
            return
        folders = {"--trainer.default_root_dir": self.trainer.default_root_dir}
        for name in ("checkpoint", "last_checkpoint"):
            if dirpath := self._get(self.config, f"{name}.dirpath"):
                folders[f"--{name}.dirpath"] = dirpath
        if self.subcommand == "predict" and (path := self._get(self.config, "predictions.path")):
            folders["--predictions.path"] = path if Path(path).is_dir() else Path(path).parent
        for option, folder in folders.items():
            check_writable(option, folder)

    def _check_before_launch(self, *stages: str) -> None:
        self._check_launcher()
        self._check_output_folders()
        self._check_data(*stages)

    def before_fit(self) -> None:
        self._check_sync_batchnorm()
        self._check_before_launch(*(("fit", "test") if self.test_after_fit else ("fit",)))

    def before_validate(self) -> None:
        self._check_before_launch("validate")

    def before_test(self) -> None:
        self._check_before_launch("test")

    def before_predict(self) -> None:
        self._check_before_launch("predict")

    def after_fit(self) -> None:
        checkpoint = self.trainer.checkpoint_callback  # the first one: best by val/acc
        best = checkpoint.best_model_path if checkpoint is not None else ""
        metrics = dict(self.trainer.callback_metrics)  # the last validation's; test() replaces them
        if self.test_after_fit:
            self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best or None)
            metrics.update(self.trainer.callback_metrics)
        self._print_summary(metrics, best)

    def after_predict(self) -> None:
        writer = next(c for c in self.trainer.callbacks if isinstance(c, PredictionWriter))
        rank_zero_info(f"Predictions: {writer.csv_path(self.trainer)}")

    def after_validate(self) -> None:
        self._print_summary(self.trainer.callback_metrics)

    def after_test(self) -> None:
        self._print_summary(self.trainer.callback_metrics)

    def _print_summary(self, metrics: dict, best_checkpoint: str = "") -> None:
        """Rank 0 closes the run with its figures and where to find its checkpoint and logs."""
        names = [name for name in ("test/acc", "test/loss", "val/acc", "val/loss") if name in metrics]
        lines = ["Finished: " + "  ".join(f"{name} {metrics[name].item():.4f}" for name in names)]
        if best_checkpoint:
            lines.append(f"Best checkpoint: {best_checkpoint}")
        if self.trainer.loggers:
            lines.append(f"Logs: {self.trainer.log_dir}")
            lines.append(f"Dashboard: tensorboard --logdir {self.trainer.logger.save_dir}")
        rank_zero_info("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["export"]:
        export_model(argv[1:])
        return
    args, test_after_fit = parse_command(argv)
    silence_noise()
    interface = choose_socket_interface()
    if interface and os.environ.get("LOCAL_RANK", os.environ.get("SLURM_LOCALID", "0")) == "0":  # once per node
        print(f"Reaching MASTER_ADDR through {interface} (set GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME to choose)")
    try:
        TrainCLI(args, test_after_fit)
    except (*USER_ERRORS, *RENDEZVOUS_ERRORS) as error:
        exit_with_error(describe(error, args))
    except SIGTERMException as stop:  # every rank stopped at the same step (app/callbacks.py: SigtermCheck)
        # 143 or 130: what shells, torchrun and SLURM read as "ended by SIGTERM" or "by Ctrl-C"
        sys.exit(128 + getattr(stop, "signum", signal.SIGTERM))
    except KeyboardInterrupt:  # Ctrl-C before training started or after it ended
        sys.exit(128 + signal.SIGINT)
    finally:
        close_process_group()


def export_model(argv: list[str]) -> None:
    """`train.py export ...` (app/export.py), with its mistakes in one line."""
    try:
        output = export(parse_export_arguments(argv))
    except (ExportError, *USER_ERRORS) as error:
        exit_with_error(describe(error))
    print(f"Exported: {output}")


def close_process_group() -> None:
    """Destroy the process group while Python is still fully alive.

    Lightning leaves it open when the program ends. Gloo's worker threads may then still hold the work of the last
    collectives, whose tensors get freed during interpreter shutdown: the process aborts (SIGABRT, "terminate called
    without an active exception") after a run that finished well, and its exit status says it failed.
    """
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
