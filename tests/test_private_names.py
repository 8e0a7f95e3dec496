"""Every private name of Lightning or torch that this program touches, each pinned by a test of the behaviour the
program relies on: a tiny Trainer, LightningCLI or process group does what the code does with the name, and the test
checks that Lightning or torch then acts on it. No test reads Lightning's or torch's source text.

No public route does what these do (each place in the code says why). A new version that moves or renames one, or
stops acting on it, fails here, naming it, instead of somewhere deep in a run, or, worse, silently:
`app/job/fault_guard.py` would stop replacing Lightning's signal handlers, `app/command_line/train_cli.py` would stop
naming a rejected value's option.

The names, and where this program uses them:
- `Trainer._signal_connector`, `_SignalConnector._sigterm_notifier_fn`, `_SignalConnector._slurm_sigusr_handler_fn`,
  `_TrainingEpochLoop._broadcast_sigterm_tensor`, and that the connector's SIGTERM handler calls the handler in place
  before it: app/job/fault_guard.py
- `_FitLoop._combined_loader`: app/run/replan.py
- `torch.distributed.distributed_c10d._get_default_store`: app/command_line/speaking.py
- `LightningCLI._subcommand_parsers`, `._parse_ckpt_path`, `._instantiate_trainer`, `._run_subcommand`:
  app/command_line/train_cli.py
- the checkpoint keys `_class_path` and `_instantiator` that LightningCLI saves: app/run/continuation.py,
  app/run/checkpoints.py, app/run/export.py
- `procs` of the private `_SubprocessScriptLauncher`: app/command_line/train_cli.py (for app/main.py)
- no name, but a behaviour of the private `lightning.pytorch.trainer.call._call_callback_hooks`: it skips a callback's
  hook that is not callable (`skip_empty_batch_hooks` in app/command_line/train_cli.py); pinned by
  tests/test_speed.py::test_a_fit_calls_no_callback_that_has_nothing_to_do
Each test is in-process and takes well under a second or two.
"""

import gc
import os
import signal
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from unittest import mock

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.strategies import SingleDeviceStrategy
from lightning.pytorch.trainer.connectors import signal_connector
from lightning.pytorch.utilities.exceptions import SIGTERMException
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.tensorboard.summary import hparams

SAMPLES, BATCH = 8, 2  # four batches an epoch


def samples() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(SAMPLES, 2, generator=generator), torch.randn(SAMPLES, 1, generator=generator))


class PositionedLoader(DataLoader):
    """A training loader that keeps a position in the checkpoints Lightning saves, as the project's StatefulDataLoader
    does (datamodules/mnist.py): Lightning saves `state_dict()` and gives it back with `load_state_dict`."""

    loaded: list

    def state_dict(self) -> dict:
        return {"position": 6}

    def load_state_dict(self, state_dict: dict) -> None:
        self.loaded.append(state_dict)


class TinyModel(LightningModule):
    """One linear layer. `plan_over_the_run` asks for `trainer.estimated_stepping_batches` in `configure_optimizers`,
    as the project's one-cycle schedule does (models/base.py)."""

    def __init__(self, lr: float = 0.1, plan_over_the_run: bool = False) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.layer = nn.Linear(2, 1)
        self.loaded: list[dict] = []  # the positions the training loaders were given back

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        inputs, targets = batch
        return F.mse_loss(self.layer(inputs), targets)

    def validation_step(self, batch, batch_idx: int) -> None:
        inputs, targets = batch
        self.log("val/loss", F.mse_loss(self.layer(inputs), targets))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        if self.hparams.plan_over_the_run:
            assert self.trainer.estimated_stepping_batches > 0
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr)

    def train_dataloader(self) -> DataLoader:
        loader = PositionedLoader(samples(), batch_size=BATCH)
        loader.loaded = self.loaded
        return loader


class RefusingModel(TinyModel):
    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        raise ValueError("refused")


class TinyData(LightningDataModule):
    def __init__(self, batch_size: int = BATCH) -> None:
        super().__init__()
        self.save_hyperparameters()

    def train_dataloader(self) -> DataLoader:
        return DataLoader(samples(), batch_size=self.hparams.batch_size)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(samples(), batch_size=self.hparams.batch_size)


