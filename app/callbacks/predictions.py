"""PredictionWriter: every input's prediction in one CSV file, in input order, written once, by global rank 0."""

import csv
import io
import os
from pathlib import Path

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter

from app.console import UserError

CSV_NAME = "predictions.csv"


class PredictionWriter(BasePredictionWriter):
    """Write what `predict_step` returns to a CSV file, one row per input, in input order.

    `predict_step` returns a tensor, or a dict of tensors, with one row per input of its batch: each key a column
    (`prediction` for a bare tensor), a row of several values several columns (`key_0`, `key_1`, ...). The first
    column is the input's `index`, or its `file` where the datamodule names the files it predicts
    (`predict_files`); where it names its classes (`class_names`), a `class_name` column follows `prediction`.

    Args:
        path: The CSV file, or a folder to write `predictions.csv` in; by default the Trainer's log folder (a
            predict's own: `<run>/predict/version_N/`). A file that exists already is refused before any batch.

    Each process predicts its share and sends its rows to global rank 0 (`gather_object`), which writes them: the
    nodes need no folder they share. Nothing is written over an earlier file (`predictions-2.csv`, ...).

    Example::

        writer = PredictionWriter("predictions.csv")
        Trainer(callbacks=[writer]).predict(model, dataloaders=loader, return_predictions=False)
        print(writer.written)
    """

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
        batches = [output if isinstance(output, dict) else {"prediction": output} for output in predictions]
        rows = {key: torch.cat([batch[key].cpu() for batch in batches]) for key in batches[0]} if batches else {}
        rows["index"] = torch.tensor([index for batch in batch_indices[0] for index in batch], dtype=torch.long)
        shares = [rows]
        if trainer.world_size > 1:  # every process reaches this at the end of its predict epoch
            shares = [None] * trainer.world_size if trainer.is_global_zero else None
            torch.distributed.gather_object(rows, shares, dst=0)
        path = self._chosen() or Path(trainer.log_dir or trainer.default_root_dir) / CSV_NAME  # a broadcast
        if trainer.is_global_zero:
            self._write(trainer, path, shares)

    def _write(self, trainer: Trainer, path: Path, shares: list[dict]) -> None:
        columns = {key: torch.cat([share[key] for share in shares if key in share]) for key in shares[0]}
        index = columns.pop("index")
        order = torch.argsort(index)
        files = getattr(trainer.datamodule, "predict_files", None)
        names = getattr(trainer.datamodule, "class_names", None)
        header, values = (
            ["file" if files else "index"],
            [[_name(files[i]) if files else i for i in index[order].tolist()]],
        )
        for key, column in columns.items():
            column = column[order].reshape(len(order), -1)
            wide = column.shape[1] > 1
            header += [f"{key}_{j}" for j in range(column.shape[1])] if wide else [key]
            values += [[_cell(value) for value in column[:, j].tolist()] for j in range(column.shape[1])]
            if key == "prediction" and names and not wide:
                header.append("class_name")
                values.append([names[int(k)] for k in column[:, 0].tolist()])
        text = io.StringIO()  # every row first: the file is written whole
        writer = csv.writer(text, lineterminator="\n")
        writer.writerows([header, *zip(*values, strict=True)])
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


def _name(path: Path) -> str:
    return os.fsencode(path.name).decode("utf-8", "backslashreplace")


def _cell(value: float | int | bool) -> str | int:
    return f"{value:.6f}" if isinstance(value, float) else int(value)
