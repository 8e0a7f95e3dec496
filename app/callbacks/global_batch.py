"""GlobalBatchInfo: what one optimizer step is made of, said and logged as training starts."""

import math

from lightning.pytorch import Callback, LightningModule, Trainer

from app.console import say


class GlobalBatchInfo(Callback):
    """Say and log what one optimizer step is made of, so that a user sees what `--devices` changes
    (docs/configuration.md): the global batch, the learning rate, the steps of an epoch (the last one takes the
    batches left over) and of the run. At the first batch, once a continued run's schedule is planned."""

    def __init__(self) -> None:
        self.due = False  # at the next training batch, the fit's first

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.due = True

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        if not self.due:
            return
        self.due = False
        per_device = len(batch[0])  # a batch of the configured size, or a process's whole share of a smaller set
        global_batch = per_device * trainer.world_size * trainer.accumulate_grad_batches
        per_epoch = math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches)
        total = trainer.estimated_stepping_batches
        group = trainer.optimizers[0].param_groups[0]
        cycle = "max_lr" in group
        lr = f"peak learning rate {group['max_lr']:g} (one-cycle)" if cycle else f"learning rate {group['lr']:g}"
        in_the_run = f", {int(total)} in the run" if math.isfinite(total) else ""
        say(
            f"Global batch {global_batch} = {per_device} per device x {trainer.world_size} processes x"
            f" {trainer.accumulate_grad_batches} accumulated; {lr}; {per_epoch} optimizer"
            f" step{'s' * (per_epoch != 1)} per epoch{in_the_run}."
        )
        for logger in trainer.loggers:
            logger.log_metrics(
                {"workload/global_batch_size": global_batch, "workload/world_size": trainer.world_size}, step=0
            )