def tiny_trainer(root: Path, **settings) -> Trainer:
    defaults = {
        "accelerator": "cpu",
        "devices": 1,
        "max_steps": 1,
        "limit_val_batches": 0,
        "num_sanity_val_steps": 0,
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
        "default_root_dir": root,
    }
    return Trainer(**{**defaults, **settings})


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def process_group_of_one(monkeypatch: pytest.MonkeyPatch):
    """A gloo process group of this process alone, at a TCP store of its own, as Lightning's launcher makes it
    (`env://`, MASTER_ADDR and MASTER_PORT); closed after the test."""
    port = free_port()
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    dist.init_process_group("gloo", init_method="env://", rank=0, world_size=1)
    try:
        yield port
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class SaidToBeTwoProcesses(SingleDeviceStrategy):
    """One process that Lightning takes for a job of two: with a process group in place, its training loop then runs
    the per-step SIGTERM check it runs under DDP."""

    def __init__(self) -> None:
        super().__init__(device="cpu")
        self.world_size = 2


def raise_signal(signum: int) -> None:
    """Deliver `signum` to this process, once a handler is in place (else the default action would end pytest)."""
    assert callable(signal.getsignal(signum)), f"no Python handler for {signal.Signals(signum).name} was installed"
    signal.raise_signal(signum)


def raise_signal_during(trainer: Trainer, signum: int) -> None:
    """Deliver `signum` with the handlers Lightning installs for a stage in place; then put back those from before."""
    trainer._signal_connector.register_signal_handlers()
    try:
        raise_signal(signum)
    finally:
        trainer._signal_connector.teardown()


# --- app/job/fault_guard.py ---------------------------------------------------------------------------------------


def test_the_signal_connector_installs_the_handlers_put_in_its_attributes_before_training(tmp_path):
    # app/job/fault_guard.py, FaultGuard.setup: `trainer._signal_connector._sigterm_notifier_fn` and
    # `._slurm_sigusr_handler_fn` are given FaultGuard's own in the `setup` hook; Lightning installs what they hold as
    # the SIGTERM and (under SLURM with auto-requeue) SIGUSR1 handlers after `setup`, in place of its own, which run
    # collectives inside the handler. Its SIGTERM handler calls the one in place before (FaultGuard's, installed in
    # `setup`) after the notifier, and puts it back when the stage ends.
    received = []

    def stop(signum, frame) -> None:
        received.append(("stop", signum))

    class Guard(Callback):
        def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
            trainer._signal_connector._sigterm_notifier_fn = lambda signum, frame: received.append(("notifier", signum))
            trainer._signal_connector._slurm_sigusr_handler_fn = lambda signum, frame: received.append(
                ("requeue", signum)
            )
            signal.signal(signal.SIGTERM, stop)

        def on_train_batch_end(self, trainer: Trainer, *args) -> None:
            raise_signal(signal.SIGTERM)
            raise_signal(signal.SIGUSR1)

    before = signal.getsignal(signal.SIGTERM)
    try:
        trainer = tiny_trainer(tmp_path, plugins=[SLURMEnvironment(auto_requeue=True)], callbacks=[Guard()])
        trainer.fit(TinyModel())
        assert signal.getsignal(signal.SIGTERM) is stop, "Lightning did not put the handler from before back"
    finally:
        signal.signal(signal.SIGTERM, before)
    expected = [("notifier", signal.SIGTERM), ("stop", signal.SIGTERM), ("requeue", signal.SIGUSR1)]
    assert received == expected, "Trainer._signal_connector handlers"
    assert not trainer.received_sigterm, "Lightning's own SIGTERM handler ran beside FaultGuard's"
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL, "Lightning did not put the handler from before back"


def test_the_signal_connectors_own_requeue_saves_an_hpc_checkpoint_and_asks_slurm_to_requeue(tmp_path, monkeypatch):
    # app/job/fault_guard.py, FaultGuard._check: after SIGUSR1 every rank calls Lightning's own requeue,
    # `type(connector)._slurm_sigusr_handler_fn(connector, SIGUSR1, None)` (the class's function: the instance's
    # attribute holds FaultGuard's handler), which saves `hpc_ckpt_N.ckpt` and has rank 0 run `scontrol requeue`.
    commands = []
    monkeypatch.setattr(signal_connector, "call", lambda command, **kwargs: commands.append(command) or 0)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)

    class Requeue(Callback):
        def on_train_batch_end(self, trainer: Trainer, *args) -> None:
            connector = trainer._signal_connector
            connector._slurm_sigusr_handler_fn = lambda signum, frame: None  # FaultGuard's, as in a run
            type(connector)._slurm_sigusr_handler_fn(connector, signal.SIGUSR1, None)

    tiny_trainer(tmp_path, callbacks=[Requeue()]).fit(TinyModel())
    assert commands == [["scontrol", "requeue", "4242"]], "_SignalConnector._slurm_sigusr_handler_fn: no requeue"
    assert (tmp_path / "hpc_ckpt_1.ckpt").is_file(), "_SignalConnector._slurm_sigusr_handler_fn: no hpc checkpoint"


