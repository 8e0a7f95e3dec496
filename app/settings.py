"""What train.py's command line settles that Lightning leaves open: a whole number of batches read as batches, the
processes a launcher started, and the values Lightning takes unchecked."""

import hashlib
import os
import tempfile
from pathlib import Path

from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment
from lightning.pytorch import Trainer as LightningTrainer

from app.console import UserError, options_of, say

# What may differ from node to node (docs/multinode.md): where each node keeps its files, and how it loads them.
# fmt: off
PER_NODE = ("--ckpt_path", "--config", "--trainer.default_root_dir", "--trainer.devices", "--trainer.num_nodes",
            "--trainer.enable_progress_bar", "--data.data_dir", "--data.num_workers", "--data.pin_memory",
            "--checkpoint.dirpath", "--last_checkpoint.dirpath", "--predictions.path")
# fmt: on
PROGRAM = Path(__file__).resolve().parents[1]


class Trainer(LightningTrainer):
    """Lightning's Trainer, whose `limit_*_batches` and `overfit_batches` take a whole number from the command line
    as a number of batches, as `Trainer(limit_val_batches=1)` does (annotated `int | float`, the parser made
    `--trainer.limit_val_batches 1` the fraction 1.0: every batch)."""

    def __init__(
        self,
        *args,
        limit_train_batches: int | float | None = None,
        limit_val_batches: int | float | None = None,
        limit_test_batches: int | float | None = None,
        limit_predict_batches: int | float | None = None,
        overfit_batches: int | float = 0.0,
        **kwargs,
    ) -> None:
        limits = {
            "limit_train_batches": limit_train_batches,
            "limit_val_batches": limit_val_batches,
            "limit_test_batches": limit_test_batches,
            "limit_predict_batches": limit_predict_batches,
        }
        super().__init__(*args, **limits, overfit_batches=overfit_batches, **kwargs)


def launcher_shape(kubeflow: bool = False) -> dict | None:
    """The processes per node and the nodes torchrun, SLURM or a PyTorchJob started (an elastic torchrun job's change
    with each restart), and how many times torchrun restarts a failed job; None where Lightning's launcher starts
    them. `kubeflow`: the Trainer was given Lightning's KubeflowEnvironment (which cannot be detected)."""
    env = os.environ
    if TorchElasticEnvironment.detect():
        devices = int(env["LOCAL_WORLD_SIZE"])
        restarts = int(env.get("TORCHELASTIC_MAX_RESTARTS", "0"))
        return {
            "launcher": "torchrun",
            "devices": devices,
            "num_nodes": int(env["WORLD_SIZE"]) // devices,
            "restarts": restarts,
        }
    if SLURMEnvironment.detect():
        nodes = int(env.get("SLURM_NNODES", env.get("SLURM_JOB_NUM_NODES", "1")))
        devices = int(str(env.get("SLURM_NTASKS_PER_NODE", int(env["SLURM_NTASKS"]) // nodes)).split("(")[0])
        return {"launcher": "SLURM", "devices": devices, "num_nodes": nodes, "restarts": 0}
    if kubeflow:  # a PyTorchJob: one process a pod
        return {"launcher": "the PyTorchJob", "devices": 1, "num_nodes": int(env["WORLD_SIZE"]), "restarts": 0}
    return None


def shared(settings: dict, subcommand: str, starts_from: object) -> dict:
    """What every node of a job must agree on: the command's `settings` but where each node keeps and loads its files
    (`PER_NODE`), the subcommand, the program's own code, and the checkpoint it starts from."""
    program = hashlib.sha256()
    for path in sorted(p for folder in ("app", "models", "datamodules") for p in (PROGRAM / folder).rglob("*.py")):
        program.update(path.read_bytes())
    program.update((PROGRAM / "train.py").read_bytes())
    options = {key: value for key, value in options_of(settings).items() if not key.startswith(PER_NODE)}
    return {**options, "--subcommand": subcommand, "--program": program.hexdigest()[:12], "--starts_from": starts_from}


def settle_shape(trainer, stop, kubeflow: bool) -> None:
    """Under torchrun, SLURM or a PyTorchJob, the Trainer's `devices` and `num_nodes` are what the launcher started
    (said where the command gave others: an elastic job's change with each restart), and a job torchrun restarts
    saves last.ckpt every minute (unless `stop.save_every_s` is given)."""
    shape = launcher_shape(kubeflow)
    if shape is None:
        return
    given = {key: trainer[key] for key in ("devices", "num_nodes")}
    if any(str(given[key]) not in ("auto", "-1", "1", str(shape[key])) for key in given):
        say(
            f"{shape['launcher']} started {shape['num_nodes']} node(s) x {shape['devices']} process(es): training on"
            f" those, not --devices {given['devices']} --num_nodes {given['num_nodes']}."
        )
    trainer.devices, trainer.num_nodes = shape["devices"], shape["num_nodes"]
    if shape["restarts"] and stop.save_every_s is None:
        stop.save_every_s = 60.0


def check(trainer: dict, seed: object) -> None:
    """Refuse in one line what Lightning would take and fail on later, with a traceback: a count it divides by, a
    seed out of NumPy's range, a NODE_RANK outside the job."""
    for name in ("accumulate_grad_batches", "check_val_every_n_epoch", "val_check_interval"):
        value = trainer.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value < 1:
            raise UserError(f"--trainer.{name} {value}: must be 1 or more. Give --trainer.{name} another value.")
    if isinstance(seed, int) and not isinstance(seed, bool) and not 0 <= seed < 2**32:
        raise UserError(f"--seed_everything {seed}: must be from 0 to {2**32 - 1}. Give another value.")
    nodes, node_rank = trainer.get("num_nodes"), os.environ.get("NODE_RANK", "0")
    if isinstance(nodes, int) and nodes > 0 and node_rank not in map(str, range(nodes)) and launcher_shape() is None:
        raise UserError(
            f"NODE_RANK {node_rank}: each of the --num_nodes {nodes} nodes takes its own NODE_RANK, from 0"
            f" to {nodes - 1}."
        )


def check_writable(option: str, folder: Path) -> None:
    """One line saying why `folder` cannot be made or written, if it cannot; nothing is created."""
    existing = next(path for path in (folder, *folder.parents) if path.exists() or path == path.parent)
    try:
        if not existing.is_dir():
            raise NotADirectoryError(20, "a file stands where a folder is needed", str(existing))
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise UserError(
            f"{option} {folder}: cannot write {existing} ({error.strerror}). Choose a folder you can write"
            " to, or ask its owner to let you."
        ) from error
