"""The files an instance needs before its processes start: PKI, kubeconfigs, the kwok configuration."""

from __future__ import annotations

from importlib import resources

from verl_devtools.devcluster import certs
from verl_devtools.devcluster.kubeconfig import write_kubeconfig
from verl_devtools.devcluster.layout import Layout, apiserver_url

#: The client identity (certificate CN and O) of each component and of the admin kubeconfig.
IDENTITIES: dict[str, tuple[str, str | None]] = {
    "admin": ("verl-operator-admin", "system:masters"),
    "kube-controller-manager": ("system:kube-controller-manager", None),
    "kube-scheduler": ("system:kube-scheduler", None),
    "kwok": ("kwok-controller", "system:masters"),
}

#: Written after every certificate and key of an instance was generated (a half-written PKI is redone).
_PKI_COMPLETE = ".complete"


def write_pki(layout: Layout, name: str, extra_ips: tuple[str, ...] = ("10.96.0.1",)) -> None:
    """Generate the instance's CA, serving and client certificates and keys, once.

    Args:
        layout: The instance's files.
        name: The instance name (in the CA's common name).
        extra_ips: IP addresses of the API server's certificate besides 127.0.0.1: the 'kubernetes'
            Service's ClusterIP (the first address of the service range) and, with real nodes, the address
            the API server listens on.
    """
    pki = layout.pki
    if (pki / _PKI_COMPLETE).is_file():
        return
    pki.mkdir(parents=True, exist_ok=True)
    ca = certs.write_ca(pki, f"verl-devcluster-{name}-ca")
    certs.write_signed(
        ca,
        pki,
        "apiserver",
        "kube-apiserver",
        server_names=("localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"),
        server_ips=("127.0.0.1", *extra_ips),
    )
    # The API server's client certificate towards the kubelets (only real nodes have a kubelet to call).
    certs.write_signed(
        ca, pki, "apiserver-kubelet-client", "kube-apiserver-kubelet-client", organization="system:masters"
    )
    for who, (common_name, organization) in IDENTITIES.items():
        certs.write_signed(ca, pki, who, common_name, organization=organization)
    certs.write_service_account_keys(pki)
    front_proxy = certs.write_ca(pki, f"verl-devcluster-{name}-front-proxy-ca", stem="front-proxy-ca")
    certs.write_signed(front_proxy, pki, "front-proxy-client", "front-proxy-client")
    (pki / _PKI_COMPLETE).write_text("")


def write_kubeconfigs(layout: Layout, name: str, ports: dict[str, int], host: str = "127.0.0.1") -> None:
    """Write the admin kubeconfig and one per component (the API server's port may change between starts)."""
    pki = layout.pki
    cluster_name = f"verl-devcluster-{name}"
    for who, (common_name, _) in IDENTITIES.items():
        path = layout.kubeconfig if who == "admin" else layout.component_kubeconfig(who)
        pair = certs.CertPair(pki / f"{who}.crt", pki / f"{who}.key")
        write_kubeconfig(path, cluster_name, apiserver_url(ports, host), pki / "ca.crt", pair, common_name)


def write_kwok_config(layout: Layout) -> None:
    """Write kwok's configuration: its options and our Stage objects (``devcluster/stages/*.yaml``)."""
    stages = resources.files("verl_devtools.devcluster") / "stages"
    documents = [
        "apiVersion: config.kwok.x-k8s.io/v1alpha1\nkind: KwokConfiguration\noptions:\n  enableCNI: false\n",
        (stages / "node.yaml").read_text(),
        (stages / "pod.yaml").read_text(),
    ]
    layout.kwok_config.write_text("\n---\n".join(documents))
