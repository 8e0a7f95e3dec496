"""RendezvousDDPStrategy: Lightning's DDP, whose processes say what they wait for when a node does not come, end at
once on Ctrl-C while they wait, and agree on their settings before anything is written."""

import ctypes
import fcntl
import hashlib
import json
import os
import signal
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch.distributed as dist
from lightning.fabric.plugins.environments import TorchElasticEnvironment
from lightning.pytorch.strategies import DDPStrategy
from typing_extensions import override

from app.console import UserError, options_of

ARRIVED = "rendezvous/node/"  # a key per node in the job's store, once one of its processes is there
SAID_AS = {
    "--subcommand": "the subcommand",
    "--program": "the program's code (train.py, app/, models/, datamodules/)",
    "--starts_from": "the checkpoint of --ckpt_path",
}


class RendezvousDDPStrategy(DDPStrategy):
    """Lightning's `DDPStrategy`, with what the processes of a job do while they meet.

    Args:
        agree_on: Settings every process of the job must share (a command line's, say). Once the processes have met,
            they compare one digest of them (one `all_gather`); where it differs, they exchange the settings and
            end, each with the same `UserError` naming every setting that differs, node by node.
        notice_after_s: While the first process of a node waits to meet nodes that are not there (none of their
            processes has reached the job's store), it says so after this many seconds, then every minute. Processes
            that are still starting on a node that is there are no missing node: nothing is said.
        *args, **kwargs: `DDPStrategy`'s.

    While the processes meet, Ctrl-C ends the process at once, by SIGINT's own action (nothing is written yet), where
    Python would wait for the meeting's C code to return, up to the process-group timeout. A process that a launcher
    started (Lightning's, torchrun) dies with it. With several nodes and neither GLOO_SOCKET_IFNAME nor
    NCCL_SOCKET_IFNAME set, both name the interface that reaches the first node (gloo's default, the address the host
    name resolves to, is often 127.0.0.1, which the other hosts cannot reach)."""

    def __init__(self, *args: Any, agree_on: dict | None = None, notice_after_s: float = 10.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agree_on = agree_on
        self.notice_after_s = notice_after_s

    @override
    def setup_environment(self) -> None:
        if "LOCAL_RANK" in os.environ and sys.platform == "linux":
            parent = os.getppid()
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the launcher
            if os.getppid() != parent:  # it died before the request was in place
                os._exit(1)
        if self.num_nodes > 1:
            _choose_the_network_interface(self.cluster_environment.main_address, self.local_rank == 0)
        with _ctrl_c_ends_the_wait(), self._said_while_waiting():
            super().setup_environment()
        if self.agree_on is not None and self.world_size > 1:
            self._agree(self.agree_on)

    @contextmanager
    def _said_while_waiting(self) -> Iterator[None]:
        """A thread of the node's first process that says what the meeting waits for, when a node is missing."""
        torchrun = isinstance(self.cluster_environment, TorchElasticEnvironment)  # its agents met before it started us
        if self.num_nodes == 1 or self.local_rank != 0 or torchrun or dist.is_initialized():
            yield
            return
        met, said = threading.Event(), threading.Event()
        started = time.monotonic()
        threading.Thread(target=self._watch_the_meeting, args=(met, said), name="rendezvous", daemon=True).start()
        try:
            yield
        finally:
            met.set()
        if said.is_set():
            print(
                f"All {self.world_size} processes of the job have met, after {time.monotonic() - started:.0f} s.",
                flush=True,
            )

    def _watch_the_meeting(self, met: threading.Event, said: threading.Event) -> None:
        host, port = self.cluster_environment.main_address, self.cluster_environment.main_port
        started, store = time.monotonic(), None
        notice = started + self.notice_after_s  # a node missing that long once the store is up (node 0's first)
        while not met.is_set():
            missing: list[int] | None = None  # no store yet: node 0's first process has not reached the meeting
            try:
                if store is None:
                    socket.create_connection((host, port), timeout=1).close()  # a client would print its retries
                    store = dist.TCPStore(
                        host, port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=5)
                    )
                    store.add(f"{ARRIVED}{self.node_rank}", 1)
                    notice = time.monotonic() + self.notice_after_s
                missing = [node for node in range(self.num_nodes) if not store.check([f"{ARRIVED}{node}"])]
            except Exception:  # noqa: BLE001, S112 (not up yet, or gone: looked at again in a moment)
                pass
            if time.monotonic() < notice or missing == [] or met.wait(0.25):
                met.wait(0.25)  # at once where met (that wait returned True), else a moment
                continue
            notice += 60
            waited = f"Node {self.node_rank} has waited {time.monotonic() - started:.0f} s"
            if missing is None:
                why = "where no process of node 0 answers yet: not started yet, or started with another MASTER_ADDR or"
                print(
                    f"{waited} at {host}:{port}, {why} MASTER_PORT, or a firewall closes the port. Ctrl-C ends the"
                    " wait.",
                    flush=True,
                )
            else:
                nodes = ", ".join(map(str, missing))
                print(
                    f"{waited} at {host}:{port} for node(s) {nodes} of {self.num_nodes}: not started yet, started"
                    " with another MASTER_ADDR or MASTER_PORT, or failed before the meeting (its output says why)."
                    " Ctrl-C ends the wait.",
                    flush=True,
                )
            said.set()

    def _agree(self, settings: dict) -> None:
        """Raise the same `UserError` in every process where their settings differ: one collective where they agree."""
        digest = hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()
        digests: list[Any] = [None] * self.world_size
        dist.all_gather_object(digests, (self.node_rank, digest))
        if len({digest for _node, digest in digests}) == 1:
            return
        everyone: list[Any] = [None] * self.world_size
        dist.all_gather_object(everyone, settings)
        by_node = {node: options_of(everyone[rank]) for rank, (node, _digest) in reversed(list(enumerate(digests)))}
        who = "node"
        if any(len({d for n, d in digests if n == node}) > 1 for node in by_node):  # and a node's processes too
            by_node, who = {rank: options_of(theirs) for rank, theirs in enumerate(everyone)}, "global rank"
        names = sorted(by_node)
        differ = [
            key
            for key in dict.fromkeys(k for flat in by_node.values() for k in flat)
            if len({json.dumps(flat.get(key), default=str) for flat in by_node.values()}) > 1
        ]
        if any(key in SAID_AS and key != "--program" for key in differ):  # they bring other settings with them
            differ = [key for key in differ if key in SAID_AS]
        said = []
        for key in differ:
            values: dict[str, list[int]] = {}
            for name in names:
                values.setdefault(json.dumps(by_node[name].get(key), default=str).strip('"'), []).append(name)
            on = " and ".join(
                f"{value} on {who}{'s' if len(of) > 1 else ''} {', '.join(map(str, of))}"
                for value, of in values.items()
            )
            said.append(f"{SAID_AS.get(key, key)} is {on}")
        raise UserError(
            f"the nodes were started with different settings: {'; '.join(said)}. Start every node with the same"
            f" {'version of the program and ' if '--program' in differ else ''}command line.",
            every_process=True,
        )


@contextmanager
def _ctrl_c_ends_the_wait() -> Iterator[None]:
    """Within: Ctrl-C ends the process by SIGINT's own action; nothing where a shell made it ignored (`&`), or
    outside the main thread, which alone may set a handler."""
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_DFL)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _choose_the_network_interface(address: str, say: bool) -> None:
    """Name the interface that routes to `address` in GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME, unless either is
    set already (the user knows better)."""
    if {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"} & set(os.environ) or sys.platform != "linux":
        return
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((address, 9))  # picks the route; sends nothing
            local = probe.getsockname()[0]
    except OSError:
        return
    for _index, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            try:
                answer = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))  # SIOCGIFADDR
            except OSError:  # no IPv4 address
                continue
        if socket.inet_ntoa(answer[20:24]) == local:
            os.environ["GLOO_SOCKET_IFNAME"] = os.environ["NCCL_SOCKET_IFNAME"] = name
            if say:
                print(
                    f"Reaching the first node ({address}) through {name} (GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME"
                    " choose another).",
                    flush=True,
                )
            return
