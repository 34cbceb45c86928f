"""What a node's labels and resources say about its GPUs, in every label style found on real clusters.

Sources (see ``docs/topology.md`` for the table of every label read):

- **GPU Feature Discovery** (GFD, part of the NVIDIA device plugin and the GPU Operator) writes
  ``nvidia.com/gpu.product`` as the NVML device name with spaces replaced by ``-``; with MIG under the
  ``single`` strategy it appends ``-MIG-<profile>`` (``-MIG-INVALID`` for a broken layout) and the
  ``nvidia.com/gpu`` resource counts MIG slices; under ``mixed`` the slices are ``nvidia.com/mig-<profile>``
  resources. ``nvidia.com/mig.strategy`` is written on every node once a strategy is configured (the GPU
  Operator's default is ``single``), MIG enabled or not, so it alone says nothing. Time-slicing appends
  ``-SHARED`` (unless the shared resource is renamed), sets ``nvidia.com/gpu.replicas`` to the replicas per
  GPU and ``nvidia.com/gpu.sharing-strategy`` to ``time-slicing`` or ``mps``; ``nvidia.com/gpu`` then counts
  replicas. ``nvidia.com/gpu.memory`` is MiB (some installations have published bytes). Older releases
  write names without the ``NVIDIA-`` prefix (``A100-SXM4-40GB``, ``Tesla-T4``).
- **GKE** without GFD: ``cloud.google.com/gke-accelerator`` (``nvidia-h100-80gb``), GPU sharing in
  ``cloud.google.com/gke-gpu-sharing-strategy`` / ``gke-max-shared-clients-per-gpu``, MIG in
  ``cloud.google.com/gke-gpu-partition-size``.
- **Karpenter on EKS**: ``karpenter.k8s.aws/instance-gpu-name`` (``h100``), ``-gpu-memory`` (MiB per GPU),
  ``-gpu-count``.
- **The instance type alone** (an EKS managed node group, AKS or OCI with the device plugin only, no GFD):
  ``node.kubernetes.io/instance-type`` of a GPU instance whose GPUs are fixed by the type
  (:data:`INSTANCE_PRODUCTS`: ``p5.48xlarge``, ``Standard_ND96isr_H100_v5``, ``BM.GPU.H100.8``, ...); older
  clusters publish it as the deprecated ``beta.kubernetes.io/instance-type`` beside or instead of it, read
  when the new label is absent.
- A bare ``nvidia.com/gpu=present|true`` label (some device-plugin installs) names no product or memory.

Pure: values in, a value out.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from verl_contract.gpu_product import product_tokens

LABEL_PRODUCT = "nvidia.com/gpu.product"
LABEL_MEMORY = "nvidia.com/gpu.memory"
LABEL_REPLICAS = "nvidia.com/gpu.replicas"
LABEL_SHARING = "nvidia.com/gpu.sharing-strategy"
LABEL_COMPUTE_MAJOR = "nvidia.com/gpu.compute.major"
LABEL_COMPUTE_MINOR = "nvidia.com/gpu.compute.minor"
LABEL_GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"
LABEL_GKE_SHARING = "cloud.google.com/gke-gpu-sharing-strategy"
LABEL_GKE_SHARED_CLIENTS = "cloud.google.com/gke-max-shared-clients-per-gpu"
LABEL_GKE_PARTITION = "cloud.google.com/gke-gpu-partition-size"
LABEL_KARPENTER_NAME = "karpenter.k8s.aws/instance-gpu-name"
LABEL_KARPENTER_MEMORY = "karpenter.k8s.aws/instance-gpu-memory"
LABEL_KARPENTER_COUNT = "karpenter.k8s.aws/instance-gpu-count"
LABEL_INSTANCE_TYPE = "node.kubernetes.io/instance-type"
#: Deprecated since Kubernetes 1.17 and still published by older clusters' kubelets and cloud providers.
LABEL_INSTANCE_TYPE_BETA = "beta.kubernetes.io/instance-type"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"

#: Above this many "MiB" an ``nvidia.com/gpu.memory`` value is bytes: no GPU has 4 TiB (a B200 has 180 GiB),
#: and the smallest GPU's bytes (a 4 GiB card: 4.3e9) are far above it.
_MEMORY_BYTES_ABOVE = 4 * 1024 * 1024

#: GKE accelerator names -> the product as GFD spells NVML's name (what ``nvidia-smi`` prints on those VMs).
GKE_PRODUCTS: dict[str, str] = {
    "nvidia-tesla-k80": "Tesla-K80",
    "nvidia-tesla-p4": "Tesla-P4",
    "nvidia-tesla-p100": "Tesla-P100-PCIE-16GB",
    "nvidia-tesla-v100": "Tesla-V100-SXM2-16GB",
    "nvidia-tesla-t4": "Tesla-T4",
    "nvidia-l4": "NVIDIA-L4",
    "nvidia-tesla-a100": "NVIDIA-A100-SXM4-40GB",
    "nvidia-a100-80gb": "NVIDIA-A100-SXM4-80GB",
    "nvidia-h100-80gb": "NVIDIA-H100-80GB-HBM3",
    "nvidia-h100-mega-80gb": "NVIDIA-H100-80GB-HBM3",
    "nvidia-h200-141gb": "NVIDIA-H200",
    "nvidia-b200": "NVIDIA-B200",
    "nvidia-gb200": "NVIDIA-GB200",
}

#: Karpenter's ``instance-gpu-name`` -> the product (GFD spelling); a tuple picks by GPU memory (MiB).
KARPENTER_PRODUCTS: dict[str, str | tuple[tuple[int, str], ...]] = {
    "k80": "Tesla-K80",
    "m60": "Tesla-M60",
    "t4": "Tesla-T4",
    "t4g": "NVIDIA-T4G",
    "a10g": "NVIDIA-A10G",
    "l4": "NVIDIA-L4",
    "l40s": "NVIDIA-L40S",
    "v100": ((20000, "Tesla-V100-SXM2-16GB"), (1 << 30, "Tesla-V100-SXM2-32GB")),
    "a100": ((50000, "NVIDIA-A100-SXM4-40GB"), (1 << 30, "NVIDIA-A100-SXM4-80GB")),
    "h100": "NVIDIA-H100-80GB-HBM3",
    "h200": "NVIDIA-H200",
    "b200": "NVIDIA-B200",
}

#: Cloud instance types whose GPUs the type fixes -> the product (GFD spelling), for nodes that carry no GPU
#: label but the well-known ``node.kubernetes.io/instance-type`` (the clouds' instance catalogs: AWS P and G
#: families, Azure ND, OCI bare-metal GPU shapes). A family prefix ends with ``.`` (every size of ``g5.``).
INSTANCE_PRODUCTS: dict[str, str] = {
    "p3.": "Tesla-V100-SXM2-16GB",
    "p3dn.24xlarge": "Tesla-V100-SXM2-32GB",
    "p4d.24xlarge": "NVIDIA-A100-SXM4-40GB",
    "p4de.24xlarge": "NVIDIA-A100-SXM4-80GB",
    "p5.48xlarge": "NVIDIA-H100-80GB-HBM3",
    "p5e.48xlarge": "NVIDIA-H200",
    "p5en.48xlarge": "NVIDIA-H200",
    "g4dn.": "Tesla-T4",
    "g5.": "NVIDIA-A10G",
    "g6.": "NVIDIA-L4",
    "g6e.": "NVIDIA-L40S",
    "Standard_ND96asr_v4": "NVIDIA-A100-SXM4-40GB",
    "Standard_ND96amsr_A100_v4": "NVIDIA-A100-SXM4-80GB",
    "Standard_ND96isr_H100_v5": "NVIDIA-H100-80GB-HBM3",
    "Standard_ND96isr_H200_v5": "NVIDIA-H200",
    "BM.GPU4.8": "NVIDIA-A100-SXM4-40GB",
    "BM.GPU.A100-v2.8": "NVIDIA-A100-SXM4-80GB",
    "BM.GPU.H100.8": "NVIDIA-H100-80GB-HBM3",
    "BM.GPU.H200.8": "NVIDIA-H200",
}


def instance_product(instance_type: str) -> str:
    """The product of a GPU instance type from :data:`INSTANCE_PRODUCTS` ("" when the type is not there).

    Example: ``p5.48xlarge`` -> ``NVIDIA-H100-80GB-HBM3``; ``g5.12xlarge`` -> ``NVIDIA-A10G`` (the family).
    """
    exact = INSTANCE_PRODUCTS.get(instance_type)
    if exact is not None:
        return exact
    family = instance_type.split(".", 1)[0] + "." if "." in instance_type else ""
    return INSTANCE_PRODUCTS.get(family, "") if family and family != instance_type else ""


#: CUDA compute capability by product-name token, for nodes without ``nvidia.com/gpu.compute.*`` labels.
#: Longest token first wins (``A10G`` before ``A10``). NVIDIA's CUDA GPU table.
COMPUTE_CAPABILITY: dict[str, tuple[int, int]] = {
    "K80": (3, 7),
    "M60": (5, 2),
    "P4": (6, 1),
    "P40": (6, 1),
    "P100": (6, 0),
    "V100": (7, 0),
    "V100S": (7, 0),
    "T4": (7, 5),
    "T4G": (7, 5),
    "A100": (8, 0),
    "A800": (8, 0),
    "A30": (8, 0),
    "A10": (8, 6),
    "A10G": (8, 6),
    "A40": (8, 6),
    "A16": (8, 6),
    "A2": (8, 6),
    "L4": (8, 9),
    "L40": (8, 9),
    "L40S": (8, 9),
    "L20": (8, 9),
    "H100": (9, 0),
    "H200": (9, 0),
    "H800": (9, 0),
    "H20": (9, 0),
    "GH200": (9, 0),
    "B100": (10, 0),
    "B200": (10, 0),
    "GB200": (10, 0),
}

_MIG_SUFFIX = re.compile(r"-MIG-(.+)$", re.IGNORECASE)
_SHARED_SUFFIX = re.compile(r"-SHARED$", re.IGNORECASE)


@dataclass(frozen=True)
class GpuReading:
    """A node's GPUs as its labels and resources describe them.

    Attributes:
        product: The physical product in GFD spelling (``NVIDIA-H100-80GB-HBM3``), without a ``-SHARED`` or
            ``-MIG-...`` suffix; "" when no label names it.
        product_source: The label the product was read from ("" when none).
        memory_mib: Memory of one physical GPU in MiB from a label, None when no label gives it (the caller
            falls back to the product table).
        memory_source: "label", "label (bytes)", "karpenter" or "" (none).
        mig: Why the node's GPU capacity is MIG slices (None: whole GPUs).
        sharing: Why the node's GPU capacity is shared replicas of fewer GPUs (None: not shared).
        replicas: Advertised GPUs per physical GPU (1 without sharing).
        compute_capability: (major, minor), from the labels or the product; None when unknown.
        compute_source: "label", "product" or "".
    """

    product: str
    product_source: str
    memory_mib: int | None
    memory_source: str
    mig: str | None
    sharing: str | None
    replicas: int
    compute_capability: tuple[int, int] | None
    compute_source: str


def _int(raw: str | None) -> int | None:
    if raw is None:
        return None
    try:
        return int(str(raw).strip())
    except ValueError:
        return None


def compute_from_product(product: str) -> tuple[int, int] | None:
    """The CUDA compute capability of a product name from :data:`COMPUTE_CAPABILITY`, None if unknown."""
    tokens = product_tokens(product)
    for token in sorted(COMPUTE_CAPABILITY, key=lambda k: (-len(k), k)):
        if token in tokens:
            return COMPUTE_CAPABILITY[token]
    return None


def _product(labels: Mapping[str, str]) -> tuple[str, str, str]:
    """(raw label value, physical product, source label)."""
    raw = labels.get(LABEL_PRODUCT, "").strip()
    if raw:
        physical = _MIG_SUFFIX.sub("", _SHARED_SUFFIX.sub("", raw))
        return raw, physical, LABEL_PRODUCT
    gke = labels.get(LABEL_GKE_ACCELERATOR, "").strip().lower()
    if gke:
        return gke, GKE_PRODUCTS.get(gke, gke.removeprefix("nvidia-")), LABEL_GKE_ACCELERATOR
    name = labels.get(LABEL_KARPENTER_NAME, "").strip().lower()
    if name:
        choice = KARPENTER_PRODUCTS.get(name, name.upper())
        if isinstance(choice, tuple):
            memory = _int(labels.get(LABEL_KARPENTER_MEMORY)) or 0
            choice = next(product for limit, product in choice if memory < limit)
        return name, choice, LABEL_KARPENTER_NAME
    source = LABEL_INSTANCE_TYPE if labels.get(LABEL_INSTANCE_TYPE, "").strip() else LABEL_INSTANCE_TYPE_BETA
    itype = labels.get(source, "").strip()
    product = instance_product(itype) if itype else ""
    if product:
        return itype, product, source
    return "", "", ""


def _memory(labels: Mapping[str, str]) -> tuple[int | None, str]:
    value = _int(labels.get(LABEL_MEMORY))
    if value is not None and value > 0:
        if value > _MEMORY_BYTES_ABOVE:
            return value // (1024 * 1024), "label (bytes)"
        return value, "label"
    karpenter = _int(labels.get(LABEL_KARPENTER_MEMORY))
    if karpenter is not None and karpenter > 0:
        return karpenter, "karpenter"
    return None, ""


def _mig(labels: Mapping[str, str], raw_product: str, resources: Mapping[str, object]) -> str | None:
    suffix = _MIG_SUFFIX.search(raw_product) if raw_product else None
    if suffix is not None:
        profile = _SHARED_SUFFIX.sub("", suffix.group(1))
        if profile.upper() == "INVALID":
            return f"MIG misconfigured ({LABEL_PRODUCT}={raw_product}): no whole GPUs advertised"
        return f"MIG {profile} slices ({LABEL_PRODUCT}={raw_product}): capacity is not whole GPUs"
    slices = sorted(k for k, v in resources.items() if k.startswith(MIG_RESOURCE_PREFIX) and _positive(v))
    if slices:
        return f"MIG slices offered as {', '.join(slices)} (mixed strategy): capacity is not whole GPUs"
    partition = labels.get(LABEL_GKE_PARTITION, "").strip()
    if partition:
        return f"MIG {partition} slices ({LABEL_GKE_PARTITION}={partition}): capacity is not whole GPUs"
    return None


def _positive(value: object) -> bool:
    try:
        return float(str(value)) > 0
    except ValueError:
        return False


def _sharing(labels: Mapping[str, str], raw_product: str) -> tuple[str | None, int]:
    replicas = _int(labels.get(LABEL_REPLICAS)) or 1
    strategy = labels.get(LABEL_SHARING, "").strip().lower()
    gke = labels.get(LABEL_GKE_SHARING, "").strip().lower()
    gke_clients = _int(labels.get(LABEL_GKE_SHARED_CLIENTS)) or 1
    if replicas > 1:
        how = f"{strategy}, " if strategy and strategy != "none" else ""
        return f"{how}{LABEL_REPLICAS}={replicas} replicas of each GPU", replicas
    if strategy and strategy != "none":
        return f"{LABEL_SHARING}={strategy}", replicas
    if raw_product and _SHARED_SUFFIX.search(raw_product):
        return f"{LABEL_PRODUCT}={raw_product}", replicas
    if gke:
        return f"{LABEL_GKE_SHARING}={gke}, {gke_clients} clients per GPU", max(replicas, gke_clients)
    return None, replicas


def read_gpu_labels(labels: Mapping[str, str], resources: Mapping[str, object]) -> GpuReading:
    """Read a node's GPU facts from its labels and allocatable resources.

    Args:
        labels: The node's labels.
        resources: ``status.allocatable`` (or capacity), for the ``nvidia.com/mig-*`` resources.

    Returns:
        The reading; see :class:`GpuReading`.
    """
    raw, product, source = _product(labels)
    memory, memory_source = _memory(labels)
    sharing, replicas = _sharing(labels, raw)
    major, minor = _int(labels.get(LABEL_COMPUTE_MAJOR)), _int(labels.get(LABEL_COMPUTE_MINOR))
    if major is not None and major > 0:
        compute: tuple[int, int] | None = (major, minor or 0)
        compute_source = "label"
    else:
        compute = compute_from_product(product) if product else None
        compute_source = "product" if compute is not None else ""
    return GpuReading(
        product=product,
        product_source=source,
        memory_mib=memory,
        memory_source=memory_source,
        mig=_mig(labels, raw, resources),
        sharing=sharing,
        replicas=replicas,
        compute_capability=compute,
        compute_source=compute_source,
    )
