"""Real kubelet nodes beside the kwok nodes: containerd, kubelet, kube-proxy and the cluster DNS, run by pid.

``start`` brings up N real nodes on a running devcluster whose API server listens on the tier's bridge
(see :mod:`verl_devtools.devcluster.nodenet`); ``stop`` (:mod:`verl_devtools.devcluster.nodeteardown`)
stops every process it started and undoes every host change it recorded (links, sysctls, cgroups, mounts,
iptables rules, host paths). The host's packages, the machine's one-instance owner record and the address
link are in :mod:`verl_devtools.devcluster.nodehost`; the agents' process bookkeeping is in
:mod:`verl_devtools.devcluster.nodeagents`. This module re-exports what the devcluster calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from verl_devtools.devcluster import binaries, certs, hostchanges, nodeconfig, projectimages
from verl_devtools.devcluster.errors import RealNodeError
from verl_devtools.devcluster.kubeconfig import write_kubeconfig
from verl_devtools.devcluster.layout import Layout, apiserver_url
from verl_devtools.devcluster.nodeagents import (
    agent_running,
    containerd_sockets,
    ctr_ready,
    http_ok,
    import_image,
    running,
    start_agent,
    wait_ready,
)
from verl_devtools.devcluster.nodehost import (
    OWNER_FILE,
    claim,
    create_network,
    ensure_host_packages,
    owner,
    release,
)
from verl_devtools.devcluster.nodenet import NodeNetwork
from verl_devtools.devcluster.nodeteardown import stop
from verl_devtools.devcluster.ports import ADDRESS_IN_USE, pick_free_ports
from verl_operator.clusters import labels as L
from verl_operator.clusters.profile import Profile, gpu_labels

__all__ = [
    "NODE_READY_TIMEOUT",
    "OWNER_FILE",
    "RealNodeError",
    "advertise_gpus",
    "claim",
    "containerd_sockets",
    "create_network",
    "ensure_host_packages",
    "import_image",
    "node_labels",
    "node_names",
    "owner",
    "release",
    "running",
    "start",
    "stop",
    "write_node_pki",
]

#: Starts of a kubelet whose port was taken between the pick and its bind (each start on new ports).
PORT_TRIES = 3
#: Seconds for a node to register Ready.
NODE_READY_TIMEOUT = 90.0
#: Seconds for a node's containerd to answer ``ctr version`` after its start (it starts in about a second).
CONTAINERD_READY_TIMEOUT = 30.0
#: Seconds for kube-proxy's healthz and the DNS's readiness endpoint to answer after their start.
AGENT_READY_TIMEOUT = 60.0

Say = Callable[[str], None]


@dataclass(frozen=True)
class _Run:
    """What every step of ``start`` needs: the instance, its ports, the state and the agents' binaries."""

    layout: Layout
    name: str
    network: NodeNetwork
    ports: dict[str, int]
    node_ports: dict[str, int]
    state: dict[str, Any]
    save: Callable[[], None]
    api: client.ApiClient
    paths: dict[str, Path]
    cni_dir: Path
    resolv: Path

    def start_agent(self, key: str, argv: list[str], log: Path) -> int:
        return start_agent(self.state, key, argv, log, self.layout.base, self.save)

    def kubeconfig(self, who: str, user: str) -> Path:
        """A client kubeconfig of ``who`` (its certificate) for the API server on the bridge."""
        path = self.layout.base / "kubeconfigs" / f"{who}.kubeconfig"
        pki = self.layout.pki
        pair = certs.CertPair(pki / f"{who}.crt", pki / f"{who}.key")
        url = apiserver_url(self.ports, self.network.api_ip)
        return write_kubeconfig(path, f"verl-devcluster-{self.name}", url, pki / "ca.crt", pair, user)


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

    Agents that still run are kept (a running node only gets the current images).

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
    _record_host_state(state)
    save()
    cni_dir, resolv = _write_node_files(layout, network)
    node_ports = _node_ports(state, names, ports)
    save()
    run = _Run(layout, name, network, ports, node_ports, state, save, api, paths, cni_dir, resolv)
    labels = node_labels(profile, gpus)
    for index, node_name in enumerate(names):

        def start_node(index: int = index) -> None:
            node = _real_nodes(layout, network, names, node_ports)[index]  # the node's current ports
            _start_node(run, node, archives, labels, gpus)

        retry_on_taken_ports(
            start_node,
            node_ports,
            [f"{node_name}_kubelet", f"{node_name}_healthz"],
            set(ports.values()),
            save,
        )
    # kube-proxy's and CoreDNS's own ports were picked free and are bound only as they start: one taken in
    # between makes the agent exit on its bind, and it starts again on new ones.
    host_agents = {"kube-proxy": lambda: _start_kube_proxy(run, names[0]), "coredns": lambda: _start_dns(run)}
    for key, start_agent_once in host_agents.items():
        if not agent_running(state, key):
            retry_on_taken_ports(
                start_agent_once, node_ports, HOST_AGENT_PORTS[key], set(ports.values()), save
            )
    say(
        f"{count} real nodes Ready in {time.monotonic() - started:.1f}s ({', '.join(names)}, {gpus} GPUs each)"
    )
    return names


