"""What train.py's command line settles that Lightning leaves open: a whole number of batches read as batches, the
processes a launcher started, and the values Lightning takes unchecked."""

import hashlib
import os
import re
import tempfile
import time
from pathlib import Path

import torch
from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment
from lightning.pytorch import Trainer as LightningTrainer
from lightning.pytorch.accelerators import AcceleratorRegistry
from lightning.pytorch.cli import LightningArgumentParser
from lightning.pytorch.strategies import StrategyRegistry

from app.console import OLDER_VALUES, UserError, options_of, say

# What may differ from node to node (docs/multinode.md): where each node keeps its files, and how it loads them.
# fmt: off
PER_NODE = ("--ckpt_path", "--config", "--trainer.default_root_dir", "--trainer.devices", "--trainer.num_nodes",
            "--trainer.enable_progress_bar", "--data.data_dir", "--data.num_workers", "--data.pin_memory",
            "--checkpoint.dirpath", "--last_checkpoint.dirpath", "--predictions.path")
# fmt: on
PROGRAM = Path(__file__).resolve().parents[1]


class Trainer(LightningTrainer):
    """Lightning's Trainer: a whole number given to a `limit_*_batches` option is a number of batches.

    `limit_*_batches` and `overfit_batches` take a whole number from the command line as a number of batches, as
    `Trainer(limit_val_batches=1)` does (annotated `int | float`, the parser made `--trainer.limit_val_batches 1` the
    fraction 1.0: every batch)."""

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


# What --ckpt_path means here (docs/run-folder.md), in place of Lightning's text for `Trainer.fit(ckpt_path=...)`: to
# fit, and to evaluate (validate, test, predict).
FIT_CKPT_PATH = (
    "The run to continue, in its folder and with its settings: last (the newest run of this --model and"
    " --data.dataset under --trainer.default_root_dir; a new run if there is none), a run's folder"
    " (runs/SeqNet-mnist/version_0), or a checkpoint file (a new run from its weights and step). None: a new run."
)
EVALUATED_CKPT_PATH = (
    "The trained weights (required: what to {}): last (the newest run of this --model and --data.dataset under"
    " --trainer.default_root_dir), a run's folder (runs/SeqNet-mnist/version_0: its checkpoints/last.ckpt), or a"
    " checkpoint file."
)


class Parser(LightningArgumentParser):
    """Lightning's parser, with this program's meaning of each subcommand's --ckpt_path in its help."""

    def add_method_arguments(self, class_type, method_name, *args, skip=None, **kwargs) -> list[str]:
        added = super().add_method_arguments(
            class_type, method_name, *args, skip={*(skip or ()), "ckpt_path"}, **kwargs
        )
        what = FIT_CKPT_PATH if method_name == "fit" else EVALUATED_CKPT_PATH.format(method_name)
        self.add_argument("--ckpt_path", type=str | None, default=None, help=what)
        return [*added, "ckpt_path"]


def launcher_shape(kubeflow: bool = False) -> dict | None:
    """The processes per node and the nodes torchrun, SLURM or a PyTorchJob started (an elastic torchrun job's change
    with each restart), and how many times torchrun restarts a failed job; None where Lightning's launcher starts
    them. `kubeflow`: the Trainer was given Lightning's KubeflowEnvironment (which cannot be detected)."""
    env = os.environ
    if TorchElasticEnvironment.detect():
        devices, restarts = int(env["LOCAL_WORLD_SIZE"]), int(env.get("TORCHELASTIC_MAX_RESTARTS", "0"))
        nodes = int(env["WORLD_SIZE"]) // devices
        return {"launcher": "torchrun", "devices": devices, "num_nodes": nodes, "restarts": restarts}
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
    for name, known in (
        ("accelerator", ("auto", "gpu", *AcceleratorRegistry)),
        ("strategy", ("auto", *StrategyRegistry)),
    ):
        value = trainer.get(name)
        if isinstance(value, str) and value.lower() not in known:  # Lightning reads them in lower case
            older = OLDER_VALUES.get(value.lower())
            shown = sorted(k for k in known if "_find_unused" not in k and "_stage" not in k)  # the variants' bases
            more = " (and their variants)" if len(shown) < len(set(known)) else ""
            today = f"Lightning 1.x's name; today: {older}" if older else "no such name"
            raise UserError(f"--trainer.{name} {value}: {today}. Known: {', '.join(shown)}{more}.")
    nodes, node_rank = trainer.get("num_nodes"), os.environ.get("NODE_RANK", "0")
    if isinstance(nodes, int) and nodes > 0 and node_rank not in map(str, range(nodes)) and launcher_shape() is None:
        raise UserError(
            f"NODE_RANK {node_rank}: each of the --num_nodes {nodes} nodes takes its own NODE_RANK, from 0"
            f" to {nodes - 1}."
        )


def check_writable(option: str, folder: str | Path, how: str = "") -> None:
    """One line saying why `folder`, where `option` (as typed: `--trainer.default_root_dir runs`) writes, cannot be
    made or written, if it cannot, and `how` to do without; nothing is created."""
    folder = Path(folder)
    existing = next(path for path in (folder, *folder.parents) if path.exists() or path == path.parent)
    if not existing.is_dir():
        raise UserError(f"{option}: {existing} is a file, where a folder is needed. Move it, or choose another folder.")
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as error:
        raise UserError(
            f"{option}: cannot write {existing} ({error.strerror})."
            f" {how or 'Choose a folder you can write to'}, or ask its owner to let you."
        ) from error


def cpu_threads() -> str:
    """One thread for a process training alone on the CPU where other work keeps half its cores or more busy (torch's
    thread per core then waits at every operation: 1.9-2x slower, docs/speed.md), unless OMP_NUM_THREADS is set; what
    it has, in words."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    others = 0.0 if "OMP_NUM_THREADS" in os.environ else busy_cores()
    if others < cores / 2:
        return f"{cores} cores"
    os.environ["OMP_NUM_THREADS"] = "1"  # and the processes it starts
    torch.set_num_threads(1)
    return f"{cores} cores, {others:.1f} of them busy with other work: 1 thread"


def busy_cores(seconds: float = 0.1) -> float:
    """How many of the cores this process may use other processes keep busy now: measured from /proc/stat while this
    process sleeps `seconds` (elsewhere the load average, which counts this program's own last run for a minute)."""
    mine = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None

    def times() -> list[list[int]]:  # user nice system idle iowait irq softirq, of each core of ours
        with open("/proc/stat") as stat:
            rows = [line.split() for line in stat if re.match(r"cpu\d", line)]
        return [[int(n) for n in row[1:8]] for row in rows if mine is None or int(row[0][3:]) in mine]

    try:
        before = times()
        time.sleep(seconds)
        spent = [[b - a for a, b in zip(*core, strict=True)] for core in zip(before, times(), strict=True)]
    except (OSError, ValueError):
        return os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    busy = sum(sum(core) - core[3] - core[4] for core in spent)
    return len(spent) * busy / max(sum(sum(core) for core in spent), 1)
