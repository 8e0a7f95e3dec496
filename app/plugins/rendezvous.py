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

ARRIVED = "rendezvous/node/"  # a key per node in the job's store, once one of its processes is there: its shape
SEEN = "rendezvous/refused/"  # a key per node that saw the nodes were told different shapes
HINT = (
    "Start every node with the same MASTER_ADDR (an address of node 0 that every node reaches) and MASTER_PORT (free on"
    " node 0), and its own NODE_RANK. --trainer.strategy RendezvousDDPStrategy --trainer.strategy.timeout 0:10:00 sets"
    " how long they wait for each other (30 minutes by default)."
)
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
    name resolves to, is often 127.0.0.1, which the other hosts cannot reach).

    Example::

        trainer = Trainer(devices=4, num_nodes=2, strategy=RendezvousDDPStrategy(agree_on={"lr": 0.01}))
    """

    def __init__(self, *args: Any, agree_on: dict | None = None, notice_after_s: float = 10.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.agree_on = agree_on
        self.notice_after_s = notice_after_s

    @override
    def setup_environment(self) -> None:
        started = self.local_rank > 0 or TorchElasticEnvironment.detect()  # not the process a user started
        if started and sys.platform == "linux":  # (Lightning's launcher sets LOCAL_RANK=0 in that one too)
            parent = os.getppid()
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: die with the launcher
            if os.getppid() != parent:  # it died before the request was in place
                os._exit(1)
        if self.num_nodes > 1:
            _choose_the_network_interface(self.cluster_environment.main_address, self.local_rank == 0)
        with _ctrl_c_ends_the_wait(), self._said_while_waiting():
            try:
                super().setup_environment()
            except (dist.DistNetworkError, dist.DistStoreError) as error:  # the meeting's own: a port in use, a timeout
                meeting = " ".join(str(error).split())
                raise UserError(f"the processes of the job could not meet: {meeting}. {HINT}") from error
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
            waited = time.monotonic() - started
            print(f"All {self.world_size} processes of the job have met, after {waited:.0f} s.", flush=True)

    def _watch_the_meeting(self, met: threading.Event, said: threading.Event) -> None:
        host, port = self.cluster_environment.main_address, self.cluster_environment.main_port
        started, store, shape = time.monotonic(), None, json.dumps(self._shape)
        notice = started + self.notice_after_s  # a node missing that long once the store is up (node 0's first)
        while not met.is_set():
            missing: list[int] | None = None  # no store yet: node 0's first process has not reached the meeting
            shapes: dict[int, dict] = {}  # each node's that is there
            try:
                if store is None:
                    socket.create_connection((host, port), timeout=1).close()  # a client would print its retries
                    store = dist.TCPStore(
                        host, port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=5)
                    )
                    store.set(f"{ARRIVED}{self.node_rank}", shape)
                    notice = time.monotonic() + self.notice_after_s
                missing = [node for node in range(self.num_nodes) if not store.check([f"{ARRIVED}{node}"])]
                shapes = {n: json.loads(store.get(f"{ARRIVED}{n}")) for n in range(self.num_nodes) if n not in missing}
            except Exception:  # noqa: BLE001, S112 (not up yet, or gone: looked at again in a moment)
                pass
            if any(theirs != self._shape for theirs in shapes.values()):  # they would wait for each other in vain
                self._refuse(store, shapes)
            if time.monotonic() < notice or missing == [] or met.wait(0.25):
                met.wait(0.25)  # at once where met (that wait returned True), else a moment
                continue
            notice += 60
            if missing is None:
                why = ", where no process of node 0 answers yet: not started yet, or started with another"
                why += " MASTER_ADDR or MASTER_PORT, or a firewall closes the port"
            else:
                why = f" for node(s) {', '.join(map(str, missing))} of {self.num_nodes}: not started yet, started with"
                why += " another MASTER_ADDR or MASTER_PORT, or failed before the meeting (its output says why)"
            waited = f"Node {self.node_rank} has waited {time.monotonic() - started:.0f} s at {host}:{port}"
            print(f"{waited}{why}. Ctrl-C ends the wait.", flush=True)
            said.set()

    def _refuse(self, store: dist.Store, shapes: dict[int, dict]) -> None:
        """End this process with the line naming what the nodes that are there were told; node 0's first process, which
        holds the job's store, only once the others have seen it too (5 s at most)."""
        who = "error" if self.node_rank == 0 else f"error (node {self.node_rank} on {socket.gethostname()})"
        print(f"{who}: {_differences(shapes, 'node')}", file=sys.stderr, flush=True)
        store.set(f"{SEEN}{self.node_rank}", "")
        deadline = time.monotonic() + 5
        while self.node_rank == 0 and time.monotonic() < deadline and not store.check([SEEN + str(n) for n in shapes]):
            time.sleep(0.05)
        if self.launcher is not None:  # the processes it started end with it
            self.launcher.kill(signal.SIGKILL)
        os._exit(1)  # the meeting, in C code, cannot be interrupted; nothing is written yet

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
        raise UserError(_differences(by_node, who), every_process=True)

    @property
    def _shape(self) -> dict:
        """What Lightning's launcher was told on this node: every node must have been told the same."""
        return {"--trainer.devices": self.num_processes, "--trainer.num_nodes": self.num_nodes}


def _differences(by_node: dict[int, dict], who: str) -> str:
    """What differs between the settings of each node (or global rank: `who`), as a mistake's line."""
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
            f"{value} on {who}{'s' if len(of) > 1 else ''} {', '.join(map(str, of))}" for value, of in values.items()
        )
        said.append(f"{SAID_AS.get(key, key)} is {on}")
    return (
        f"the nodes were started with different settings: {'; '.join(said)}. Start every node with the same"
        f" {'version of the program and ' if '--program' in differ else ''}command line."
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
    if local.startswith("127."):  # node 0's own address resolves to its loopback here: the other nodes reach no `lo`
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
                chosen = f"through {name} (GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME choose another)"
                print(f"Reaching the first node ({address}) {chosen}.", flush=True)
            return
