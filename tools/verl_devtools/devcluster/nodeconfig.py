"""Configuration files and command lines of the real-node tier's agents (pure: text in, text out).

Per real node: a containerd (own socket, root and state directories: a kubelet removes every pod of its
runtime that it does not know, so two kubelets cannot share one containerd) and a kubelet (own ports, root
directory, cgroup root and node name). Per instance: one kube-proxy (the nodes share the host's network
namespace, whose Service rules one kube-proxy programs) and the cluster DNS.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import yaml

from verl_devtools.devcluster.nodenet import CLUSTER_DOMAIN, NodeNetwork

#: The taint that keeps every pod without a matching toleration off the real nodes.
REAL_NODE_TAINT = {"key": "verl-operator.io/real-node", "value": "true", "effect": "NoSchedule"}
#: The label every real node carries (select them with ``verl-operator.io/real-node=true``).
REAL_NODE_LABEL = "verl-operator.io/real-node"
#: CNI plugins of Debian's containernetworking-plugins.
CNI_BIN_DIR = "/usr/lib/cni"


@dataclass(frozen=True)
class RealNode:
    """One real node: its name, address, ports and directory."""

    index: int
    name: str
    ip: str
    directory: Path
    kubelet_port: int
    healthz_port: int

    @property
    def containerd_dir(self) -> Path:
        return self.directory / "containerd"

    @property
    def containerd_socket(self) -> Path:
        return self.containerd_dir / "containerd.sock"

    @property
    def containerd_config(self) -> Path:
        return self.containerd_dir / "config.toml"

    @property
    def kubelet_dir(self) -> Path:
        return self.directory / "kubelet"

    @property
    def kubelet_config(self) -> Path:
        return self.directory / "kubelet-config.yaml"

    @property
    def cgroup(self) -> str:
        """The kubelet's ``cgroupRoot`` (its ``kubepods`` hierarchy is created below it)."""
        return f"verl-devcluster-{self.directory.parent.parent.name}-{self.name}"


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))


def _toml(sections: dict[str, dict[str, object]], top: dict[str, object]) -> str:
    lines = [f"{k} = {_toml_value(v)}" for k, v in top.items()]
    for section, values in sections.items():
        lines.append("")
        lines.append(f"[{section}]")
        lines.extend(f"  {k} = {_toml_value(v)}" for k, v in values.items())
    return "\n".join(lines) + "\n"


def containerd_config(node: RealNode, cni_conf_dir: Path, sandbox_image: str) -> str:
    """containerd's ``config.toml`` (version 2) for one node.

    ``restrict_oom_score_adj``: root in a container without CAP_SYS_RESOURCE cannot lower OOM scores, and
    runc fails on the kubelet's negative score otherwise. ``netns_mounts_under_state_dir`` keeps the pods'
    network namespace mounts inside the instance directory.
    """
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    base = node.containerd_dir
    return _toml(
        {
            "grpc": {"address": str(node.containerd_socket)},
            "ttrpc": {"address": str(base / "containerd.sock.ttrpc")},
            "metrics": {"address": ""},
            cri: {
                "sandbox_image": sandbox_image,
                "restrict_oom_score_adj": True,
                "netns_mounts_under_state_dir": True,
                "enable_selinux": False,
                "disable_apparmor": True,
                "stream_server_address": "127.0.0.1",
                "stream_server_port": "0",
            },
            f"{cri}.containerd": {"snapshotter": "overlayfs", "default_runtime_name": "runc"},
            f"{cri}.containerd.runtimes.runc": {"runtime_type": "io.containerd.runc.v2"},
            f"{cri}.containerd.runtimes.runc.options": {"SystemdCgroup": False},
            f"{cri}.cni": {"bin_dir": CNI_BIN_DIR, "conf_dir": str(cni_conf_dir), "max_conf_num": 1},
            'plugins."io.containerd.internal.v1.opt"': {"path": str(base / "opt")},
        },
        {
            "version": 2,
            "root": str(base / "root"),
            "state": str(base / "state"),
            # Snapshotters this machine does not need (each probes the host at start).
            "disabled_plugins": [
                "io.containerd.snapshotter.v1.aufs",
                "io.containerd.snapshotter.v1.btrfs",
                "io.containerd.snapshotter.v1.devmapper",
                "io.containerd.snapshotter.v1.zfs",
                "io.containerd.tracing.processor.v1.otlp",
            ],
        },
    )


def cni_conflist(network: NodeNetwork, ipam_dir: Path) -> str:
    """The CNI network: the tier's bridge, addresses from the pod range (one host-local pool for all nodes)."""
    document = {
        "cniVersion": "1.0.0",
        "name": network.network_name,
        "plugins": [
            {
                "type": "bridge",
                "bridge": network.bridge,
                "isGateway": True,
                # Pods talk only to each other and to addresses on the bridge: no masquerading needed.
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": network.pod_cidr, "gateway": network.gateway}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(ipam_dir),
                },
            }
        ],
    }
    return json.dumps(document, indent=2) + "\n"


