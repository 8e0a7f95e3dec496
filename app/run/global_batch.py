"""What one optimizer step is made of, printed and logged at the start of training."""

import math

from lightning.pytorch import Callback, LightningModule, Trainer
from torch.optim.lr_scheduler import OneCycleLR

from app.run.replan import steps_in_the_run
from app.say import say


class GlobalBatchInfo(Callback):
    """Print and log what one optimizer step is made of, so a user sees what changing `--devices` does
    (docs/configuration.md). An epoch's steps are rounded up: the last one takes the batches left over."""

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.first_batch = True

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        """At the first batch, once a continued run's schedule is planned (app/run/replan.py)."""
        if not getattr(self, "first_batch", False):
            return
        self.first_batch = False
        datamodule = trainer.datamodule  # a batch holds at most a rank's share of the training set
        per_device = min(datamodule.hparams.batch_size, math.ceil(len(datamodule.train_set) / trainer.world_size))
        global_batch = per_device * trainer.world_size * trainer.accumulate_grad_batches
        steps_per_epoch = math.ceil(trainer.num_training_batches / trainer.accumulate_grad_batches)
        group = trainer.optimizers[0].param_groups[0]
        # A continued run counts the steps it took before at their size (app/run/replan.py), as its one-cycle
        # schedule does; `batch_idx` is where its epoch continues.
        cycles = [c.scheduler for c in trainer.lr_scheduler_configs if isinstance(c.scheduler, OneCycleLR)]
        total = cycles[0].total_steps if cycles else steps_in_the_run(trainer, batch_idx)
        if cycles:
            lr = f"peak learning rate {group['max_lr']:g} (one-cycle)"
        elif math.isfinite(total) or trainer.lr_scheduler_configs or not pl_module.hparams.get("one_cycle"):
            lr = f"learning rate {group['lr']:g}"
        else:  # the one-cycle schedule needs a number of steps to plan for (models/base.py)
            lr = (
                f"learning rate {group['lr']:g}, constant: the run's number of steps is open (--trainer.max_epochs -1"
                " without --trainer.max_steps), so there is no one-cycle schedule to plan"
            )
        in_the_run = f", {total} in the run" if math.isfinite(total) else ""
        say(
            f"Global batch {global_batch} = {per_device} per device x {trainer.world_size} processes"
            f" x {trainer.accumulate_grad_batches} accumulated; {lr}; {steps_per_epoch} optimizer steps per epoch"
            f"{in_the_run}."
        )
        for logger in trainer.loggers:  # loggers write on rank 0 only
            logger.log_metrics(
                {
                    "workload/global_batch_size": global_batch,
                    "workload/world_size": trainer.world_size,
                    "workload/steps_per_epoch": steps_per_epoch,
                },
                step=0,
            )
