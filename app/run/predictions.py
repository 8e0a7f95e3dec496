"""`train.py predict`: every input's predicted class in one CSV file, written once, by global rank 0."""

import csv
import io
import os
from pathlib import Path

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter

from app.errors import UserError
from app.run.folder import RunFolder

CSV_NAME = "predictions.csv"


class PredictionWriter(BasePredictionWriter):
    """Write the predictions of a `predict` run to a CSV file, one row per input, in input order.

    Args:
        path: The CSV file to write, or a folder to write `predictions.csv` in; by default a folder of this predict's
            own (`<run>/predict/version_N/`). An earlier file is never overwritten: a file that exists already is
            refused before anything runs.

    Each rank predicts its share and sends its rows to global rank 0 (`gather_object`: the shares differ in
    length), which writes the CSV in input order (columns: docs/use-the-model.md)."""

    def __init__(self, path: str | None = None) -> None:
        super().__init__(write_interval="epoch")
        self.path = path
        self.run: RunFolder | None = None  # the folder of this predict, set by train.py on every rank
        self.written: Path | None = None

    def chosen_path(self) -> Path | None:
        """The CSV file `path` names (`predictions.csv` in it when it is a folder), or None for the default."""
        if not self.path:
            return None
        path = Path(self.path)
        return path / CSV_NAME if path.is_dir() or self.path.endswith("/") else path

    def refuse_an_earlier_file(self) -> None:
        """Before anything runs: one line instead of overwriting an earlier predict's file."""
        path = self.chosen_path()
        if path is not None and path.exists():
            raise UserError(
                f"--predictions.path {self.path}: {path} exists already, from an earlier predict. Give another file"
                " name, or leave --predictions.path out (each predict then writes into a folder of its own)."
            )

    def write_on_epoch_end(
        self, trainer: Trainer, pl_module: LightningModule, predictions: list[dict], batch_indices: list
    ) -> None:
        path = self.chosen_path()
        if path is None and self.run is None:  # Lightning's `trainer.log_dir`, a broadcast from rank 0: every rank asks
            path = Path(trainer.log_dir or trainer.default_root_dir or ".") / CSV_NAME
        rows = {key: torch.cat([batch[key] for batch in predictions]) for key in predictions[0]} if predictions else {}
        rows["index"] = torch.tensor([index for batch in batch_indices[0] for index in batch], dtype=torch.long)
        shares = [rows]
        if trainer.world_size > 1:  # every rank reaches this call, at the end of its predict epoch
            shares = [None] * trainer.world_size if trainer.is_global_zero else None
            torch.distributed.gather_object(rows, shares, dst=0)
        if trainer.is_global_zero:  # the run's folder is claimed here alone: another rank's claim would make another
            self._write(trainer, path or self.run.claim() / CSV_NAME, shares)
        trainer.strategy.barrier()  # no rank ends the run before the CSV is complete

    def _write(self, trainer: Trainer, path: Path, shares: list[dict]) -> None:
        rows = {key: torch.cat([share[key] for share in shares if key in share]) for key in set().union(*shares)}
        order = torch.argsort(rows["index"]).tolist()
        names, files = trainer.datamodule.class_names, trainer.datamodule.predict_files
        header = ["file" if files else "index", "prediction", "class_name", "probability"] + (
            [] if files else ["target"]
        )
        text = io.StringIO()  # every row first: a file is written whole
        writer = csv.writer(text, lineterminator="\n")  # lines as Unix tools read them (the csv default: \r\n)
        writer.writerow(header)
        for position in order:
            index, prediction = int(rows["index"][position]), int(rows["prediction"][position])
            row = [_shown(files[index].name) if files else index, prediction, names[prediction]]
            row.append(f"{float(rows['probability'][position]):.6f}")
            if not files:
                row.append(int(rows["target"][position]))
            writer.writerow(row)
        path.parent.mkdir(parents=True, exist_ok=True)
        with _new_file(path) as out:
            out.write(text.getvalue())
        self.written = Path(out.name)


def _shown(name: str) -> str:
    """A file's name in UTF-8; the bytes of a name in another encoding (`caf\xe9.png`, from an old zip) escaped."""
    return os.fsencode(name).decode("utf-8", "backslashreplace")


def _new_file(path: Path):
    """`path` opened for writing if no file has that name yet, else the first free `NAME-2.csv`, ...: the rows are
    never lost, and no earlier file is overwritten."""
    candidate, number = path, 1
    while True:
        try:
            return candidate.open("x", newline="", encoding="utf-8")
        except FileExistsError:
            number += 1
            candidate = path.with_name(f"{path.stem}-{number}{path.suffix}")
