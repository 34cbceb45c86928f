"""Real kubelet nodes beside the kwok nodes: containerd, kubelet, kube-proxy and the cluster DNS, run by pid.

``start`` brings up N real nodes on a running devcluster whose API server listens on the tier's bridge
(see :mod:`verl_operator.devcluster.nodenet`); ``stop`` stops every process it started and undoes every
host change it recorded (links, sysctls, cgroups, mounts, iptables rules, host paths). Only one instance
with real nodes runs on a machine at a time (kube-proxy owns the host's Service rules): the owner is
recorded in :data:`OWNER_FILE`.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from verl_operator.devcluster import binaries, certs, hostchanges, nodeconfig, process, projectimages
from verl_operator.devcluster import labels as L
from verl_operator.devcluster.kubeconfig import write_kubeconfig
from verl_operator.devcluster.layout import Layout, apiserver_url
from verl_operator.devcluster.nodenet import NodeNetwork
from verl_operator.devcluster.ports import pick_free_ports
from verl_operator.devcluster.profiles import Profile, gpu_labels

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
#: Seconds for a node to register Ready, and for its pods to be gone at teardown.
NODE_READY_TIMEOUT = 90.0
POD_STOP_TIMEOUT = 60.0

Say = Callable[[str], None]


class RealNodeError(RuntimeError):
    """A real-node agent could not be started or the host is not suitable (the message says why)."""


def ensure_host_packages(say: Say) -> None:
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


# -- start -----------------------------------------------------------------------------------------------------


def node_names(count: int) -> list[str]:
    return [f"real-{i}" for i in range(count)]


def write_node_pki(layout: Layout, network: NodeNetwork, names: list[str]) -> None:
    """Client certificates of the node agents and serving certificates of the kubelets (once)."""
    pki = layout.pki
    ca = certs.CertPair(pki / "ca.crt", pki / "ca.key")
    for name, ip in zip(names, network.node_ips, strict=True):
        if not (pki / f"kubelet-{name}.crt").is_file():
            certs.write_signed(ca, pki, f"kubelet-{name}", name, server_names=(name,), server_ips=(ip,))
        if not (pki / f"node-{name}.crt").is_file():
            certs.write_signed(ca, pki, f"node-{name}", f"system:node:{name}", organization="system:nodes")
    if not (pki / "kube-proxy.crt").is_file():
        certs.write_signed(ca, pki, "kube-proxy", "system:kube-proxy")


def _kubeconfig(layout: Layout, name: str, who: str, user: str, ports: dict[str, int], host: str) -> Path:
    path = layout.base / "kubeconfigs" / f"{who}.kubeconfig"
    pki = layout.pki
    pair = certs.CertPair(pki / f"{who}.crt", pki / f"{who}.key")
    return write_kubeconfig(
        path, f"verl-devcluster-{name}", apiserver_url(ports, host), pki / "ca.crt", pair, user
    )


def _start_process(
    state: dict[str, Any], key: str, argv: list[str], log: Path, cwd: Path, save: Callable[[], None]
) -> int:
    pid = process.start(argv, log, cwd)
    state.setdefault("node_processes", {})[key] = {
        "pid": pid,
        "executable": argv[0],
        "started": process.start_time(pid),
    }
    save()
    return pid


def _wait(check: Callable[[], bool], pid: int, what: str, log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.alive(pid):
            raise RealNodeError(
                f"{what} exited during start; last lines of {log}:\n{process.log_tail(log, 25)}"
            )
        if check():
            return
        time.sleep(0.2)
    raise RealNodeError(
        f"{what} not ready within {timeout:.0f}s; last lines of {log}:\n{process.log_tail(log, 25)}"
    )


def _ctr(socket: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["ctr", f"--address={socket}", "--namespace=k8s.io", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )


def import_image(socket: Path, archive: Path) -> None:
    """``ctr images import`` an OCI archive into one node's containerd (unpacked for overlayfs).

    Raises:
        RealNodeError: The import failed.
    """
    done = _ctr(socket, "images", "import", "--snapshotter=overlayfs", str(archive))
    if done.returncode != 0:
        raise RealNodeError(
            f"ctr images import {archive} failed: {done.stderr.strip() or done.stdout.strip()}"
        )


def node_labels(profile: Profile, gpus: int) -> dict[str, str]:
    """The labels of a real node: the first GPU group of ``profile`` with ``gpus`` GPUs, plus ours."""
    group = next((g for g in profile.node_groups if g.gpu is not None), None)
    labels = {nodeconfig.REAL_NODE_LABEL: "true", L.PROFILE: f"{profile.name}-real"}
    if group is not None and group.gpu is not None:
        labels.update(gpu_labels(group.gpu))
        labels[L.GPU_COUNT] = str(gpus)
        if L.NVLINK_DOMAIN_SIZE in labels:
            labels[L.NVLINK_DOMAIN_SIZE] = str(min(gpus, int(labels[L.NVLINK_DOMAIN_SIZE])))
        labels.update({k: v for k, v in group.labels.items() if not k.startswith("kubernetes.io/")})
    return labels


def _node_ready(api: client.ApiClient, name: str) -> bool:
    try:
        node = client.CoreV1Api(api).read_node(name)
    except ApiException:
        return False
    conditions = (node.status.conditions if node.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)


def advertise_gpus(api: client.ApiClient, name: str, gpus: int) -> None:
    """Add ``nvidia.com/gpu`` capacity to the node's status, as a device plugin would (kept by the kubelet)."""
    client.CoreV1Api(api).patch_node_status(
        name,
        {"status": {"capacity": {L.GPU_RESOURCE: str(gpus)}, "allocatable": {L.GPU_RESOURCE: str(gpus)}}},
    )


