"""Two "nodes" on one machine: two network namespaces joined by a veth pair.

Used by the multi-node tests and ``multinode.py``. Needs root and iproute2. The
namespaces and the veth pair are always removed, whatever happens inside the block.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


class NamespacesUnavailable(RuntimeError):
    """The two-node network cannot be made here (no root, no iproute2, a failed step)."""


@dataclass
class Nodes:
    """Two namespaces: node i is ``names[i]``, its interface ``links[i]``, address ``addrs[i]``."""

    names: tuple[str, str]
    links: tuple[str, str]
    addrs: tuple[str, str]

    def run(self, node: int, cmd: list[str], cwd: Path, extra_env: dict | None = None
            ) -> subprocess.Popen:
        """Start ``cmd`` inside node ``node``'s namespace (gloo bound to its interface)."""
        env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": self.links[node],
               "PYTHONUNBUFFERED": "1", **(extra_env or {})}
        return subprocess.Popen(["ip", "netns", "exec", self.names[node], *cmd], cwd=cwd,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


@contextmanager
def two_nodes(tag: str | None = None) -> Iterator[Nodes]:
    """The two namespaces for the duration of the block; NamespacesUnavailable if they
    cannot be made (nothing is left behind either way)."""
    if shutil.which("ip") is None:
        raise NamespacesUnavailable("iproute2 (`ip`) is not installed: cannot create "
                                    "network namespaces")
    if os.geteuid() != 0:
        raise NamespacesUnavailable("creating network namespaces needs root (CI runs as root)")
    tag = tag or f"{os.getpid() % 100000}"
    subnet = 10 + os.getpid() % 200
    names = (f"pfnode0-{tag}", f"pfnode1-{tag}")
    links = (f"pfa{tag}", f"pfb{tag}")
    addrs = (f"10.213.{subnet}.1", f"10.213.{subnet}.2")
    steps = [("netns", "add", names[0]), ("netns", "add", names[1]),
             ("link", "add", links[0], "type", "veth", "peer", "name", links[1]),
             ("link", "set", links[0], "netns", names[0]),
             ("link", "set", links[1], "netns", names[1])]
    for i in range(2):
        steps += [("-n", names[i], "addr", "add", f"{addrs[i]}/24", "dev", links[i]),
                  ("-n", names[i], "link", "set", links[i], "up"),
                  ("-n", names[i], "link", "set", "lo", "up")]
    try:
        for step in steps:
            done = _ip(*step)
            if done.returncode != 0:
                raise NamespacesUnavailable(f"cannot create the two-node network (ip "
                                            f"{' '.join(step)}: {done.stderr.strip()})")
        yield Nodes(names, links, addrs)
    finally:
        for name in names:  # deleting a namespace deletes its end of the veth pair
            _ip("netns", "delete", name)
        _ip("link", "delete", links[0])
        left = [n for n in names if n in _ip("netns", "list").stdout]
        if left:
            raise RuntimeError(f"network namespaces {left} were not removed")
