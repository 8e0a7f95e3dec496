"""Every node of a job runs with the same settings, checked when the processes meet (docs/multinode.md): nodes that
disagree would drift apart in silence, hang, or fail in DDP's C++."""

import hashlib
import json
from pathlib import Path
from typing import Any

import torch.distributed as dist

from app.errors import UserError
from app.run.continuation import differences, shown

# Settings that may differ from node to node (docs/multinode.md); `--config` files are compared by what they set,
# and `--ckpt_path` by the step of its checkpoint (`STARTS_FROM`).
PER_NODE = {
    "config": (),
    "ckpt_path": (),
    "weights_only": (),
    "data": ("data_dir", "num_workers", "pin_memory"),
    "trainer": ("default_root_dir", "devices", "num_nodes", "enable_progress_bar"),
    "checkpoint": ("dirpath",),
    "last_checkpoint": ("dirpath",),
    "timed_checkpoint": ("dirpath",),
    "predictions": ("path",),
}
COMMAND, STARTS_FROM, PROGRAM = "subcommand", "starts_from", "program"  # keys of the settings beside the options
SAID_AS = {
    f"--{COMMAND}": "the subcommand",
    f"--{STARTS_FROM}": "the checkpoint of --ckpt_path",
    f"--{PROGRAM}": "the program's code (a digest of train.py, app/, models/ and datamodules/)",
}
ROOT = Path(__file__).resolve().parents[2]  # the repository (or where the package is installed)


def same_settings_everywhere(settings: dict[str, Any], node_rank: int) -> None:
    """Raise the same `UserError` in every process where their `settings` differ beyond `PER_NODE`: one collective
    where they agree, two where they differ, reached by every process alike."""
    mine = compared_settings(settings)
    digests: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(digests, (node_rank, _digest(mine)))
    if len({digest for _node, digest in digests}) == 1:
        return
    everyone: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    by_node = all(len({d for n, d in digests if n == node}) == 1 for node, _ in digests)  # nodes agree inside
    if by_node:
        raise UserError(disagreement({node: everyone[rank] for rank, (node, _digest_) in enumerate(digests)}, "node"))
    raise UserError(disagreement(dict(enumerate(everyone)), "global rank"))


def compared_settings(settings: dict[str, Any]) -> dict[str, Any]:
    """`settings` without those that may differ per node (`PER_NODE`)."""
    settings = {key: dict(value) if isinstance(value, dict) else value for key, value in settings.items()}
    for section, keys in PER_NODE.items():
        if not keys:
            settings.pop(section, None)
        for key in keys:
            (settings.get(section) or {}).pop(key, None)
    return settings


def disagreement(settings_of: dict[int, dict[str, Any]], who: str = "node") -> str:
    """One line naming each option that differs between the nodes (or processes: `who`), with its value on each."""
    names = sorted(settings_of)
    first = settings_of[names[0]]
    values: dict[str, dict[int, Any]] = {}
    for name in names[1:]:
        for change in differences(first, settings_of[name]):
            values.setdefault(change.option, {names[0]: change.before})[name] = change.after
    if values.keys() & {f"--{COMMAND}", f"--{STARTS_FROM}"}:  # they change other settings with them: said alone
        values = {option: differing for option, differing in values.items() if option in SAID_AS}
    said = []
    for option, differing in values.items():
        value_of = {name: differing.get(name, differing[names[0]]) for name in names}  # the others agree with the first
        as_shown = {name: shown(value) for name, value in value_of.items()}
        if len(set(as_shown.values())) == 1:  # `shown` names classes only: their arguments differ
            as_shown = {name: json.dumps(value, sort_keys=True) for name, value in value_of.items()}
        where: dict[str, list[int]] = {}
        for name in names:
            where.setdefault(as_shown[name], []).append(name)
        on = " and ".join(f"{value} on {_them(who, numbers)}" for value, numbers in where.items())
        said.append(f"{SAID_AS.get(option, option)} is {on}")
    same = "version of the program and the same command line" if f"--{PROGRAM}" in values else "command line"
    return f"the nodes were started with different settings: {'; '.join(said)}. Start every node with the same {same}."


def program_digest(root: Path = ROOT) -> str:
    """A digest of the program's own code: nodes that run other versions of it (another model's layers, another
    sampler) drift apart in silence, or fail in DDP's C++ with "a bug"."""
    files = [
        root / "train.py",
        *(path for folder in ("app", "models", "datamodules") for path in (root / folder).rglob("*.py")),
    ]
    digest = hashlib.sha256()
    for path in sorted(file for file in files if file.is_file()):
        digest.update(f"{path.relative_to(root)}\n".encode() + path.read_bytes())
    return digest.hexdigest()[:12]


def _them(who: str, numbers: list[int]) -> str:
    return f"{who} {numbers[0]}" if len(numbers) == 1 else f"{who}s {', '.join(map(str, numbers))}"


def _digest(settings: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()
