"""The TensorBoard side of a run: a logger with a real HPARAMS tab, fed with the run's whole configuration, and
the run's record of its settings."""

from argparse import Namespace
from typing import Any

from lightning.fabric.utilities.logger import _convert_params, _flatten_dict
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger as LightningTensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.tensorboard.summary import hparams
from typing_extensions import override

from app.run_folder import CHECKPOINTS, RunFolder, next_record_name

HPARAMS_METRICS = ("val/acc", "val/loss", "test/acc", "test/loss")
HPARAMS_SECTIONS = ("model", "data", "trainer", "seed_everything")  # of the CLI config; callbacks' stay in config.yaml


class TensorBoardLogger(LightningTensorBoardLogger):
    """Lightning's TensorBoard logger, minus the placeholder `hp_metric = -1` in the HPARAMS tab.

    Lightning writes the HPARAMS tab only together with metric values, which it also logs as scalars at step 0.
    Here the tab names `HPARAMS_METRICS` as its metrics without logging any value: TensorBoard shows the last
    value of the scalars of those names, which the run logs itself. TensorBoard reads only the first hparams record
    of a run, so the first call writes it (with the whole configuration, see `LogConfigCallback`); later calls only
    add to `hparams.yaml`. Only rank 0 writes, as with any Lightning logger.

    With `run`, the version is the folder that global rank 0 claimed for the run (`app/run_folder.py`), not the next
    number Lightning would find by listing the folder, which two runs started at once can both find.
    """

    def __init__(self, *args: Any, run: RunFolder | None = None, **kwargs: Any) -> None:
        super().__init__(*args, default_hp_metric=False, **kwargs)
        self.run = run
        self._hparams_written = False

    @override
    def _get_next_version(self) -> int | str:
        if self.run is None:
            return super()._get_next_version()
        if rank_zero_only.rank == 0:  # after the processes met, when Lightning first asks for the folder
            self.run.claim()
        return self.run.version if self.run.version is not None else super()._get_next_version()

    @override
    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace, metrics: Any = None, step: int | None = None) -> None:
        super().log_hyperparams(params, metrics, step)
        if metrics is not None or self._hparams_written:
            return
        flat = _flatten_dict(_convert_params(params))
        # jsonargparse nests class arguments under "init_args"; "model/optimizer/lr" reads better in a table.
        flat = {key.replace("/init_args", ""): _plain(value) for key, value in flat.items()}
        writer = self.experiment._get_file_writer()
        for summary in hparams(self._sanitize_params(flat), dict.fromkeys(HPARAMS_METRICS, 0.0)):
            writer.add_summary(summary, step)
        self._hparams_written = True


def _plain(value: Any) -> Any:
    """A number of a subtype (jsonargparse's PositiveInt, say) as a plain number, so TensorBoard can sort by it."""
    for number_type in (bool, int, float):
        if isinstance(value, number_type):
            return number_type(value)
    return value


class LogConfigCallback(SaveConfigCallback):
    """Save the run's settings as LightningCLI does, and log them as hyperparameters.

    With `run`, global rank 0 writes them into the run's folder under a name no earlier file has: `config.yaml` when
    the run starts, `config-continued-K.yaml` for its K-th continuation, with `header` (what the continuation
    changed) as a comment at the top. Nothing is ever overwritten. Without `run` (a logger of the user's choice),
    Lightning's own way: `config.yaml` in the logger's folder.

    The HPARAMS tab holds every model, data and trainer setting of the run (`HPARAMS_SECTIONS`), not only the
    constructor arguments of the model and the datamodule. Lightning calls `save_config` on rank 0 only, before the
    Trainer logs the hyperparameters itself.
    """

    def __init__(self, *args: Any, run: RunFolder | None = None, header: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run = run
        self.header = header

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.run is None:
            super().setup(trainer, pl_module, stage)
            return
        if self.already_saved:
            return
        if trainer.is_global_zero:
            folder = self.run.claim()
            if not trainer.loggers:  # --trainer.logger false: the checkpoints in the run's folder all the same
                for callback in trainer.checkpoint_callbacks:  # set up after this callback, Lightning broadcasts
                    callback.dirpath = callback.dirpath or str(folder / CHECKPOINTS)  # rank 0's dirpath
            path = folder / next_record_name(folder, self.run.continued)
            comment = "".join(f"# {line}\n" for line in self.header.splitlines())
            with path.open("x") as record:  # "x": fails rather than overwrite
                record.write(comment + self.parser.dump(self.config, skip_none=False))
            self.save_config(trainer, pl_module, stage)
        self.already_saved = True

    @override
    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        config = self.config.as_dict()
        settings = {section: _without_unset(config[section]) for section in HPARAMS_SECTIONS if section in config}
        for logger in trainer.loggers:
            logger.log_hyperparams(settings)


def _without_unset(settings: Any) -> Any:
    """Drop options left at None (unset: Lightning picks its default), which would only crowd the table."""
    if not isinstance(settings, dict):
        return settings
    return {key: _without_unset(value) for key, value in settings.items() if value is not None}
