"""The Trainer both benchmarks time: DDP, and nothing that does not train (no logger, checkpoints, progress bar,
model summary or validation), but with the callback of train.py that changes the speed of a step."""

from lightning.pytorch import Trainer

from app.job.fault_guard import FaultGuard


def bare_trainer(strategy="ddp", callbacks=(), sigterm_every_n_steps: int = 50, **kwargs) -> Trainer:
    return Trainer(
        strategy=strategy,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[FaultGuard(sigterm_every_n_steps), *callbacks],
        **kwargs,
    )