def node_names(count: int) -> list[str]:
    """The real nodes' names: ``real-0``, ``real-1``, ..."""
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


def advertise_gpus(api: client.ApiClient, name: str, gpus: int) -> None:
    """Add ``nvidia.com/gpu`` capacity to the node's status, as a device plugin would (kept by the kubelet)."""
    client.CoreV1Api(api).patch_node_status(
        name,
        {"status": {"capacity": {L.GPU_RESOURCE: str(gpus)}, "allocatable": {L.GPU_RESOURCE: str(gpus)}}},
    )


# -- the steps of start ----------------------------------------------------------------------------------------


def _record_host_state(state: dict[str, Any]) -> None:
    """Record the host's sysctls, missing host paths and iptables tables before the first change (once)."""
    host = state.setdefault("host", {})
    host.setdefault("sysctls", hostchanges.read_sysctls())
    host.setdefault("paths", hostchanges.missing_host_paths())
    host.setdefault("iptables", {t: sorted(hostchanges.iptables_tables(t)) for t in hostchanges.IPTABLES})


def _write_node_files(layout: Layout, network: NodeNetwork) -> tuple[Path, Path]:
    """Write the CNI configuration and the nodes' resolv.conf; returns the CNI directory and resolv.conf."""
    cni_dir = layout.base / "cni"
    (cni_dir / "net.d").mkdir(parents=True, exist_ok=True)
    (cni_dir / "net.d" / "10-devcluster.conflist").write_text(
        nodeconfig.cni_conflist(network, cni_dir / "ipam")
    )
    resolv = layout.base / "resolv.conf"
    resolv.write_text(nodeconfig.resolv_conf())
    return cni_dir, resolv


#: The ports of the agents that serve the whole instance (kube-proxy, CoreDNS), by agent: new ones are picked
#: for an agent whose port was taken since the pick.
HOST_AGENT_PORTS: dict[str, tuple[str, ...]] = {
    "kube-proxy": ("kube_proxy_healthz", "kube_proxy_metrics"),
    "coredns": ("dns_health", "dns_ready"),
}


def _node_ports(state: dict[str, Any], names: list[str], ports: dict[str, int]) -> dict[str, int]:
    """The agents' ports: picked free (apart from the control plane's) at the first start, then kept."""
    node_ports: dict[str, int] = state.setdefault("node_ports", {})
    if not node_ports:
        wanted = [
            *(f"{n}_{p}" for n in names for p in ("kubelet", "healthz")),
            *(key for keys in HOST_AGENT_PORTS.values() for key in keys),
        ]
        node_ports.update(pick_free_ports(wanted, avoid=set(ports.values())))
    return node_ports


def retry_on_taken_ports(
    start: Callable[[], None],
    node_ports: dict[str, int],
    keys: Sequence[str],
    avoid: set[int],
    save: Callable[[], None],
    tries: int = PORT_TRIES,
) -> None:
    """Run ``start``; when it fails because a port of ``keys`` was taken since the pick (the agent exited on
    its bind: "address already in use" in the error's log tail), pick new ports for ``keys`` (apart from
    ``avoid`` and the other agents' ports), save them and start again, ``tries`` starts in all.

    A kubelet exits when its port is taken; its node's containerd keeps running (``_start_node`` starts only
    what is not running).

    Raises:
        RealNodeError: another failure, or a port taken at every try.
    """
    for attempt in range(1, tries + 1):
        try:
            start()
            return
        except RealNodeError as exc:
            if ADDRESS_IN_USE not in str(exc).lower() or attempt == tries:
                raise
        others = {port for key, port in node_ports.items() if key not in keys}
        node_ports.update(pick_free_ports(keys, avoid=avoid | others | {node_ports[k] for k in keys}))
        save()