def start(
    *,
    layout: Layout,
    name: str,
    network: NodeNetwork,
    count: int,
    gpus: int,
    profile: Profile,
    ports: dict[str, int],
    state: dict[str, Any],
    save: Callable[[], None],
    api: client.ApiClient,
    say: Say,
) -> list[str]:
    """Start containerd and a kubelet per node, kube-proxy and the DNS; wait until every node is Ready.

    Returns:
        The real nodes' names.

    Raises:
        RealNodeError: An agent failed to start (its log's tail is in the message).
    """
    started = time.monotonic()
    paths = binaries.ensure(("kubelet", "kube-proxy", "coredns"), progress=say)
    archives = [projectimages.pause_image(), projectimages.build_operator_image(say)]
    names = node_names(count)
    write_node_pki(layout, network, names)
    host = state.setdefault("host", {})
    host.setdefault("sysctls", hostchanges.read_sysctls())
    host.setdefault("paths", hostchanges.missing_host_paths())
    host.setdefault("iptables", {t: sorted(hostchanges.iptables_tables(t)) for t in hostchanges.IPTABLES})
    save()
    cni_dir = layout.base / "cni"
    (cni_dir / "net.d").mkdir(parents=True, exist_ok=True)
    (cni_dir / "net.d" / "10-devcluster.conflist").write_text(
        nodeconfig.cni_conflist(network, cni_dir / "ipam")
    )
    resolv = layout.base / "resolv.conf"
    resolv.write_text(nodeconfig.resolv_conf())
    node_ports = state.setdefault("node_ports", {})
    if not node_ports:
        node_ports.update(
            pick_free_ports(
                [
                    *(f"{n}_{p}" for n in names for p in ("kubelet", "healthz")),
                    "kube_proxy_healthz",
                    "kube_proxy_metrics",
                    "dns_health",
                    "dns_ready",
                ],
                avoid=set(ports.values()),
            )
        )
    save()
    nodes = [
        nodeconfig.RealNode(
            index=i,
            name=n,
            ip=network.node_ips[i],
            directory=layout.base / "nodes" / n,
            kubelet_port=node_ports[f"{n}_kubelet"],
            healthz_port=node_ports[f"{n}_healthz"],
        )
        for i, n in enumerate(names)
    ]
    procs = state.get("node_processes", {})
    labels = node_labels(profile, gpus)
    for node in nodes:
        if _running(state, f"containerd-{node.name}"):
            # A running node gets the current images (the operator image changes with the sources).
            for archive in archives:
                import_image(node.containerd_socket, archive)
        if all(
            process.alive(int(procs[k]["pid"]), procs[k].get("started")) for k in _keys(node) if k in procs
        ) and all(k in procs for k in _keys(node)):
            continue
        node.containerd_dir.mkdir(parents=True, exist_ok=True)
        node.containerd_config.write_text(
            nodeconfig.containerd_config(node, cni_dir / "net.d", projectimages.PAUSE_IMAGE)
        )
        log = layout.logs / f"containerd-{node.name}.log"
        pid = _start_process(
            state,
            f"containerd-{node.name}",
            ["containerd", f"--config={node.containerd_config}"],
            log,
            layout.base,
            save,
        )
        _wait(_ctr_ready(node.containerd_socket), pid, f"containerd of {node.name}", log, 30)
        for archive in archives:
            import_image(node.containerd_socket, archive)
        for cgroup in hostchanges.create_cgroup(node.cgroup):
            hostchanges.record(state, "cgroups", cgroup)
        save()
        node.kubelet_config.write_text(nodeconfig.kubelet_config(node, network, layout.pki, resolv))
        kubeconfig = _kubeconfig(
            layout, name, f"node-{node.name}", f"system:node:{node.name}", ports, network.api_ip
        )
        log = layout.logs / f"kubelet-{node.name}.log"
        pid = _start_process(
            state,
            f"kubelet-{node.name}",
            nodeconfig.kubelet_argv(paths["kubelet"], node, kubeconfig, labels),
            log,
            layout.base,
            save,
        )
        _wait(_ready_check(api, node.name), pid, f"kubelet of {node.name}", log, NODE_READY_TIMEOUT)
        advertise_gpus(api, node.name, gpus)
    if not _running(state, "kube-proxy"):
        kubeconfig = _kubeconfig(layout, name, "kube-proxy", "system:kube-proxy", ports, network.api_ip)
        config = layout.base / "kube-proxy.yaml"
        config.write_text(nodeconfig.kube_proxy_config(network, kubeconfig, names[0], node_ports))
        log = layout.logs / "kube-proxy.log"
        pid = _start_process(
            state,
            "kube-proxy",
            [str(paths["kube-proxy"]), f"--config={config}", "--v=1"],
            log,
            layout.base,
            save,
        )
        hostchanges.record(state, "kube_proxy", str(config))
        url = f"http://127.0.0.1:{node_ports['kube_proxy_healthz']}/healthz"
        _wait(lambda: _http_ok(url), pid, "kube-proxy", log, 60)
    if not _running(state, "coredns"):
        corefile = layout.base / "Corefile"
        corefile.write_text(nodeconfig.corefile(network, layout.kubeconfig, node_ports))
        log = layout.logs / "coredns.log"
        pid = _start_process(
            state, "coredns", [str(paths["coredns"]), "-conf", str(corefile)], log, layout.base, save
        )
        url = f"http://127.0.0.1:{node_ports['dns_ready']}/ready"
        _wait(lambda: _http_ok(url), pid, "coredns", log, 60)
    say(
        f"{count} real nodes Ready in {time.monotonic() - started:.1f}s ({', '.join(names)}, {gpus} GPUs each)"
    )
    return names


