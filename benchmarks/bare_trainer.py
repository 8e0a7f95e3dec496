"""The Trainer both benchmarks time: DDP, and nothing that does not train (no logger, checkpoints, progress bar,
model summary or validation)."""

from lightning.pytorch import Trainer


def bare_trainer(strategy="ddp", **kwargs) -> Trainer:
    return Trainer(
        strategy=strategy,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )
