"""PredictionWriter: every input's predicted class in one CSV file, written once, by global rank 0."""

import csv
import io
import os
from pathlib import Path

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter

from app.console import UserError

CSV_NAME = "predictions.csv"
COLUMNS = ["prediction", "class_name", "probability"]


class PredictionWriter(BasePredictionWriter):
    """Write the predictions of a `predict` run to a CSV file, one row per input, in input order.

    Its columns: docs/use-the-model.md.

    Args:
        path: The CSV file, or a folder to write `predictions.csv` in; by default the Trainer's log folder (a
            predict's own: `<run>/predict/version_N/`). A file that exists already is refused before any batch.

    Each process predicts its share and sends its rows to global rank 0 (`gather_object`), which writes them: the
    nodes need no folder they share."""

    def __init__(self, path: str | None = None) -> None:
        super().__init__(write_interval="epoch")
        self.path = path
        self.written: Path | None = None

    def _chosen(self) -> Path | None:
        if not self.path:
            return None
        return Path(self.path) / CSV_NAME if Path(self.path).is_dir() or self.path.endswith("/") else Path(self.path)

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage == "predict" and trainer.is_global_zero and (chosen := self._chosen()) is not None and chosen.exists():
            raise UserError(
                f"--predictions.path {self.path}: {chosen} exists already. Give another file, or leave"
                " --predictions.path out (each predict then writes into a folder of its own)."
            )

    def write_on_epoch_end(self, trainer: Trainer, pl_module: LightningModule, predictions, batch_indices) -> None:
        rows = {key: torch.cat([batch[key] for batch in predictions]) for key in predictions[0]} if predictions else {}
        rows["index"] = torch.tensor([index for batch in batch_indices[0] for index in batch], dtype=torch.long)
        shares = [rows]
        if trainer.world_size > 1:  # every process reaches this at the end of its predict epoch
            shares = [None] * trainer.world_size if trainer.is_global_zero else None
            torch.distributed.gather_object(rows, shares, dst=0)
        path = self._chosen() or Path(trainer.log_dir or trainer.default_root_dir) / CSV_NAME  # a broadcast
        if trainer.is_global_zero:
            self._write(trainer, path, shares)

    def _write(self, trainer: Trainer, path: Path, shares: list[dict]) -> None:
        rows = {key: torch.cat([share[key] for share in shares if key in share]) for key in shares[0]}
        files, names = trainer.datamodule.predict_files, trainer.datamodule.class_names
        text = io.StringIO()  # every row first: the file is written whole
        writer = csv.writer(text, lineterminator="\n")
        writer.writerow(["file", *COLUMNS] if files else ["index", *COLUMNS, "target"])
        for position in torch.argsort(rows["index"]).tolist():
            index, prediction = int(rows["index"][position]), int(rows["prediction"][position])
            name = os.fsencode(files[index].name).decode("utf-8", "backslashreplace") if files else index
            row = [name, prediction, names[prediction], f"{float(rows['probability'][position]):.6f}"]
            writer.writerow(row if files else [*row, int(rows["target"][position])])
        path.parent.mkdir(parents=True, exist_ok=True)
        candidate, number = path, 1
        while True:  # never over an earlier file: NAME-2.csv, ...
            try:
                with candidate.open("x", newline="", encoding="utf-8") as out:
                    out.write(text.getvalue())
                break
            except FileExistsError:
                number += 1
                candidate = path.with_name(f"{path.stem}-{number}{path.suffix}")
        self.written = candidate
