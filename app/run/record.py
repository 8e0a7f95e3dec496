"""The run's record of its settings: `config.yaml` when it starts, `config-continued-K.yaml` for each continuation,
and the same settings in TensorBoard's HPARAMS tab."""

from functools import cached_property
from typing import Any

import yaml
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.cli import SaveConfigCallback
from typing_extensions import override

from app.run.folder import CHECKPOINTS, RunFolder, next_record_name, write_record

HPARAMS_SECTIONS = ("model", "data", "trainer", "seed_everything")  # of the CLI config; callbacks' stay in config.yaml


class RunRecord(SaveConfigCallback):
    """Save the run's settings as LightningCLI does, and log them as hyperparameters (`HPARAMS_SECTIONS`).

    With `run`, global rank 0 writes them into the run's folder under a name no earlier file has, with `header` as
    a comment at the top; without (a logger of the user's), Lightning's own way."""

    def __init__(self, *args: Any, run: RunFolder | None = None, header: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.run = run
        self.header = header

    @cached_property
    def dumped(self) -> str:
        """The settings as `config.yaml` holds them: dumped once for the record and the HPARAMS tab (50 ms each)."""
        return self.parser.dump(self.config, skip_none=False)

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
            write_record(path, comment + self.dumped)
            self.save_config(trainer, pl_module, stage)
        self.already_saved = True

    @override
    def save_config(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        config = yaml.safe_load(self.dumped)  # plain values, which hparams.yaml can hold (`as_dict` keeps objects)
        settings = {section: _without_unset(config[section]) for section in HPARAMS_SECTIONS if section in config}
        for logger in trainer.loggers:
            logger.log_hyperparams(settings)


def _without_unset(settings: Any) -> Any:
    """Drop options left at None (unset: Lightning picks its default), which would only crowd the table."""
    if not isinstance(settings, dict):
        return settings
    return {key: _without_unset(value) for key, value in settings.items() if value is not None}
