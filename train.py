"""Train an image classifier on MNIST or FashionMNIST with PyTorch Lightning: a LightningCLI and a main() (the help,
`python train.py --help`, is app/settings.py's HELP; docs/architecture.md maps the rest)."""

import json
import re
import shlex
import signal
import sys
from argparse import ArgumentError
from pathlib import Path
from types import SimpleNamespace

if __name__ == "__main__" and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C while the libraries load: the end, by it (nothing written)

import yaml
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.strategies import StrategyRegistry
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import MisconfigurationException
from torch import optim

from app.callbacks import Dashboard, GracefulStop, PredictionWriter, StallWatchdog, Stopped
from app.console import UserError, runnable
from app.errors import parser_line, rejected
from app.export import export
from app.launch import end_the_job, one_process_on_the_cpu, pass_stop_signals_on, shared, wait_for_the_launched
from app.plugins import RendezvousDDPStrategy
from app.runs import RunLogger, RunRecord, check_folders, next_record, run_name
from app.settings import HELP, Parser, Trainer, command_line, on, settle
from app.start import find_start, run_logger, where_it_runs
from datamodules import MNISTDataModule
from models import ImageClassifier

ABOUT = dict(re.findall(r"^  (fit|validate|test|predict|export) +(.+)$", HELP, re.M))  # each subcommand's help
# The pieces `--KEY.OPTION VALUE` configures, with this program's defaults (off means absent: app/settings.py, `on`).
PIECES = {
    "checkpoint": (ModelCheckpoint, {"monitor": "val/acc", "mode": "max"}),  # the best
    "last_checkpoint": (ModelCheckpoint, {"filename": "last", "enable_version_counter": False}),  # each epoch's
    "stop": (GracefulStop, {}),
    "watchdog": (StallWatchdog, {}),
    "lr_monitor": (LearningRateMonitor, {}),
    "dashboard": (Dashboard, {}),
    "predictions": (PredictionWriter, {}),
}
# The class of each section of a command's settings, whose message of a value it refuses names the section's option.
SECTIONS = {"model": (ImageClassifier, optim.Optimizer, optim.lr_scheduler.LRScheduler), "data": MNISTDataModule}
SECTIONS |= {"trainer": Trainer} | {key: piece for key, (piece, _settings) in PIECES.items()}
# Lightning's choice for several processes (`strategy="auto"` picks "ddp"): DDP whose processes meet as app/ has them.
StrategyRegistry.register("ddp", RendezvousDDPStrategy, "DDP, with app/'s rendezvous", override=True)