def _real_nodes(
    layout: Layout, network: NodeNetwork, names: list[str], node_ports: dict[str, int]
) -> list[nodeconfig.RealNode]:
    return [
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


def _start_node(
    run: _Run, node: nodeconfig.RealNode, archives: list[Path], labels: dict[str, str], gpus: int
) -> None:
    """Start the node's containerd (with the images) and kubelet unless both still run."""
    if agent_running(run.state, f"containerd-{node.name}"):
        # A running node gets the current images (the operator image changes with the sources).
        for archive in archives:
            import_image(node.containerd_socket, archive)
    if all(agent_running(run.state, key) for key in (f"containerd-{node.name}", f"kubelet-{node.name}")):
        return
    if not agent_running(run.state, f"containerd-{node.name}"):  # kept when only the kubelet starts again
        _start_containerd(run, node, archives)
    for cgroup in hostchanges.create_cgroup(node.cgroup):
        hostchanges.record(run.state, "cgroups", cgroup)
    run.save()
    _start_kubelet(run, node, labels)
    advertise_gpus(run.api, node.name, gpus)


def _start_containerd(run: _Run, node: nodeconfig.RealNode, archives: list[Path]) -> None:
    node.containerd_dir.mkdir(parents=True, exist_ok=True)
    node.containerd_config.write_text(
        nodeconfig.containerd_config(node, run.cni_dir / "net.d", projectimages.PAUSE_IMAGE)
    )
    log = run.layout.logs / f"containerd-{node.name}.log"
    argv = ["containerd", f"--config={node.containerd_config}"]
    pid = run.start_agent(f"containerd-{node.name}", argv, log)
    wait_ready(
        ctr_ready(node.containerd_socket), pid, f"containerd of {node.name}", log, CONTAINERD_READY_TIMEOUT
    )
    for archive in archives:
        import_image(node.containerd_socket, archive)


def _start_kubelet(run: _Run, node: nodeconfig.RealNode, labels: dict[str, str]) -> None:
    node.kubelet_config.write_text(nodeconfig.kubelet_config(node, run.network, run.layout.pki, run.resolv))
    kubeconfig = run.kubeconfig(f"node-{node.name}", f"system:node:{node.name}")
    log = run.layout.logs / f"kubelet-{node.name}.log"
    argv = nodeconfig.kubelet_argv(run.paths["kubelet"], node, kubeconfig, labels)
    pid = run.start_agent(f"kubelet-{node.name}", argv, log)
    ready = _ready_check(run.api, node.name)
    wait_ready(ready, pid, f"kubelet of {node.name}", log, NODE_READY_TIMEOUT)


def _start_kube_proxy(run: _Run, first_node: str) -> None:
    kubeconfig = run.kubeconfig("kube-proxy", "system:kube-proxy")
    config = run.layout.base / "kube-proxy.yaml"
    config.write_text(nodeconfig.kube_proxy_config(run.network, kubeconfig, first_node, run.node_ports))
    log = run.layout.logs / "kube-proxy.log"
    pid = run.start_agent("kube-proxy", [str(run.paths["kube-proxy"]), f"--config={config}", "--v=1"], log)
    hostchanges.record(run.state, "kube_proxy", str(config))
    url = f"http://127.0.0.1:{run.node_ports['kube_proxy_healthz']}/healthz"
    wait_ready(lambda: http_ok(url), pid, "kube-proxy", log, AGENT_READY_TIMEOUT)


def _start_dns(run: _Run) -> None:
    corefile = run.layout.base / "Corefile"
    corefile.write_text(nodeconfig.corefile(run.network, run.layout.kubeconfig, run.node_ports))
    log = run.layout.logs / "coredns.log"
    pid = run.start_agent("coredns", [str(run.paths["coredns"]), "-conf", str(corefile)], log)
    url = f"http://127.0.0.1:{run.node_ports['dns_ready']}/ready"
    wait_ready(lambda: http_ok(url), pid, "coredns", log, AGENT_READY_TIMEOUT)


def _ready_check(api: client.ApiClient, name: str) -> Callable[[], bool]:
    return lambda: _node_ready(api, name)


def _node_ready(api: client.ApiClient, name: str) -> bool:
    try:
        node = client.CoreV1Api(api).read_node(name)
    except ApiException:
        return False
    conditions = (node.status.conditions if node.status else None) or []
    return any(c.type == "Ready" and c.status == "True" for c in conditions)
