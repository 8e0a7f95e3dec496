"""`train.py predict`: every input's predicted class in one CSV file, written once, by global rank 0."""

import csv
from pathlib import Path

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import BasePredictionWriter


class PredictionWriter(BasePredictionWriter):
    """Write the predictions of a `predict` run to a CSV file, one row per input, in input order.

    Args:
        path: The CSV file to write, or a folder to write `predictions.csv` in; by default the run's folder.

    Under DDP each rank predicts its share of the inputs (Lightning's sampler gives every input to exactly one
    rank, and tells this callback which). Each rank saves its rows beside the CSV, the ranks wait for each other,
    and global rank 0 merges the parts in input order into the CSV and deletes them. The official test set's rows
    are `index,prediction,class_name,probability,target`; a folder's (`--data.predict_dir`) are
    `file,prediction,class_name,probability`.
    """

    def __init__(self, path: str | None = None) -> None:
        super().__init__(write_interval="epoch")
        self.path = path

    def csv_path(self, trainer: Trainer) -> Path:
        if self.path and not Path(self.path).is_dir():
            return Path(self.path)
        return Path(self.path or trainer.log_dir or trainer.default_root_dir) / "predictions.csv"

    def write_on_epoch_end(
        self, trainer: Trainer, pl_module: LightningModule, predictions: list[dict], batch_indices: list
    ) -> None:
        path = self.csv_path(trainer)
        rows = {key: torch.cat([batch[key] for batch in predictions]) for key in predictions[0]} if predictions else {}
        rows["index"] = torch.tensor([index for batch in batch_indices[0] for index in batch], dtype=torch.long)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save(rows, _part(path, trainer.global_rank))
        trainer.strategy.barrier()  # every part is written
        if trainer.is_global_zero:
            self._merge(trainer, path)
        trainer.strategy.barrier()  # no rank leaves before the CSV is complete

    def _merge(self, trainer: Trainer, path: Path) -> None:
        parts = [_part(path, rank) for rank in range(trainer.world_size)]
        loaded = [torch.load(part, weights_only=True) for part in parts]
        rows = {key: torch.cat([part[key] for part in loaded if key in part]) for key in set().union(*loaded)}
        order = torch.argsort(rows["index"]).tolist()
        names, files = trainer.datamodule.class_names, trainer.datamodule.predict_files
        header = ["file" if files else "index", "prediction", "class_name", "probability"] + (
            [] if files else ["target"]
        )
        with path.open("w", newline="") as out:
            writer = csv.writer(out)
            writer.writerow(header)
            for position in order:
                index, prediction = int(rows["index"][position]), int(rows["prediction"][position])
                row = [files[index].name if files else index, prediction, names[prediction]]
                row.append(f"{float(rows['probability'][position]):.6f}")
                if not files:
                    row.append(int(rows["target"][position]))
                writer.writerow(row)
        for part in parts:
            part.unlink()


def _part(path: Path, rank: int) -> Path:
    return path.with_name(f".{path.name}.rank{rank}")
