"""Label and annotation keys the devcluster writes on its simulated nodes (and the rest of the project reads)."""

from __future__ import annotations

# NVIDIA GPU Feature Discovery (GFD) labels, as the NVIDIA GPU operator writes them on real nodes.
GPU_PRESENT = "nvidia.com/gpu.present"
GPU_PRODUCT = "nvidia.com/gpu.product"
GPU_COUNT = "nvidia.com/gpu.count"
GPU_MEMORY_MIB = "nvidia.com/gpu.memory"
GPU_FAMILY = "nvidia.com/gpu.family"
GPU_MACHINE = "nvidia.com/gpu.machine"
GPU_COMPUTE_MAJOR = "nvidia.com/gpu.compute.major"
GPU_COMPUTE_MINOR = "nvidia.com/gpu.compute.minor"
GPU_REPLICAS = "nvidia.com/gpu.replicas"
GPU_SHARING_STRATEGY = "nvidia.com/gpu.sharing-strategy"
GPU_MODE = "nvidia.com/gpu.mode"
MIG_CAPABLE = "nvidia.com/mig.capable"
MIG_STRATEGY = "nvidia.com/mig.strategy"
MIG_CONFIG = "nvidia.com/mig.config"
MIG_CONFIG_STATE = "nvidia.com/mig.config.state"
MPS_CAPABLE = "nvidia.com/mps.capable"
#: The GPU Operator's per-component ``nvidia.com/gpu.deploy.<component>=true`` labels.
GPU_OPERATOR_COMPONENTS = (
    "driver",
    "container-toolkit",
    "device-plugin",
    "gpu-feature-discovery",
    "dcgm",
    "dcgm-exporter",
    "mig-manager",
    "node-status-exporter",
    "operator-validator",
)
# GKE's and Karpenter's GPU labels, on nodes without GFD.
GKE_ACCELERATOR = "cloud.google.com/gke-accelerator"
GKE_SHARING = "cloud.google.com/gke-gpu-sharing-strategy"
GKE_SHARED_CLIENTS = "cloud.google.com/gke-max-shared-clients-per-gpu"
KARPENTER_GPU_NAME = "karpenter.k8s.aws/instance-gpu-name"
KARPENTER_GPU_MANUFACTURER = "karpenter.k8s.aws/instance-gpu-manufacturer"
KARPENTER_GPU_COUNT = "karpenter.k8s.aws/instance-gpu-count"
KARPENTER_GPU_MEMORY = "karpenter.k8s.aws/instance-gpu-memory"
#: ``<ClusterUUID>.<CliqueID>``: GPUs joined by multi-node NVLink (GB200 NVL72); absent otherwise.
GPU_CLIQUE = "nvidia.com/gpu.clique"
#: The extended resource the NVIDIA device plugin advertises.
GPU_RESOURCE = "nvidia.com/gpu"

#: Ours: GPUs per intra-node NVLink domain ("1" = no NVLink), written by the launcher's topology probe.
#: Absent: derived from the product (see docs/topology.md).
NVLINK_DOMAIN_SIZE = "verl-operator.io/nvlink-domain-size"

# Network topology. Zone and region are the Kubernetes well-known labels; below a zone we use the labels of
# NVIDIA Topograph: the leaf switch a node hangs off (= its rack) and the spine above it (= a block of racks).
REGION = "topology.kubernetes.io/region"
ZONE = "topology.kubernetes.io/zone"
RACK = "network.topology.nvidia.com/leaf"
BLOCK = "network.topology.nvidia.com/spine"

# kwok: which nodes it simulates. It runs with --manage-nodes-with-annotation-selector=KWOK_NODE=fake.
KWOK_NODE = "kwok.x-k8s.io/node"
KWOK_NODE_VALUE = "fake"
#: Which devcluster profile created a node (so a profile's nodes can be removed again).
PROFILE = "verl-operator.io/devcluster-profile"

#: Pod annotation read by the kwok pod stages: ``fail`` turns a Running pod Failed (a simulated crash).
SIMULATE = "verl-operator.io/simulate"
#: Pod annotation: the exit code of the simulated crash (default 1).
SIMULATE_EXIT_CODE = "verl-operator.io/simulate-exit-code"