def kubelet_config(node: RealNode, network: NodeNetwork, pki: Path, resolv_conf: Path) -> str:
    """The ``KubeletConfiguration`` of one node.

    Authentication is by client certificate (the API server's kubelet client certificate, signed by the
    instance CA) with authorization through the API server; no anonymous or read-only port.
    """
    document = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": node.ip,
        "port": node.kubelet_port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": node.healthz_port,
        "tlsCertFile": str(pki / f"kubelet-{node.name}.crt"),
        "tlsPrivateKeyFile": str(pki / f"kubelet-{node.name}.key"),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(pki / "ca.crt")},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": f"unix://{node.containerd_socket}",
        "cgroupDriver": "cgroupfs",
        "cgroupRoot": f"/{node.cgroup}",
        # This machine runs cgroup v1 (kubelet 1.35 refuses it unless told otherwise).
        "failCgroupV1": False,
        "failSwapOn": False,
        "clusterDNS": [network.dns_ip],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(resolv_conf),
        "podLogsDir": str(node.directory / "pod-logs"),
        "volumePluginDir": str(node.directory / "volume-plugins"),
        # No iptables chains of the kubelet's own (kube-proxy's are removed with `kube-proxy --cleanup`).
        "makeIPTablesUtilChains": False,
        # Development machine: evict only when nearly out of memory or disk, never collect the local images
        # (they cannot be pulled again).
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "maxPods": 30,
        "registerWithTaints": [REAL_NODE_TAINT],
        "nodeStatusUpdateFrequency": "4s",
        "shutdownGracePeriod": "0s",
    }
    return yaml.safe_dump(document, sort_keys=True)


def kubelet_argv(binary: Path, node: RealNode, kubeconfig: Path, labels: dict[str, str]) -> list[str]:
    """The kubelet's command line."""
    label_text = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
    return [
        str(binary),
        f"--config={node.kubelet_config}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={node.kubelet_dir}",
        f"--cert-dir={node.directory / 'kubelet-pki'}",
        f"--hostname-override={node.name}",
        f"--node-ip={node.ip}",
        f"--node-labels={label_text}",
        "--v=1",
    ]


def kube_proxy_config(network: NodeNetwork, kubeconfig: Path, node_name: str, ports: dict[str, int]) -> str:
    """The ``KubeProxyConfiguration`` (iptables mode) of the instance."""
    document = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "mode": "iptables",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": node_name,
        "bindAddress": "127.0.0.1",
        "healthzBindAddress": f"127.0.0.1:{ports['kube_proxy_healthz']}",
        "metricsBindAddress": f"127.0.0.1:{ports['kube_proxy_metrics']}",
        # A healthz or metrics port taken since it was picked: exit (the devcluster starts it again on new
        # ports) instead of retrying the bind every 5 s and never getting ready.
        "bindAddressHardFail": True,
        "clusterCIDR": network.pod_cidr,
        # NodePorts only on the nodes' addresses, never on the machine's interfaces.
        "nodePortAddresses": [f"{ip}/32" for ip in network.node_ips],
        "iptables": {
            # Every Service connection is masqueraded, so replies between pods on the one bridge pass
            # through the host (no br_netfilter needed).
            "masqueradeAll": True,
            # No route_localnet sysctl: NodePorts are not served on 127.0.0.1.
            "localhostNodePorts": False,
            "syncPeriod": "30s",
            "minSyncPeriod": "0s",
        },
        # Zero: keep the host's conntrack settings (kube-proxy otherwise raises the table size and timeouts).
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }
    return yaml.safe_dump(document, sort_keys=True)


def resolv_conf() -> str:
    """The resolver file the kubelet builds the pods' ``/etc/resolv.conf`` from (no upstream servers)."""
    return "options ndots:5\n"


def corefile(network: NodeNetwork, kubeconfig: Path, ports: dict[str, int]) -> str:
    """CoreDNS's Corefile: the cluster domain from the API server, served on the DNS address only."""
    return (
        f"{CLUSTER_DOMAIN}:53 {{\n"
        f"    bind {network.dns_ip}\n"
        "    errors\n"
        f"    health 127.0.0.1:{ports['dns_health']}\n"
        f"    ready 127.0.0.1:{ports['dns_ready']}\n"
        f"    kubernetes {CLUSTER_DOMAIN} {{\n"
        f"        kubeconfig {kubeconfig}\n"
        "        pods insecure\n"
        "        ttl 5\n"
        "    }\n"
        "}\n"
    )
