"""The Trainer the benchmarks time: DDP, and nothing that does not train (no logger, checkpoints, progress bar,
model summary or validation), but with the callbacks of train.py that act at every step: `GracefulStop` (the stop
check every `stop_every_n_steps` steps, `--stop.every_n_steps`, which also takes the place of Lightning's SIGTERM
broadcast before every step) and `StallWatchdog` (its thread, `--watchdog.timeout`; given `watchdog_timeout=0`, off).
Given `stop_every_n_steps=None`: neither, Lightning's loop alone, as `host_step.py` times it."""

from lightning.pytorch import Trainer

from app.callbacks.graceful_stop import GracefulStop
from app.callbacks.stall_watchdog import StallWatchdog


def bare_trainer(
    strategy="ddp", callbacks=(), stop_every_n_steps: int | None = 50, watchdog_timeout: float = 60, **kwargs
) -> Trainer:
    own = [] if stop_every_n_steps is None else [GracefulStop(stop_every_n_steps), StallWatchdog(watchdog_timeout)]
    return Trainer(
        strategy=strategy,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[*own, *callbacks],
        **kwargs,
    )
