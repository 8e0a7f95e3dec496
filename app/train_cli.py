"""TrainCLI: LightningCLI with this project's models, data, callbacks and Trainer defaults, and what it adds to a run:
the settings a checkpoint brings, resuming, the checks before the launch and the summary at the end."""

import os
from argparse import RawDescriptionHelpFormatter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from jsonargparse import DefaultHelpFormatter
from lightning.pytorch import Trainer
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher
from lightning.pytorch.utilities import rank_zero_info

from app.checkpoint_io import AtomicCheckpointIO
from app.checkpoints import read_checkpoint
from app.checks import (
    COUNTS,
    check_accelerator,
    check_counts,
    check_data,
    check_launcher,
    check_sync_batchnorm,
    check_writable,
)
from app.command_line import subcommand_of
from app.dashboard import Dashboard
from app.errors import OWN_ERRORS, VALUE_ERRORS, UserError, blame_option, one_line, options_set
from app.fault_guard import FaultGuard
from app.global_batch import GlobalBatchInfo
from app.local_processes import CHECKED, STARTED, wait_for_the_meeting_place
from app.logger import LogConfigCallback, TensorBoardLogger
from app.peers import announce_rendezvous
from app.predictions import PredictionWriter
from app.resume import latest_version, resume_from_newest_checkpoint
from datamodules import MNISTDataModule
from models import ImageClassifier

DESCRIPTION = """\
Train SeqNet or ConvNet on MNIST or FashionMNIST with PyTorch Lightning: DDP on every visible GPU, or in one
process on a machine without one (--devices N: N processes on the CPU).
Without a subcommand it fits, then tests the best checkpoint; 'fit', 'validate', 'test' and 'predict' run one
stage. --devices and --num_nodes may stand anywhere, for --trainer.devices and --trainer.num_nodes.

  python train.py --model ConvNet --data.dataset mnist --devices 2
  python train.py test --ckpt_path runs/ConvNet-mnist/version_0/checkpoints/last.ckpt
  python train.py --model ConvNet --data.dataset mnist --ckpt_path last    # continue the latest such run

Every option: python train.py fit --help"""