def _ctr_ready(sock: Path) -> Callable[[], bool]:
    return lambda: _ctr(sock, "version").returncode == 0


def _ready_check(api: client.ApiClient, name: str) -> Callable[[], bool]:
    return lambda: _node_ready(api, name)


def containerd_sockets(layout: Layout, state: dict[str, Any]) -> list[Path]:
    """The containerd socket of every running real node."""
    keys = sorted(k for k in state.get("node_processes", {}) if k.startswith("containerd-"))
    return [
        layout.base / "nodes" / k.removeprefix("containerd-") / "containerd" / "containerd.sock"
        for k in keys
        if _running(state, k)
    ]


def _keys(node: nodeconfig.RealNode) -> list[str]:
    return [f"containerd-{node.name}", f"kubelet-{node.name}"]


def _running(state: dict[str, Any], key: str) -> bool:
    entry = state.get("node_processes", {}).get(key)
    return bool(entry) and process.alive(int(entry["pid"]), entry.get("started"))


def _http_ok(url: str) -> bool:
    from urllib.parse import urlsplit

    from verl_operator.devcluster.health import http_status

    parts = urlsplit(url)  # loopback only
    return http_status(f"{parts.scheme}://{parts.netloc}", parts.path or "/") == 200


def running(state: dict[str, Any]) -> dict[str, bool]:
    """Whether each started agent still runs."""
    return {key: _running(state, key) for key in state.get("node_processes", {})}


# -- stop ------------------------------------------------------------------------------------------------------


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


def _stop_key(state: dict[str, Any], key: str) -> None:
    entry = state.get("node_processes", {}).pop(key, None)
    if entry:
        process.stop(int(entry["pid"]), entry.get("started"))


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


def stop(
    layout: Layout, state: dict[str, Any], api: client.ApiClient | None, save: Callable[[], None], say: Say
) -> list[str]:
    """Stop every agent and undo every recorded host change; returns what could not be undone.

    Order: the real nodes' pods are deleted (so the kubelets run CNI DEL and unmount volumes), then
    kube-proxy (and ``kube-proxy --cleanup`` removes its iptables rules), the DNS, the kubelets, whatever
    container is left (killed by cgroup), the containerds and their shims; then mounts, the bridge, sysctls,
    cgroups and host paths.
    """
    names = sorted({k.split("-", 1)[1] for k in state.get("node_processes", {}) if k.startswith("kubelet-")})
    if any(running(state).values()):
        _delete_real_pods(api, names, say)
    problems: list[str] = []
    host = state.get("host", {})
    _stop_key(state, "kube-proxy")
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
    _stop_key(state, "coredns")
    for key in sorted(k for k in state.get("node_processes", {}) if k.startswith("kubelet-")):
        _stop_key(state, key)
    save()
    hostchanges.kill_cgroup_processes(host.get("cgroups", []))
    for key in sorted(k for k in state.get("node_processes", {}) if k.startswith("containerd-")):
        _stop_key(state, key)
    for pid in _shim_pids(layout):
        process.stop(pid, timeout=5)
    save()
    hostchanges.unmount_below(layout.base)
    for link in host.get("links", []):
        try:
            hostchanges.delete_link(link)
        except hostchanges.HostError as exc:
            problems.append(str(exc))
    problems += [f"sysctl {k}" for k in hostchanges.restore_sysctls(host.get("sysctls", {}))]
    problems += [f"cgroup {c}" for c in hostchanges.remove_cgroups(host.get("cgroups", []))]
    hostchanges.remove_host_paths(host.get("paths", []))
    state.pop("host", None)
    state.pop("node_processes", None)
    save()
    release(layout)
    return problems
