"""A run continued from a checkpoint trains with the command's plan: its optimizer, its settings, its schedule.

Lightning restores the optimizer and the schedulers exactly as saved, which is wrong for any change of plan (an
extended one-cycle schedule fails, another optimizer gets the old one's state, a new learning rate is replaced). What
happens instead, per case: docs/run-folder.md. Every rank does the same on its own: no collective."""

import math
import warnings

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from torch.optim import Optimizer
from torch.optim.lr_scheduler import OneCycleLR

# Keys that a learning-rate scheduler writes into an optimizer's parameter groups, beside the optimizer's own.
SCHEDULE_KEYS = {"lr", "initial_lr", "max_lr", "min_lr", "base_momentum", "max_momentum", "momentum", "betas"}
PLAN = ("optimizer", "lr_scheduler", "one_cycle")  # the model's settings that make the optimizer and its schedule


class ReplanOnResume(Callback):
    """Continue a checkpoint's training with the optimizer settings and learning-rate schedule of the command."""

    def __init__(self) -> None:
        self.checkpoint: dict | None = None  # the checkpoint being restored, until training starts
        self.fresh_groups: list[list[dict]] = []  # the optimizers' settings as the command makes them
        self.restarted: list[bool] = []  # per optimizer: its state did not fit, it starts afresh
        self.planned_before: list[int | None] = []  # per saved scheduler: the steps a one-cycle one planned for
        self.keep_schedulers = True  # neither the optimizer nor its schedule changed: Lightning's restore stands
        self.batches_done = 0  # of the epoch the run continues inside, before it stopped
        self.said: list[str] = []  # what changed, said at the first batch
        self.first_batch = False  # the next batch is the first after the checkpoint

    def on_load_checkpoint(self, trainer: Trainer, pl_module: LightningModule, checkpoint: dict) -> None:
        # Before the optimizers exist; Lightning loads their states from this same dictionary after `on_fit_start`.
        self.checkpoint = checkpoint

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """The optimizers and schedulers are the command's here, not yet given the checkpoint's states."""
        if self.checkpoint is None:
            return
        # `estimated_stepping_batches` built the loader before the checkpoint was read; Lightning (2.6) restores its
        # position only when it builds it: forgotten here, it is built again, position included.
        trainer.fit_loop._combined_loader = None
        saved_optimizers = self.checkpoint.get("optimizer_states", [])
        saved_schedulers = self.checkpoint.get("lr_schedulers", [])
        self.fresh_groups = [[_without_params(group) for group in o.param_groups] for o in trainer.optimizers]
        self.restarted = [
            not _state_fits(optimizer, saved)
            for optimizer, saved in zip(trainer.optimizers, saved_optimizers, strict=False)
        ]
        for index, restart in enumerate(self.restarted):
            if restart:  # the optimizer loads its own empty state: it starts afresh
                saved_optimizers[index] = trainer.optimizers[index].state_dict()
        self.planned_before = [saved.get("total_steps") for saved in saved_schedulers]
        plan_changed = _plan_of(self.checkpoint.get("hyper_parameters", {})) != _plan_of(pl_module.hparams)
        plan_changed |= len(saved_schedulers) != len(trainer.lr_scheduler_configs)  # a one-cycle schedule, or none
        self.keep_schedulers = not plan_changed and not any(self.restarted)
        for index, config in enumerate(trainer.lr_scheduler_configs[: len(saved_schedulers)]):
            if isinstance(config.scheduler, OneCycleLR) or not self.keep_schedulers:
                saved_schedulers[index] = config.scheduler.state_dict()  # planned again in `on_train_start`

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        """The checkpoint's states are loaded: give the optimizers the command's settings, note the epoch's position."""
        if self.checkpoint is None:
            return
        saved_epoch, self.checkpoint = self.checkpoint.get("epoch"), None  # its tensors are in the optimizers now
        inside = trainer.current_epoch == saved_epoch  # else it was saved at an epoch's end: the next one starts
        self.batches_done = trainer.fit_loop.epoch_loop.batch_progress.current.ready if inside else 0
        cycles = [isinstance(config.scheduler, OneCycleLR) for config in trainer.lr_scheduler_configs]
        self.said = self._give_the_commands_settings(trainer) if not self.keep_schedulers or any(cycles) else []
        self.first_batch = True

    def on_train_batch_start(self, trainer: Trainer, pl_module: LightningModule, batch, batch_idx: int) -> None:
        """Before the first step: plan the schedule (the sampler knows now what is left of the epoch), bring it to the
        run's step, and say what changed."""
        if not self.first_batch:
            return
        self.first_batch, step, said = False, trainer.global_step, self.said
        for index, config in enumerate(trainer.lr_scheduler_configs):
            if _planned_over_the_run(config.scheduler, pl_module, trainer):
                config.scheduler = _one_cycle_over(config.scheduler, steps_in_the_run(trainer, self.batches_done))
            scheduler = config.scheduler
            before = self.planned_before[index] if index < len(self.planned_before) else None
            if isinstance(scheduler, OneCycleLR) and step <= scheduler.total_steps:
                _bring_to_step(scheduler, step)
                if before != scheduler.total_steps or not self.keep_schedulers:
                    peak = scheduler.optimizer.param_groups[0]["max_lr"]
                    said.append(
                        f"the one-cycle schedule is planned over {scheduler.total_steps} steps"
                        f"{f' (it was {before})' if before else ''}, from here, peaking at learning rate {peak:g}"
                    )
            elif not self.keep_schedulers and not isinstance(scheduler, OneCycleLR):
                said.append(f"{type(scheduler).__name__} starts from its beginning")
        if not trainer.lr_scheduler_configs and len(self.planned_before) > 0:
            lr = trainer.optimizers[0].param_groups[0]["lr"]
            said.append(f"no learning-rate schedule from here: the rate stays at {lr:g}")
        if said:
            rank_zero_info(f"Continuing at step {step}: {'; '.join(said)}; the weights continue.")

    def _give_the_commands_settings(self, trainer: Trainer) -> list[str]:
        """Every parameter group takes the command's settings (and loses what an old schedule wrote there)."""
        changed, scheduled = False, bool(trainer.lr_scheduler_configs)
        for optimizer, fresh_groups in zip(trainer.optimizers, self.fresh_groups, strict=True):
            for group, fresh in zip(optimizer.param_groups, fresh_groups, strict=True):
                changed |= _settings(group, scheduled) != _settings(fresh, scheduled)
                for key in set(group) - set(fresh) - {"params"}:
                    del group[key]
                group.update(fresh)
        name = type(trainer.optimizers[0]).__name__
        if any(self.restarted):
            return [f"{name} starts afresh (the checkpoint's state does not fit it)"]
        return [f"{name} keeps its state and takes the command's settings"] if changed else []


