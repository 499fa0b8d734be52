"""Separate hosts on one machine: Linux network namespaces on one virtual LAN.

:func:`lan` creates one namespace per host and a hub namespace holding a bridge; every
host gets a veth pair, one end (``eth0``, with the host's address) in its namespace and
the other on the bridge. The test process itself (the root namespace) joins the LAN too,
as the operator's machine, so the ``flwr`` CLI runs unchanged. Everything is removed on
exit (deleting a namespace deletes its veth ends, and with them their peers).

Needs root (CAP_NET_ADMIN) and iproute2; :func:`unavailable` says why not, for a skip.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

PREFIX = "fcx"  # every namespace and interface made here starts with it
# What this process made (another test run on the same machine makes its own: the leak
# check must neither see nor delete those).
MADE_NAMESPACES: set[str] = set()
MADE_LINKS: set[str] = set()


class NetnsError(RuntimeError):
    pass


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done


def unavailable() -> str | None:
    """Why namespaces cannot be made here (None if they can)."""
    if shutil.which("ip") is None:
        return "iproute2's `ip` command is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root (CAP_NET_ADMIN)"
    probe = f"{PREFIX}probe{uuid.uuid4().hex[:6]}"
    done = _ip("netns", "add", probe, check=False)
    if done.returncode != 0:
        return f"`ip netns add` failed: {done.stderr.strip()}"
    _ip("netns", "delete", probe, check=False)
    return None


def namespaces() -> list[str]:
    """The namespaces made by this module in this process that exist now."""
    out = _ip("netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines()
            if line.split() and line.split()[0] in MADE_NAMESPACES]


def links() -> list[str]:
    """Interfaces of the root namespace made by this module in this process that exist now."""
    out = _ip("-o", "link", "show", check=False).stdout
    names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]
    return [name for name in names if name in MADE_LINKS]


@dataclass
class Lan:
    """Hosts on one virtual LAN: ``address[host]``, ``namespace[host]``, and the
    operator's (this process's) address ``operator``."""

    address: dict[str, str]
    namespace: dict[str, str]
    operator: str

    def exec_prefix(self, host: str) -> list[str]:
        """Prepend to a command's argv to run it on ``host``."""
        return ["ip", "netns", "exec", self.namespace[host]]


@contextlib.contextmanager
def lan(hosts: list[str], subnet: str | None = None) -> Iterator[Lan]:
    """Namespaces for ``hosts`` (addresses ``subnet``.1, .2, ...; the operator is .254).
    The default subnet is a random 10.231-254.x.0/24, so that concurrent test runs on one
    machine do not put the same operator address on two interfaces."""
    tag = uuid.uuid4().hex[:5]
    if subnet is None:
        octets = uuid.UUID(int=uuid.uuid4().int).bytes
        subnet = f"10.{231 + octets[0] % 24}.{octets[1]}"
    hub = f"{PREFIX}{tag}hub"
    made: list[str] = []
    root_end = f"{PREFIX}{tag}op"
    MADE_NAMESPACES.update([hub, *(f"{PREFIX}{tag}h{i}" for i in range(1, len(hosts) + 1))])
    MADE_LINKS.add(root_end)
    try:
        _ip("netns", "add", hub)
        made.append(hub)
        in_hub = ["-n", hub]
        _ip(*in_hub, "link", "add", "br0", "type", "bridge")
        _ip(*in_hub, "link", "set", "br0", "up")
        address, namespace = {}, {}
        for i, host in enumerate(hosts, start=1):
            ns = f"{PREFIX}{tag}h{i}"
            _ip("netns", "add", ns)
            made.append(ns)
            host_end, hub_end = f"{PREFIX}{tag}a{i}", f"{PREFIX}{tag}b{i}"
            _ip("link", "add", host_end, "type", "veth", "peer", "name", hub_end)
            _ip("link", "set", host_end, "netns", ns)
            _ip("link", "set", hub_end, "netns", hub)
            _ip("-n", ns, "link", "set", host_end, "name", "eth0")
            _ip("-n", ns, "addr", "add", f"{subnet}.{i}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
            _ip(*in_hub, "link", "set", hub_end, "master", "br0")
            _ip(*in_hub, "link", "set", hub_end, "up")
            address[host], namespace[host] = f"{subnet}.{i}", ns
        # The operator's machine: this (root) namespace joins the LAN.
        hub_end = f"{PREFIX}{tag}bop"
        _ip("link", "add", root_end, "type", "veth", "peer", "name", hub_end)
        _ip("link", "set", hub_end, "netns", hub)
        _ip(*in_hub, "link", "set", hub_end, "master", "br0")
        _ip(*in_hub, "link", "set", hub_end, "up")
        _ip("addr", "add", f"{subnet}.254/24", "dev", root_end)
        _ip("link", "set", root_end, "up")
        yield Lan(address, namespace, f"{subnet}.254")
    finally:
        _ip("link", "delete", root_end, check=False)
        for ns in reversed(made):
            _ip("netns", "delete", ns, check=False)
