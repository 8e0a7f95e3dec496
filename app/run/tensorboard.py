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
    """Lightning's TensorBoard logger in the folder rank 0 claims for the run (`folder.py`), with the cards of loss
    and accuracy first (docs/dashboard.md) and no placeholder `hp_metric = -1` in the HPARAMS tab.

    The tab names `HPARAMS_METRICS` as its metrics without logging values (TensorBoard shows the last ones the run
    logs); TensorBoard reads only a run's first hparams record, so the first call writes it."""

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
    """`{"model": {"init_args": {"optimizer": {"init_args": {"lr": 0.01}}}}}` as `{"model/optimizer/lr": 0.01}`."""
    flat = {}
    for key, value in (vars(params) if isinstance(params, Namespace) else params).items():
        name = prefix if key == "init_args" else f"{prefix}/{key}" if prefix else str(key)
        if isinstance(value, dict | Namespace):
            flat.update(_flattened(value, name))
        else:
            flat[name] = value
    return flat


def _shown(value: Any) -> bool | int | float | str:
    """A value as TensorBoard's table takes it: a plain number (not a PositiveInt, so that it sorts), bool, or text."""
    for kind in (bool, int, float):
        if isinstance(value, kind):
            return kind(value)
    return value if isinstance(value, str) else str(value)