def _state_fits(optimizer: Optimizer, saved: dict) -> bool:
    """Whether `saved` is the state of the same algorithm over as many parameters: the same settings by name and the
    same switches (`amsgrad` adds a moment to the state, `fused` keeps its step counts elsewhere)."""
    groups = saved.get("param_groups", [])
    if len(groups) != len(optimizer.param_groups):
        return False
    return all(
        len(group["params"]) == len(old["params"])
        and _settings(group).keys() == _settings(old).keys()
        and _switches(group) == _switches(old)
        for group, old in zip(optimizer.param_groups, groups, strict=True)
    )


def _settings(group: dict, scheduled: bool = True) -> dict:
    """A parameter group's optimizer settings, without what a scheduler writes there."""
    left_out = SCHEDULE_KEYS if scheduled else SCHEDULE_KEYS - {"lr", "momentum", "betas"}
    return {key: value for key, value in group.items() if key != "params" and key not in left_out}


def _switches(group: dict) -> dict:
    return {key: value for key, value in _settings(group).items() if value is None or isinstance(value, bool | str)}


def _without_params(group: dict) -> dict:
    return {key: value for key, value in group.items() if key != "params"}


def _plan_of(hparams) -> dict:
    return {key: hparams.get(key) for key in PLAN}


def _planned_over_the_run(scheduler: object, pl_module: LightningModule, trainer: Trainer) -> bool:
    """The one-cycle schedule that the model plans over the whole run (`--model.one_cycle`, models/base.py)."""
    own = pl_module.hparams.get("one_cycle") and pl_module.hparams.get("lr_scheduler") is None
    planned = trainer.estimated_stepping_batches
    return bool(own) and isinstance(scheduler, OneCycleLR) and scheduler.total_steps == planned


def steps_in_the_run(trainer: Trainer, batches_done: int) -> float:
    """The optimizer steps of the whole run: those taken, and those left now. (Lightning's `estimated_stepping_batches`
    counts every epoch at today's batch size; the sampler knows what is left of the current epoch.)"""
    accumulated, loader = trainer.accumulate_grad_batches, trainer.train_dataloader
    counted = trainer.num_training_batches - batches_done  # as Lightning counts the batches of the epoch
    if hasattr(loader.sampler, "indices_in_pass"):
        batches = math.ceil(loader.sampler.indices_in_pass() / loader.batch_size)
        whole = isinstance(trainer.limit_train_batches, float) and trainer.limit_train_batches == 1.0  # 1: one batch
        batches = batches if whole else min(batches, counted)
    else:
        batches = counted
    # Lightning steps after every `accumulated` batches of the epoch, counted from its first, and after its last
    ends = batches_done + batches
    this_epoch = ends // accumulated - batches_done // accumulated + (ends % accumulated != 0) if batches else 0
    per_epoch = math.ceil(trainer.num_training_batches / accumulated)
    later_epochs = (trainer.max_epochs - trainer.current_epoch - 1) * per_epoch
    by_epochs = trainer.global_step + this_epoch + later_epochs
    by_epochs = by_epochs if trainer.max_epochs not in (None, -1) else math.inf
    return min(by_epochs, trainer.max_steps if trainer.max_steps != -1 else math.inf)


def _one_cycle_over(scheduler: OneCycleLR, total: float) -> OneCycleLR:
    """The model's one-cycle schedule, planned over `total` steps instead (as models/base.py makes it)."""
    if not math.isfinite(total) or total == scheduler.total_steps:
        return scheduler
    peaks = [group["max_lr"] for group in scheduler.optimizer.param_groups]
    cycle_momentum = scheduler.cycle_momentum
    return OneCycleLR(scheduler.optimizer, max_lr=peaks, total_steps=int(total), cycle_momentum=cycle_momentum)


def _bring_to_step(scheduler: OneCycleLR, step: int) -> None:
    """Set the learning rate (and momentum) of `step` in a one-cycle schedule just made."""
    scheduler.last_epoch = step - 1
    with warnings.catch_warnings():  # torch warns of a scheduler stepped before its optimizer: here on purpose
        warnings.simplefilter("ignore", UserWarning)
        scheduler.step()
