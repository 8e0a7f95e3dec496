"""TrainCLI: LightningCLI with this project's models, data, callbacks and Trainer defaults, and what it adds to a run:
the settings a checkpoint brings, resuming, the checks before the launch and the summary at the end."""

import os
import subprocess
import textwrap
from argparse import ArgumentError, RawDescriptionHelpFormatter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

import yaml
from jsonargparse import DefaultHelpFormatter
from lightning.pytorch import Callback
from lightning.pytorch.accelerators import CPUAccelerator
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint, ProgressBar, TQDMProgressBar
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.plugins import CheckpointIO
from lightning.pytorch.plugins.environments import ClusterEnvironment
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from app.command_line.argv import subcommand_of, value_given
from app.command_line.checks import (
    COUNTS,
    check_accelerator,
    check_callback_states,
    check_counts,
    check_data,
    check_launcher,
    check_node_rank,
    check_seed,
    check_sync_batchnorm,
    check_writable,
)
from app.command_line.errors import OWN_ERRORS, VALUE_ERRORS, UserError, blame_option, one_line, options_set
from app.command_line.parser_messages import config_not_text, shorten
from app.command_line.quiet import silence_a_continuation
from app.command_line.same_settings import COMMAND, PROGRAM, STARTS_FROM, program_digest, same_settings_everywhere
from app.command_line.trainer import Trainer
from app.invocation import tool, train_py
from app.job.fault_guard import FaultGuard, last_checkpoint_path
from app.job.launcher_shape import LauncherShape, launcher_shape
from app.job.rendezvous import Meeting
from app.run.checkpoints import AtomicCheckpointIO, remove_partial_files
from app.run.continuation import (
    DATA_OF_THE_RUN,
    Start,
    changes_between,
    find_start,
    model_changes,
    refuse_another,
    refuse_another_model,
    refuse_other_statistics,
    refuse_weights_that_do_not_fit,
)
from app.run.dashboard import Dashboard
from app.run.folder import (
    CHECKPOINTS,
    DEFAULT_ROOT,
    RECORD,
    RunFolder,
    checkpoint_folders,
    is_run,
    newest_run_with_a_checkpoint,
    run_name,
    trained_runs_in,
)
from app.run.global_batch import GlobalBatchInfo
from app.run.model_summary import NetworkSummary
from app.run.predictions import PredictionWriter
from app.run.record import RunRecord
from app.run.replan import ReplanOnResume
from app.run.tensorboard import RunLogger
from app.say import say
from datamodules import MNISTDataModule
from models import ImageClassifier, model_names

# The hooks Lightning calls at every batch (`lightning.pytorch.trainer.call._call_callback_hooks`).
BATCH_HOOKS = (
    *("on_train_batch_start", "on_before_backward", "on_after_backward", "on_before_optimizer_step"),
    *("on_before_zero_grad", "on_train_batch_end", "on_validation_batch_start", "on_validation_batch_end"),
    *("on_test_batch_start", "on_test_batch_end", "on_predict_batch_start", "on_predict_batch_end"),
)
PROGRESS_BAR_EVERY_N_STEPS = 10  # at tens or hundreds of steps a second, as often as a terminal shows it
STOPS = (KeyboardInterrupt, SIGTERMException)  # Ctrl-C, and a stop every rank agreed on (app/job/fault_guard.py)

DESCRIPTION = """\
Train an image classifier on MNIST or FashionMNIST with PyTorch Lightning: DDP on every visible GPU, or in one
process on a machine without one (--devices N: N processes on the CPU). --model names it: {models}.
Without a subcommand it fits, then tests the best checkpoint; 'fit', 'validate', 'test' and 'predict' run one
stage, 'export' writes a trained model as ONNX or TorchScript. --devices and --num_nodes may stand anywhere, for
--trainer.devices and --trainer.num_nodes.

  {train} --model ConvNet --data.dataset mnist --devices 2
  {train} test --ckpt_path runs/ConvNet-mnist/version_0/checkpoints/last.ckpt
  {train} --model ConvNet --data.dataset mnist --ckpt_path last    # continue the latest such run
  {train} export --ckpt_path CKPT --format onnx --output model.onnx

Every option: {train} fit --help (export's: {train} export --help)"""


def trainer_defaults() -> dict:
    """The Trainer's defaults, with callbacks of their own for each run."""
    return {
        "strategy": "ddp",
        "accelerator": "auto",
        "devices": "auto",
        "max_epochs": 10,
        "default_root_dir": DEFAULT_ROOT,
        "callbacks": [ReplanOnResume(), GlobalBatchInfo(), NetworkSummary()],
    }


class HelpFormatter(RawDescriptionHelpFormatter, DefaultHelpFormatter):
    """jsonargparse's help, keeping the line breaks of DESCRIPTION."""


