"""The TensorBoard logger of a run, with an HPARAMS tab that compares runs by their real accuracy."""

from argparse import Namespace
from typing import Any

from lightning.fabric.utilities.logger import _convert_params, _flatten_dict
from lightning.pytorch.loggers import TensorBoardLogger as LightningTensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.tensorboard.summary import hparams
from typing_extensions import override

HPARAMS_METRICS = ("val/acc", "val/loss", "test/acc", "test/loss")


class TensorBoardLogger(LightningTensorBoardLogger):
    """Lightning's TensorBoard logger, minus the placeholder `hp_metric = -1` in the HPARAMS tab.

    Lightning writes the HPARAMS tab only together with metric values, which it also logs as scalars at step 0.
    Here the tab names `HPARAMS_METRICS` as its metrics without logging any value: TensorBoard shows the last
    value of the scalars of those names, which the run logs itself. Only rank 0 writes, as with any Lightning logger.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, default_hp_metric=False, **kwargs)

    @override
    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace, metrics: Any = None, step: int | None = None) -> None:
        super().log_hyperparams(params, metrics, step)
        if metrics is not None:
            return
        flat_params = self._sanitize_params(_flatten_dict(_convert_params(params)))
        writer = self.experiment._get_file_writer()
        for summary in hparams(flat_params, dict.fromkeys(HPARAMS_METRICS, 0.0)):
            writer.add_summary(summary, step)
