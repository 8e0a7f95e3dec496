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


@dataclass(frozen=True)
class LauncherShape:
    launcher: str  # as a user names it: "torchrun", "SLURM", "the PyTorchJob"
    devices: int  # processes per node
    num_nodes: int
    elastic: str | None = None  # torchrun's `--nnodes MIN:MAX` when MIN < MAX, else None
    restarts: int = 0  # how many times the launcher restarts a failed job (torchrun's --max-restarts)

    @property
    def restartable(self) -> bool:
        """Whether the job may start again from its checkpoint, on the same or another number of nodes."""
        return self.elastic is not None or self.restarts > 0

    def settle(self, devices: object, num_nodes: object) -> dict[str, object]:
        """The Trainer's `devices` and `num_nodes` for the command's: the launcher's where the command leaves them
        out (`auto`, 1: the Trainer's defaults), and under an elastic job where it gives others (said in a line).
        Elsewhere a difference stays, for Lightning's check to refuse in one line."""
        command = {"devices": devices, "num_nodes": num_nodes}
        started = {"devices": self.devices, "num_nodes": self.num_nodes}
        left_out = {"devices": ("auto", None), "num_nodes": (1, None)}
        given = {name: value for name, value in command.items() if value not in left_out[name]}
        if any(not isinstance(value, int) for value in given.values()):  # GPU indices: Lightning's to check
            return command
        different = {name: value for name, value in given.items() if value != started[name]}
        if different and not self.elastic:
            return {**started, **different}
        if different:
            options = ", ".join(f"--{name} {value}" for name, value in different.items())
            elastic = f" (an elastic job, --nnodes {self.elastic})"
            rank_zero_info(
                f"{self.launcher} started {self.num_nodes} node(s) x {self.devices} process(es){elastic}: training"
                f" on those, not {options}."
            )
        return started


def launcher_shape(environment: ClusterEnvironment | None) -> LauncherShape | None:
    """The shape of the job that `environment` (the one the Trainer will use: given with `--trainer.plugins`, or
    the one Lightning detects) started, or None where train.py or Lightning's launcher start the processes."""
    env = os.environ
    if isinstance(environment, TorchElasticEnvironment) or (environment is None and TorchElasticEnvironment.detect()):
        devices = int(env["LOCAL_WORLD_SIZE"])
        nodes = int(env.get("GROUP_WORLD_SIZE", int(env["WORLD_SIZE"]) // devices))
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