class TrainCLI(LightningCLI):
    """LightningCLI with the Trainer defaults of this project and a fit-then-test default command."""

    def __init__(self, args: list[str], test_after_fit: bool = False) -> None:
        self.test_after_fit = test_after_fit
        self.chosen_subcommand = subcommand_of(args)
        self.start: Start | None = None  # what --ckpt_path starts from (app/run/continuation.py)
        self.run: RunFolder | None = None  # the folder this command writes into (app/run/folder.py)
        self.shape: LauncherShape | None = None  # what torchrun, SLURM or a PyTorchJob started (launcher_shape.py)
        try:
            super().__init__(
                model_class=ImageClassifier,
                subclass_mode_model=True,
                datamodule_class=MNISTDataModule,
                trainer_class=Trainer,  # whole numbers of batches read as batches (app/command_line/trainer.py)
                trainer_defaults=trainer_defaults(),
                seed_everything_default=42,
                auto_configure_optimizers=False,  # the models take their optimizer as a constructor argument
                save_config_callback=RunRecord,
                parser_kwargs={
                    "allow_abbrev": False,  # `--trainer.max_epoch` is not taken for `--trainer.max_epochs`
                    "exit_on_error": False,
                    "description": DESCRIPTION.format(train=train_py(), models=", ".join(model_names())),
                    "formatter_class": HelpFormatter,
                },
                args=args,
            )
        finally:
            if self.run is not None:  # let go of the run for a later command of this process (a notebook's)
                self.run.release()

    def subcommands(self) -> dict[str, set[str]]:
        """Only the subcommand asked for (all when none is named): LightningCLI builds a parser for each, in every
        process (0.37 s for all four)."""
        every = LightningCLI.subcommands()
        return {self.chosen_subcommand: every[self.chosen_subcommand]} if self.chosen_subcommand else every

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.set_defaults({"model": "models.SeqNet"})
        # The best by val/acc, and last.ckpt after every epoch (since Lightning 2.6, save_last=True rewrites last.ckpt
        # only when a new best is saved).
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")
        parser.set_defaults({"checkpoint.monitor": "val/acc", "checkpoint.mode": "max"})
        parser.add_lightning_class_args(ModelCheckpoint, "last_checkpoint")
        parser.set_defaults({"last_checkpoint.filename": "last", "last_checkpoint.enable_version_counter": False})
        # last.ckpt every `--timed_checkpoint.train_time_interval` too; off by default: Lightning would broadcast rank
        # 0's decision before every step (`--fault_guard.checkpoint_every_s` saves at the fault guard's checks).
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
        """Parse, and check the values Lightning takes unchecked; an unknown option is met with a guess."""
        try:
            self._parse_with_the_starts_settings(parser, args)
        except UnicodeDecodeError:
            if (line := config_not_text(args)) is None:
                raise
            raise UserError(line) from None
        except ArgumentError as error:
            if "nrecognized arguments" not in str(error) and "does not accept option" not in str(error):
                raise
            as_typed = args[1:] if self.test_after_fit else args  # without the `fit` put in front
            raise UserError(shorten(str(error), as_typed, self._option_names())) from None
        if self.config.get("subcommand"):
            check_accelerator(self._setting("trainer.accelerator"))  # before anything else is printed
            check_counts({f"--trainer.{name}": self._setting(f"trainer.{name}") for name in COUNTS})
            check_seed(self._setting("seed_everything"))

    def _parse_with_the_starts_settings(self, parser: LightningArgumentParser, args: list[str]) -> None:
        """Parse; the run or checkpoint `--ckpt_path` names brings its settings as defaults, below every config file
        and option (LightningCLI's `_parse_ckpt_path` would put them above, dropping a new learning rate)."""
        self._load_checkpoints_as_data_only()
        printing = [arg for arg in args if arg.startswith("--print_config")]
        mistake = None  # before a checkpoint's settings are the defaults
        try:
            super().parse_arguments(parser, [arg for arg in args if arg not in printing])
        except ArgumentError as error:  # `--model.width 16` for a TinyNet's checkpoint: its settings may take it
            mistake = error
            self.start = self._start_from_a_file_named_in(args)
            if self.start is None:
                raise
            subcommand = subcommand_of(args)
        else:
            subcommand = self.config.get("subcommand")
            self.start = self._find_start(subcommand) if subcommand else None
        if self.start is None:
            if printing:
                super().parse_arguments(parser, args)
            return
        try:
            super().parse_arguments(parser, [*self.start.defaults_argument(subcommand), *args])
        except ArgumentError as error:
            if mistake is not None:
                raise mistake from None
            problem = shorten(str(error), args).rstrip(".")
            how = f"Start a new run from its weights instead: --ckpt_path {self.start.checkpoint}, with your options"
            if self.start.record is None or problem.startswith(("--model", "--data")):  # as its weights bring them
                how = "Evaluate or continue it with the version of this program that wrote it"
            raise UserError(  # the settings of an older run, which this code no longer takes
                f"the settings of {self.start.record or self.start.checkpoint} do not fit this program now: {problem}."
                f" {how}."
            ) from error
        config = self.config[subcommand]
        if config.trainer.callbacks:  # a callback the run had and the command repeats (`--trainer.callbacks+=`)
            config.trainer.callbacks = [
                c for i, c in enumerate(config.trainer.callbacks) if c not in config.trainer.callbacks[:i]
            ]
        self.start.changes = changes_between(self.start.settings, self._dumped(subcommand))
        refuse_another(self.start, "--model", "a")
        refuse_other_statistics(self.start)
        if subcommand == "predict":  # as export refuses it
            refuse_another(
                self.start, "--data.dataset", "a model trained on", ", whose class names would label its predictions"
            )
        if self.start.run is not None and subcommand == "fit":
            refuse_another_model(self.start, ImageClassifier.training_settings)

    def _option_names(self) -> list[str]:
        """The options of the subcommand asked for, as typed (`--model.optimizer.lr`; the default classes' arguments):
        what a guess is chosen among."""
        parser = self._subcommand_parsers.get(self.chosen_subcommand or "fit")
        if parser is None:
            return []
        keys = (key for key, _ in parser.get_defaults().items(branches=False))
        names = (key.replace(".init_args.", ".").removesuffix(".class_path") for key in keys)
        return list(dict.fromkeys(f"--{name}" for name in names if name != "config"))

    def _find_start(self, subcommand: str) -> Start | None:
        config = self.config[subcommand]
        runs_of_model = self._runs_of_model(config)
        return find_start(config.get("ckpt_path"), subcommand, runs_of_model, runs_of_model.parent)

    def _runs_of_model(self, config=None) -> Path:
        """`<root>/<Model>-<dataset>`: where the runs of this model on this dataset are."""
        config = config or self.config[self.subcommand]
        root = Path(config.trainer.default_root_dir or ".")
        return root / run_name(config.model.class_path, config.data.dataset)

    def _start_from_a_file_named_in(self, args: list[str]) -> Start | None:
        """The checkpoint file or run folder `--ckpt_path` names on the command line, read, or None."""
        value = value_given(args, "--ckpt_path")
        path = Path(value) if value is not None else None
        named = path is not None and (path.is_file() or (path.is_dir() and is_run(path)))
        return find_start(str(path), subcommand_of(args), Path(), Path()) if named else None

    def _setting(self, key: str, config=None):
        """The value of an option of the subcommand run (`trainer.accelerator`), in `config` or the parsed one."""
        config = self.config if config is None else config
        return config[config["subcommand"]][key]

    def _dumped(self, subcommand: str) -> dict:
        """The parsed settings of `subcommand` as plain values."""
        return yaml.safe_load(self.parser.dump(self.config, skip_none=False))[subcommand]

    def _parse_ckpt_path(self) -> None:
        """Nothing: the checkpoint's settings are defaults here (`parse_arguments`), below the command line."""

    def instantiate_classes(self) -> None:
        with self._errors_named_by_option():
            super().instantiate_classes()

    def _run_subcommand(self, subcommand: str) -> None:
        """Around `trainer.fit(...)` and the like (no public hook there): a late value error named by its option, and
        what a failed start wrote taken back."""
        trainer = self.trainer
        try:
            with self._errors_named_by_option():
                super()._run_subcommand(subcommand)
        except BaseException as error:
            _end_the_progress_bars(trainer)  # what is said next stands on lines of its own, the last ones
            # A run stopped before its first step, or an evaluation cut short: what it wrote is taken back
            if self.run is not None and (not self.run.started or subcommand != "fit") and trainer.global_rank == 0:
                self.run.undo()
            if subcommand != "fit" and isinstance(error, STOPS):
                stage = {"validate": "validation", "predict": "prediction"}.get(subcommand, subcommand)
                say(f"Stopped: the {stage} was cut short and keeps nothing. Run the same command to {subcommand}.")
            elif isinstance(error, STOPS) and self.run is not None and not self.run.started:  # the sanity check
                say("Stopped before the first training step: this command kept nothing. Run it again to train.")
            raise
        finally:
            self._fault_guard().put_back_the_handlers()

    @contextmanager
    def _errors_named_by_option(self) -> Iterator[None]:
        """A value the parser accepted but torch or Lightning rejected later (`--model.optimizer.lr -1`): one line
        naming the option where the evidence is certain (`blame_option`); any other error is raised as it is."""
        try:
            yield
        except VALUE_ERRORS as error:
            if isinstance(error, OWN_ERRORS):
                raise
            # What a class's __init__ said, wrapped by jsonargparse as it tries each of --model's classes ("Does not
            # validate against any of the Union subtypes"): said as it was.
            if isinstance(own := error.__cause__, OWN_ERRORS):
                raise own from own.__cause__
            subcommand = self.config.subcommand
            # The subcommand parser's defaults tell the options the user set (no public accessor)
            config, defaults = self.config[subcommand], self._subcommand_parsers[subcommand].get_defaults()
            if isinstance(error, RuntimeError) and "loading state_dict" in str(error):  # a checkpoint not read before
                raise UserError(
                    f"--ckpt_path {config.ckpt_path} does not fit {config.model.class_path}:"
                    f" {textwrap.shorten(one_line(error), 300, placeholder=' ...')} Give a checkpoint of this model."
                ) from error
            line = blame_option(error, options_set(config, defaults))
            if line is None:
                raise
            raise UserError(line) from error

    def _load_checkpoints_as_data_only(self) -> None:
        """Default `--weights_only true`, so that loading a checkpoint cannot run code (Lightning's None unpickles
        anything from a URL)."""
        for subparser in self._subcommand_parsers.values():  # fit, validate, test and predict all take it
            subparser.set_defaults({"weights_only": True})

    def instantiate_trainer(self, **kwargs):
        """The Trainer, with this project's logger in the command's folder, the checkpoint `--ckpt_path` stands for,
        and atomic checkpoint files (unless --trainer.plugins gives a CheckpointIO)."""
        trainer_config = self._setting("trainer", self.config_init)
        plugins = _as_list(trainer_config.get("plugins"))
        if not any(isinstance(plugin, CheckpointIO) for plugin in plugins):
            kwargs["plugins"] = [*plugins, AtomicCheckpointIO(self.continue_command)]
        if trainer_config["logger"] in (None, True, False):  # not a logger of the user's, which has its own folder
            self.run = self._folder_to_write(Path(trainer_config["default_root_dir"] or "."))
        elif self._continuing():
            raise UserError(
                f"--ckpt_path {self._setting('ckpt_path')} continues {self.start.run} in its folder, where"
                " --trainer.logger would not write: leave --trainer.logger out to continue the run, or start a new"
                f" run from its weights with --ckpt_path {self.start.checkpoint}."
            )
        if trainer_config["logger"] in (None, True):  # this project's TensorBoard logger, in that folder
            continued = self.run.path
            kwargs["logger"] = RunLogger(
                save_dir=self.run.parent.parent,
                name=self.run.parent.name,
                version=continued.name if continued else None,
                run=self.run,
            )
        header = ""  # what a run's record says of where the run came from
        if self.start is None and self._setting("ckpt_path") == "last":  # nothing to continue: said in before_fit,
            self.config_init[self.subcommand]["ckpt_path"] = None  # and not again by Lightning with a HINT
        if self.start is not None:
            self.config_init[self.subcommand]["ckpt_path"] = str(self.start.checkpoint)
            if self.subcommand == "fit":
                header = f"{'Continued' if self.start.run else 'Started from'} {self.start.where}"
                if self.start.changes:
                    header += "\nChanged: " + ", ".join(map(str, self.start.changes))
        self.save_config_kwargs = {"run": self.run, "header": header, "overwrite": False}
        trainer = super().instantiate_trainer(**kwargs)
        for guard in (callback for callback in trainer.callbacks if isinstance(callback, FaultGuard)):
            guard.test_after_fit = self.test_after_fit  # the heartbeats go on from the fit into the test
            guard.continue_command = self.continue_command
        if self.run is not None:
            trainer.callbacks.append(self.run)
        if not trainer.loggers:  # --trainer.logger false: LearningRateMonitor would refuse to run without a logger
            trainer.callbacks = [c for c in trainer.callbacks if not isinstance(c, LearningRateMonitor)]
        if trainer_config["enable_model_summary"] is False:  # Lightning turns off its own summary only
            trainer.callbacks = [c for c in trainer.callbacks if not isinstance(c, NetworkSummary)]
        skip_empty_batch_hooks(trainer.callbacks)
        return trainer

    def continue_command(self) -> str:
        """How to continue this run, as the user types it here (under a launcher: what to give train.py there)."""
        where = self._saved_where()
        if self.shape is not None:
            return f"the same {self.shape.launcher.removeprefix('the ')} command, with --ckpt_path {where}"
        trainer, shape = self.trainer, ""
        if trainer.num_nodes > 1:
            shape = f" --devices {trainer.num_devices} --num_nodes {trainer.num_nodes}"
        elif trainer.num_devices > 1:
            shape = f" --devices {trainer.num_devices}"
        subcommand = "" if self.test_after_fit else f" {self.subcommand}"
        return f"{train_py()}{subcommand} --ckpt_path {where}{shape}"

    def _saved_where(self) -> Path | None:
        """What `--ckpt_path` names to take this run up again: its folder, else its last checkpoint."""
        if self.run is not None and self.run.path is not None:  # global rank 0, which claimed it
            return self.run.path
        where = last_checkpoint_path(self.trainer)  # another rank: Lightning gave it rank 0's folders
        if where is not None and (where.parent.parent / RECORD).is_file():
            return where.parent.parent  # else (a logger of the user's, say): a new run from its weights
        return where

    def _settings_every_node_shares(self) -> dict:
        """What the nodes of a job must agree on: the settings, the subcommand, and the checkpoint's step."""
        settings = self._dumped(self.subcommand)
        settings[COMMAND] = "fit then test (none named)" if self.test_after_fit else self.subcommand
        settings[PROGRAM] = program_digest()
        if self.start is not None:
            settings[STARTS_FROM] = f"step {self.start.contents.get('global_step', 0)}"
        elif self._setting("ckpt_path") in (None, "last"):  # `fit --ckpt_path last` with nothing to continue
            settings[STARTS_FROM] = "none"
        else:  # a name Lightning resolves (hpc, a registry's)
            settings[STARTS_FROM] = self._setting("ckpt_path")
        return settings

    def _folder_to_write(self, root: Path) -> RunFolder:
        """Where this command writes (docs/run-folder.md): a continued run's folder, the next `version_N` of
        `<root>/<Model>-<dataset>`, or for an evaluation of `<run>/<stage>` (or `<root>/<Model>-<dataset>/<stage>`)."""
        if self.subcommand == "fit" and self.start is not None and self.start.run is not None:
            return RunFolder(self.start.run.parent, path=self.start.run)
        runs_of_model = self._runs_of_model()
        if self.subcommand == "fit":
            return RunFolder(runs_of_model)
        base = runs_of_model
        if self.start is not None:
            run = self.start.run or self.start.checkpoint.parent.parent
            in_a_run = self.start.run is not None or (self.start.checkpoint.parent.name == CHECKPOINTS and is_run(run))
            explicit_root = root != Path(DEFAULT_ROOT) and not run.resolve().is_relative_to(root.resolve())
            if in_a_run and not explicit_root:
                base = run
        return RunFolder(base / self.subcommand)

    def _instantiate_trainer(self, config: dict, callbacks: list) -> Trainer:
        """The callbacks of this command. Lightning calls every callback at every hook of every step, so the
        prediction writer is left out outside `predict` (benchmarks/host_step.py), and every checkpoint callback with
        `--trainer.enable_checkpointing false`. (The timed checkpoint stays when idle: the checkpoints of earlier runs
        hold its state, which Lightning would miss.) The progress bar refreshes every `PROGRESS_BAR_EVERY_N_STEPS`
        steps, where Lightning's refreshes at every step; a progress bar of the user's replaces it."""
        idle = [] if self.subcommand == "predict" else [self.config_init[self.subcommand]["predictions"]]
        if config.get("enable_checkpointing") is False:
            idle += [callback for callback in callbacks if isinstance(callback, ModelCheckpoint)]
        callbacks = [callback for callback in callbacks if all(callback is not other for other in idle)]
        users = _as_list(config.get("callbacks"))
        if config.get("enable_progress_bar") is not False and not any(isinstance(c, ProgressBar) for c in users):
            callbacks.append(TQDMProgressBar(refresh_rate=PROGRESS_BAR_EVERY_N_STEPS))
        self._take_the_launchers_shape(config, callbacks)
        made = self.config_init[self.subcommand]  # this program's callbacks, by their option (`--last_checkpoint`)
        own = {id(made[key]): f"--{key}" for key in self._parser(self.subcommand).callback_keys}
        check_callback_states([*users, *callbacks], own)  # Lightning's own check raises a RuntimeError, "a bug"
        return super()._instantiate_trainer(config, callbacks)

    def _take_the_launchers_shape(self, config: dict, callbacks: list) -> None:
        """Under a launcher, `--devices` and `--num_nodes` follow what it started (`launcher_shape.py`), and the fault
        guard's save interval its restarts (here, not in the parser: the run's record keeps what the user chose)."""
        plugins = _as_list(config.get("plugins"))
        environment = next((p for p in plugins if isinstance(p, ClusterEnvironment)), None)
        self.shape = launcher_shape(environment)
        if self.shape is None:
            if environment is None:  # Lightning's own environment, which reads NODE_RANK
                check_node_rank(config["num_nodes"])
            return
        config.update(self.shape.settle(config["devices"], config["num_nodes"]))
        for guard in (callback for callback in callbacks if isinstance(callback, FaultGuard)):
            guard.checkpoint_every_s = self.shape.checkpoint_every_s(guard.checkpoint_every_s)

    def _output_folders(self) -> dict[str, Path | str]:
        """The folders global rank 0 writes the run's logs, checkpoints and predictions into, by option."""
        folders = {"--trainer.default_root_dir": self.trainer.default_root_dir}
        for name in ("checkpoint", "last_checkpoint"):
            if dirpath := self._setting(f"{name}.dirpath"):
                folders[f"--{name}.dirpath"] = dirpath
        if self.subcommand == "predict" and (path := self._prediction_writer().chosen_path()):
            folders["--predictions.path"] = path.parent
        return folders

    def _check_before_launch(self, *stages: str) -> None:
        """Find what is wrong before the other processes start and before anything is written (`checks.py`)."""
        check_launcher(self.trainer)
        self._refuse_untrained_weights()
        self._refuse_evaluating_nothing()
        if "fit" in stages:
            self.model.check_fit(self.trainer)
        continuing = self._continuing()
        if continuing:
            silence_a_continuation()
        if self.trainer.global_rank == 0 and continuing:
            self.run.take()  # first: a run another process trains is refused before anything else is done
        if self.start is not None:
            self._check_the_start()
        if self.trainer.global_rank == 0:
            for option, folder in self._output_folders().items():
                check_writable(option, folder)
            if self.subcommand == "predict":
                self._prediction_writer().refuse_an_earlier_file()
        check_data(self.trainer, self.datamodule, stages)
        if self.trainer.global_rank == 0 and continuing:  # what a killed save left, now that the run is ours
            for folder in checkpoint_folders(self.run.path):
                remove_partial_files(folder)
        if self.start is not None:
            self._say_where_it_starts()
        guard = self._fault_guard()
        if self.trainer.world_size == 1:  # one process has no one to meet
            guard.catch_stop_signals(self.trainer)
            return
        settings, node_rank = self._settings_every_node_shares(), self.trainer.node_rank

        def after_meeting() -> None:
            guard.catch_stop_signals(self.trainer)
            same_settings_everywhere(settings, node_rank)

        Meeting.install(self.trainer, after_meeting)

    def _refuse_untrained_weights(self) -> None:
        """An evaluation without `--ckpt_path` would evaluate an untrained model: refused."""
        if self.subcommand == "fit" or self._setting("ckpt_path"):
            return
        needs = f"{self.subcommand} needs trained weights: without --ckpt_path it would evaluate an untrained model."
        runs = self._runs_of_model()
        if newest_run_with_a_checkpoint(runs) is not None:
            how = f"Add --ckpt_path last (the latest run in {runs}), a run's folder, or a checkpoint file."
        else:  # the runs there are of other models or data: how to name each
            named = " or ".join(f"{options} --ckpt_path last" for options in trained_runs_in(runs.parent))
            how = f"{runs} holds no trained run: add " + (
                named or "--ckpt_path with a checkpoint file, or train first."
            )
        raise UserError(f"{needs} {how}")

    def _refuse_evaluating_nothing(self) -> None:
        """An evaluation of no batch (`--trainer.limit_test_batches 0`) is refused: it printed no figure, or
        `Predictions: None`, and left an empty folder."""
        if self.subcommand == "fit":
            return
        stage = {"validate": "val"}.get(self.subcommand, self.subcommand)
        name = f"limit_{stage}_batches"
        if getattr(self.trainer, name) == 0:
            raise UserError(
                f"--trainer.{name} 0: {self.subcommand} would run no batch. Leave --trainer.{name} out (every batch),"
                " or give a number of batches or a fraction above 0."
            )

    def _continuing(self) -> bool:
        """Whether this command continues a run in its folder (`fit --ckpt_path last`, or a run's folder)."""
        return self.subcommand == "fit" and self.start is not None and self.start.run is not None

    def _trained_nothing(self) -> bool:
        return self.trainer.global_step == (self.start.contents.get("global_step", 0) if self.start else 0)

    def _check_the_start(self) -> None:
        """The checkpoint fits the model the command builds, and its batches the processes there are now."""
        refuse_weights_that_do_not_fit(self.model, self.start, ImageClassifier.training_settings)
        data_state = self.start.contents.get(type(self.datamodule).__qualname__)
        if self.subcommand != "fit" or not data_state or not hasattr(self.datamodule, "batch_size_to_continue"):
            return
        trainer, hparams = self.trainer, self.datamodule.hparams
        chosen = any(change.option == "--data.batch_size" for change in self.start.changes)
        epoch = self.start.contents.get("epoch", 0)
        args = (data_state, trainer.world_size, trainer.accumulate_grad_batches, chosen, epoch)
        batch_size = self.datamodule.batch_size_to_continue(*args)
        if batch_size != hparams.batch_size:
            rank_zero_info(
                f"Continuing a run of {data_state['world_size']} processes on {trainer.world_size}: per-device batch"
                f" {hparams.batch_size} -> {batch_size}, to keep the global batch of {data_state['global_batch_size']}."
            )
            hparams.batch_size = self.config[self.subcommand].data.batch_size = batch_size  # and the run's record
        self._say_the_job_changed_size(data_state["world_size"])

    def _say_the_job_changed_size(self, world_size_before: int) -> None:
        """Say so when the launcher restarted this very job on another number of nodes (`FaultGuard.state_dict`)."""
        shape, saved = self.shape, self.start.contents.get("callbacks", {}).get(FaultGuard.__qualname__, {})
        if shape is None or saved.get("torchrun_run_id") != os.environ.get("TORCHELASTIC_RUN_ID"):
            return
        nodes_before = saved.get("num_nodes", shape.num_nodes)
        step = self.start.contents.get("global_step", 0)
        restarted = f"({shape.launcher} restarted the job; {world_size_before} -> {self.trainer.world_size} processes)"
        if shape.num_nodes < nodes_before:
            rank_zero_info(
                f"Node lost: continuing on {shape.num_nodes} node(s) of {nodes_before} from step {step} {restarted}."
            )
        elif shape.num_nodes > nodes_before:
            rank_zero_info(
                f"Node(s) joined: continuing on {shape.num_nodes} nodes ({nodes_before} before) from step {step}"
                f" {restarted}."
            )

    def _say_where_it_starts(self) -> None:
        ckpt_path, changed = self._setting("ckpt_path"), self.start.changes
        if self.subcommand != "fit":  # of an evaluation, what makes its figures another's than the weights were
            # trained with: the network, another dataset, another validation split (not a folder, a batch size)
            data_options = DATA_OF_THE_RUN if self.subcommand == "validate" else {"--data.dataset"}  # the split's
            data = [change for change in changed if change.option in data_options]
            changed = model_changes(changed, ImageClassifier.training_settings) + data
        changes = f"; changed: {', '.join(map(str, changed))}" if changed else ""
        if self.subcommand == "fit":
            how = f"continuing {self.start.where}" if self.start.run else f"a new run from {self.start.where}"
            rank_zero_info(f"--ckpt_path {ckpt_path}: {how}{changes}.")
        else:  # which weights are evaluated (Lightning's own "Restoring states ..." is silenced: quiet.py)
            rank_zero_info(f"--ckpt_path {ckpt_path}: {self.start.where}{changes}.")

    def processes_started_here(self) -> list[subprocess.Popen]:
        """The processes of this node that Lightning's launcher started from this one (`launcher.procs`)."""
        return list(getattr(self.trainer.strategy.launcher, "procs", []))

    def _fault_guard(self) -> FaultGuard:
        return next(callback for callback in self.trainer.callbacks if isinstance(callback, FaultGuard))

    def _prediction_writer(self) -> PredictionWriter:
        return next(c for c in self.trainer.callbacks if isinstance(c, PredictionWriter))

    def before_fit(self) -> None:
        check_sync_batchnorm(self.trainer, self._setting("trainer.sync_batchnorm"))
        if self._setting("ckpt_path") == "last" and self.start is None:
            rank_zero_info(f"--ckpt_path last: nothing to continue in {self._runs_of_model()}, starting a new run.")
        self._check_before_launch(*(("fit", "test") if self.test_after_fit else ("fit",)))
        no_launcher = self.shape is None  # a launcher's one process was asked for
        if self.trainer.world_size == 1 and isinstance(self.trainer.accelerator, CPUAccelerator) and no_launcher:
            # Lightning's `devices="auto"` is one process on a CPU: more would share its cores and run no faster.
            rank_zero_info(
                f"Training in 1 process on the CPU ({os.cpu_count()} cores): --devices N trains with DDP in N"
                " processes, which share those cores."
            )

    def before_evaluation(self) -> None:
        self._check_before_launch(self.subcommand)

    before_validate = before_test = before_evaluation

    def before_predict(self) -> None:
        self._prediction_writer().run = self.run
        self._check_before_launch("predict")

    def after_fit(self) -> None:
        # The best by --checkpoint.monitor (val/acc): this program's own, not a ModelCheckpoint of the user's
        checkpoint = self.config_init[self.subcommand]["checkpoint"]
        best = checkpoint.best_model_path if checkpoint in self.trainer.callbacks else ""
        metrics = dict(self.trainer.callback_metrics)  # the last validation's; test() replaces them
        if best and checkpoint.monitor and checkpoint.best_model_score is not None:
            # The figure of the weights the summary names (and tests): the best checkpoint's score, which may come
            # from an earlier epoch than the last validation's figures
            metrics = {checkpoint.monitor: checkpoint.best_model_score}
        if self.test_after_fit and self.trainer.global_step == 0:  # Lightning's meaning of a 0, kept for the fit
            rank_zero_info(
                "No test: the fit took no training step (--trainer.max_epochs, --trainer.max_steps or"
                " --trainer.limit_train_batches 0), and the figures of untrained weights would mean nothing."
            )
        elif self.test_after_fit and self.trainer.limit_test_batches == 0:
            rank_zero_info("No test: --trainer.limit_test_batches 0 runs no test batch.")
        elif self.test_after_fit:
            if best and not Path(best).is_file():  # every rank reads it (a folder every node shares)
                raise UserError(
                    f"the run's best checkpoint, {best}, is not there (removed after it was saved, or on another"
                    " node's disk): there is no test after this fit. The training is kept; test its last checkpoint"
                    f" with: {train_py()} test --ckpt_path {self._saved_where()}"
                )
            try:
                self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best or None)
            except STOPS:
                if best:
                    said = f"Stopped in the test after training, which had finished; test {best} with:"
                    say(f"{said} {train_py()} test --ckpt_path {best}")
                raise
            metrics.update(self.trainer.callback_metrics)
        if self._continuing() and self._trained_nothing():
            rank_zero_info(
                f"Nothing left to train: the run had reached --trainer.max_epochs {self.trainer.max_epochs} (or"
                " --trainer.max_steps). Give a larger one to train it further."
            )
        self._print_summary(metrics, best, checkpoint.monitor)

    def after_predict(self) -> None:
        rank_zero_info(f"Predictions: {self._prediction_writer().written}")

    def after_evaluation(self) -> None:
        self._print_summary(self.trainer.callback_metrics)

    after_validate = after_test = after_evaluation

    def _print_summary(self, metrics: dict, best_checkpoint: str = "", monitor: str | None = None) -> None:
        """Rank 0 closes the command with its figures, its dashboard, and last, the folder it wrote into."""
        names = [name for name in ("test/acc", "test/loss", "val/acc", "val/loss") if name in metrics]
        names += [monitor] if monitor in metrics and monitor not in names else []  # `--checkpoint.monitor train/loss`
        lines = ["Finished: " + "  ".join(f"{name} {metrics[name].item():.4f}" for name in names)] if names else []
        if best_checkpoint:
            lines.append(f"Best checkpoint: {best_checkpoint}")
        if self.trainer.loggers:
            lines.append(f"Dashboard: {tool('tensorboard')} --logdir {self.trainer.logger.save_dir}")
        if self.run is not None:  # claimed by global rank 0, which alone prints
            if self.run.path is not None:
                lines.append(f"{'Run folder' if self.subcommand == 'fit' else 'Logs'}: {self.run.path}")
        elif self.trainer.loggers:  # a logger of the user's: where it writes (a broadcast from rank 0: on every rank)
            lines.append(f"Logs: {self.trainer.log_dir}")
        rank_zero_info("\n".join(lines))


