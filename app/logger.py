"""The TensorBoard side of a run: a logger with a real HPARAMS tab, fed with the run's whole configuration."""

from argparse import Namespace
from typing import Any

from lightning.fabric.utilities.logger import _convert_params, _flatten_dict
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import SaveConfigCallback
from lightning.pytorch.loggers import TensorBoardLogger as LightningTensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.tensorboard.summary import hparams
from typing_extensions import override

HPARAMS_METRICS = ("val/acc", "val/loss", "test/acc", "test/loss")
HPARAMS_SECTIONS = ("model", "data", "trainer", "seed_everything")  # of the CLI config; callbacks' stay in config.yaml


class TensorBoardLogger(LightningTensorBoardLogger):
    """Lightning's TensorBoard logger, minus the placeholder `hp_metric = -1` in the HPARAMS tab.

    Lightning writes the HPARAMS tab only together with metric values, which it also logs as scalars at step 0.
    Here the tab names `HPARAMS_METRICS` as its metrics without logging any value: TensorBoard shows the last
    value of the scalars of those names, which the run logs itself. TensorBoard reads only the first hparams record
    of a run, so the first call writes it (with the whole configuration, see `LogConfigCallback`); later calls only
    add to `hparams.yaml`. Only rank 0 writes, as with any Lightning logger.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, default_hp_metric=False, **kwargs)
        self._hparams_written = False

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
    """Save the run's `config.yaml` (LightningCLI's default) and log the same settings as hyperparameters.

    So the HPARAMS tab holds every model, data and trainer setting of the run (`HPARAMS_SECTIONS`), not only the
    constructor arguments of the model and the datamodule. Lightning calls `save_config` on rank 0 only, before the
    Trainer logs the hyperparameters itself.
    """

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
