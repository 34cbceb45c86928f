"""Cluster profiles: YAML files of GPU node groups, validated, turned into Node manifests.

A profile (``examples/clusters/<name>.yaml``) lists node groups; every node of a group is identical except
its name, its rack and its pod CIDR. The manifests carry what a real GPU node carries: GPU Feature Discovery
labels, ``nvidia.com/gpu`` capacity, CPU/memory/pods, zone/region and rack labels, plus the kwok annotation
that hands the node to the simulator. ``verl-operator plan --nodes <profile.yaml>`` plans against these
nodes; the development cluster (``verl-operator-dev devcluster up``) creates them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.alias_generators import to_camel

from verl_operator.api.errors import validation_lines
from verl_operator.clusters import labels as L

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
# A Kubernetes resource quantity: a decimal number with an optional SI or binary suffix ("224", "2Ti", "500m").
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei)?$")
# A label value: at most 63 characters, alphanumeric at both ends, '-', '_' and '.' inside.
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_CLIQUE = re.compile(r"^[0-9a-fA-F-]{8,36}\.[0-9]+$")


class ProfileError(ValueError):
    """A profile file is missing or invalid (the message names the file and the field)."""


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)


def _label_value(value: str, what: str) -> str:
    if not _LABEL_VALUE.match(value):
        raise ValueError(f"{what} {value!r} is not a valid label value (<= 63 chars: letters, digits, '-_.')")
    return value


class TimeSlicing(_Model):
    """GPU sharing as the NVIDIA device plugin configures it (``sharing.timeSlicing`` or ``sharing.mps``)."""

    replicas: int = Field(ge=2, le=64, description="Advertised GPUs per physical GPU")
    strategy: Literal["time-slicing", "mps"] = "time-slicing"
    rename: bool = Field(
        default=False,
        description="renameByDefault: no -SHARED suffix on the product (the resource is renamed)",
    )


class Mig(_Model):
    """MIG slices on every GPU of the node, advertised under the device plugin's MIG strategy."""

    strategy: Literal["single", "mixed"]
    profile: str = Field(pattern=r"^[0-9]+g\.[0-9]+gb$", description="The MIG profile, e.g. 1g.10gb")
    per_gpu: int = Field(ge=1, le=7, description="Slices per GPU")
    memory_mib: int = Field(gt=0, description="Memory of one slice in MiB")


class Gpu(_Model):
    """The GPUs of every node in a group, labelled as the group's ``labelStyle`` says.

    ``gfd`` (default): the full label set of a stock NVIDIA GPU Operator (GPU Feature Discovery, with
    ``mig.strategy=single`` whether MIG is in use or not); ``gke``: GKE's device plugin without GFD
    (``cloud.google.com/gke-accelerator``); ``karpenter``: Karpenter's ``karpenter.k8s.aws/instance-gpu-*``;
    ``bare``: only ``nvidia.com/gpu=present``.
    """

    product: str = Field(description="nvidia.com/gpu.product, e.g. NVIDIA-H100-80GB-HBM3")
    count: int = Field(ge=1, le=64, description="GPUs per node (nvidia.com/gpu capacity)")
    memory_mib: int = Field(gt=0, description="nvidia.com/gpu.memory: memory of one GPU in MiB")
    family: str = Field(description="nvidia.com/gpu.family, e.g. hopper")
    machine: str = Field(description="nvidia.com/gpu.machine: the server model")
    compute_major: int = Field(ge=1)
    compute_minor: int = Field(ge=0)
    nvlink_domain_size: int | None = Field(
        default=None,
        ge=1,
        description="verl-operator.io/nvlink-domain-size, only where a topology probe would have written it",
    )
    clique: str | None = Field(default=None, description="nvidia.com/gpu.clique for multi-node NVLink")
    label_style: Literal["gfd", "gke", "karpenter", "bare"] = "gfd"
    mig_capable: bool | None = Field(
        default=None, description="nvidia.com/mig.capable (default: true for A100/A30/H100/H200/B200/GB200)"
    )
    cloud_name: str | None = Field(
        default=None, description="gke: the gke-accelerator value; karpenter: instance-gpu-name"
    )
    time_slicing: TimeSlicing | None = None
    mig: Mig | None = None

    @field_validator("product", "family", "machine")
    @classmethod
    def _valid_label(cls, value: str) -> str:
        return _label_value(value, "value")

    @field_validator("clique")
    @classmethod
    def _valid_clique(cls, value: str | None) -> str | None:
        if value is not None and not _CLIQUE.match(value):
            raise ValueError(f"clique {value!r} is not '<ClusterUUID>.<CliqueID>'")
        return value

    @model_validator(mode="after")
    def _style_fits(self) -> Gpu:
        if self.label_style in ("gke", "karpenter") and not self.cloud_name:
            raise ValueError(f"labelStyle {self.label_style} needs cloudName (the cloud's GPU name)")
        if self.mig is not None and self.label_style != "gfd":
            raise ValueError("mig is modelled for labelStyle gfd only")
        return self

    @model_validator(mode="after")
    def _domain_divides_count(self) -> Gpu:
        if self.nvlink_domain_size is not None and self.count % self.nvlink_domain_size:
            raise ValueError(
                f"nvlinkDomainSize {self.nvlink_domain_size} does not divide the {self.count} GPUs of a node"
            )
        return self