def skip_empty_batch_hooks(callbacks: list[Callback]) -> None:
    """Lightning calls every callback at each hook of every batch, one whose hook is `Callback`'s empty one too: 1.4 us
    a call on the development VM, 2.9 for a `ModelCheckpoint`, whose name for the profiler is made anew each time
    (benchmarks/host_step.py). It skips a hook that is not callable: such a hook is set to None on the callback
    (one the callback set itself stays)."""
    for callback in callbacks:
        for hook in BATCH_HOOKS:
            if hook not in vars(callback) and getattr(type(callback), hook) is getattr(Callback, hook):
                setattr(callback, hook, None)


def _end_the_progress_bars(trainer: Trainer) -> None:
    """Close the progress bars a failed stage left open (Lightning closes them when a stage ends well): a line
    printed after an open bar stood on the bar's line, or the bar was drawn again after it."""
    if isinstance(trainer.progress_bar_callback, TQDMProgressBar):
        for stage in ("train", "val", "test", "predict"):
            with suppress(TypeError):  # a bar the stage never made
                getattr(trainer.progress_bar_callback, f"{stage}_progress_bar").close()


def _as_list(value) -> list:
    """A Trainer setting that takes one object or a list of them (`--trainer.callbacks`, `--trainer.plugins`)."""
    return [] if value is None else value if isinstance(value, list) else [value]
