"""The host side of the real-node tier: its Debian packages, the machine's owner record, the address link.

Only one instance with real nodes runs on a machine at a time (kube-proxy owns the host's Service rules):
the owner is recorded in :data:`OWNER_FILE`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verl_devtools.devcluster import hostchanges
from verl_devtools.devcluster.errors import RealNodeError
from verl_devtools.devcluster.layout import Layout
from verl_devtools.devcluster.nodenet import NodeNetwork

#: Which instance has real nodes on this machine (a file on tmpfs: gone after a reboot, like the nodes).
OWNER_FILE = Path("/run/verl-operator/real-nodes.json")
#: Debian packages the tier needs (``ensure_host_packages`` installs the missing ones).
PACKAGES: dict[str, str] = {
    "containerd": "containerd",
    "runc": "runc",
    "ctr": "containerd",
    "iptables": "iptables",
    "conntrack": "conntrack",
    "nft": "nftables",
    "mmdebstrap": "mmdebstrap",
    "/usr/lib/cni/bridge": "containernetworking-plugins",
}


def ensure_host_packages(say: Callable[[str], None]) -> None:
    """Install the Debian packages the tier needs when any is missing (``apt-get``, as root).

    Raises:
        RealNodeError: Not root, or apt-get failed.
    """
    missing = sorted({pkg for tool, pkg in PACKAGES.items() if not _have(tool)})
    if not missing:
        return
    if os.geteuid() != 0:
        raise RealNodeError(f"real nodes need root and the Debian packages {', '.join(missing)}")
    say(f"installing {', '.join(missing)} with apt-get")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-q"], ["apt-get", "install", "-y", "-q", *missing]):
        done = subprocess.run(argv, capture_output=True, text=True, env=env, check=False)
        if done.returncode != 0:
            raise RealNodeError(f"{' '.join(argv)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")


def _have(tool: str) -> bool:
    return Path(tool).exists() if tool.startswith("/") else shutil.which(tool) is not None


# -- ownership -----------------------------------------------------------------------------------------------


def owner() -> dict[str, Any] | None:
    """The instance that has real nodes on this machine, if its record is there."""
    try:
        data: dict[str, Any] = json.loads(OWNER_FILE.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None
    return data


def claim(layout: Layout, name: str) -> None:
    """Record this instance as the machine's real-node instance.

    Raises:
        RealNodeError: Another instance, whose directory still exists, has real nodes.
    """
    current = owner()
    if current and current.get("directory") != str(layout.base) and Path(current["directory"]).is_dir():
        raise RealNodeError(
            f"devcluster {current.get('name')!r} ({current['directory']}) already runs real nodes on this "
            "machine (one instance at a time: its kube-proxy owns the host's Service rules); stop it first"
        )
    OWNER_FILE.parent.mkdir(parents=True, exist_ok=True)
    OWNER_FILE.write_text(json.dumps({"name": name, "directory": str(layout.base), "pid": os.getpid()}))


def release(layout: Layout) -> None:
    """Remove the owner record when it is this instance's (or names none)."""
    current = owner()
    if current is None or current.get("directory") == str(layout.base):
        OWNER_FILE.unlink(missing_ok=True)
        with contextlib.suppress(OSError):
            OWNER_FILE.parent.rmdir()


# -- network ---------------------------------------------------------------------------------------------------


def create_network(network: NodeNetwork, state: dict[str, Any]) -> None:
    """Create the link with the API server's, the DNS's and the nodes' addresses (idempotent).

    The pods' bridge is created by the CNI bridge plugin with the first pod; both are recorded for teardown.
    """
    hostchanges.record(state, "links", network.bridge)
    hostchanges.record(state, "links", network.address_link)
    if hostchanges.link_exists(network.address_link):
        return
    addresses = sorted({network.api_ip, network.dns_ip, *network.node_ips})
    hostchanges.create_bridge(network.address_link, [f"{a}/32" for a in addresses])
