"""The host changes of the real-node tier, each recorded so that teardown undoes exactly it.

A :class:`HostChanges` record (kept in the instance's state file) lists the links it created, the sysctls
it saw before the node agents ran (restored at teardown), the cgroups it created, and the host paths that
did not exist before. Commands run as argv lists (``ip``), never through a shell.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

#: Sysctls the node agents change: kubelet (``protectKernelDefaults: false``), the CNI bridge plugin
#: (``ip_forward``), kube-proxy (``route_localnet``, off in this tier's configuration but recorded anyway).
SYSCTLS: tuple[str, ...] = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
    "net/ipv4/ip_forward",
    "net/ipv4/conf/all/route_localnet",
)
#: Host paths the kubelet, containerd's shims and the CNI plugins use whatever their configuration says.
HOST_PATHS: tuple[str, ...] = (
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/cni",
    "/run/containerd",
    "/run/netns",
    "/opt/cni",
    "/etc/cni",
)
CGROUP_ROOT = Path("/sys/fs/cgroup")


class HostError(RuntimeError):
    """A host change could not be made (the message names the command and its output)."""


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise HostError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")
    return done


def networks_in_use() -> list[str]:
    """The IPv4 networks of every interface address and route of the machine (``ip -j``)."""
    used: list[str] = []
    for entry in json.loads(_ip("-j", "-4", "addr", "show").stdout or "[]"):
        for info in entry.get("addr_info", []):
            used.append(f"{info['local']}/{info['prefixlen']}")
    for route in json.loads(_ip("-j", "-4", "route", "show", "table", "all").stdout or "[]"):
        dst = route.get("dst", "")
        if dst and dst != "default" and route.get("type", "unicast") in ("unicast", "local"):
            used.append(dst if "/" in dst else f"{dst}/32")
    return used


def link_exists(name: str) -> bool:
    return _ip("link", "show", "dev", name, check=False).returncode == 0


def create_bridge(name: str, addresses: list[str]) -> None:
    """Create bridge ``name`` with the given ``addr/prefix`` addresses and bring it up."""
    _ip("link", "add", name, "type", "bridge")
    for address in addresses:
        _ip("addr", "add", address, "dev", name)
    _ip("link", "set", name, "up")


def delete_link(name: str) -> None:
    if link_exists(name):
        _ip("link", "del", name)


def read_sysctls() -> dict[str, str]:
    """The current value of each of :data:`SYSCTLS` that exists."""
    values = {}
    for key in SYSCTLS:
        with contextlib.suppress(OSError):
            values[key] = Path("/proc/sys", key).read_text().strip()
    return values


def restore_sysctls(saved: dict[str, str]) -> list[str]:
    """Write back the recorded values; returns the keys that could not be restored."""
    failed = []
    for key, value in saved.items():
        path = Path("/proc/sys", key)
        try:
            if path.read_text().strip() != value:
                path.write_text(value)
        except OSError:
            failed.append(key)
    return failed


def cgroup_controllers() -> list[Path]:
    """The mounted cgroup v1 hierarchies (``/sys/fs/cgroup/<controller>``)."""
    if not CGROUP_ROOT.is_dir():
        return []
    return sorted(
        p
        for p in CGROUP_ROOT.iterdir()
        if p.is_dir() and not p.is_symlink() and (p / "cgroup.procs").exists()
    )


def create_cgroup(name: str) -> list[str]:
    """Create ``/<name>`` in every hierarchy (the kubelet's ``cgroupRoot``); returns the created paths."""
    created = []
    for hierarchy in cgroup_controllers():
        path = hierarchy / name
        if path.is_dir():
            continue
        path.mkdir()
        created.append(str(path))
        if (hierarchy / "cpuset.cpus").exists():
            # A new cpuset starts empty and accepts no task until it has CPUs and memory nodes.
            for knob in ("cpuset.cpus", "cpuset.mems"):
                (path / knob).write_text((hierarchy / knob).read_text())
    return created


def cgroup_dirs(top: str, deepest_first: bool = False) -> list[Path]:
    """``top`` and every cgroup below it, parents first (children first with ``deepest_first``).

    The kubelet and containerd remove cgroups while this walks them, so a directory that vanishes
    between its listing and its scan is skipped (``os.walk`` ignores it), never an error.
    """
    return [Path(directory) for directory, _, _ in os.walk(top, topdown=not deepest_first)]


def cgroup_pids(paths: list[str]) -> list[int]:
    """Every pid in the given cgroups and their descendants."""
    pids: set[int] = set()
    for top in paths:
        for directory in cgroup_dirs(top):
            with contextlib.suppress(OSError):
                pids.update(int(line) for line in (directory / "cgroup.procs").read_text().split())
    return sorted(pids)


def kill_cgroup_processes(paths: list[str], timeout: float = 10.0) -> list[int]:
    """SIGKILL every process left in the cgroups (containers whose pods did not stop); returns the pids."""
    killed = cgroup_pids(paths)
    for pid in killed:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout
    while cgroup_pids(paths) and time.monotonic() < deadline:
        time.sleep(0.1)
    return killed


def remove_cgroups(paths: list[str]) -> list[str]:
    """rmdir the cgroups and everything below them, deepest first; returns those that remain."""
    left = []
    for top in paths:
        root = Path(top)
        if not root.is_dir():
            continue
        for directory in cgroup_dirs(top, deepest_first=True):
            for _ in range(50):
                try:
                    directory.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)
        if root.is_dir():
            left.append(top)
    return left


