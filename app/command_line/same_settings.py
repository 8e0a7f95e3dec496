"""SameSettings: every node of a job was started with the same settings, checked when the processes meet.

Each node of a cluster gets its own command line (an sbatch script edited on one node, a pod spec, a shell per
host), and nothing in Lightning or torch compares them. Nodes that disagree drift apart in silence (another
learning rate: each node steps its own optimizer on the averaged gradient) or hang until the process-group timeout
(another number of epochs: one node waits in the test while the other trains), or fail in DDP's C++ (another
model). Here the processes compare their settings once, before anything is written: a digest each, and the settings
themselves only when the digests differ.
"""

import hashlib
import json
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from lightning.pytorch import Callback, LightningModule, Trainer

from app.command_line.errors import UserError
from app.run.continuation import changes_between, shown

# Settings that may differ from node to node (docs/multinode.md): paths on a node's own disks, how a node loads its
# data, what it displays, and what its launcher decides. `--config` files are compared by what they set, and
# `--ckpt_path` by the step of the checkpoint it names (`STARTS_FROM`).
PER_NODE = {
    "config": (),
    "ckpt_path": (),
    "data": ("data_dir", "num_workers", "pin_memory"),
    "trainer": ("default_root_dir", "devices", "num_nodes", "enable_progress_bar"),
    "checkpoint": ("dirpath",),
    "last_checkpoint": ("dirpath",),
    "timed_checkpoint": ("dirpath",),
    "predictions": ("path",),
}
COMMAND, STARTS_FROM = "subcommand", "starts_from"  # keys of the settings beside the options
SAID_AS = {f"--{COMMAND}": "the subcommand", f"--{STARTS_FROM}": "the checkpoint of --ckpt_path"}


class SameSettings(Callback):
    """When the processes have met (the first `setup`, before the run's folder is written), compare the settings
    of every process; where they differ, every process raises the same `UserError`, naming each option that differs
    and its value on each node.

    `settings` returns the parsed settings of the command (LightningCLI's config of its subcommand, as a dict),
    with `COMMAND` (what the command runs) and `STARTS_FROM` (the step of the checkpoint it starts from) added.
    """

    def __init__(self, settings: Callable[[], dict[str, Any]]) -> None:
        self.settings = settings
        self.compared = False

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.compared or trainer.world_size == 1 or not dist.is_initialized():
            return
        self.compared = True
        mine = compared_settings(self.settings())
        digests: list[tuple[int, str] | None] = [None] * trainer.world_size
        dist.all_gather_object(digests, (trainer.node_rank, _digest(mine)))
        if len({digest for _node, digest in digests}) == 1:
            return
        everyone: list[tuple[int, dict] | None] = [None] * trainer.world_size
        dist.all_gather_object(everyone, (trainer.node_rank, mine))
        raise UserError(disagreement(dict(everyone)))


def compared_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """`settings` without those that may differ per node (`PER_NODE`)."""
    settings = {key: dict(value) if isinstance(value, dict) else value for key, value in settings.items()}
    for section, keys in PER_NODE.items():
        if not keys:
            settings.pop(section, None)
        for key in keys:
            (settings.get(section) or {}).pop(key, None)
    return settings


def disagreement(settings_of_node: dict[int, dict[str, Any]]) -> str:
    """One line naming each option whose value differs between the nodes, with its value on each node."""
    nodes = sorted(settings_of_node)
    options: dict[str, dict[int, Any]] = {}
    for node in nodes[1:]:
        for change in changes_between(settings_of_node[nodes[0]], settings_of_node[node]):
            options.setdefault(change.option, {nodes[0]: change.before})[node] = change.after
    said = []
    for option, values in options.items():
        by_value: dict[str, list[int]] = {}
        for node in nodes:  # a node that agrees with node `nodes[0]` on this option has its value
            by_value.setdefault(shown(values.get(node, values[nodes[0]])), []).append(node)
        on_nodes = " and ".join(f"{value} on {_nodes(where)}" for value, where in by_value.items())
        said.append(f"{SAID_AS.get(option, option)} is {on_nodes}")
    return (
        f"the nodes were started with different settings: {'; '.join(said)}. Start every node with the same"
        " command line."
    )


def _nodes(numbers: list[int]) -> str:
    return f"node {numbers[0]}" if len(numbers) == 1 else f"nodes {', '.join(map(str, numbers))}"


def _digest(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()