TRAINER_DEFAULTS = {
    "strategy": "ddp",
    "accelerator": "auto",
    "devices": "auto",
    "max_epochs": 10,
    "default_root_dir": "runs",
    "callbacks": [GlobalBatchInfo()],
}


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
        # A third: last.ckpt also every `--timed_checkpoint.train_time_interval` (H:MM:SS) of training, in the middle
        # of an epoch too, so that a SIGKILL or a power cut loses at most that much. Off by default: with it,
        # Lightning broadcasts rank 0's decision to save before every step.
        parser.add_lightning_class_args(ModelCheckpoint, "timed_checkpoint")
        parser.set_defaults(
            {
                "timed_checkpoint.filename": "last",
                "timed_checkpoint.enable_version_counter": False,
                "timed_checkpoint.every_n_epochs": 0,  # no save at all until the interval is given
            }
        )
        parser.add_lightning_class_args(LearningRateMonitor, "lr_monitor")
        parser.add_lightning_class_args(Dashboard, "dashboard")
        parser.add_lightning_class_args(FaultGuard, "fault_guard")
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
        check_accelerator(self._get(self.config, "trainer.accelerator"))  # before anything else is printed
        trainer = self._get(self.config, "trainer")
        check_counts({f"--trainer.{name}": trainer[name] for name in COUNTS})
        seed = self._get(self.config, "seed_everything")
        try:
            super()._set_seed()
        except ValueError as error:  # the seed is all that Lightning's seed_everything takes
            raise UserError(
                f"--seed_everything {seed}: {one_line(error)}. Give --seed_everything another value."
            ) from error

    def instantiate_classes(self) -> None:
        with self._errors_named_by_option():
            super().instantiate_classes()

    def _run_subcommand(self, subcommand: str) -> None:
        trainer = self.trainer
        meeting = announce_rendezvous(trainer.world_size, trainer.num_nodes, trainer.node_rank, trainer.local_rank)
        wait_for_the_meeting_place()
        with self._errors_named_by_option(), meeting:
            super()._run_subcommand(subcommand)

    @contextmanager
    def _errors_named_by_option(self) -> Iterator[None]:
        """A value the parser accepted but torch, Lightning or the model rejected later (`--model.optimizer.lr -1`,
        `--model.lr_scheduler.step_size 0`): one line that names the option, instead of a traceback from every rank,
        where the evidence is certain (`app.errors.blame_option`). Any other error is raised as it is."""
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
        for subparser in self._subcommand_parsers.values():  # fit, validate, test and predict all take it
            subparser.set_defaults({"weights_only": True})

    def instantiate_trainer(self, **kwargs):
        """Give the Trainer this project's TensorBoard logger, in a folder named after model and dataset, and
        checkpoint files written atomically (unless --trainer.plugins says otherwise). When resuming, reuse the
        latest run's folder and start from its newest checkpoint (see `app/resume.py`). `test`, `validate` and
        `predict` of a run's checkpoint write beside that run, in `<run>/test/` and so on, where a user looks."""
        trainer_config = self._get(self.config_init, "trainer")
        root = Path(trainer_config["default_root_dir"] or ".")
        resuming = self._resuming()
        if trainer_config["plugins"] is None:
            kwargs["plugins"] = [AtomicCheckpointIO()]
        if trainer_config["logger"] in (None, True):
            if run_folder := self._checkpoints_run():
                kwargs["logger"] = TensorBoardLogger(save_dir=run_folder, name="", version=self.subcommand)
            else:
                run_name = f"{type(self.model).__name__}-{self.datamodule.hparams.dataset}"
                version = latest_version(root / run_name) if resuming else None
                kwargs["logger"] = TensorBoardLogger(save_dir=root, name=run_name, version=version)
        trainer = super().instantiate_trainer(**kwargs)
        if isinstance(trainer.strategy.launcher, _SubprocessScriptLauncher):  # they get SIGTERM and SIGHUP from it
            trainer.strategy.launcher.procs = STARTED  # the processes train.py started (app/local_processes.py)
        if not trainer.loggers:  # --trainer.logger false: LearningRateMonitor would refuse to run without a logger
            trainer.callbacks = [c for c in trainer.callbacks if not isinstance(c, LearningRateMonitor)]
        if resuming:
            self.config_init[self.subcommand]["ckpt_path"] = resume_from_newest_checkpoint(
                trainer, root, self.subcommand
            )
        return trainer

    def _checkpoints_run(self) -> Path | None:
        """The run folder of the checkpoint that `test`, `validate` or `predict` is given, when it lies in one
        (`<run>/checkpoints/NAME.ckpt`, beside the run's `config.yaml`); else None."""
        ckpt_path = self.config_init[self.subcommand].get("ckpt_path")
        if self.subcommand == "fit" or not ckpt_path:
            return None
        run_folder = Path(ckpt_path).parent.parent
        return (
            run_folder
            if Path(ckpt_path).parent.name == "checkpoints" and (run_folder / "config.yaml").is_file()
            else None
        )

    def _instantiate_trainer(self, config: dict, callbacks: list) -> Trainer:
        """`--trainer.enable_checkpointing false` turns off the checkpoint callbacks this program adds, as it turns
        off Lightning's own (Lightning refuses a ModelCheckpoint beside it)."""
        if config.get("enable_checkpointing") is False:
            callbacks = [callback for callback in callbacks if not isinstance(callback, ModelCheckpoint)]
        return super()._instantiate_trainer(config, callbacks)

    def _resuming(self) -> bool:
        return self.config_init[self.subcommand].get("ckpt_path") == "last"

    def _output_folders(self) -> dict[str, Path | str]:
        """The folders global rank 0 writes the run's logs, checkpoints and predictions into, by option."""
        folders = {"--trainer.default_root_dir": self.trainer.default_root_dir}
        for name in ("checkpoint", "last_checkpoint"):
            if dirpath := self._get(self.config, f"{name}.dirpath"):
                folders[f"--{name}.dirpath"] = dirpath
        if self.subcommand == "predict" and (path := self._get(self.config, "predictions.path")):
            folders["--predictions.path"] = path if Path(path).is_dir() else Path(path).parent
        return folders

    def _check_before_launch(self, *stages: str) -> None:
        """What can be wrong is found here, by one process, before the others start (`app/checks.py`)."""
        check_launcher(self.trainer)
        if self.trainer.global_rank == 0:
            for option, folder in self._output_folders().items():
                check_writable(option, folder)
        check_data(self.trainer, self.datamodule, stages)
        CHECKED.set()  # from here, a mistake met by a process train.py started early is that process's own

    def before_fit(self) -> None:
        check_sync_batchnorm(self.trainer, self._get(self.config, "trainer.sync_batchnorm"))
        self._check_before_launch(*(("fit", "test") if self.test_after_fit else ("fit",)))
        if self.trainer.world_size == 1 and isinstance(self.trainer.accelerator, CPUAccelerator):
            # Lightning's `devices="auto"` is one process on a CPU: more would share its cores and run no faster.
            rank_zero_info(
                f"Training in 1 process on the CPU ({os.cpu_count()} cores): --devices N trains with DDP in N"
                " processes, which share those cores."
            )

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
