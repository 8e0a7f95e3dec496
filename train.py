"""usage: train.py [fit | validate | test | predict | export] [OPTIONS]

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

import gc
import json
import logging
import os
import re
import signal
import sys
import warnings
from argparse import ArgumentError
from pathlib import Path

if __name__ == "__main__" and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # Ctrl-C while the libraries load: the end, by it (nothing written)

import torch.distributed as dist
import yaml
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.plugins import CheckpointIO

from app.callbacks.dashboard import Dashboard
from app.callbacks.global_batch import GlobalBatchInfo
from app.callbacks.graceful_stop import GracefulStop, Stopped
from app.callbacks.predictions import PredictionWriter
from app.callbacks.stall_watchdog import StallWatchdog
from app.console import TRACEBACK_VARIABLE, UserError, here, options_of, parser_line, rank, report, runnable, say
from app.export import export
from app.plugins.checkpoint_io import AtomicCheckpointIO
from app.plugins.rendezvous import RendezvousDDPStrategy, wait_for_the_launched
from app.runs import RunLogger, RunRecord, find_start, next_record, run_name
from app.settings import Parser, Trainer, check, check_writable, cpu_threads, launcher_shape, settle_shape, shared
from datamodules import MNISTDataModule
from models import ImageClassifier

# Each subcommand's --help says what it does, as the table above (Lightning's would be the Trainer method's docstring).
ABOUT = {
    name: {"description": text} for name, text in re.findall(r"^  (fit|validate|test|predict) +(.+)$", __doc__, re.M)
}
SHORTCUTS = {"--devices": "--trainer.devices", "--num_nodes": "--trainer.num_nodes"}


class TrainCLI(LightningCLI):
    """LightningCLI with this program's pieces and defaults. Without a subcommand it fits, then tests the best
    checkpoint; `--ckpt_path` names a checkpoint file, a run's folder, or `last` (docs/run-folder.md)."""

    def __init__(self, args: list[str]) -> None:
        tokens, shortcuts, args = iter(args), [], []
        for token in tokens:
            name, has_value, value = token.partition("=")
            if name in SHORTCUTS:
                shortcuts.append(f"{SHORTCUTS[name]}={value if has_value else next(tokens, '')}")
            else:
                args.append(token)
        values = {i + 1 for i, a in enumerate(args) if a.startswith("-")}  # `--trainer.default_root_dir test`
        self.chosen = next((a for i, a in enumerate(args) if a in LightningCLI.subcommands() and i not in values), None)
        if self.chosen is None and {"-h", "--help"} & set(args):  # the program's; a subcommand's lists its options
            print(__doc__.strip())
            raise SystemExit(0)
        self.test_after_fit = self.chosen is None
        self.start, self.logger, self.named = None, None, None
        super().__init__(
            ImageClassifier,
            MNISTDataModule,
            subclass_mode_model=True,
            trainer_class=Trainer,
            trainer_defaults={
                "strategy": "ddp",
                "max_epochs": 10,
                "default_root_dir": "runs",
                "callbacks": [GlobalBatchInfo()],
            },
            seed_everything_default=42,
            auto_configure_optimizers=False,
            parser_kwargs={
                "exit_on_error": False,
                "allow_abbrev": False,
                **{name: ABOUT[name] for name in self.subcommands()},
            },
            parser_class=Parser,
            args=(["fit"] if self.test_after_fit else []) + args + shortcuts,
        )

    def subcommands(self) -> dict[str, set[str]]:
        """The parser of the subcommand asked for alone (all when none is named): each takes 0.1 s to build."""
        every = LightningCLI.subcommands()
        return {self.chosen: every[self.chosen]} if self.chosen else every

    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        self.own_parser = parser
        parser.set_defaults({"model": "models.SeqNet"})
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")  # the best by val/acc
        parser.set_defaults({"checkpoint.monitor": "val/acc", "checkpoint.mode": "max"})
        # last.ckpt at every epoch's end: the first one's `save_last` copies only a new best (Lightning 2.x)
        parser.add_lightning_class_args(ModelCheckpoint, "last_checkpoint")
        parser.set_defaults({"last_checkpoint.filename": "last", "last_checkpoint.enable_version_counter": False})
        parser.add_lightning_class_args(GracefulStop, "stop")
        parser.link_arguments("last_checkpoint", "stop.checkpoint", apply_on="instantiate")
        parser.add_lightning_class_args(StallWatchdog, "watchdog")
        parser.add_lightning_class_args(LearningRateMonitor, "lr_monitor")
        parser.add_lightning_class_args(Dashboard, "dashboard")
        parser.add_lightning_class_args(PredictionWriter, "predictions")

    def parse_arguments(self, parser: LightningArgumentParser, args: list[str]) -> None:
        """Parse; what `--ckpt_path` starts from brings its settings as defaults, below every option and file."""
        try:
            super().parse_arguments(parser, args)
            subcommand = self.config.get("subcommand")
            if subcommand is None:
                return
            config = self.config[subcommand]
            runs = Path(config.trainer.default_root_dir or ".") / run_name(config.model.class_path, config.data.dataset)
            self.named = config.ckpt_path  # as typed
            self.start = find_start(config.ckpt_path, subcommand, runs, config.get("weights_only") is not False)
            if self.start is not None:
                super().parse_arguments(parser, ["--config", json.dumps({subcommand: self.start.settings}), *args])
                self.start.refuse_changes(self._dumped(subcommand), subcommand)
                self.config[subcommand].ckpt_path = None  # read: LightningCLI would read it again, as data only
            if self.config[subcommand].get("weights_only") is None:  # loading a checkpoint runs no code
                self.config[subcommand].weights_only = True
            check(dict(self.config[subcommand].trainer), self.config[subcommand].seed_everything)
        except ArgumentError as error:  # the deepest line, and the closest of the subcommand's options
            subcommand = self.chosen or "fit"
            options = options_of(yaml.safe_load(parser.dump(parser.parse_args([subcommand])))[subcommand])
            raise UserError(parser_line(str(error), list(options), args, subcommand), every_process=True) from None

    def _dumped(self, subcommand: str) -> dict:
        return yaml.safe_load(self.parser.dump(self.config, skip_unset=False))[subcommand]

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand]
        settle_shape(config.trainer, config.stop, kubeflow="KubeflowEnvironment" in str(config.trainer.plugins))

    def instantiate_trainer(self, **kwargs) -> Trainer:
        """The Trainer, with the run's folder (`RunLogger`), the rendezvous that checks the nodes' settings, whole
        checkpoint files, and this program's callbacks (those of checkpoints not with --trainer.enable_checkpointing
        false; the learning rate's not without a logger)."""
        config = self.config_init[self.subcommand]
        if self.start is not None or config["ckpt_path"] == "last":  # what Lightning is given: the file, or nothing
            config["ckpt_path"] = str(self.start.checkpoint) if self.start else None
        trainer = {**config["trainer"], **kwargs}
        model, dataset = type(self.model).__qualname__, self.datamodule.hparams.dataset
        runs = Path(trainer["default_root_dir"]) / run_name(model, dataset)
        if trainer["logger"] in (None, True):
            self.logger = trainer["logger"] = self._run_logger(runs)
        if trainer["strategy"] == "ddp":
            trainer["strategy"] = RendezvousDDPStrategy()
        if isinstance(trainer["strategy"], RendezvousDDPStrategy) and trainer["strategy"].agree_on is None:
            starts_from = f"step {self.start.contents.get('global_step')}" if self.start else config["ckpt_path"]
            subcommand = "fit then test" if self.test_after_fit else self.subcommand
            trainer["strategy"].agree_on = shared(self._dumped(self.subcommand), subcommand, starts_from)
        plugins, callbacks = (
            v if isinstance(v, list) else [v] if v else [] for v in (trainer["plugins"], trainer["callbacks"])
        )
        if not any(isinstance(plugin, CheckpointIO) for plugin in plugins):
            trainer["plugins"] = [*plugins, AtomicCheckpointIO()]
        ours = [config[key] for key in self.own_parser.callback_keys]
        ours = [c for c in ours if trainer["enable_checkpointing"] is not False or not isinstance(c, ModelCheckpoint)]
        ours = [c for c in ours if trainer["logger"] not in (None, False) or not isinstance(c, LearningRateMonitor)]
        ours = [c for c in ours if not isinstance(c, StallWatchdog) or c.timeout]  # off: absent
        trainer["callbacks"] = [*callbacks, *ours, *self.trainer_defaults["callbacks"]]
        if not trainer["fast_dev_run"] and trainer["logger"] not in (None, False):  # the record goes beside the logs
            record = next_record(self.start.run if self.start and self.start.continues else None)
            trainer["callbacks"].append(RunRecord(self.own_parser, self.config[self.subcommand], record))
        return Trainer(**trainer)

    def _run_logger(self, runs: Path) -> RunLogger:
        """Where this command writes: the run it continues, a new `version_N` of the model's runs, or for an
        evaluation `<run>/<stage>/version_N` beside the run whose checkpoint it evaluates."""
        if self.start is not None and self.start.continues:
            return RunLogger(self.start.run.parent.parent, self.start.run.parent.name, version=self.start.run.name)
        if self.subcommand == "fit":
            return RunLogger(runs.parent, runs.name)
        return RunLogger(self.start.run if self.start and self.start.run else runs, self.subcommand)

    def before_fit(self) -> None:
        self._before_the_stage()
        self.model.check_fit(self.trainer)
        if self.trainer.strategy.root_device.type == "cpu" and self.config.fit.trainer.sync_batchnorm:
            raise UserError("--trainer.sync_batchnorm true needs GPUs (torch's SyncBatchNorm has none for the CPU).")
        if self.start is None and self.named == "last":
            say(f"--ckpt_path last: nothing to continue under {self.trainer.default_root_dir}, starting a new run.")
        elif self.start is not None:
            if saved := self.start.contents.get(type(self.datamodule).__qualname__):  # its global batch, kept
                trainer, epoch = self.trainer, self.start.contents.get("epoch", 0)
                self.datamodule.continue_from(saved, trainer.world_size, trainer.accumulate_grad_batches, epoch)
            how = "continuing" if self.start.continues else "a new run from"
            say(f"--ckpt_path {self.named}: {how} {self.start.where}.")
        if self.trainer.world_size == 1 and self.trainer.strategy.root_device.type == "cpu" and not launcher_shape():
            say(f"Training in 1 process on the CPU ({cpu_threads()}): --devices N trains with DDP in N processes.")

    def _before_the_stage(self) -> None:
        """Refuse before anything is written: a folder that cannot be written, an evaluation of untrained weights."""
        if self.logger is not None and rank() == 0:  # the process that writes
            continued = self.start.run if self.start and self.start.continues else None
            option, how = f"--trainer.default_root_dir {self.trainer.default_root_dir}", ""
            if continued:  # another's run, say
                option, how = (
                    f"--ckpt_path {self.named}",
                    f"Start a new run from its weights (--model.weights {self.start.checkpoint})",
                )
            elif self.subcommand != "fit" and self.start is not None and self.start.run is not None:
                how = "Logs go beside the run evaluated: copy its checkpoint to a file, give that and a folder of yours"
                option = f"--ckpt_path {self.named}"
            check_writable(option, continued / "checkpoints" if continued else self.logger.root_dir, how)
        for callback in self.trainer.checkpoint_callbacks if self.subcommand == "fit" and rank() == 0 else []:
            if callback.dirpath and "://" not in str(callback.dirpath):  # given, on this machine
                check_writable(f"--checkpoint.dirpath {callback.dirpath}", callback.dirpath)
        if self.subcommand != "fit" and self.named is None:
            raise UserError(
                f"{self.subcommand} needs trained weights: add --ckpt_path last (the newest run of this"
                " model and dataset), a run's folder, or a checkpoint file."
            )
        if self.subcommand != "fit" and self.start is not None:  # the file it reads, where another name was typed
            say(
                f"--ckpt_path {self.start.where}."
                if Path(self.named) == self.start.checkpoint
                else f"--ckpt_path {self.named}: {self.start.where}."
            )

    before_validate = before_test = before_predict = _before_the_stage

    def _stop_if_signalled(self) -> None:
        """A stop signal after the stage's last check: the stage's work is kept, and the command stops here."""
        if signum := self.config_init[self.subcommand].stop.signal:
            raise Stopped(signum)

    def after_fit(self) -> None:
        self._stop_if_signalled()
        best, metrics = self.config_init.fit.checkpoint.best_model_path, dict(self.trainer.callback_metrics)
        if self.config_init.fit.checkpoint.best_model_score is not None:  # the figure of the weights it names
            metrics = {self.config_init.fit.checkpoint.monitor: self.config_init.fit.checkpoint.best_model_score}
        if self.test_after_fit and (best or self.trainer.global_step > 0):  # (ddp_spawn's steps: in its processes)
            if not best:  # no checkpoint (fast_dev_run, --trainer.enable_checkpointing false): as Lightning's test()
                say("Testing the weights as the fit left them: it saved no best checkpoint.")
            self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path=best or None, weights_only=True)
            metrics.update(self.trainer.callback_metrics)
        elif self.test_after_fit:
            say("No test: the fit saved no checkpoint and took no training step in this process.")
        self._summary(metrics, best)

    def after_validate(self) -> None:
        self._stop_if_signalled()
        self._summary(self.trainer.callback_metrics)

    after_test = after_validate

    def after_predict(self) -> None:
        self._stop_if_signalled()
        say(f"Predictions: {next(c.written for c in self.trainer.callbacks if isinstance(c, PredictionWriter))}")

    def _summary(self, metrics: dict, best: str = "") -> None:
        names = [name for name in ("test/acc", "test/loss", "val/acc", "val/loss") if name in metrics]
        lines = ["Finished: " + "  ".join(f"{name} {float(metrics[name]):.4f}" for name in names)] if names else []
        lines += [f"Best checkpoint: {best}"] if best else []
        if self.logger is not None and self.logger.folder is not None:
            tensorboard = runnable(Path(sys.executable).with_name("tensorboard"))
            folder = "Run folder" if self.subcommand == "fit" else "Logs"
            lines += [
                f"Dashboard: {tensorboard} --logdir {self.trainer.default_root_dir}",
                f"{folder}: {self.logger.folder}",
            ]
        say("\n".join(lines))


