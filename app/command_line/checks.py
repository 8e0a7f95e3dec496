"""Checks before the processes meet, said by one process of each node (Lightning finds most of these only after
they have met, with a traceback from every process, or after training for a folder it cannot write)."""

import errno
import os
import tempfile
from pathlib import Path

import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException
from lightning.pytorch import Callback, LightningDataModule, Trainer
from lightning.pytorch.accelerators import AcceleratorRegistry, CPUAccelerator, CUDAAccelerator, MPSAccelerator

from app.errors import UserError


def check_launcher(trainer: Trainer) -> None:
    """Stop when the launcher (torchrun, SLURM) started other processes than --devices x --num_nodes asks for."""
    environment = getattr(trainer.strategy, "cluster_environment", None)
    if environment is None:
        return
    try:
        environment.validate_settings(num_devices=trainer.num_devices, num_nodes=trainer.num_nodes)
    except ValueError as error:
        raise MisconfigurationException(f"{error} Make --devices and --num_nodes match the launcher.") from error


def check_node_rank(num_nodes: object) -> None:
    """Where no launcher sets the ranks, NODE_RANK is one of 0 .. --num_nodes - 1 (else "a bug": int()'s ValueError
    or gloo's "rank < size", while node 0 waits for the node to come). Below 1 node: Lightning refuses."""
    node_rank = os.environ.get("NODE_RANK", "0")
    if isinstance(num_nodes, int) and num_nodes > 0 and node_rank not in map(str, range(num_nodes)):
        raise UserError(
            f"NODE_RANK {node_rank}: each of the --num_nodes {num_nodes} nodes takes its own NODE_RANK, from 0 to"
            f" {num_nodes - 1}."
        )


HARDWARE = {"gpu": "GPU", "cuda": "CUDA GPU", "mps": "Apple GPU (MPS)", "tpu": "TPU"}


def check_accelerator(accelerator: object) -> None:
    """Stop first thing when `--trainer.accelerator` names hardware this machine does not have (Lightning finds it
    after "Seed set to 42", with no word of what to do); classes and other names are left to Lightning."""
    name = accelerator.lower() if isinstance(accelerator, str) else None
    if name == "gpu":
        available = CUDAAccelerator.is_available() or MPSAccelerator.is_available()
    elif name in HARDWARE and name in AcceleratorRegistry:
        available = AcceleratorRegistry[name]["accelerator"].is_available()
    else:
        return
    if not available:
        build = " (this torch is a CPU-only build)" if name in ("gpu", "cuda") and not torch.version.cuda else ""
        raise UserError(
            f"--trainer.accelerator {accelerator}: this machine has no {HARDWARE[name]} that torch can use{build}."
            " Leave --trainer.accelerator out (Lightning then uses what there is) or give cpu."
        )


# Trainer arguments that Lightning divides by without checking them first: 0 would end in a ZeroDivisionError (a
# whole number of `val_check_interval` counts batches; a fraction of an epoch, 0.25, is Lightning's to check).
COUNTS = ("accumulate_grad_batches", "check_val_every_n_epoch", "val_check_interval")


def check_counts(values: dict[str, object]) -> None:
    """Refuse a count below 1 (`--trainer.check_val_every_n_epoch 0`) where it enters, by the option's name."""
    for option, value in values.items():
        if isinstance(value, int) and value < 1:
            fraction = ", or a fraction of an epoch such as 0.25" if option.endswith("val_check_interval") else ""
            raise UserError(f"{option} {value}: must be 1 or more{fraction}. Give {option} another value.")


def check_callback_states(callbacks: list[Callback], options: dict[int, str]) -> None:
    """Refuse two callbacks that keep their state under one key (a ModelCheckpoint of the user's with the settings of
    `--last_checkpoint`): Lightning refuses them as the Trainer is built, with a RuntimeError ("a bug"). `options`
    names this program's callbacks by their option (`--last_checkpoint`); the others are `--trainer.callbacks`'."""
    seen: dict[str, Callback] = {}
    for callback in callbacks:
        if type(callback).state_dict is Callback.state_dict:  # it keeps no state
            continue
        first = seen.setdefault(callback.state_key, callback)
        if first is not callback:
            named = [options.get(id(c), f"--trainer.callbacks {type(c).__name__}") for c in (callback, first)]
            named.sort(key=lambda name: not name.startswith("--trainer.callbacks"))  # the user's first
            settings = callback.state_key.removeprefix(type(callback).__qualname__)
            raise UserError(
                f"{named[0]} has the settings of {named[1]} ({settings}), and Lightning cannot keep the state of both"
                " in a checkpoint: give one of them other settings, or leave it out."
            )


SEEDS = (0, 2**32 - 1)  # what NumPy, and so Lightning's seed_everything, takes


def check_seed(seed: object) -> None:
    """Refuse a seed that Lightning's `seed_everything` would refuse after printing its first lines."""
    if isinstance(seed, int) and not isinstance(seed, bool) and not SEEDS[0] <= seed <= SEEDS[1]:
        raise UserError(
            f"--seed_everything {seed}: must be from {SEEDS[0]} to {SEEDS[1]}. Give --seed_everything another value."
        )


def check_sync_batchnorm(trainer: Trainer, sync_batchnorm: bool) -> None:
    if sync_batchnorm and isinstance(trainer.accelerator, CPUAccelerator):
        raise MisconfigurationException(
            "--trainer.sync_batchnorm true needs GPUs: torch's SyncBatchNorm has no CPU implementation. On CPU,"
            " leave it off (each process then normalises with its own batch statistics)."
        )


def check_writable(option: str, folder: str | Path) -> None:
    """Say in one line why `folder` cannot be written, if it cannot, creating nothing: the nearest folder that
    exists takes a nameless file (gone when closed)."""
    folder = Path(folder)
    try:
        existing = next(path for path in (folder, *folder.parents) if path.exists())
        if not existing.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(existing))
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        reason = error.strerror or type(error).__name__
        if isinstance(error, (FileExistsError, NotADirectoryError)):
            reason = f"{reason}: a file stands where a folder is needed"
        raise UserError(
            f"{option} {folder}: cannot write there ({reason}). Choose a folder you can write to."
        ) from error


def check_data(trainer: Trainer, datamodule: LightningDataModule, stages: tuple[str, ...]) -> None:
    """Download and decode the data now, before the processes meet, on local rank 0 (as `prepare_data` runs): a bad
    file is one message from one process; the others load the data in `setup`, after Lightning's barrier."""
    if trainer.local_rank != 0:
        return
    if getattr(datamodule, "reads_the_dataset", lambda predicting: True)(predicting=stages == ("predict",)):
        datamodule.prepare_data()
    for stage in stages:
        datamodule.setup(stage)