@pytest.fixture
def broadcasts(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The source ranks of the broadcasts this process makes (each still made)."""
    made, broadcast = [], dist.broadcast

    def counted(tensor: torch.Tensor, src: int, *args, **kwargs):
        made.append(src)
        return broadcast(tensor, src, *args, **kwargs)

    monkeypatch.setattr(dist, "broadcast", counted)
    return made


def test_the_epoch_loop_calls_the_sigterm_check_put_on_its_instance_before_every_step(
    tmp_path, process_group_of_one, broadcasts
):
    # app/job/fault_guard.py, FaultGuard.on_train_start: `trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor` is
    # replaced on the loop instance by a function that does nothing: the loop calls what the instance holds before
    # every step, instead of Lightning's broadcast of rank 0's SIGTERM flag (a collective, and on a GPU a host-device
    # synchronisation, per step).
    steps = []

    class ReplaceTheCheck(Callback):
        def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
            trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = lambda: steps.append(trainer.global_step)

    trainer = tiny_trainer(tmp_path, strategy=SaidToBeTwoProcesses(), max_steps=3, callbacks=[ReplaceTheCheck()])
    trainer.fit(TinyModel())
    assert steps == [0, 1, 2], "_TrainingEpochLoop._broadcast_sigterm_tensor is no longer called before every step"
    assert broadcasts == [], "the loop still broadcasts a SIGTERM flag every step"


def test_the_epoch_loops_own_sigterm_broadcast_is_back_once_the_instances_is_removed(
    tmp_path, process_group_of_one, broadcasts
):
    # app/job/fault_guard.py, FaultGuard._put_back: `vars(epoch_loop).pop("_broadcast_sigterm_tensor")` gives the
    # loop its class's method again, Lightning's own per-step check: a broadcast of rank 0's SIGTERM flag before every
    # step (after which a SIGTERM stops the fit with SIGTERMException).
    class ReplaceAndPutBack(Callback):
        def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
            trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor = lambda: None
            vars(trainer.fit_loop.epoch_loop).pop("_broadcast_sigterm_tensor")

    trainer = tiny_trainer(tmp_path, strategy=SaidToBeTwoProcesses(), max_steps=3, callbacks=[ReplaceAndPutBack()])
    trainer.fit(TinyModel())
    assert broadcasts == [0, 0, 0], "_TrainingEpochLoop._broadcast_sigterm_tensor no longer broadcasts every step"
    trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor()  # no SIGTERM: nothing happens
    raise_signal_during(trainer, signal.SIGTERM)  # Lightning's own handler records it
    with pytest.raises(SIGTERMException):
        trainer.fit_loop.epoch_loop._broadcast_sigterm_tensor()


# --- app/run/replan.py --------------------------------------------------------------------------------------------


def test_the_fit_loops_combined_loader_forgotten_at_fit_start_is_built_again_with_the_checkpoints_position(tmp_path):
    # app/run/replan.py, ReplanOnResume.on_fit_start: `trainer.fit_loop._combined_loader = None`. The model's
    # schedule asks for `trainer.estimated_stepping_batches` in `configure_optimizers`, which makes Lightning build the
    # training loader before the checkpoint is read; forgotten in `on_fit_start`, the loader is built again after,
    # and given the position the checkpoint saved.
    built_before = []

    class ForgetTheLoader(Callback):
        def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
            built_before.append(trainer.fit_loop._combined_loader is not None)
            trainer.fit_loop._combined_loader = None

    first = tiny_trainer(tmp_path, max_epochs=1, max_steps=2)  # stops in the middle of the epoch
    first.fit(TinyModel(plan_over_the_run=True))
    first.save_checkpoint(tmp_path / "middle.ckpt")
    model = TinyModel(plan_over_the_run=True)
    trainer = tiny_trainer(tmp_path, max_epochs=1, max_steps=3, callbacks=[ForgetTheLoader()])
    trainer.fit(model, ckpt_path=tmp_path / "middle.ckpt")
    assert built_before == [True], (
        "Lightning no longer builds the training loader before the checkpoint is read: the reset in replan.py may no"
        " longer be needed"
    )
    assert model.loaded == [{"position": 6}], "_FitLoop._combined_loader: the loader's position was not restored"


# --- app/command_line/speaking.py ---------------------------------------------------------------------------------


def test_the_default_store_is_the_jobs_tcp_store_and_stays_open_while_it_is_held(process_group_of_one):
    # app/command_line/speaking.py, leave_the_store: global rank 0 takes `dist.distributed_c10d._get_default_store()`,
    # closes the process group, and keeps the job's TCP store open (a reference to it) until the other processes
    # have reported through clients of their own at MASTER_ADDR:MASTER_PORT; dropping it closes the store.
    port = process_group_of_one
    server = dist.distributed_c10d._get_default_store()
    server.set("written", "by rank 0")
    assert server.get("written") == b"by rank 0", "_get_default_store: not a working store"
    tcp_store = server
    while isinstance(tcp_store, dist.PrefixStore):
        tcp_store = tcp_store.underlying_store
    assert isinstance(tcp_store, dist.TCPStore) and tcp_store.port == port, "_get_default_store: not the job's store"
    dist.destroy_process_group()

    client = dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=5), wait_for_workers=False)
    client.set("reported/1", "")
    assert tcp_store.check(["reported/1"]), "the store held did not outlive the process group"
    del client, tcp_store, server
    gc.collect()
    with pytest.raises(dist.DistError):  # closed with the last reference to it
        dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timedelta(seconds=0.2), wait_for_workers=False)


# --- app/command_line/train_cli.py --------------------------------------------------------------------------------


class RecordingCLI(LightningCLI):
    """LightningCLI with TrainCLI's overrides of its private methods (app/command_line/train_cli.py), each doing what
    TrainCLI's does with what LightningCLI gives it, and recording the call."""

    def __init__(self, args: list[str], calls: list[tuple] | None = None) -> None:
        self.calls = [] if calls is None else calls
        with mock.patch.object(sys, "argv", ["train.py"]):  # LightningCLI warns of args given beside pytest's own
            super().__init__(
                model_class=TinyModel,
                subclass_mode_model=True,  # as TrainCLI: the checkpoint names the model's class
                datamodule_class=TinyData,
                save_config_callback=None,
                trainer_defaults={
                    "accelerator": "cpu",
                    "devices": 1,
                    "max_epochs": 3,
                    "logger": False,
                    "enable_progress_bar": False,
                    "enable_model_summary": False,
                    "num_sanity_val_steps": 0,
                },
                seed_everything_default=0,
                parser_kwargs={"exit_on_error": False},
                args=args,
            )

    def add_arguments_to_parser(self, parser) -> None:
        parser.set_defaults({"model": f"{TinyModel.__module__}.TinyModel"})
        parser.add_lightning_class_args(ModelCheckpoint, "checkpoint")

    def parse_arguments(self, parser, args) -> None:
        # TrainCLI._load_checkpoints_as_data_only: a default set on each subcommand's parser, before parsing
        self.calls.append(("parse_arguments", sorted(self._subcommand_parsers)))
        for subparser in self._subcommand_parsers.values():
            subparser.set_defaults({"weights_only": True})
        super().parse_arguments(parser, args)

    def _parse_ckpt_path(self) -> None:
        self.calls.append(("_parse_ckpt_path",))  # TrainCLI's does nothing

    def _instantiate_trainer(self, config: dict, callbacks: list) -> Trainer:
        # TrainCLI's: the checkpoint callbacks dropped with --trainer.enable_checkpointing false, and `config` updated
        # (`_take_the_launchers_shape`: devices and num_nodes) before the Trainer is made from it
        self.calls.append(("_instantiate_trainer", dict(config), list(callbacks)))
        if config.get("enable_checkpointing") is False:
            callbacks = [callback for callback in callbacks if not isinstance(callback, ModelCheckpoint)]
        config.update(max_steps=1)
        return super()._instantiate_trainer(config, callbacks)

    def _run_subcommand(self, subcommand: str) -> None:
        self.calls.append(("_run_subcommand", subcommand))
        try:
            super()._run_subcommand(subcommand)
        except ValueError as error:  # TrainCLI._errors_named_by_option: an error of the Trainer's method, here
            self.calls.append(("raised", str(error)))
            raise
        self.calls.append(("_run_subcommand returned",))

    def before_fit(self) -> None:
        self.calls.append(("before_fit",))

    def after_fit(self) -> None:
        self.calls.append(("after_fit", self.trainer.global_step))


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> tuple[RecordingCLI, Path]:
    """A fit of one step through RecordingCLI, and the checkpoint it ends with."""
    root = tmp_path_factory.mktemp("fit")
    args = ["fit", "--model.lr", "0.3", "--trainer.max_steps", "5", "--trainer.enable_checkpointing", "false"]
    cli = RecordingCLI([*args, "--trainer.default_root_dir", str(root)])
    cli.trainer.save_checkpoint(root / "fitted.ckpt")
    return cli, root / "fitted.ckpt"


def test_lightning_cli_calls_the_overridden_private_methods_with_the_trainer_settings_and_callbacks(fitted):
    # app/command_line/train_cli.py: LightningCLI calls `_parse_ckpt_path()` after `parse_arguments`,
    # `_instantiate_trainer(config, callbacks)` with the Trainer's settings as a dict (what the Trainer is made from,
    # updated in place by TrainCLI) and the callbacks of `add_lightning_class_args`, and `_run_subcommand("fit")`,
    # which runs `before_fit`, the Trainer's `fit` and `after_fit`.
    cli, _ = fitted
    names = [call[0] for call in cli.calls]
    assert names == [
        "parse_arguments",
        "_parse_ckpt_path",
        "_instantiate_trainer",
        "_run_subcommand",
        "before_fit",
        "after_fit",
        "_run_subcommand returned",
    ], "LightningCLI no longer calls _parse_ckpt_path, _instantiate_trainer or _run_subcommand as it did"
    _, config, callbacks = cli.calls[2]
    assert config["max_steps"] == 5 and config["enable_checkpointing"] is False, "_instantiate_trainer's config"
    assert [type(callback) for callback in callbacks] == [ModelCheckpoint], "_instantiate_trainer's callbacks"
    assert cli.calls[3] == ("_run_subcommand", "fit")
    assert cli.trainer.max_steps == 1 and cli.calls[5] == ("after_fit", 1), "the config given on is not the Trainer's"
    assert not any(isinstance(callback, ModelCheckpoint) for callback in cli.trainer.callbacks)


def test_an_error_of_the_trainers_method_passes_through_run_subcommand(tmp_path):
    # app/command_line/train_cli.py, TrainCLI._run_subcommand: a value error raised inside the Trainer's method
    # (`fit`) passes through `_run_subcommand`, where TrainCLI names its option and takes back what the run wrote.
    calls: list[tuple] = []
    model = f"{RefusingModel.__module__}.RefusingModel"
    with pytest.raises(ValueError, match="refused"):
        RecordingCLI(["fit", "--model", model, "--trainer.default_root_dir", str(tmp_path)], calls)
    assert calls[-3:] == [("_run_subcommand", "fit"), ("before_fit",), ("raised", "refused")], (
        "LightningCLI._run_subcommand: the Trainer's fit runs outside it"
    )


def test_the_subcommand_parsers_are_the_ones_lightning_cli_parses_with(fitted):
    # app/command_line/train_cli.py: `self._subcommand_parsers[subcommand]` is the subcommand's parser: a default set
    # on it before parsing is in the parsed settings (`_load_checkpoints_as_data_only`), and its `get_defaults()`
    # tells the options a user set from those left as they were (`_errors_named_by_option`, `_option_names`).
    cli, _ = fitted
    assert cli.calls[0] == ("parse_arguments", sorted(cli.subcommands())), "LightningCLI._subcommand_parsers"
    assert cli.config.fit.weights_only is True, "a default of _subcommand_parsers['fit'] is not the parsed one"
    defaults = cli._subcommand_parsers["fit"].get_defaults()
    assert defaults.trainer.max_steps == -1 and cli.config.fit.trainer.max_steps == 5
    assert defaults.trainer.max_epochs == cli.config.fit.trainer.max_epochs == 3
    assert set(defaults.keys()) == set(cli.config.fit.keys()), "the defaults no longer match the subcommand's config"


def test_parse_ckpt_path_is_where_lightning_cli_puts_a_checkpoints_settings_over_the_command_line(fitted, tmp_path):
    # app/command_line/train_cli.py, TrainCLI._parse_ckpt_path does nothing: a checkpoint's settings are defaults
    # below the command line there (`parse_arguments`), where LightningCLI's own `_parse_ckpt_path` would put them
    # over it and silently drop `--model.lr 0.05` for the checkpoint's 0.3.
    _, checkpoint = fitted
    args = ["validate", "--ckpt_path", str(checkpoint), "--model.lr", "0.05", "--trainer.limit_val_batches", "1"]
    cli = RecordingCLI([*args, "--trainer.default_root_dir", str(tmp_path)])
    assert ("_parse_ckpt_path",) in cli.calls
    assert cli.model.hparams.lr == 0.05, "LightningCLI put the checkpoint's settings over the command line elsewhere"
    LightningCLI._parse_ckpt_path(cli)  # what the override keeps from happening
    assert cli.config.validate.model.init_args.lr == 0.3, (
        "LightningCLI._parse_ckpt_path no longer puts the checkpoint's settings over the command line: TrainCLI's"
        " override may no longer be needed"
    )


# --- app/run/continuation.py, app/run/checkpoints.py, app/run/export.py -----------------------------------------


def test_the_keys_lightning_cli_saves_in_a_checkpoint_are_the_ones_read_back(fitted):
    # app/run/continuation.py (`_settings_of_checkpoint`) and app/run/checkpoints.py (`saved_model_class`) read the
    # model's class from `hyper_parameters["_class_path"]` and drop `_instantiator` from the model's and the data's
    # hyper-parameters; app/run/export.py then loads the model with `<class>.load_from_checkpoint`, which takes both.
    _, path = fitted
    checkpoint = torch.load(path, weights_only=True, map_location="cpu")
    model, data = checkpoint["hyper_parameters"], checkpoint["datamodule_hyper_parameters"]
    assert model.get("_class_path") == f"{TinyModel.__module__}.TinyModel", "LightningCLI no longer saves _class_path"
    assert "_instantiator" in model and "_instantiator" in data, "LightningCLI no longer saves _instantiator"
    assert model["lr"] == 0.3 and data["batch_size"] == BATCH
    loaded = TinyModel.load_from_checkpoint(path, map_location="cpu", weights_only=True)
    assert type(loaded) is TinyModel and loaded.hparams.lr == 0.3, "load_from_checkpoint no longer reads them"


# --- app/command_line/train_cli.py and app/main.py: the processes Lightning's launcher starts -------------------


def test_lightnings_launcher_keeps_the_processes_it_starts_in_procs(tmp_path, monkeypatch):
    # app/command_line/train_cli.py, TrainCLI.processes_started_here: `trainer.strategy.launcher.procs`, the processes
    # of this node that Lightning's launcher started from this one, which app/job/children.py waits for at the end; the
    # launcher passes signals on to them (`launcher.kill`, app/job/fault_guard.py).
    class Started:
        returncode = 0  # ended well, for the launcher's thread that watches them

        def __init__(self, command: list[str], env: dict, cwd: str | None) -> None:
            self.local_rank, self.signals, self.pid = env["LOCAL_RANK"], [], 0

        def send_signal(self, signum: int) -> None:
            self.signals.append(signum)

        def poll(self) -> int:  # for the launcher's thread that watches them
            return 0

    monkeypatch.setattr(os, "environ", dict(os.environ))  # the launcher sets MASTER_ADDR, LOCAL_RANK, ... here
    monkeypatch.setattr(subprocess, "Popen", Started)
    trainer = tiny_trainer(tmp_path, strategy="ddp", devices=3)
    launcher = trainer.strategy.launcher
    assert launcher.launch(lambda: "the work") == "the work"
    assert [proc.local_rank for proc in launcher.procs] == ["1", "2"], "_SubprocessScriptLauncher.procs"
    launcher.kill(signal.SIGTERM)
    assert [proc.signals for proc in launcher.procs] == [[signal.SIGTERM]] * 2


# --- app/run/tensorboard.py (public names, pinned here since the first version of this file) ---------------------


def test_the_loggers_log_dir_is_its_version_and_the_writers_file_writer_takes_the_hparams_table(tmp_path):
    # app/run/tensorboard.py, RunLogger: `version` (a property) names the run's folder, which Lightning's `log_dir`
    # is made of; the HPARAMS table goes in through `experiment.file_writer.add_summary`.
    class NamedVersion(TensorBoardLogger):
        @property
        def version(self) -> str:
            return "version_7"

    logger = NamedVersion(save_dir=tmp_path, name="run")
    assert Path(logger.log_dir) == tmp_path / "run" / "version_7", "TensorBoardLogger.log_dir ignores version"
    for summary in hparams({"lr": 0.1}, {"val/acc": 0.0}):
        logger.experiment.file_writer.add_summary(summary, 0)
    logger.experiment.flush()
    events = EventAccumulator(logger.log_dir)
    events.Reload()
    assert "_hparams_/experiment" in events.PluginTagToContent("hparams"), "SummaryWriter.file_writer"
