"""The model summary at the start of `fit`, without the metric objects (child modules of `ImageClassifier`, seven
rows without parameters that came before the network)."""

from typing import Any

from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelSummary
from torchmetrics import Metric


class NetworkSummary(ModelSummary):
    """Lightning's `ModelSummary`, its rows of metric objects left out (the totals stay as they are)."""

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.metrics = {name for name, module in pl_module.named_modules() if isinstance(module, Metric)}
        super().on_fit_start(trainer, pl_module)

    def summarize(self, summary_data: list[tuple[str, list[str]]], *args: Any, **kwargs: Any) -> None:
        names = dict(summary_data)["Name"]
        kept = [index for index, name in enumerate(names) if name not in self.metrics]
        rows = [(header, [column[index] for index in kept]) for header, column in summary_data]
        rows[0] = (rows[0][0], [str(number) for number in range(len(kept))])  # the row numbers, again from 0
        super().summarize(rows, *args, **kwargs)
