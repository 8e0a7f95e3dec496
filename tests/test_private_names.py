"""Every private name of Lightning or torch that this program touches, checked where it lives.

No public route does what these do (each place in the code says why). A new version that moves or renames one
fails here, naming it, instead of somewhere deep in a run, or, worse, silently: `app/job/fault_guard.py` would stop
replacing Lightning's signal handlers, `app/command_line/train_cli.py` would stop naming a rejected value's option.
"""

import inspect

import pytest
from lightning.pytorch import Trainer
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector
from torch.utils.tensorboard import SummaryWriter


def parameters(function) -> list[str]:
    return list(inspect.signature(function).parameters)


@pytest.fixture(scope="module")
def trainer() -> Trainer:
    return Trainer(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_progress_bar=False)


def test_lightnings_signal_handlers_per_step_check_and_training_loader_are_where_they_were(trainer):
    # app/job/fault_guard.py: FaultGuard.setup puts its own handlers in these attributes, which Lightning's connector
    # reads when it registers the handlers, and `_check` calls Lightning's own requeue.
    assert isinstance(trainer._signal_connector, _SignalConnector), "Trainer._signal_connector moved"
    for name in ("_sigterm_notifier_fn", "_slurm_sigusr_handler_fn"):
        assert parameters(getattr(_SignalConnector, name)) == ["self", "signum", "_"], f"_SignalConnector.{name}"
    source = inspect.getsource(_SignalConnector.register_signal_handlers)
    for name in ("self._sigterm_notifier_fn", "self._slurm_sigusr_handler_fn"):
        assert name in source, f"_SignalConnector.register_signal_handlers no longer installs {name}"
    # FaultGuard.on_train_start: the broadcast of rank 0's SIGTERM flag before every training step.
    loop = trainer.fit_loop.epoch_loop
    assert parameters(loop._broadcast_sigterm_tensor) == [], "_TrainingEpochLoop._broadcast_sigterm_tensor"
    assert "self._broadcast_sigterm_tensor()" in inspect.getsource(type(loop)), "the per-step SIGTERM check moved"
    # app/run/replan.py, ReplanOnResume.on_fit_start: the loader Lightning built before the checkpoint was read.
    assert "_combined_loader" in vars(trainer.fit_loop), "_FitLoop._combined_loader"


def test_train_cli_overrides_lightning_cli_methods_with_their_signatures():
    # app/command_line/train_cli.py: errors named by option (with the subcommand's defaults), the folder claimed
    # once the processes have met, the Trainer given this project's logger and checkpoint files.
    assert parameters(LightningCLI._run_subcommand) == ["self", "subcommand"], "LightningCLI._run_subcommand"
    assert parameters(LightningCLI._instantiate_trainer) == ["self", "config", "callbacks"], (
        "LightningCLI._instantiate_trainer"
    )
    assert "self._subcommand_parsers" in inspect.getsource(LightningCLI), "LightningCLI._subcommand_parsers"
    # parse_arguments: the checkpoint's settings are defaults below the command line, not put over it.
    assert parameters(LightningCLI._parse_ckpt_path) == ["self"], "LightningCLI._parse_ckpt_path"
    assert "self._parse_ckpt_path()" in inspect.getsource(LightningCLI.__init__), "LightningCLI._parse_ckpt_path"


def test_the_logger_writes_the_hparams_table_and_gives_its_version_where_lightning_looks():
    # app/run/tensorboard.py: the HPARAMS table through the writer's file writer, the run's folder as the version.
    assert "file_writer" in inspect.getsource(SummaryWriter.__init__), "SummaryWriter.file_writer"
    assert isinstance(TensorBoardLogger.version, property), "TensorBoardLogger.version"
    assert "self.version" in inspect.getsource(TensorBoardLogger.log_dir.fget), "TensorBoardLogger.log_dir"


def test_lightnings_launcher_keeps_the_processes_it_starts_where_train_py_waits_for_them():
    # app/main.py waits for them at the end (`procs`, where the launcher keeps them to pass signals on).
    from lightning.pytorch.strategies.launchers.subprocess_script import _SubprocessScriptLauncher

    launcher = _SubprocessScriptLauncher(cluster_environment=None, num_processes=2, num_nodes=1)
    assert launcher.procs == [], "_SubprocessScriptLauncher.procs"


def test_the_keys_lightning_cli_saves_in_a_checkpoint_are_the_ones_read_back():
    # app/run/continuation.py and app/run/checkpoints.py read the model's class from a checkpoint's hyper-parameters,
    # where LightningCLI saves it (`_class_path`), and what would instantiate it on load (`_instantiator`).
    import lightning.pytorch.cli as cli
    import lightning.pytorch.core.saving as saving

    assert '"_class_path"' in inspect.getsource(cli), "LightningCLI no longer saves _class_path"
    assert '"_instantiator"' in inspect.getsource(cli), "LightningCLI no longer saves _instantiator"
    assert '"_instantiator"' in inspect.getsource(saving), "Lightning no longer reads _instantiator"


def test_the_process_groups_store_is_where_the_store_holder_keeps_it_open():
    # app/command_line/speaking.py: global rank 0, which holds the job's TCP store, keeps it open after closing the
    # process group until the others have reported; torch has no public handle on the default group's store.
    import torch.distributed as dist

    assert parameters(dist.distributed_c10d._get_default_store) == [], "distributed_c10d._get_default_store"