def main(args: list[str] | None = None) -> None:
    """Run `train.py ARGS` and end as a shell expects: 0; 1 after a mistake or a bug; after a stop by a signal, by
    that signal (130 after Ctrl-C, 143 after SIGTERM: a shell loop stops)."""
    args, status = list(sys.argv[1:] if args is None else args), 0
    if signal.getsignal(signal.SIGINT) == signal.SIG_DFL:
        signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C is KeyboardInterrupt again
    for noise in ("LightningCLI's args", r"`isinstance\(treespec", "'set_vital'", "The dirpath has", "Checkpoint dir"):
        warnings.filterwarnings("ignore", message=noise)  # nothing a user of this program does or can change
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(lambda r: "litlogger" not in r.getMessage())
    try:
        if args[:1] == ["export"]:
            print(f"Exported: {export(args[1:])}")
        else:
            status = wait_for_the_launched(TrainCLI(args).trainer.strategy)
    except Stopped as stop:  # the run's folder is what --ckpt_path continues, with its settings
        if stop.checkpoint and (run := Path(stop.checkpoint).parent.parent).joinpath("config.yaml").is_file():
            shape = [a for i, a in enumerate(args) if a.split("=")[0] in SHORTCUTS or (i and args[i - 1] in SHORTCUTS)]
            command = [runnable(Path(sys.executable)), here(Path(__file__)), *["fit"] * ("fit" in args)]
            say(f"Continue with: {' '.join([*command, '--ckpt_path', str(run), *shape])}")
        status = -stop.signum
    except KeyboardInterrupt:
        status = -signal.SIGINT
    except SystemExit as end:  # Lightning ends a stage that Ctrl-C interrupted with status 1: a shell loop would go on
        status = -signal.SIGINT if isinstance(end.__context__, KeyboardInterrupt) else end.code or 0
    except Exception as error:
        if os.environ.get(TRACEBACK_VARIABLE, "") not in ("", "0"):
            raise
        report(error)
        status = 1
    finally:
        if dist.is_available() and dist.is_initialized():  # else gloo's threads may abort the process at its exit
            dist.destroy_process_group()
    sys.stdout.flush()
    gc.freeze()  # Python's last collection would scan the million objects of torch's and Lightning's: 1 s a process
    if status < 0:
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    sys.exit(status)


if __name__ == "__main__":
    main()
