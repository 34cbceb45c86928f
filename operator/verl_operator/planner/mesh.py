"""One owner of a candidate's mesh and batch arithmetic (the idea of torchtitan's ``ParallelDims``).

``Mesh.of(problem, settings)`` computes, once, every derived number verl's workers compute from the same
settings: the world, the data-parallel sizes (actor and critic), the FSDP shard group, the rollout replicas,
the trajectories and their padding, the per-GPU mini-batch and log-prob batch, the accumulation steps, the
NVLink group, and the per-pod layout (pods, GPUs and CPUs per pod, the part of the NVLink group on each pod).
The search, the rules, the memory inputs and the report read them from here; the plan carries the per-pod
layout to placement, the manifests and the launcher's check. So the numbers a violation shows, the numbers the
plan reports, the numbers the checks use and the pods that are created cannot drift apart.

The predicates below (heads per SP or TP group, a group inside an NVLink domain) and the CPU request of a pod
are the one copy of those rules: the search's candidate generation and the rules both call them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from verl_operator.api.spec import ModelShape
from verl_operator.planner.inputs import Problem, Settings

#: CPUs verl's Ray placement group asks per GPU (``{GPU: 1, CPU: 3}`` bundles, verl-constraints rule 25),
#: plus spare CPUs per pod for the Ray daemons and the launcher.
CPU_PER_GPU = 3
SPARE_CPU = 2
#: Memory each Ray pod requests per GPU unless ``resources.memoryPerNode`` says otherwise.
MEMORY_GIB_PER_GPU = 16


def data_parallel_size(world: int, sequence_parallel_size: int) -> int:
    """Data-parallel ranks of a trainer: ``world / SP`` (integer division; the rules check divisibility)."""
    return max(1, world // sequence_parallel_size)


def heads_allow_sp(shape: ModelShape, sp: int) -> bool:
    """Ulysses SP ``sp`` splits the model's heads: heads % SP == 0 and (KV heads % SP == 0 or SP % KV heads == 0)."""
    heads, kv = shape.attention_heads, shape.kv_heads
    return heads % sp == 0 and (kv % sp == 0 or sp % kv == 0)


def heads_allow_tp(shape: ModelShape, tp: int) -> bool:
    """vLLM tensor parallelism ``tp`` splits the model's attention heads evenly."""
    return shape.attention_heads % tp == 0


def fits_nvlink_domain(size: int, domain: int) -> bool:
    """A group of ``size`` GPUs sits inside one NVLink domain of ``domain`` GPUs, which such groups tile."""
    return size <= domain and domain % size == 0


def nvlink_group_per_node(group: int, gpus_per_node: int) -> int:
    """GPUs of one node in an NVLink group: the group, or the whole node when the group spans nodes."""
    return min(group, gpus_per_node)


def pod_cpu(requested: str | None, gpus_per_node: int) -> str:
    """The CPU request of one Ray pod: ``resources.cpuPerNode`` as written, else verl's placement group
    (``CPU_PER_GPU`` per GPU) plus ``SPARE_CPU``."""
    return requested or str(CPU_PER_GPU * gpus_per_node + SPARE_CPU)


def pod_memory(requested: str | None, gpus_per_node: int) -> str:
    """The memory request of one Ray pod: ``resources.memoryPerNode`` as written, else ``MEMORY_GIB_PER_GPU``
    per GPU."""
    return requested or f"{MEMORY_GIB_PER_GPU * gpus_per_node}Gi"


@dataclass(frozen=True)
class Mesh:
    """The derived numbers of one candidate layout (see the module docstring)."""

    world: int
    nnodes: int
    gpus_per_node: int
    sequence_parallel_size: int
    rollout_tp: int
    data_parallel_size: int
    critic_data_parallel_size: int
    fsdp_shard: int
    rollout_replicas: int
    trajectories: int
    padded_trajectories: int
    mini_per_gpu: int
    critic_mini_per_gpu: int
    log_prob_per_gpu: int
    nvlink_group_size: int
    nvlink_group_per_node: int
    cpu_per_node: str
    pads: bool

    @classmethod
    def of(cls, p: Problem, s: Settings, cpu_per_node: str | None = None) -> Mesh:
        """The mesh of settings ``s`` for job ``p``.

        ``cpu_per_node`` is the CPU request asked for each pod (``resources.cpuPerNode``, or the layout's, which
        ``pod_cpu`` made of it); None or empty: verl's placement group (``pod_cpu``).
        """
        dp = data_parallel_size(s.world, s.sequence_parallel_size)
        critic_dp = data_parallel_size(s.world, p.critic_sequence_parallel_size)
        mini = s.ppo_mini_batch_size * s.rollout_n
        # verl >= 0.7 pads the step's trajectories to lcm(DP, mini x n[, critic mini x n]); 0.6 does not.
        pads = p.version != "0.6"
        unit = max(1, math.lcm(dp, mini))  # a mini-batch of 0 is a violation, not a division by zero
        padded = -(-s.trajectories // unit) * unit if pads else s.trajectories
        group = max(s.rollout_tp, s.sequence_parallel_size) if p.nvlink_required else 1
        return cls(
            world=s.world,
            nnodes=s.nnodes,
            gpus_per_node=s.gpus_per_node,
            sequence_parallel_size=s.sequence_parallel_size,
            rollout_tp=s.rollout_tp,
            data_parallel_size=dp,
            critic_data_parallel_size=critic_dp,
            fsdp_shard=s.world if s.fsdp_size == -1 or s.fsdp_size >= s.world else s.fsdp_size,
            rollout_replicas=max(1, s.world // s.rollout_tp),
            trajectories=s.trajectories,
            padded_trajectories=padded,
            mini_per_gpu=mini // dp,
            critic_mini_per_gpu=mini // critic_dp,
            log_prob_per_gpu=padded // dp,
            nvlink_group_size=group,
            nvlink_group_per_node=nvlink_group_per_node(group, s.gpus_per_node),
            cpu_per_node=pod_cpu(cpu_per_node, s.gpus_per_node),
            pads=pads,
        )

    @property
    def waste(self) -> int:
        """Zero-weight samples the trainer adds per step."""
        return self.padded_trajectories - self.trajectories

    @property
    def nvlink_spans_nodes(self) -> bool:
        """One NVLink group spans several nodes (multi-node NVLink: one ``nvidia.com/gpu.clique``)."""
        return self.nvlink_group_size > self.gpus_per_node

    def accumulation_steps(self, micro: int | None) -> int | None:
        """Gradient-accumulation steps of the actor's per-GPU mini-batch at ``micro`` (None: dynamic)."""
        return self.mini_per_gpu // micro if micro else None

    def log_prob_passes(self, micro: int | None) -> int | None:
        """Forward passes of the per-GPU log-prob batch at ``micro`` (None: dynamic)."""
        return math.ceil(self.log_prob_per_gpu / micro) if micro else None
