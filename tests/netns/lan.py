"""Separate hosts on one machine: Linux network namespaces joined by veth pairs to a bridge.

Each host is a namespace with its own loopback, ports and one address in a private /24 that
exists only between these namespaces (the bridge lives in a namespace of its own, so the
machine's own network is never touched). Needs root and `ip netns`; everything is removed on exit.
"""

import os
import random
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Host:
    namespace: str
    address: str

    def command(self, *argv: str) -> list[str]:
        """``argv`` run inside this host's network namespace."""
        return ["ip", "netns", "exec", self.namespace, *argv]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True, timeout=20)


def require_netns() -> None:
    """Skip the calling test, with the reason, where network namespaces cannot be made."""
    if shutil.which("ip") is None:
        pytest.skip("`ip` (iproute2) is not installed")
    if os.geteuid() != 0:
        pytest.skip("network-namespace tests need root (ip netns add)")
    probe = f"kvgprobe{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True, timeout=20)
    if made.returncode != 0:
        pytest.skip(f"`ip netns add` fails here: {made.stderr.strip()}")
    subprocess.run(["ip", "netns", "del", probe], capture_output=True, timeout=20)


@contextmanager
def lan(names: list[str]) -> Iterator[dict[str, Host]]:
    """Hosts ``names`` on one private /24 (10.213.N.0/24, N random), removed on exit whatever happens."""
    tag = f"kvg{os.getpid() % 100000}"
    subnet = f"10.213.{random.randint(1, 254)}"
    switch = f"{tag}-sw"
    made: list[str] = []
    try:
        _ip("netns", "add", switch)
        made.append(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        hosts = {}
        for index, name in enumerate(names):
            host = Host(f"{tag}-{name}", f"{subnet}.{index + 1}")
            _ip("netns", "add", host.namespace)
            made.append(host.namespace)
            _ip("-n", host.namespace, "link", "set", "lo", "up")
            _ip("link", "add", "eth0", "netns", host.namespace, "type", "veth", "peer", f"port{index}", "netns", switch)
            _ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
            _ip("-n", host.namespace, "link", "set", "eth0", "up")
            _ip("-n", switch, "link", "set", f"port{index}", "master", "br0")
            _ip("-n", switch, "link", "set", f"port{index}", "up")
            hosts[name] = host
        yield hosts
    finally:
        for namespace in reversed(made):
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True, timeout=20)
