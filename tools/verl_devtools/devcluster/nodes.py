"""Create, update and remove a profile's simulated nodes through the API server."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from verl_operator.clusters import labels as L
from verl_operator.clusters.profile import Profile, node_manifests
from verl_operator.planner.facts import nvlink_domain_from_product


def apply_nodes(api: client.ApiClient, profile: Profile) -> list[str]:
    """Create the profile's nodes, or bring existing ones back to the profile (labels, capacity).

    Args:
        api: A client of the cluster.
        profile: The profile.

    Returns:
        The node names, in manifest order.
    """
    core = client.CoreV1Api(api)
    names = []
    for manifest in node_manifests(profile):
        name = manifest["metadata"]["name"]
        names.append(name)
        try:
            core.create_node(client.V1Node.model_validate(manifest))
        except ApiException as exc:
            if exc.status != 409:
                raise
            core.patch_node(name, {"metadata": manifest["metadata"]})
            core.patch_node_status(
                name,
                {
                    "status": {
                        "capacity": manifest["status"]["capacity"],
                        "allocatable": manifest["status"]["allocatable"],
                    }
                },
            )
    return names


def remove_nodes(api: client.ApiClient, profile_name: str) -> list[str]:
    """Delete every node a profile created (by the ``verl-operator.io/devcluster-profile`` label).

    Returns:
        The deleted node names.
    """
    core = client.CoreV1Api(api)
    listed = core.list_node(label_selector=f"{L.PROFILE}={profile_name}")
    names = [_name(n) for n in listed.items]
    for name in names:
        try:
            core.delete_node(name)
        except ApiException as exc:
            if exc.status != 404:
                raise
    return names


def _name(node: client.V1Node) -> str:
    return str(node.metadata.name) if node.metadata else ""


def _ready(node: Any) -> bool:
    for condition in (node.status.conditions or []) if node.status else []:
        if condition.type == "Ready":
            return bool(condition.status == "True")
    return False


def wait_nodes_ready(api: client.ApiClient, names: list[str], timeout: float = 60.0) -> None:
    """Wait until kwok reports every named node Ready.

    Raises:
        TimeoutError: Naming the nodes that are not Ready.
    """
    core = client.CoreV1Api(api)
    wanted = set(names)
    deadline = time.monotonic() + timeout
    pending = wanted
    while time.monotonic() < deadline:
        nodes = core.list_node().items
        pending = wanted - {_name(n) for n in nodes if _ready(n)}
        if not pending:
            return
        time.sleep(0.3)
    raise TimeoutError(f"nodes not Ready after {timeout:.0f}s (is kwok running?): {sorted(pending)}")


def wait_nodes_gone(api: client.ApiClient, names: list[str], timeout: float = 60.0) -> None:
    """Wait until none of the named nodes exists.

    Raises:
        TimeoutError: Naming the nodes still there.
    """
    core = client.CoreV1Api(api)
    deadline = time.monotonic() + timeout
    left = set(names)
    while time.monotonic() < deadline:
        left = set(names) & {_name(n) for n in core.list_node().items}
        if not left:
            return
        time.sleep(0.3)
    raise TimeoutError(f"nodes still present after {timeout:.0f}s: {sorted(left)}")


@dataclass(frozen=True)
class NodeRow:
    """One line of the node table, read from a live Node object."""

    name: str
    product: str
    gpus: int
    memory_mib: int | None
    #: ``"<n> (label)"`` when the node carries verl-operator.io/nvlink-domain-size, else ``"<n> (derived)"``
    #: from the product by the planner's rule (docs/topology.md).
    nvlink_domain: str
    clique: str
    rack: str
    ready: bool

    @classmethod
    def from_node(cls, node: Any) -> NodeRow:
        """Read a row from a ``V1Node``."""
        labels: dict[str, str] = node.metadata.labels or {}
        allocatable = (node.status.allocatable or {}) if node.status else {}
        memory = labels.get(L.GPU_MEMORY_MIB)
        gpus = int(allocatable.get(L.GPU_RESOURCE, "0"))
        if L.NVLINK_DOMAIN_SIZE in labels:
            nvlink = f"{labels[L.NVLINK_DOMAIN_SIZE]} (label)"
        elif L.GPU_PRODUCT in labels:
            nvlink = f"{nvlink_domain_from_product(labels[L.GPU_PRODUCT], gpus)} (derived)"
        else:
            nvlink = "-"
        return cls(
            name=node.metadata.name,
            product=labels.get(L.GPU_PRODUCT, "-"),
            gpus=gpus,
            memory_mib=int(memory) if memory and memory.isdigit() else None,
            nvlink_domain=nvlink,
            clique=labels.get(L.GPU_CLIQUE, "-"),
            rack=labels.get(L.RACK, "-"),
            ready=_ready(node),
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-friendly dict."""
        return {
            "name": self.name,
            "product": self.product,
            "gpus": self.gpus,
            "gpuMemoryMiB": self.memory_mib,
            "nvlinkDomainSize": self.nvlink_domain,
            "clique": self.clique,
            "rack": self.rack,
            "ready": self.ready,
        }


def node_rows(api: client.ApiClient) -> list[NodeRow]:
    """A row per node of the cluster, sorted by name."""
    core = client.CoreV1Api(api)
    return sorted((NodeRow.from_node(n) for n in core.list_node().items), key=lambda r: r.name)


def format_table(rows: list[NodeRow]) -> str:
    """The node table as aligned text columns."""
    header = ("NAME", "PRODUCT", "GPUS", "GPU MEMORY", "NVLINK DOMAIN", "CLIQUE", "RACK", "READY")
    lines = [header] + [
        (
            r.name,
            r.product,
            str(r.gpus),
            f"{r.memory_mib} MiB" if r.memory_mib is not None else "-",
            r.nvlink_domain,
            r.clique,
            r.rack,
            "True" if r.ready else "False",
        )
        for r in rows
    ]
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip() for line in lines
    )
