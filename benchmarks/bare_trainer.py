"""The Trainer the benchmarks time: DDP, and nothing that does not train (no logger, checkpoints, progress bar,
model summary or validation), but with the callback of train.py that changes the speed of a step (without it, given
`sigterm_every_n_steps=None`: Lightning's loop alone, as `host_step.py` times it)."""

from lightning.pytorch import Trainer

from app.job.fault_guard import FaultGuard


def bare_trainer(strategy="ddp", callbacks=(), sigterm_every_n_steps: int | None = 50, **kwargs) -> Trainer:
    guard = [] if sigterm_every_n_steps is None else [FaultGuard(sigterm_every_n_steps)]
    return Trainer(
        strategy=strategy,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[*guard, *callbacks],
        **kwargs,
    )
