"""Cluster facts from raw Kubernetes Node objects (camelCase dicts, as ``kubectl get nodes -o json`` gives).

NVLink domain (see ``docs/topology.md``): the label ``verl-operator.io/nvlink-domain-size`` (GPUs per
intra-node NVLink domain, ``"1"`` = none) wins when the launcher's topology probe has written it; otherwise the
size is derived from ``nvidia.com/gpu.product``: SXM/HGX/NVSwitch parts -> all GPUs of the node, PCIe parts -> 1.
``nvidia.com/gpu.clique`` names a multi-node NVLink domain (GB200 NVL72). The GPU labels themselves (GFD, GKE,
Karpenter spellings; MIG and sharing) are read by :mod:`verl_operator.planner.gpu_labels`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from verl_contract.gpu_product import product_key, product_tokens
from verl_operator.planner.gpu_labels import read_gpu_labels

GPU_RESOURCE = "nvidia.com/gpu"
LABEL_CLIQUE = "nvidia.com/gpu.clique"
LABEL_NVLINK_DOMAIN = "verl-operator.io/nvlink-domain-size"
TOPOLOGY_LABELS: tuple[str, ...] = (
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
    "network.topology.nvidia.com/spine",
    "network.topology.nvidia.com/leaf",
    "cloud.google.com/gce-topology-block",
    "cloud.google.com/gce-topology-subblock",
    "topology.k8s.aws/network-node-layer-1",
    "topology.k8s.aws/network-node-layer-2",
    "topology.k8s.aws/network-node-layer-3",
)
#: Network domains from the narrowest to the widest, in each labelling style (NVIDIA Topograph's leaf and spine,
#: GKE's sub-block and block, EKS's network node layers 3 and 2, layer 3 the closest to the instance): a
#: multi-node job without ``spec.placement.topologyPolicy`` is placed in the first of them one domain of which
#: holds it (``placement.choose``).
NETWORK_DOMAINS: tuple[str, ...] = (
    "network.topology.nvidia.com/leaf",
    "cloud.google.com/gce-topology-subblock",
    "topology.k8s.aws/network-node-layer-3",
    "network.topology.nvidia.com/spine",
    "cloud.google.com/gce-topology-block",
    "topology.k8s.aws/network-node-layer-2",
)

#: GPU memory in MiB by product (what the GPU reports), used when ``nvidia.com/gpu.memory`` is absent.
#: Keys are matched against the product's :func:`~verl_contract.gpu_product.product_key`, longest key first.
GPU_MEMORY_MIB: dict[str, int] = {
    "GB200": 189471,
    "B200": 183359,
    "H200": 143771,
    "H100-NVL": 95830,
    "H100-80GB": 81559,
    "H100-SXM": 81559,
    "H100-PCIE": 81559,
    "H100": 81559,
    "H800": 81559,
    "H20": 97871,
    "A100-SXM4-80GB": 81920,
    "A100-80GB": 81920,
    "A100-SXM4-40GB": 40960,
    "A100-PCIE-40GB": 40960,
    "A100-PCIE-80GB": 81920,
    "A800-SXM4-80GB": 81920,
    "A800": 81920,
    "L40S": 46068,
    "L40": 46068,
    "L4": 23034,
    "A10G": 23028,
    "A30": 24576,
    "L20": 46068,
    "V100-PCIE-16GB": 16384,
    "V100-PCIE-32GB": 32768,
    "V100S-PCIE-32GB": 32768,
    "A10": 23028,
    "A40": 46068,
    "V100-SXM2-32GB": 32768,
    "V100-SXM2-16GB": 16384,
    "T4": 15360,
}

# Product-name tokens of parts whose GPUs share one NVSwitch fabric (or a full NVLink mesh) inside a node.
_NVSWITCH_TOKENS: frozenset[str] = frozenset(
    {
        "SXM",
        "SXM2",
        "SXM3",
        "SXM4",
        "SXM5",
        "HBM3",
        "HBM3E",
        "HGX",
        "GB200",
        "B200",
        "B100",
        "H200",
        "H100",
        "H800",
        "H20",
    }
)
# Product-name tokens of PCIe-only parts (no NVLink between the GPUs of a node).
_PCIE_TOKENS: frozenset[str] = frozenset(
    {"PCIE", "L40S", "L40", "L4", "A10", "A10G", "T4", "A40", "A2", "A16"}
)


@dataclass(frozen=True)
class Taint:
    """A node taint."""

    key: str
    value: str
    effect: str


@dataclass(frozen=True)
class NodeFacts:
    """What the planner needs to know about one node.

    Attributes:
        name: metadata.name.
        labels: all labels.
        gpu_product: The physical GPU product in GFD spelling (from ``nvidia.com/gpu.product`` without its
            ``-SHARED`` / ``-MIG-...`` suffix, or from a cloud label); "" when no label names it.
        gpus: allocatable ``nvidia.com/gpu`` (0 when absent).
        gpu_memory_mib: from ``nvidia.com/gpu.memory`` (MiB, or bytes), Karpenter's label or the product table;
            None when unknown.
        gpu_memory_source: "label", "label (bytes)", "karpenter", "table" or "unknown".
        nvlink_domain_size: GPUs per intra-node NVLink domain (1 = none).
        nvlink_source: "label" (topology probe), "product" (derived) or "default".
        clique: ``nvidia.com/gpu.clique`` (multi-node NVLink domain) or None.
        gpu_replicas: ``nvidia.com/gpu.replicas`` (> 1 means time-sliced GPUs).
        schedulable: not cordoned (``spec.unschedulable`` false).
        ready: the Ready condition is True (or the object has no Ready condition at all).
        taints: the node's taints.
        topology: the values of the well-known topology labels present on the node.
        cpu_millicores: allocatable CPU in millicores (None when absent).
        memory_bytes: allocatable memory in bytes (None when absent or unparsable).
        gpu_product_source: the label the product was read from ("" when none).
        gpu_mig: why the GPU capacity is MIG slices, None for whole GPUs.
        gpu_sharing: why the GPU capacity is shared replicas (time-slicing, MPS), None when not shared.
        compute_capability: CUDA compute capability (major, minor) from the labels or the product; None if
            unknown.
    """

    name: str
    labels: Mapping[str, str]
    gpu_product: str
    gpus: int
    gpu_memory_mib: int | None
    gpu_memory_source: str
    nvlink_domain_size: int
    nvlink_source: str
    clique: str | None
    gpu_replicas: int
    schedulable: bool
    ready: bool
    taints: tuple[Taint, ...] = field(default_factory=tuple)
    topology: Mapping[str, str] = field(default_factory=dict)
    cpu_millicores: int | None = None
    memory_bytes: int | None = None
    gpu_product_source: str = ""
    gpu_mig: str | None = None
    gpu_sharing: str | None = None
    compute_capability: tuple[int, int] | None = None


def memory_from_product(product: str) -> int | None:
    """GPU memory in MiB from the product table, or None for an unknown product.

    Args:
        product: The ``nvidia.com/gpu.product`` value, e.g. ``NVIDIA-H100-80GB-HBM3``.
    """
    norm = product_key(product)
    for key in sorted(GPU_MEMORY_MIB, key=lambda k: (-len(k), k)):
        # Match whole dash-separated tokens so that "L4" does not match "L40S".
        if re.search(rf"(^|-){re.escape(key)}(-|$)", norm):
            return GPU_MEMORY_MIB[key]
    return None


def nvlink_domain_from_product(product: str, gpus: int) -> int:
    """GPUs per intra-node NVLink domain derived from the product name.

    SXM/HGX/NVSwitch parts -> all GPUs of the node; H100 NVL -> pairs (NVLink bridges); PCIe parts and unknown
    products -> 1 (no NVLink assumed).

    Args:
        product: The ``nvidia.com/gpu.product`` value.
        gpus: GPUs of the node.
    """
    tokens = set(product_tokens(product))
    if not tokens or gpus <= 0:
        return 1
    if tokens & _PCIE_TOKENS or any(t.startswith("RTX") for t in tokens):
        return 1
    if "NVL" in tokens:  # H100 NVL: NVLink bridges join pairs of PCIe cards
        return min(2, gpus)
    if tokens & _NVSWITCH_TOKENS:
        return gpus
    return 1


def _int_label(labels: Mapping[str, str], key: str) -> int | None:
    raw = labels.get(key)
    if raw is None:
        return None
    try:
        return int(str(raw).strip())
    except ValueError:
        return None


def _quantity_int(raw: Any) -> int:
    """Parse an integer Kubernetes quantity (``"8"``); extended resources are whole numbers."""
    if raw is None:
        return 0
    text = str(raw).strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return int(float(text))
    except ValueError:
        return 0


def cpu_millicores(raw: Any) -> int | None:
    """Parse a Kubernetes CPU quantity (``"96"``, ``"95500m"``, ``"1.5"``) into millicores; None if unparsable."""
    if raw is None:
        return None
    text = str(raw).strip()
    try:
        if text.endswith("m"):
            return int(text[:-1])
        return int(float(text) * 1000)
    except ValueError:
        return None


#: Kubernetes quantity suffixes for memory: binary (Ki ... Ei) and decimal (k ... E).
_MEMORY_SUFFIXES = {
    **{s: 1024**i for i, s in enumerate(("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"), start=1)},
    **{s: 1000**i for i, s in enumerate(("k", "M", "G", "T", "P", "E"), start=1)},
}
_MEMORY = re.compile(r"^([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)|[eE]([0-9]+))?$")


def memory_bytes(raw: Any) -> int | None:
    """Parse a Kubernetes memory quantity (``"2Ti"``, ``"1031828Ki"``, ``"128G"``, ``"1e9"``) into bytes; None
    if unparsable."""
    if raw is None:
        return None
    match = _MEMORY.match(str(raw).strip())
    if match is None:
        return None
    number, suffix, exponent = match.groups()
    scale = _MEMORY_SUFFIXES[suffix] if suffix else 10 ** int(exponent or 0)
    return int(float(number) * scale)


def node_facts(node: Mapping[str, Any]) -> NodeFacts:
    """Read the planner's facts from one Kubernetes Node object.

    Args:
        node: A Node as a camelCase dict (``metadata``, ``spec``, ``status``).

    Returns:
        The node's facts. Missing parts read as empty: no GPUs, no labels, not ready.
    """
    metadata: Mapping[str, Any] = node.get("metadata") or {}
    spec: Mapping[str, Any] = node.get("spec") or {}
    status: Mapping[str, Any] = node.get("status") or {}
    labels = {str(k): str(v) for k, v in (metadata.get("labels") or {}).items()}
    allocatable: Mapping[str, Any] = status.get("allocatable") or status.get("capacity") or {}
    gpus = _quantity_int(allocatable.get(GPU_RESOURCE))
    reading = read_gpu_labels(labels, allocatable)
    product, replicas = reading.product, reading.replicas

    memory, memory_source = reading.memory_mib, reading.memory_source
    if memory is None:
        memory = memory_from_product(product) if product else None
        memory_source = "table" if memory is not None else "unknown"

    physical = gpus // replicas if replicas > 1 else gpus
    probed = _int_label(labels, LABEL_NVLINK_DOMAIN)
    if probed is not None and probed >= 1:
        nvlink, nvlink_source = probed, "label"
    elif product:
        nvlink, nvlink_source = nvlink_domain_from_product(product, physical), "product"
    else:
        nvlink, nvlink_source = 1, "default"

    # A Ready condition that is not True (False, or Unknown after the kubelet stopped reporting) means not
    # ready; a node object without any Ready condition (a hand-written or generated NODES.yaml) counts as ready.
    ready_conditions = [c for c in (status.get("conditions") or []) if c.get("type") == "Ready"]
    ready = all(str(c.get("status")) == "True" for c in ready_conditions)
    taints = tuple(
        Taint(key=str(t.get("key", "")), value=str(t.get("value", "") or ""), effect=str(t.get("effect", "")))
        for t in (spec.get("taints") or [])
    )
    clique = labels.get(LABEL_CLIQUE) or None
    return NodeFacts(
        name=str(metadata.get("name", "")),
        labels=labels,
        gpu_product=product,
        gpus=gpus,
        gpu_memory_mib=memory,
        gpu_memory_source=memory_source,
        nvlink_domain_size=nvlink,
        nvlink_source=nvlink_source,
        clique=clique,
        gpu_replicas=replicas,
        schedulable=not bool(spec.get("unschedulable", False)),
        ready=ready,
        taints=taints,
        topology={k: labels[k] for k in TOPOLOGY_LABELS if k in labels},
        cpu_millicores=cpu_millicores(allocatable.get("cpu")),
        memory_bytes=memory_bytes(allocatable.get("memory")),
        gpu_product_source=reading.product_source,
        gpu_mig=reading.mig,
        gpu_sharing=reading.sharing,
        compute_capability=reading.compute_capability,
    )
