"""The run's TensorBoard logger: in the run's own folder, with a real HPARAMS tab, loss and accuracy first."""

from argparse import Namespace
from typing import Any

from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.tensorboard.summary import hparams
from typing_extensions import override

from app.run.folder import RunFolder

HPARAMS_METRICS = ("val/acc", "val/loss", "test/acc", "test/loss")


class RunLogger(TensorBoardLogger):
    """Lightning's TensorBoard logger in the run's folder, minus the placeholder `hp_metric = -1` in the HPARAMS tab.

    The version is the folder that global rank 0 claims for the run once the processes have met (`folder.py`), not
    the next number Lightning finds by listing the folder, which two runs started at once can both find.

    Lightning writes the HPARAMS tab only together with metric values, which it also logs as scalars at step 0.
    Here the tab names `HPARAMS_METRICS` as its metrics without logging any value: TensorBoard shows the last value
    of the scalars of those names, which the run logs itself. TensorBoard reads only the first hparams record of a
    run, so the first call writes it (with the whole configuration: `record.py`); later calls only add to
    `hparams.yaml`. Only rank 0 writes, as with any Lightning logger.

    TensorBoard orders its cards by name and groups them by the name's first part, so the groups of the loss and
    accuracy (`test/`, `train/`, `val/`) come first only if every other scalar is in a group named after `val`:
    the project names its own that way (`val_per_class/`, `visuals/`, `workload/`), and this logger moves
    Lightning's (`epoch`, and `lr-<optimizer>` of the LearningRateMonitor) under `workload/`.
    """

    def __init__(self, *args: Any, run: RunFolder | None = None, **kwargs: Any) -> None:
        super().__init__(*args, default_hp_metric=False, **kwargs)
        self.run = run
        self._hparams_written = False

    @property
    @override
    def version(self) -> int | str:
        if self.run is None:
            return super().version
        if rank_zero_only.rank == 0:  # Lightning asks for the folder once the processes have met
            self.run.claim()
        return self.run.version if self.run.version is not None else super().version

    @override
    @rank_zero_only
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        super().log_metrics({_card_name(name): value for name, value in metrics.items()}, step)

    @override
    @rank_zero_only
    def log_hyperparams(self, params: dict[str, Any] | Namespace, metrics: Any = None, step: int | None = None) -> None:
        super().log_hyperparams(params, metrics, step)
        if metrics is not None or self._hparams_written:
            return
        table = {name: _shown(value) for name, value in _flattened(params).items()}
        for summary in hparams(table, dict.fromkeys(HPARAMS_METRICS, 0.0)):
            self.experiment.file_writer.add_summary(summary, step)
        self._hparams_written = True


def _card_name(name: str) -> str:
    """Lightning's own scalars under `workload/`, after the cards of the loss and accuracy."""
    return f"workload/{name}" if name == "epoch" or name.startswith("lr-") else name


def _flattened(params: dict[str, Any] | Namespace, prefix: str = "") -> dict[str, Any]:
    """`{"model": {"init_args": {"optimizer": {"init_args": {"lr": 0.01}}}}}` as `{"model/optimizer/lr": 0.01}`:
    jsonargparse nests class arguments under "init_args", which would only lengthen the table's names."""
    flat = {}
    for key, value in (vars(params) if isinstance(params, Namespace) else params).items():
        name = prefix if key == "init_args" else f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, dict | Namespace):
            flat.update(_flattened(value, name))
        else:
            flat[name] = value
    return flat


def _shown(value: Any) -> bool | int | float | str:
    """A value as TensorBoard's table takes it: a plain number (not jsonargparse's PositiveInt, so that it sorts), a
    boolean, or text."""
    for kind in (bool, int, float):
        if isinstance(value, kind):
            return kind(value)
    return value if isinstance(value, str) else str(value)
