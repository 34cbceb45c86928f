"""Where one devcluster instance keeps its files, and the command lines of its components (pure)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from verl_devtools.devcluster.nodenet import NodeNetwork
from verl_operator.clusters import labels as L

#: Components in start order (stopped in reverse).
COMPONENTS: tuple[str, ...] = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")

#: ClusterIP range of Services (any private range: nothing routes to it in a simulation).
SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"

#: Controllers the controller-manager runs: object lifecycle (garbage collection, namespaces, service
#: accounts and their tokens, the root CA ConfigMap) and the workload controllers a chart or an operator
#: relies on. Node lifecycle, IPAM, volumes and cloud controllers have nothing to do on simulated nodes.
CONTROLLERS: tuple[str, ...] = (
    "garbage-collector-controller",
    "namespace-controller",
    "serviceaccount-controller",
    "serviceaccount-token-controller",
    "root-ca-certificate-publisher-controller",
    "clusterrole-aggregation-controller",
    "deployment-controller",
    "replicaset-controller",
    "statefulset-controller",
    "job-controller",
    "endpoints-controller",
    "endpointslice-controller",
    "disruption-controller",
    "pod-garbage-collector-controller",
    "resourcequota-controller",
    "ttl-after-finished-controller",
)
#: With real nodes, DaemonSets run too (the topology probe).
REAL_NODE_CONTROLLERS: tuple[str, ...] = (*CONTROLLERS, "daemonset-controller")


@dataclass(frozen=True)
class Layout:
    """The files of one instance, all under ``base``."""

    base: Path

    @property
    def state_file(self) -> Path:
        return self.base / "state.json"

    @property
    def pki(self) -> Path:
        return self.base / "pki"

    @property
    def etcd_data(self) -> Path:
        return self.base / "etcd-data"

    @property
    def logs(self) -> Path:
        return self.base / "logs"

    @property
    def kubeconfig(self) -> Path:
        """The admin kubeconfig (``system:masters``), for users and tests."""
        return self.base / "kubeconfig"

    @property
    def kwok_config(self) -> Path:
        return self.base / "kwok.yaml"

    def component_kubeconfig(self, component: str) -> Path:
        return self.base / "kubeconfigs" / f"{component}.kubeconfig"

    def log(self, component: str) -> Path:
        return self.logs / f"{component}.log"


def apiserver_url(ports: dict[str, int], host: str = "127.0.0.1") -> str:
    """The API server's URL (on loopback, or on the real-node bridge's address)."""
    return f"https://{host}:{ports['apiserver']}"


def _apiserver_network_args(layout: Layout, network: NodeNetwork | None) -> list[str]:
    if network is None:
        return [
            "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            # Endpoints of the 'kubernetes' Service would point at 127.0.0.1, which Endpoints reject.
            "--endpoint-reconciler-type=none",
        ]
    pki = layout.pki
    # Real nodes: the API server listens on the tier's bridge address, which pods reach through the
    # 'kubernetes' Service (its endpoint is the advertised address); it calls the kubelets with a client
    # certificate and checks their serving certificates against the instance CA.
    return [
        f"--bind-address={network.api_ip}",
        f"--advertise-address={network.api_ip}",
        f"--service-cluster-ip-range={network.service_cidr}",
        "--endpoint-reconciler-type=lease",
        f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
        f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
        f"--kubelet-certificate-authority={pki / 'ca.crt'}",
        "--kubelet-preferred-address-types=InternalIP,Hostname",
    ]


def component_argv(
    component: str,
    binary: Path,
    layout: Layout,
    ports: dict[str, int],
    name: str,
    network: NodeNetwork | None = None,
) -> list[str]:
    """The command line of one component.

    Args:
        component: One of :data:`COMPONENTS`.
        binary: Its executable.
        layout: The instance's files.
        ports: The instance's ports (see ``ports.PORT_NAMES``).
        name: The instance name (the controller-manager's ``--cluster-name``).
        network: The real-node network, when the instance has real nodes.

    Returns:
        argv, every server bound to 127.0.0.1 (the API server to the real-node bridge's address instead).

    Raises:
        KeyError: Unknown component.
    """
    builder = _ARGV_BUILDERS.get(component)
    if builder is None:
        raise KeyError(f"unknown component {component!r}")
    return [str(binary), *builder(layout, ports, name, network)]


def _etcd_args(layout: Layout, ports: dict[str, int], name: str, network: NodeNetwork | None) -> list[str]:
    client = f"http://127.0.0.1:{ports['etcd_client']}"
    peer = f"http://127.0.0.1:{ports['etcd_peer']}"
    return [
        "--name=devcluster",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=devcluster={peer}",
        # A throwaway development store: skipping fsync keeps the API fast on a small, shared disk.
        "--unsafe-no-fsync=true",
        "--log-level=warn",
    ]


def _apiserver_args(
    layout: Layout, ports: dict[str, int], name: str, network: NodeNetwork | None
) -> list[str]:
    pki = layout.pki
    return [
        f"--etcd-servers=http://127.0.0.1:{ports['etcd_client']}",
        *_apiserver_network_args(layout, network),
        f"--secure-port={ports['apiserver']}",
        f"--cert-dir={pki}",
        f"--tls-cert-file={pki / 'apiserver.crt'}",
        f"--tls-private-key-file={pki / 'apiserver.key'}",
        f"--client-ca-file={pki / 'ca.crt'}",
        "--authorization-mode=Node,RBAC",
        "--enable-admission-plugins=NodeRestriction",
        # New nodes get a not-ready taint from this plugin that only the node-lifecycle controller lifts;
        # simulated nodes are Ready from the start and that controller is not run (see CONTROLLERS).
        "--disable-admission-plugins=TaintNodesByCondition",
        # The aggregation layer's front proxy (also fills the request-header CA that the
        # controller-manager and scheduler read for their own authentication).
        f"--requestheader-client-ca-file={pki / 'front-proxy-ca.crt'}",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        f"--proxy-client-cert-file={pki / 'front-proxy-client.crt'}",
        f"--proxy-client-key-file={pki / 'front-proxy-client.key'}",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={pki / 'sa.pub'}",
        f"--service-account-signing-key-file={pki / 'sa.key'}",
        "--allow-privileged=true",
        "--profiling=false",
        "--v=1",
    ]


def _client_component_args(layout: Layout, component: str) -> list[str]:
    """The flags the controller-manager and the scheduler share (their kubeconfig, loopback, no election)."""
    kubeconfig = str(layout.component_kubeconfig(component))
    return [
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        "--bind-address=127.0.0.1",
        "--leader-elect=false",
        "--profiling=false",
        "--v=1",
    ]


def _controller_manager_args(
    layout: Layout, ports: dict[str, int], name: str, network: NodeNetwork | None
) -> list[str]:
    pki = layout.pki
    return [
        *_client_component_args(layout, "kube-controller-manager"),
        f"--secure-port={ports['controller_manager']}",
        f"--controllers={','.join(REAL_NODE_CONTROLLERS if network else CONTROLLERS)}",
        "--use-service-account-credentials=true",
        f"--service-account-private-key-file={pki / 'sa.key'}",
        f"--root-ca-file={pki / 'ca.crt'}",
        f"--cluster-signing-cert-file={pki / 'ca.crt'}",
        f"--cluster-signing-key-file={pki / 'ca.key'}",
        f"--cluster-name=verl-devcluster-{name}",
    ]


def _scheduler_args(
    layout: Layout, ports: dict[str, int], name: str, network: NodeNetwork | None
) -> list[str]:
    return [*_client_component_args(layout, "kube-scheduler"), f"--secure-port={ports['scheduler']}"]


def _kwok_args(layout: Layout, ports: dict[str, int], name: str, network: NodeNetwork | None) -> list[str]:
    return [
        f"--kubeconfig={layout.component_kubeconfig('kwok')}",
        f"--config={layout.kwok_config}",
        "--manage-all-nodes=false",
        f"--manage-nodes-with-annotation-selector={L.KWOK_NODE}={L.KWOK_NODE_VALUE}",
        f"--server-address=127.0.0.1:{ports['kwok']}",
        # Pod IPs come from one /16 (the first address is the start of the pool); node IPs are fixed.
        "--cidr=10.244.0.1/16",
        "--node-ip=10.1.0.1",
    ]


#: Each component's flags (after its executable), from the instance's files, ports, name and network.
_ARGV_BUILDERS: dict[str, Callable[[Layout, dict[str, int], str, NodeNetwork | None], list[str]]] = {
    "etcd": _etcd_args,
    "kube-apiserver": _apiserver_args,
    "kube-controller-manager": _controller_manager_args,
    "kube-scheduler": _scheduler_args,
    "kwok": _kwok_args,
}