class NodeGroup(_Model):
    """``count`` identical nodes named ``<namePrefix>-<index>``."""

    name_prefix: str
    count: int = Field(ge=1, le=200)
    gpu: Gpu | None = None
    cpu: str = Field(description="CPU capacity (a Kubernetes quantity, e.g. '224')")
    memory: str = Field(description="memory capacity (a Kubernetes quantity, e.g. '2Ti')")
    pods: int = Field(default=110, ge=1)
    arch: Literal["amd64", "arm64"] = "amd64"
    region: str
    zone: str
    block: str | None = Field(default=None, description="network.topology.nvidia.com/spine")
    racks: tuple[str, ...] = Field(
        min_length=1, description="network.topology.nvidia.com/leaf values; nodes fill them in order"
    )
    labels: dict[str, str] = Field(default_factory=dict, description="extra node labels")

    @field_validator("name_prefix")
    @classmethod
    def _valid_prefix(cls, value: str) -> str:
        if not _DNS_LABEL.match(value) or len(value) > 50:
            raise ValueError(f"namePrefix {value!r} is not a DNS label (lowercase letters, digits, '-')")
        return value

    @field_validator("cpu", "memory")
    @classmethod
    def _valid_quantity(cls, value: str) -> str:
        if not _QUANTITY.match(value):
            raise ValueError(f"{value!r} is not a Kubernetes quantity (e.g. '224', '2Ti')")
        return value

    @field_validator("region", "zone", "block")
    @classmethod
    def _valid_topology(cls, value: str | None) -> str | None:
        return None if value is None else _label_value(value, "topology value")

    @field_validator("racks")
    @classmethod
    def _valid_racks(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for rack in value:
            _label_value(rack, "rack")
        return value

    def rack_of(self, index: int) -> str:
        """The rack of node ``index``: nodes fill the racks in order, in equal blocks (4 nodes, 2 racks: AABB)."""
        return self.racks[index * len(self.racks) // self.count]


class Profile(_Model):
    """A simulated cluster: named node groups."""

    name: str
    description: str = ""
    node_groups: tuple[NodeGroup, ...] = Field(min_length=1)

    @field_validator("name")
    @classmethod
    def _valid_name(cls, value: str) -> str:
        if not _DNS_LABEL.match(value):
            raise ValueError(f"name {value!r} is not a DNS label")
        return value

    @model_validator(mode="after")
    def _unique_prefixes(self) -> Profile:
        prefixes = [g.name_prefix for g in self.node_groups]
        duplicates = sorted({p for p in prefixes if prefixes.count(p) > 1})
        if duplicates:
            raise ValueError(f"nodeGroups share namePrefix {duplicates}: node names would collide")
        return self

    @property
    def node_names(self) -> list[str]:
        """Every node name, in manifest order."""
        return [f"{g.name_prefix}-{i}" for g in self.node_groups for i in range(g.count)]

    @property
    def gpu_count(self) -> int:
        """GPUs in the whole profile."""
        return sum(g.count * g.gpu.count for g in self.node_groups if g.gpu)


def parse_profile(data: Any, source: str = "<profile>") -> Profile:
    """Validate profile data (a dict from YAML).

    Args:
        data: The parsed YAML.
        source: Where it came from, for the error message.

    Returns:
        The profile.

    Raises:
        ProfileError: Naming the source and every invalid field (``nodeGroups[0].gpu.count``).
    """
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: a profile is a mapping with 'name' and 'nodeGroups'")
    try:
        return Profile.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(validation_lines(exc, root=""))
        raise ProfileError(f"{source}: {problems}") from None


def read_profile(path: Path) -> Profile:
    """Read and validate a profile file.

    Raises:
        ProfileError: The file is missing, unreadable, not YAML, or not a valid profile.
    """
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ProfileError(f"profile file {path}: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise ProfileError(f"{path}: not valid YAML: {exc}") from None
    return parse_profile(data, str(path))


_MIG_CAPABLE = ("A100", "A30", "H100", "H200", "H800", "H20", "B200", "GB200")


def gpu_labels(gpu: Gpu) -> dict[str, str]:
    """The labels a node with these GPUs carries in the group's label style (and the NVLink label where set).

    ``gfd`` follows GPU Feature Discovery (NVIDIA/k8s-device-plugin ``internal/lm``) under a stock GPU
    Operator: ``-MIG-<profile>`` under ``mig.strategy=single``, ``-SHARED`` and ``gpu.replicas`` under
    time-slicing, ``gpu.replicas=1`` / ``sharing-strategy=none`` otherwise.
    """
    if gpu.label_style == "gke":
        out = {L.GKE_ACCELERATOR: str(gpu.cloud_name), "cloud.google.com/gke-gpu": "true"}
        if gpu.time_slicing is not None:
            out[L.GKE_SHARING] = "time-sharing" if gpu.time_slicing.strategy == "time-slicing" else "mps"
            out[L.GKE_SHARED_CLIENTS] = str(gpu.time_slicing.replicas)
    elif gpu.label_style == "karpenter":
        out = {
            L.KARPENTER_GPU_NAME: str(gpu.cloud_name),
            L.KARPENTER_GPU_MANUFACTURER: "nvidia",
            L.KARPENTER_GPU_COUNT: str(gpu.count),
            L.KARPENTER_GPU_MEMORY: str(gpu.memory_mib),
        }
    elif gpu.label_style == "bare":
        out = {L.GPU_RESOURCE: "present"}
    else:
        out = _gfd_labels(gpu)
    if gpu.clique is not None:
        out[L.GPU_CLIQUE] = gpu.clique
    if gpu.nvlink_domain_size is not None:
        out[L.NVLINK_DOMAIN_SIZE] = str(gpu.nvlink_domain_size)
    return out


def _gfd_labels(gpu: Gpu) -> dict[str, str]:
    mig_capable = gpu.mig_capable
    if mig_capable is None:
        mig_capable = any(token in gpu.product.upper().split("-") for token in _MIG_CAPABLE)
    product, count, memory, replicas = gpu.product, gpu.count, gpu.memory_mib, 1
    if gpu.mig is not None and gpu.mig.strategy == "single":
        product, count, memory = (
            f"{product}-MIG-{gpu.mig.profile}",
            gpu.count * gpu.mig.per_gpu,
            gpu.mig.memory_mib,
        )
    if gpu.time_slicing is not None:
        replicas = gpu.time_slicing.replicas
        if not gpu.time_slicing.rename:
            product = f"{product}-SHARED"
    out = {
        L.GPU_PRESENT: "true",
        **{f"nvidia.com/gpu.deploy.{c}": "true" for c in L.GPU_OPERATOR_COMPONENTS},
        L.GPU_PRODUCT: product,
        L.GPU_COUNT: str(count),
        L.GPU_MEMORY_MIB: str(memory),
        L.GPU_FAMILY: gpu.family,
        L.GPU_MACHINE: gpu.machine,
        L.GPU_COMPUTE_MAJOR: str(gpu.compute_major),
        L.GPU_COMPUTE_MINOR: str(gpu.compute_minor),
        L.GPU_REPLICAS: str(replicas),
        L.GPU_SHARING_STRATEGY: gpu.time_slicing.strategy if gpu.time_slicing is not None else "none",
        L.GPU_MODE: "compute",
        L.MIG_CAPABLE: str(mig_capable).lower(),
        L.MIG_STRATEGY: gpu.mig.strategy if gpu.mig is not None else "single",
        L.MPS_CAPABLE: "false",
    }
    if mig_capable:
        out[L.MIG_CONFIG] = f"all-{gpu.mig.profile}" if gpu.mig is not None else "all-disabled"
        out[L.MIG_CONFIG_STATE] = "success"
    if gpu.mig is not None and gpu.mig.strategy == "mixed":
        key = f"nvidia.com/mig-{gpu.mig.profile}"
        out.update(
            {f"{key}.count": str(gpu.count * gpu.mig.per_gpu), f"{key}.memory": str(gpu.mig.memory_mib)}
        )
        out[L.GPU_REPLICAS] = "0"  # GFD labels MIG-enabled GPUs without their sharing config
    return out


def gpu_resources(gpu: Gpu) -> dict[str, str]:
    """The node's GPU extended resources: whole GPUs, time-sliced replicas or MIG slices."""
    if gpu.mig is not None:
        slices = gpu.count * gpu.mig.per_gpu
        if gpu.mig.strategy == "single":
            return {L.GPU_RESOURCE: str(slices)}
        return {L.GPU_RESOURCE: "0", f"nvidia.com/mig-{gpu.mig.profile}": str(slices)}
    replicas = gpu.time_slicing.replicas if gpu.time_slicing is not None else 1
    return {L.GPU_RESOURCE: str(gpu.count * replicas)}


def node_manifests(profile: Profile) -> list[dict[str, Any]]:
    """The Node objects of a profile, in a fixed order (groups as listed, then index).

    Args:
        profile: A validated profile.

    Returns:
        Node manifests with ``status.capacity``/``allocatable`` set (the API server keeps the status of a
        created Node, as it does for a kubelet's registration).
    """
    nodes: list[dict[str, Any]] = []
    for group in profile.node_groups:
        for index in range(group.count):
            name = f"{group.name_prefix}-{index}"
            node_labels = {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": group.arch,
                "type": "kwok",
                L.PROFILE: profile.name,
                L.REGION: group.region,
                L.ZONE: group.zone,
                L.RACK: group.rack_of(index),
            }
            if group.block is not None:
                node_labels[L.BLOCK] = group.block
            resources = {"cpu": group.cpu, "memory": group.memory, "pods": str(group.pods)}
            if group.gpu is not None:
                node_labels.update(gpu_labels(group.gpu))
                resources.update(gpu_resources(group.gpu))
            node_labels.update(group.labels)
            nodes.append(
                {
                    "apiVersion": "v1",
                    "kind": "Node",
                    "metadata": {
                        "name": name,
                        "labels": node_labels,
                        "annotations": {
                            L.KWOK_NODE: L.KWOK_NODE_VALUE,
                            "node.alpha.kubernetes.io/ttl": "0",
                        },
                    },
                    "spec": {},
                    "status": {
                        "capacity": dict(resources),
                        "allocatable": dict(resources),
                        "nodeInfo": {
                            "architecture": group.arch,
                            "operatingSystem": "linux",
                            "osImage": "simulated by kwok",
                            "kernelVersion": "kwok",
                            "kubeletVersion": "kwok",
                            "kubeProxyVersion": "kwok",
                            "containerRuntimeVersion": "kwok",
                            "bootID": "",
                            "machineID": "",
                            "systemUUID": "",
                        },
                    },
                }
            )
    return nodes
