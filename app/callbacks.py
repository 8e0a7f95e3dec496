"""Callbacks the training program adds to every run."""

from jsonargparse.typing import PositiveInt
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info


class GlobalBatchInfo(Callback):
    """Print and log what one optimizer step is made of, so a user sees what changing `--devices` does.

    Under DDP each of the `world_size` processes takes `batch_size` samples per step and the gradients are
    averaged, so one step sees the global batch. Lightning does not rescale the learning rate.
    """

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        per_device = trainer.datamodule.hparams.batch_size
        global_batch = per_device * trainer.world_size * trainer.accumulate_grad_batches
        steps_per_epoch = trainer.num_training_batches // trainer.accumulate_grad_batches
        group = trainer.optimizers[0].param_groups[0]
        lr = (
            f"peak learning rate {group['max_lr']:g} (one-cycle)"
            if "max_lr" in group
            else f"learning rate {group['lr']:g}"
        )
        rank_zero_info(
            f"Global batch {global_batch} = {per_device} per device x {trainer.world_size} processes"
            f" x {trainer.accumulate_grad_batches} accumulated; {lr};"
            f" {steps_per_epoch} optimizer steps per epoch."
        )
        for logger in trainer.loggers:  # loggers write on rank 0 only
            logger.log_metrics(
                {
                    "global_batch_size": global_batch,
                    "world_size": trainer.world_size,
                    "steps_per_epoch": steps_per_epoch,
                },
                step=0,
            )


class SigtermCheck(Callback):
    """Ask whether rank 0 received SIGTERM every `every_n_steps` training steps instead of before every step.

    Args:
        every_n_steps: Steps between two checks; 1 is Lightning's own behaviour.

    Under DDP, Lightning (2.5 and 2.6) broadcasts a flag from rank 0 before every training step and reads it back
    with `.item()`, so that all ranks stop together when rank 0 alone is told to stop. That is one more collective
    per step, which holds every rank until the slowest arrives, and on a GPU a host-device synchronisation per step:
    on 2 CPU processes it cost 0.3-3.8 ms a step, 4-19% of the step (benchmarks/README.md). Checking every n steps
    keeps the guarantee with at most n-1 steps of delay. Every rank decides from its count of batches, which is the
    same on all ranks, so all of them take part in the same broadcasts. (SLURM, torchrun and Lightning's launcher
    signal every process anyway.) Lightning PR #21640 proposes this as a Trainer argument.
    """

    def __init__(self, every_n_steps: PositiveInt = 50) -> None:
        self.every_n_steps = every_n_steps

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        loop = trainer.fit_loop.epoch_loop
        check = getattr(type(loop), "_broadcast_sigterm_tensor", None)  # absent before Lightning 2.5
        if check is None or self.every_n_steps == 1:
            return

        def check_every_n_steps() -> None:
            if loop.batch_progress.total.ready % self.every_n_steps == 0:  # batches fetched so far, on every rank
                check(loop)

        loop._broadcast_sigterm_tensor = check_every_n_steps

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        vars(trainer.fit_loop.epoch_loop).pop("_broadcast_sigterm_tensor", None)  # the class's own method again
