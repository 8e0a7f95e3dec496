"""The processes per node and the nodes that a launcher started, so that `--devices` and `--num_nodes` can be left out.

Under torchrun, SLURM or Kubeflow's PyTorchJob the launcher, not train.py, starts every process, and Lightning only
checks that `devices x num_nodes` matches what it finds. Under an elastic torchrun job (`--nnodes MIN:MAX`) the
number of nodes is not known when the command is written, and changes when a node is lost or joins: there the
launcher's figures win over the command line's, and a line says so. Lightning never closed that gap itself (its
issues #9063 and #10180).
"""

import os
from dataclasses import dataclass
from pathlib import Path

from lightning.fabric.plugins.environments import (
    ClusterEnvironment,
    KubeflowEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from lightning.pytorch.utilities import rank_zero_info

from app.errors import UserError

# In a job the launcher restarts, last.ckpt is also saved every minute of training (at the first fault guard check
# after it: `--fault_guard.checkpoint_every_s`): what a lost node or process costs, at most.
RESTARTABLE_CHECKPOINT_EVERY_S = 60.0


@dataclass(frozen=True)
class LauncherShape:
    """What a launcher started: the processes per node and the nodes, and whether it restarts the job."""

    launcher: str  # as a user names it: "torchrun", "SLURM", "the PyTorchJob"
    devices: int  # processes per node
    num_nodes: int
    elastic: str | None = None  # torchrun's `--nnodes MIN:MAX` when MIN < MAX, else None
    restarts: int = 0  # how many times the launcher restarts a failed job (torchrun's --max-restarts)

    @property
    def restartable(self) -> bool:
        """Whether a failed job starts again, from its checkpoint (an elastic job with no restarts ends at a loss)."""
        return self.restarts > 0

    def describe(self) -> str:
        elastic = f" (an elastic job, --nnodes {self.elastic})" if self.elastic else ""
        return f"{self.launcher} started {self.num_nodes} node(s) x {self.devices} process(es){elastic}"

    def settle(self, devices: object, num_nodes: object) -> dict[str, object]:
        """The Trainer's `devices` and `num_nodes` for the command's: the launcher's where the command leaves them
        out (`auto`, -1, 1: the Trainer's defaults), and under an elastic job where it gives others (said in a
        line). Under a fixed launch, others are a mistake, said in one line."""
        command = {"devices": _number(devices), "num_nodes": _number(num_nodes)}
        started = {"devices": self.devices, "num_nodes": self.num_nodes}
        left_out = {"devices": ("auto", -1, None), "num_nodes": (1, None)}
        given = {name: value for name, value in command.items() if value not in left_out[name]}
        if any(not isinstance(value, int) for value in given.values()):  # GPU indices: Lightning's to check
            return {"devices": devices, "num_nodes": num_nodes}
        different = {name: value for name, value in given.items() if value != started[name]}
        options = " ".join(f"--{name} {value}" for name, value in different.items())
        if different and not self.elastic:
            raise UserError(
                f"{options}: {self.describe()}. Leave --devices and --num_nodes out (the launcher's are used), or"
                " make them match it."
            )
        if different:
            rank_zero_info(f"{self.describe()}: training on those, not {options}.")
        return started

    def checkpoint_every_s(self, given: float | None) -> float | None:
        """`--fault_guard.checkpoint_every_s` in this job: every minute in one the launcher restarts, unless given."""
        return RESTARTABLE_CHECKPOINT_EVERY_S if given is None and self.restartable else given


def _number(value: object) -> object:
    """`'2'` as 2: jsonargparse gives `--devices 2` as a string (the Trainer takes GPU indices such as `'0,1'` too)."""
    return int(value) if isinstance(value, str) and value.lstrip("-").isdigit() else value


def launcher_shape(environment: ClusterEnvironment | None) -> LauncherShape | None:
    """The shape of the job that `environment` (the one the Trainer will use: given with `--trainer.plugins`, or
    the one Lightning detects) started, or None where train.py or Lightning's launcher start the processes."""
    env = os.environ
    if isinstance(environment, TorchElasticEnvironment) or (environment is None and TorchElasticEnvironment.detect()):
        devices, world_size = int(env["LOCAL_WORLD_SIZE"]), int(env["WORLD_SIZE"])
        nodes = int(env.get("GROUP_WORLD_SIZE", world_size // devices))
        if devices * nodes != world_size:  # Lightning would advise --devices and --num_nodes, which are not the cause
            raise UserError(
                f"torchrun started {devices} process(es) on this node but {world_size} on its {nodes} nodes: give"
                " every node the same --nproc-per-node."
            )
        restarts = int(env.get("TORCHELASTIC_MAX_RESTARTS", "0"))
        return LauncherShape("torchrun", devices, nodes, elastic=_elastic_nnodes(), restarts=restarts)
    if isinstance(environment, SLURMEnvironment) or (environment is None and SLURMEnvironment.detect()):
        nodes = int(env.get("SLURM_NNODES", env.get("SLURM_JOB_NUM_NODES", "1")))
        devices = int(env.get("SLURM_NTASKS_PER_NODE", int(env["SLURM_NTASKS"]) // nodes))
        return LauncherShape("SLURM", devices, nodes)
    if isinstance(environment, KubeflowEnvironment):  # one process per pod, as Lightning's environment reads them
        return LauncherShape("the PyTorchJob", 1, int(env["WORLD_SIZE"]))
    return None


def _elastic_nnodes() -> str | None:
    """torchrun's `--nnodes` when it is a range of sizes (`1:4`), from its own command line (this process's
    parent: torchrun passes the range on to no variable of its workers) or the PET_NNODES variable it reads."""
    nnodes = os.environ.get("PET_NNODES")
    try:
        args = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().decode().split("\0")
    except OSError:  # not Linux: PET_NNODES alone
        args = []
    for index, arg in enumerate(args):
        if arg == "--nnodes" and index + 1 < len(args):
            nnodes = args[index + 1]
        elif arg.startswith("--nnodes="):
            nnodes = arg.partition("=")[2]
    low, colon, high = (nnodes or "").partition(":")
    return nnodes if colon and low != high else None
