"""Stopping the real nodes: their pods, every agent, and every host change the tier recorded.

Order: the real nodes' pods are deleted (so the kubelets run CNI DEL and unmount volumes), then kube-proxy
(and ``kube-proxy --cleanup`` removes its iptables rules), the DNS, the kubelets, whatever container is left
(killed by cgroup), the containerds and their shims; then mounts, the bridge, sysctls, cgroups and host
paths.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from verl_devtools.devcluster import binaries, hostchanges, process
from verl_devtools.devcluster.layout import Layout
from verl_devtools.devcluster.nodeagents import running, stop_agent
from verl_devtools.devcluster.nodehost import release

#: Seconds for the real nodes' pods to be gone at teardown before their containers are stopped by force.
POD_STOP_TIMEOUT = 60.0

Say = Callable[[str], None]


def stop(
    layout: Layout, state: dict[str, Any], api: client.ApiClient | None, save: Callable[[], None], say: Say
) -> list[str]:
    """Stop every agent and undo every recorded host change (in the module's order).

    Returns:
        What could not be undone (links, sysctls, cgroups), one line each.
    """
    names = sorted({k.split("-", 1)[1] for k in state.get("node_processes", {}) if k.startswith("kubelet-")})
    if any(running(state).values()):
        _delete_real_pods(api, names, say)
    host = state.get("host", {})
    _stop_kube_proxy(state, host)
    stop_agent(state, "coredns")
    _stop_agents(state, "kubelet-")
    save()
    hostchanges.kill_cgroup_processes(host.get("cgroups", []))
    _stop_agents(state, "containerd-")
    for pid in _shim_pids(layout):
        process.stop(pid, timeout=5)
    save()
    problems = _undo_host_changes(layout, host)
    state.pop("host", None)
    state.pop("node_processes", None)
    save()
    release(layout)
    return problems


def _delete_real_pods(api: client.ApiClient | None, names: list[str], say: Say) -> None:
    """Delete the pods on the real nodes and wait until the kubelets removed them (CNI DEL, unmounts)."""
    if api is None or not names:
        return
    core = client.CoreV1Api(api)

    def on_real_nodes() -> list[tuple[str, str]]:
        return [
            (str(p.metadata.namespace), str(p.metadata.name))
            for p in core.list_pod_for_all_namespaces().items
            if p.spec is not None and p.metadata is not None and p.spec.node_name in names
        ]

    try:
        for namespace, pod in on_real_nodes():
            with contextlib.suppress(ApiException):
                core.delete_namespaced_pod(pod, namespace, grace_period_seconds=1)
        deadline = time.monotonic() + POD_STOP_TIMEOUT
        left = on_real_nodes()
        while time.monotonic() < deadline:
            left = on_real_nodes()
            if not left:
                return
            time.sleep(0.5)
        say(f"{len(left)} pods still on the real nodes after {POD_STOP_TIMEOUT:.0f}s: stopping them by force")
    except (ApiException, OSError) as exc:
        say(f"could not list the real nodes' pods ({exc}); stopping their containers by force")


def _stop_kube_proxy(state: dict[str, Any], host: dict[str, Any]) -> None:
    """Stop kube-proxy, let ``kube-proxy --cleanup`` remove its rules, drop the chains and tables it added."""
    stop_agent(state, "kube-proxy")
    for config in host.get("kube_proxy", []):
        located = binaries.find("kube-proxy")
        if located is not None and Path(config).is_file():
            subprocess.run(
                [str(located.path), "--cleanup", f"--config={config}"],
                capture_output=True,
                check=False,
                timeout=60,
            )
    for tool in hostchanges.IPTABLES:
        hostchanges.remove_kube_chains(tool)
    if "iptables" in host:
        hostchanges.drop_new_empty_tables(host["iptables"])


def _stop_agents(state: dict[str, Any], prefix: str) -> None:
    """Stop every recorded agent whose key starts with ``prefix`` (in name order)."""
    for key in sorted(k for k in state.get("node_processes", {}) if k.startswith(prefix)):
        stop_agent(state, key)


def _shim_pids(layout: Layout) -> list[int]:
    """containerd shims started by this instance's containerds (their command line names its sockets)."""
    marker = str(layout.base / "nodes")
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "containerd-shim" in cmdline and marker in cmdline:
            found.append(int(proc.name))
    return found


def _undo_host_changes(layout: Layout, host: dict[str, Any]) -> list[str]:
    """Unmount, delete the links, restore sysctls, remove cgroups and host paths; returns what failed."""
    problems: list[str] = []
    hostchanges.unmount_below(layout.base)
    for link in host.get("links", []):
        try:
            hostchanges.delete_link(link)
        except hostchanges.HostError as exc:
            problems.append(str(exc))
    problems += [f"sysctl {k}" for k in hostchanges.restore_sysctls(host.get("sysctls", {}))]
    problems += [f"cgroup {c}" for c in hostchanges.remove_cgroups(host.get("cgroups", []))]
    hostchanges.remove_host_paths(host.get("paths", []))
    return problems
