"""Hosts that find each other without interface variables: the network interface that reaches MASTER_ADDR."""

import fcntl
import os
import socket
import struct
import sys

SIOCGIFADDR = 0x8915  # from <linux/sockios.h>: the IPv4 address of an interface


def choose_socket_interface() -> str | None:
    """Name the network interface that routes to MASTER_ADDR in GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME.

    Without them, Gloo advertises the address the host name resolves to, often 127.0.0.1, which the other hosts
    cannot reach ("Gloo connectFullMesh failed ... Connection refused, remote=[127.0.0.1]"). Does nothing when
    either variable is set already (the user knows better), when MASTER_ADDR is unset (one node), or off Linux.
    Under SLURM, where Lightning sets MASTER_ADDR later, the first node of the job stands for it.
    Returns the interface chosen, or None.
    """
    address = os.environ.get("MASTER_ADDR") or _slurm_root_node()
    if not address or sys.platform != "linux" or {"GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"} & set(os.environ):
        return None
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((address, int(os.environ.get("MASTER_PORT", "29500"))))  # picks a route; sends nothing
            local_address = probe.getsockname()[0]
    except (OSError, ValueError):
        return None
    for _index, name in socket.if_nameindex():
        if _ipv4_address(name) == local_address:
            os.environ["GLOO_SOCKET_IFNAME"] = os.environ["NCCL_SOCKET_IFNAME"] = name
            return name
    return None


def _slurm_root_node() -> str | None:
    """The host that Lightning's SLURM plugin will make MASTER_ADDR: the first node of the job."""
    from lightning.fabric.plugins.environments import SLURMEnvironment  # here: train.py imports this module first

    nodes = os.environ.get("SLURM_NODELIST")
    return SLURMEnvironment.resolve_root_node_address(nodes) if nodes and SLURMEnvironment.detect() else None


def _ipv4_address(interface: str) -> str | None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            answer = fcntl.ioctl(probe.fileno(), SIOCGIFADDR, struct.pack("256s", interface[:15].encode()))
        except OSError:  # no IPv4 address
            return None
    return socket.inet_ntoa(answer[20:24])
