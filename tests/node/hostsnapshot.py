"""What the real-node tier may change on the host, read before ``up`` and after ``down`` to compare."""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from verl_devtools.devcluster import DevCluster, hostchanges, process
from verl_devtools.devcluster.nodenet import short_hash


@dataclass(frozen=True)
class HostSnapshot:
    links: frozenset[str]
    veths: frozenset[str]
    iptables: frozenset[str]
    nft_tables: frozenset[str]
    sysctls: tuple[tuple[str, str], ...]
    cgroups: frozenset[str]
    mounts: frozenset[str]
    host_paths: frozenset[str]


def _lines(argv: list[str]) -> list[str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    except FileNotFoundError:
        return []
    return done.stdout.splitlines()


def take(instance_dir: Path) -> HostSnapshot:
    """Read the host's links, rules, tables, sysctls, tier cgroups, mounts and tier host paths.

    Links, cgroups and mounts are those of this instance only (another instance may start real nodes as
    soon as this one released them); the global parts are compared by :func:`differences` only when no
    other instance had real nodes while the snapshots were taken.
    """
    suffix = short_hash(instance_dir.name)
    names = [line.split()[0].split("@")[0] for line in _lines(["ip", "-br", "link"])]
    rules = {
        f"{tool} {line}"
        for tool in ("iptables-save", "ip6tables-save")
        for line in _lines([tool])
        if line.startswith(("-A ", ":", "*"))
        and not line.startswith((":INPUT", ":OUTPUT", ":FORWARD", ":PRE", ":POST"))
    }
    mounts = {
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if str(instance_dir) in line.split()[4]
        or "/run/netns" in line.split()[4]
        or "kubelet" in line.split()[4]
    }
    cgroups = {
        str(p) for hierarchy in hostchanges.cgroup_controllers() for p in hierarchy.glob("verl-devcluster-*")
    }
    return HostSnapshot(
        links=frozenset(name for name in names if suffix in name),
        veths=frozenset(name for name in names if name.startswith("veth")),
        iptables=frozenset(rules),
        nft_tables=frozenset(_lines(["nft", "list", "tables"])),
        sysctls=tuple(sorted(hostchanges.read_sysctls().items())),
        cgroups=frozenset(cgroups),
        mounts=frozenset(mounts),
        host_paths=frozenset(p for p in hostchanges.HOST_PATHS if os.path.lexists(p)),
    )


#: Parts that belong to the instance, and parts shared by the machine.
OWN = ("links", "cgroups", "mounts")
SHARED = ("veths", "iptables", "nft_tables", "host_paths")


def differences(before: HostSnapshot, after: HostSnapshot, shared: bool = True) -> list[str]:
    """One line per thing that differs (the machine-wide parts and sysctls only when ``shared``)."""
    out: list[str] = []
    for field in (*OWN, *SHARED) if shared else OWN:
        old, new = getattr(before, field), getattr(after, field)
        out += [f"{field}: added {item}" for item in sorted(new - old)]
        out += [f"{field}: removed {item}" for item in sorted(old - new)]
    if not shared:
        return out
    old_sysctls, new_sysctls = dict(before.sysctls), dict(after.sysctls)
    out += [
        f"sysctl {key}: {old_sysctls.get(key)} -> {value}"
        for key, value in new_sysctls.items()
        if old_sysctls.get(key) != value
    ]
    return out


def node_pids(cluster: DevCluster) -> dict[str, int]:
    """The pids of the real-node agents (containerd, kubelet, kube-proxy, CoreDNS)."""
    state = cluster._state()
    return {key: int(entry["pid"]) for key, entry in state.get("node_processes", {}).items()}


def alive(pid: int) -> bool:
    """Whether the pid runs (a reaped or zombie process does not)."""
    return process.alive(pid)