def missing_host_paths() -> list[str]:
    """Which of :data:`HOST_PATHS` do not exist now (those are removed again at teardown)."""
    return [p for p in HOST_PATHS if not os.path.lexists(p)]


def remove_host_paths(paths: list[str]) -> None:
    for path in paths:
        target = Path(path)
        if target.is_symlink() or target.is_file():
            target.unlink()
        elif target.is_dir():
            unmount_below(target)
            shutil.rmtree(target, ignore_errors=True)


def mounts_below(directory: Path) -> list[str]:
    """Mount points at or below ``directory`` (from ``/proc/self/mountinfo``), deepest first."""
    prefix = str(directory.resolve())
    found = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"), reverse=True)


def unmount_below(directory: Path) -> list[str]:
    """Lazily unmount every mount at or below ``directory``; returns what was unmounted."""
    done = []
    for point in mounts_below(directory):
        result = subprocess.run(["umount", "-l", point], capture_output=True, check=False)
        if result.returncode == 0:
            done.append(point)
    return done


def record(state: dict[str, Any], key: str, value: Any) -> None:
    """Append ``value`` to the list ``state['host'][key]`` (kept in the instance's state file)."""
    state.setdefault("host", {}).setdefault(key, [])
    if value not in state["host"][key]:
        state["host"][key].append(value)


#: iptables front ends whose rules the node agents add (Debian's iptables uses the nf_tables backend).
IPTABLES: tuple[str, ...] = ("iptables", "ip6tables")
#: Prefix of every chain kube-proxy and the kubelet create.
KUBE_CHAIN_PREFIX = "KUBE-"


def iptables_tables(tool: str) -> set[str]:
    """The tables ``<tool>-save`` lists now (empty when the tool is missing)."""
    try:
        done = subprocess.run([f"{tool}-save"], capture_output=True, text=True, check=False, timeout=30)
    except FileNotFoundError:
        return set()
    return {line[1:].strip() for line in done.stdout.splitlines() if line.startswith("*")}


def remove_kube_chains(tool: str) -> list[str]:
    """Delete every rule that jumps to a ``KUBE-*`` chain, then those chains (what ``--cleanup`` leaves).

    Only chains with the Kubernetes prefix are touched; nothing is flushed wholesale. Returns the chains
    removed.
    """
    removed: list[str] = []
    for table in sorted(iptables_tables(tool)):
        listing = subprocess.run([tool, "-w", "-t", table, "-S"], capture_output=True, text=True, check=False)
        chains = [
            line.split()[1]
            for line in listing.stdout.splitlines()
            if line.startswith("-N ") and line.split()[1].startswith(KUBE_CHAIN_PREFIX)
        ]
        for line in listing.stdout.splitlines():
            words = line.split()
            if words[:1] == ["-A"] and ("-j" in words or "-g" in words):
                target = words[words.index("-j" if "-j" in words else "-g") + 1]
                if target.startswith(KUBE_CHAIN_PREFIX) and not words[1].startswith(KUBE_CHAIN_PREFIX):
                    subprocess.run(
                        [tool, "-w", "-t", table, "-D", *words[1:]], capture_output=True, check=False
                    )
        for chain in chains:
            subprocess.run([tool, "-w", "-t", table, "-F", chain], capture_output=True, check=False)
        for chain in chains:
            if (
                subprocess.run(
                    [tool, "-w", "-t", table, "-X", chain], capture_output=True, check=False
                ).returncode
                == 0
            ):
                removed.append(f"{tool} {table} {chain}")
    return removed


def drop_new_empty_tables(before: dict[str, list[str]]) -> None:
    """Delete the nf_tables tables the iptables front ends created for this tier (when ``nft`` exists)."""
    nft = shutil.which("nft")
    if nft is None:
        return
    family = {"iptables": "ip", "ip6tables": "ip6"}
    for tool, tables in before.items():
        for table in iptables_tables(tool) - set(tables):
            listing = subprocess.run(
                [f"{tool}-save", "-t", table], capture_output=True, text=True, check=False
            )
            if any(line.startswith("-A ") for line in listing.stdout.splitlines()):
                continue  # someone else's rules: leave the table alone
            subprocess.run([nft, "delete", "table", family[tool], table], capture_output=True, check=False)
