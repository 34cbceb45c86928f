"""Addresses and names of the real-node tier's network (pure: no I/O).

The tier creates two links: ``vod<hash>``, a bridge with no ports that only holds addresses (this kernel's
stand-in for a dummy interface: the API server's and the cluster DNS's address and one address per node,
all from an RFC 5737 documentation range that no interface or route of the machine already uses,
TEST-NET-1 first), and ``vob<hash>``, the pods' bridge (the CNI bridge plugin owns its address in the pod
range). Nothing binds to the machine's own interfaces.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

#: RFC 5737 documentation ranges, in the order they are tried.
DOCUMENTATION_RANGES: tuple[str, ...] = ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24")
#: Pod addresses of the real nodes (kwok's simulated pods use 10.244.0.0/16).
POD_CIDR = "10.245.0.0/16"
#: ClusterIP range of a devcluster with real nodes (the kwok-only instances use 10.96.0.0/16): Services of
#: this instance get iptables rules on the host, which must never match another instance's addresses.
SERVICE_CIDR = "10.97.0.0/16"
#: Kubernetes' DNS domain of the cluster.
CLUSTER_DOMAIN = "cluster.local"


class NetworkError(RuntimeError):
    """No address range is free, or the pod range is already in use."""


@dataclass(frozen=True)
class NodeNetwork:
    """The addresses of one real-node instance.

    Attributes:
        bridge: The pods' bridge (their veths attach to it; created by the CNI bridge plugin).
        address_link: The link that holds the addresses below.
        network_name: The CNI network name.
        api_ip: Where the API server listens and what it advertises (the ``kubernetes`` Service endpoint).
        dns_ip: Where the cluster DNS listens (the pods' nameserver).
        node_ips: One address per real node (the kubelet's ``--node-ip`` and serving address).
        pod_cidr: The pods' range; its first address is the bridge's gateway address.
        service_cidr: The ClusterIP range.
    """

    bridge: str
    address_link: str
    network_name: str
    api_ip: str
    dns_ip: str
    node_ips: tuple[str, ...]
    pod_cidr: str = POD_CIDR
    service_cidr: str = SERVICE_CIDR

    @property
    def gateway(self) -> str:
        """The bridge's address in the pod range (the pods' default gateway)."""
        return str(next(ipaddress.ip_network(self.pod_cidr).hosts()))

    @property
    def kubernetes_service_ip(self) -> str:
        """The ``kubernetes`` Service's ClusterIP (the first address of the range)."""
        return str(next(ipaddress.ip_network(self.service_cidr).hosts()))

    @property
    def dns_service_ip(self) -> str:
        """Not a Service here: the pods use :attr:`dns_ip` directly."""
        return self.dns_ip


def short_hash(name: str, length: int = 6) -> str:
    """A stable hex digest of an instance name (interface names are limited to 15 characters)."""
    return hashlib.sha256(name.encode()).hexdigest()[:length]


def choose_range(in_use: Iterable[str]) -> ipaddress.IPv4Network:
    """The first documentation range that overlaps none of the networks in use.

    Args:
        in_use: Networks of the machine's interface addresses and routes (``"192.0.2.2/24"``, ...).

    Returns:
        The range.

    Raises:
        NetworkError: Every documentation range is in use.
    """
    used = [ipaddress.ip_network(n, strict=False) for n in in_use]
    used4 = [n for n in used if isinstance(n, ipaddress.IPv4Network)]
    for candidate in DOCUMENTATION_RANGES:
        network = ipaddress.IPv4Network(candidate)
        if not any(network.overlaps(n) for n in used4 if n.prefixlen > 0):
            return network
    raise NetworkError(
        f"every RFC 5737 range ({', '.join(DOCUMENTATION_RANGES)}) is used by an interface or route of "
        "this machine: the real-node tier needs one of them"
    )


def plan_network(instance: str, nodes: int, in_use: Iterable[str]) -> NodeNetwork:
    """The addresses of an instance with ``nodes`` real nodes.

    Example: with the machine on ``192.0.2.2/24`` the range is ``198.51.100.0/24``: the API server and DNS
    on ``.1``, nodes on ``.11``, ``.12``, ...

    Raises:
        NetworkError: No range is free, or the pod range overlaps a network in use.
    """
    used = list(in_use)
    pods = ipaddress.ip_network(POD_CIDR)
    clash = [n for n in used if ipaddress.ip_network(n, strict=False).overlaps(pods)]
    clash = [n for n in clash if ipaddress.ip_network(n, strict=False).prefixlen > 0]
    if clash:
        raise NetworkError(f"the pod range {POD_CIDR} overlaps {', '.join(clash)} on this machine")
    network = choose_range(used)
    base = network.network_address
    suffix = short_hash(instance)
    return NodeNetwork(
        bridge=f"vob{suffix}",
        address_link=f"vod{suffix}",
        network_name=f"verl-devcluster-{suffix}",
        api_ip=str(base + 1),
        dns_ip=str(base + 1),
        node_ips=tuple(str(base + 11 + i) for i in range(nodes)),
    )