class TrainCLI(LightningCLI):
    """LightningCLI with this program's pieces and defaults; without a subcommand, fit then test the best checkpoint."""

    def __init__(self, args: list[str], subcommand: str | None, job: SimpleNamespace) -> None:
        self.chosen, self.test_after_fit, self.job = subcommand or "fit", subcommand is None, job
        self.start, self.settings, self.checked = None, None, False  # --ckpt_path's; as recorded; checks done
        kwargs = {"exit_on_error": False, "allow_abbrev": False, self.chosen: {"description": ABOUT[self.chosen]}}
        try:
            super().__init__(
                ImageClassifier,
                MNISTDataModule,
                save_config_callback=RunRecord,
                trainer_class=Trainer,
                trainer_defaults={"max_epochs": 10, "default_root_dir": "runs"},
                seed_everything_default=42,
                parser_kwargs=kwargs,
                parser_class=Parser,
                subclass_mode_model=True,
                auto_configure_optimizers=False,
                args=args,
            )
        except (ValueError, TypeError, MisconfigurationException) as error:  # a value refused as a class was built
            if self.checked or self.settings is None or not (mistake := rejected(error, self.settings, SECTIONS)):
                raise
            raise mistake from error

    def subcommands(self) -> dict[str, set[str]]:  # the one asked for alone: each parser takes 0.1 s to build
        return {self.chosen: super().subcommands()[self.chosen]}

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_arguments_to_parser(parser)
        parser.set_defaults({"model": "models.SeqNet"})
        for key, (piece, settings) in PIECES.items():  # (last.ckpt: the best's `save_last` copies only a new best)
            if key != "predictions" or self.chosen == "predict":
                parser.add_class_arguments(piece, key, fail_untyped=False, sub_configs=True)
                parser.set_defaults({f"{key}.{name}": value for name, value in settings.items()})
        parser.link_arguments("last_checkpoint", "stop.checkpoint", apply_on="instantiate")

    def parse_arguments(self, parser: LightningArgumentParser, args: list[str]) -> None:
        """Parse; what `--ckpt_path` starts from brings its settings as defaults, below every option and file."""
        try:
            super().parse_arguments(parser, args)
            config = self.config[self.chosen]
            runs = Path(config.trainer.default_root_dir or ".") / run_name(config.model.class_path, config.data.dataset)
            self.start = find_start(config.ckpt_path, self.chosen, runs, config.get("weights_only") is not False)
            if self.start is not None:  # the run's settings below the command line's: parsed again on them
                super().parse_arguments(parser, ["--config", json.dumps({self.chosen: self.start.settings}), *args])
                self.config[self.chosen].ckpt_path = None  # read: LightningCLI would read it again, as data only
        except ArgumentError as error:  # the deepest line, and the closest of the subcommand's options
            raise UserError(parser_line(str(error), parser, args, self.chosen), every_process=True) from None
        self.job.shape = where_it_runs(self.config[self.chosen].trainer)  # as given: what a continuation takes
        settle(self.config[self.chosen])
        self.settings = yaml.safe_load(parser.dump(self.config, skip_unset=False))[self.chosen]  # as its record has
        if self.start is not None:
            self.start.refuse_changes(self.settings, self.chosen)
            self.start.say(self.chosen)

    def instantiate_trainer(self, **kwargs) -> Trainer:
        """Lightning's, with the pieces: the run's folder (`RunLogger`) and its record, whole checkpoint files, the
        callbacks of PIECES that are on, and for DDP what every node must agree on."""
        config, start = self.config_init[self.subcommand], self.start
        config.ckpt_path = str(start.checkpoint) if start else None if config.ckpt_path == "last" else config.ckpt_path
        if (logger := config.trainer.logger) in (None, True):
            logger = run_logger(start, self.subcommand, config.trainer.default_root_dir, self.model, self.datamodule)
        self.save_config_callback = RunRecord if logger else None  # the record goes beside the logs
        self.save_config_kwargs = {"config_filename": next_record(start.run if start and start.continues else None)}
        pieces = on([config[key] for key in PIECES if key in config], config.trainer, logger)
        made = super().instantiate_trainer(logger=logger, **pieces, **kwargs)
        if isinstance(made.strategy, RendezvousDDPStrategy) and made.strategy.agree_on is None:
            starts_from = f"step {start.contents.get('global_step')}" if start else config.ckpt_path
            subcommand = "fit then test" if self.test_after_fit else self.subcommand
            made.strategy.agree_on = shared(self.settings, subcommand, starts_from)
        return made

    def before_fit(self) -> None:
        self.model.check_fit(self.trainer, new_run=self.start is None)  # (a checkpoint restores its weights)
        if self.start is not None and (saved := self.start.contents.get(type(self.datamodule).__qualname__)):
            epoch, trainer = self.start.contents.get("epoch", 0), self.trainer  # its global batch, kept
            self.datamodule.continue_from(saved, trainer.world_size, trainer.accumulate_grad_batches, epoch)
        self.before_validate()
        one_process_on_the_cpu(self.trainer)

    def before_validate(self) -> None:
        check_folders(self.trainer, self.start, self.subcommand)  # before anything is written
        self.checked = True
        pass_stop_signals_on(self.trainer)  # (ddp_spawn's processes)

    before_test = before_predict = before_validate

    def after_fit(self) -> None:
        self._stop_if_signalled(fit_ended=True)
        checkpoint, metrics = self.config_init.fit.checkpoint, dict(self.trainer.callback_metrics)
        if checkpoint.best_model_score is not None:  # the figure of the weights it names
            metrics = {checkpoint.monitor: checkpoint.best_model_score}
        best = checkpoint.best_model_path or None
        if self.test_after_fit and (best or self.trainer.global_step > 0):  # (ddp_spawn's steps: not in this process)
            if not best:  # fast_dev_run, --trainer.enable_checkpointing false: as Lightning's test()
                rank_zero_info("Testing the weights as the fit left them: it saved no best checkpoint.")
            try:
                self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best, weights_only=True)
            except Stopped as stop:  # the fit's work is kept: what tests it
                stop.command = ["test", "--ckpt_path", best] if best else []  # (the weights as the fit left them)
                raise
            metrics.update(self.trainer.callback_metrics)
        elif self.test_after_fit:
            rank_zero_info("No test: the fit saved no checkpoint and took no training step in this process.")
        self.after_validate(metrics, [f"Best checkpoint: {shlex.quote(best)}"] if best else [])

    def after_validate(self, metrics: dict | None = None, best: list[str] = ()) -> None:
        """Say the figures and where the command wrote (a stop signal after the stage's last check stops it here)."""
        self._stop_if_signalled()
        metrics = self.trainer.callback_metrics if metrics is None else metrics
        names = [name for name in ("test/acc", "test/loss", "val/acc", "val/loss") if name in metrics]
        lines = [*(["Finished: " + "  ".join(f"{n} {float(metrics[n]):.4f}" for n in names)] if names else []), *best]
        if self.subcommand == "predict":
            lines = [f"Predictions: {shlex.quote(str(self.config_init.predict.predictions.written))}"]
        elif isinstance(logger := self.trainer.logger, RunLogger) and logger.folder is not None:
            tensorboard = runnable(Path(sys.executable).with_name("tensorboard"))
            lines += [f"Dashboard: {shlex.join([tensorboard, '--logdir', str(logger.save_dir)])}"]  # (the run's too)
            lines += [f"{'Run folder' if self.subcommand == 'fit' else 'Logs'}: {shlex.quote(str(logger.folder))}"]
        rank_zero_info("\n".join(lines))

    after_test = after_predict = after_validate

    def _stop_if_signalled(self, fit_ended: bool = False) -> None:  # after a stage's last check: its work is done
        if not (signum := (stop := self.config_init[self.subcommand].stop).signal):
            return
        if fit_ended and (last := stop.last_path()) and Path(last).is_file():  # the run continues to its test
            rank_zero_info(f"Stopped by {signal.Signals(signum).name} as the fit ended; {last} holds its end.")
            raise Stopped(signum, last)
        raise Stopped(signum, command=[])


def main(args: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if args is None else args)
    cli_args, subcommand = command_line(args, ABOUT)
    if subcommand is None and {"-h", "--help"} & set(args):  # the program's; a subcommand's lists its options
        return print(HELP.strip())
    with end_the_job(args, subcommand == "fit") as job:  # the exit status, and what is said
        if subcommand == "export":
            job.status = export(cli_args[1:])
        else:
            job.status = wait_for_the_launched(TrainCLI(cli_args, subcommand, job).trainer.strategy)


if __name__ == "__main__":
    main()
