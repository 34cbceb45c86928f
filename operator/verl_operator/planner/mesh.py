"""One owner of a candidate's mesh and batch arithmetic (the idea of torchtitan's ``ParallelDims``).

``Mesh.of(problem, settings)`` is built once per candidate the search tries and holds every derived number
verl's workers compute from the same settings: the world, the data-parallel sizes (actor and critic), the FSDP
shard group, the rollout replicas, the trajectories and their padding, the per-GPU mini-batch and log-prob
batch, the accumulation steps, the NVLink group, and the per-pod layout (pods, GPUs and CPUs per pod, the part
of the NVLink group on each pod). The rules take the Mesh (``rule(problem, mesh)``), and the search, the memory
inputs and the report read its numbers; the plan carries the per-pod layout to placement, the manifests and
the launcher's check. So the numbers a violation shows, the numbers the plan reports, the numbers the checks
use and the pods that are created cannot drift apart.

The functions below (heads per SP or TP group, a group inside an NVLink domain or spanning nodes, a replica
on whole nodes, the batch steps that divide over a number of ranks) and the CPU request of a pod are the one
copy of those rules: the search's candidate generation (which runs before a candidate's Mesh exists), the
Mesh's own checks and placement all call them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any

from verl_operator.api.spec import ModelShape
from verl_operator.planner.arith import divisors
from verl_operator.planner.inputs import Problem, Settings
from verl_operator.planner.megatron import state_shard as megatron_state_shard

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


def rollout_tp_split(shape: ModelShape, tp: int) -> list[str]:
    """Why the rollout engine's tensor parallelism ``tp`` cannot split the model (empty: it can).

    vLLM (and SGLang, the same layers) splits the attention heads evenly; the key/value heads are split
    evenly when there are at least ``tp`` of them and replicated otherwise, so either ``kv % tp == 0`` or
    ``tp % kv == 0`` (vLLM ``QKVParallelLinear``; MLA models keep no per-head KV and are exempt); a dense MLP's
    intermediate size is split by ``RowParallelLinear`` with ``divide()``, which asserts divisibility (a MoE
    model's dense MLPs only where it has leading dense layers).

    Example: 24 heads, 3 KV heads, TP 2 -> ``["the model's 3 KV heads neither divide by nor divide TP 2"]``.
    """
    out: list[str] = []
    if shape.attention_heads % tp:
        out.append(
            f"the model's {shape.attention_heads} attention heads are not divisible by tensorParallelSize {tp}"
        )
    kv = shape.kv_heads
    if shape.kv_lora_rank is None and kv % tp and tp % kv:
        out.append(
            f"the model's {kv} KV heads neither divide by tensorParallelSize {tp} nor divide it (vLLM splits "
            f"them or replicates each on tp / kv ranks)"
        )
    dense = shape.num_experts is None or (shape.first_k_dense_replace or 0) > 0
    if dense and shape.intermediate_size % tp:
        out.append(
            f"the model's intermediateSize {shape.intermediate_size} is not divisible by tensorParallelSize {tp} "
            f"({shape.intermediate_size} % {tp} = {shape.intermediate_size % tp}: the MLP's RowParallelLinear "
            "asserts it)"
        )
    return out


def heads_allow_tp(shape: ModelShape, tp: int) -> bool:
    """vLLM tensor parallelism ``tp`` splits the model evenly (:func:`rollout_tp_split`)."""
    return not rollout_tp_split(shape, tp)


def fits_nvlink_domain(size: int, domain: int) -> bool:
    """A group of ``size`` GPUs sits inside one NVLink domain of ``domain`` GPUs, which such groups tile."""
    return size <= domain and domain % size == 0


def nvlink_group_per_node(group: int, gpus_per_node: int) -> int:
    """GPUs of one node in an NVLink group: the group, or the whole node when the group spans nodes."""
    return min(group, gpus_per_node)


def nvlink_spans_nodes(group: int, gpus_per_node: int) -> bool:
    """One NVLink group of ``group`` GPUs spans several nodes (multi-node NVLink: one ``nvidia.com/gpu.clique``)."""
    return group > gpus_per_node


def replica_fits_nodes(tp: int, gpus_per_node: int) -> bool:
    """A vLLM replica of ``tp`` GPUs spans whole nodes (larger than a node) or tiles one (not larger)."""
    if tp > gpus_per_node:
        return tp % gpus_per_node == 0
    return gpus_per_node % tp == 0


def rollout_tp_sizes(gpus_per_node: int, nnodes: int) -> list[int]:
    """Replica sizes of a layout, smallest first: the divisors of a node, then whole nodes, each dividing the
    world."""
    world = gpus_per_node * nnodes
    sizes = [*divisors(gpus_per_node), *(gpus_per_node * k for k in range(2, nnodes + 1))]
    return [tp for tp in sizes if world % tp == 0]


def batch_step(ranks: int, n: int) -> int:
    """The step of batch sizes ``b`` whose ``b x n`` sequences divide over ``ranks``: ``ranks / gcd(ranks, n)``."""
    return ranks // math.gcd(ranks, n)


def fewest_batch(ranks: int, n: int) -> int:
    """The smallest batch size ``b`` whose ``b x n`` sequences give each of ``ranks`` at least one."""
    return -(-ranks // n)


def divides_over(sequences: int, ranks: int) -> bool:
    """``sequences`` divide evenly over ``ranks``, at least one per rank."""
    return sequences % ranks == 0 and sequences >= ranks


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
    critic_sequence_parallel_size: int
    #: The candidate's settings and the job's facts the numbers were derived from (the rules read the
    #: settings' own values, such as the batch sizes, for their messages).
    settings: Settings = field(repr=False, compare=False)
    problem: Problem = field(repr=False, compare=False)
    requested_cpu: str | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, p: Problem, s: Settings, cpu_per_node: str | None = None) -> Mesh:
        """The mesh of settings ``s`` for job ``p``.

        ``cpu_per_node`` is the CPU request asked for each pod (``resources.cpuPerNode``, or the layout's, which
        ``pod_cpu`` made of it); None or empty: verl's placement group (``pod_cpu``).
        """
        dp = data_parallel_size(s.world, s.sequence_parallel_size)
        critic_dp = data_parallel_size(s.world, p.critic_sequence_parallel_size)
        megatron = p.training_engine == "megatron"
        if megatron:  # megatron-core's DP: world / (TP x PP x CP), for actor, ref and critic
            dp = critic_dp = max(1, s.world // (s.megatron_tp * s.megatron_pp * s.megatron_cp))
        mini = s.ppo_mini_batch_size * s.rollout_n
        # verl >= 0.7 pads the step's trajectories to lcm(DP, mini x n[, critic mini x n]); 0.6 does not.
        pads = p.version != "0.6"
        unit = max(1, math.lcm(dp, mini))  # a mini-batch of 0 is a violation, not a division by zero
        padded = -(-s.trajectories // unit) * unit if pads else s.trajectories
        group = max(s.rollout_tp, s.sequence_parallel_size) if p.nvlink_required else 1
        if megatron and fits_nvlink_domain(s.megatron_tp, p.nvlink_domain):
            group = max(group, s.megatron_tp)  # a Megatron TP group sits inside one NVLink domain
        return cls(
            world=s.world,
            nnodes=s.nnodes,
            gpus_per_node=s.gpus_per_node,
            sequence_parallel_size=s.sequence_parallel_size,
            rollout_tp=s.rollout_tp,
            data_parallel_size=dp,
            critic_data_parallel_size=critic_dp,
            fsdp_shard=(
                megatron_state_shard(
                    p.shape, p.params, s
                )  # Megatron: over TP x PP, experts over EP x ETP x PP
                if megatron
                else s.world
                if s.fsdp_size == -1 or s.fsdp_size >= s.world
                else s.fsdp_size
            ),
            # A replica holds TP x rollout DP GPUs (verl's RolloutReplica.world_size).
            rollout_replicas=max(1, s.world // (s.rollout_tp * (p.rollout_dp or 1))),
            trajectories=s.trajectories,
            padded_trajectories=padded,
            mini_per_gpu=mini // dp,
            critic_mini_per_gpu=mini // critic_dp,
            log_prob_per_gpu=padded // dp,
            nvlink_group_size=group,
            nvlink_group_per_node=nvlink_group_per_node(group, s.gpus_per_node),
            cpu_per_node=pod_cpu(cpu_per_node, s.gpus_per_node),
            pads=pads,
            critic_sequence_parallel_size=p.critic_sequence_parallel_size,
            settings=s,
            problem=p,
            requested_cpu=cpu_per_node,
        )

    def changed(self, **settings: Any) -> Mesh:
        """The mesh of the same job with some settings changed (``Settings`` field names)."""
        return Mesh.of(self.problem, replace(self.settings, **settings), self.requested_cpu)

    @property
    def waste(self) -> int:
        """Zero-weight samples the trainer adds per step."""
        return self.padded_trajectories - self.trajectories

    @property
    def waste_fraction(self) -> float:
        """The share of zero-weight samples in the padded step (4 decimals; 0 for an empty step)."""
        return round(self.waste / self.padded_trajectories, 4) if self.padded_trajectories else 0.0

    def divides_world(self, size: int) -> bool:
        """``size`` GPUs (an SP, TP or FSDP group) tile the world."""
        return self.world % size == 0

    def world_common_divisor(self, n: int) -> int:
        """The largest group size that divides both ``n`` (a head count) and the world."""
        return math.gcd(n, self.world)

    @property
    def ulysses_rows(self) -> int:
        """Rows of verl's ``(world / SP, SP)`` device mesh (integer division: 0 when SP exceeds the world)."""
        return self.world // self.sequence_parallel_size

    @property
    def fsdp_size_valid(self) -> bool:
        """``fsdp_size`` is -1, at least the world, or a divisor of it."""
        f = self.settings.fsdp_size
        return f == -1 or f >= self.world or (f > 0 and self.world % f == 0)

    @property
    def replica_fits_nodes(self) -> bool:
        """A vLLM replica spans whole nodes or tiles one (:func:`replica_fits_nodes`)."""
        return replica_fits_nodes(self.rollout_tp, self.gpus_per_node)

    @property
    def mini_sequences(self) -> int:
        """Sequences of one PPO mini-batch: ``ppo_mini_batch_size x n``."""
        return self.settings.ppo_mini_batch_size * self.settings.rollout_n

    @property
    def mini_divides_dp(self) -> bool:
        """The actor's mini-batch divides over its data-parallel ranks, at least one sequence per rank."""
        return divides_over(self.mini_sequences, self.data_parallel_size)

    @property
    def mini_divides_critic_dp(self) -> bool:
        """The critic's mini-batch divides over its own data-parallel ranks, at least one sequence per rank."""
        return divides_over(self.mini_sequences, self.critic_data_parallel_size)

    def batch_step(self, ranks: int) -> int:
        """The step of batch sizes whose ``x n`` sequences divide over ``ranks`` (:func:`batch_step`)."""
        return batch_step(ranks, self.settings.rollout_n)

    @property
    def world_divides_trajectories(self) -> bool:
        """The step's ``train_batch_size x n`` trajectories divide evenly over the world."""
        return self.trajectories % self.world == 0

    @property
    def chunk_ranks(self) -> int:
        """verl 0.6's even split of a step with dynamic batch size: over the actor's DP ranks and the rollout's
        replicas, so the trajectories must divide by ``lcm(DP, replicas)``."""
        return math.lcm(self.data_parallel_size, self.rollout_replicas)

    def share(self, tokens: int, sp: int | None = None) -> int:
        """Tokens per rank of ``tokens`` split over a Ulysses group (``ceil(tokens / SP)``; the actor's SP by
        default)."""
        return -(-tokens // (sp or self.sequence_parallel_size))

    def per_gpu_of_global(self, global_size: int | None, critic: bool = False) -> int | None:
        """verl 0.6's conversion of a deprecated global micro-batch: ``global // DP`` (the critic's DP for the
        critic's)."""
        if global_size is None:
            return None
        return global_size // (self.critic_data_parallel_size if critic else self.data_parallel_size)

    def critic_micro_bound(self, actor_micro: int) -> int:
        """The largest critic micro-batch with no more tokens per GPU than the actor's ``actor_micro``
        (``micro x seq / SP``, each with its own SP)."""
        return max(1, actor_micro * self.critic_sequence_parallel_size // self.sequence_parallel_size)

    @property
    def prompts_per_replica(self) -> float:
        """Prompts of one step per vLLM replica."""
        return self.settings.train_batch_size / self.rollout_replicas

    @property
    def sequences_per_replica(self) -> float:
        """Sequences (trajectories) of one step per vLLM replica."""
        return self.trajectories / self.rollout_replicas

    @property
    def mini_batches_per_step(self) -> int:
        """PPO mini-batches (updates) per step, a partial last one counted."""
        return math.ceil(self.settings.train_batch_size / self.settings.ppo_mini_batch_size)

    @property
    def partial_mini_batch(self) -> bool:
        """The train batch is not a multiple of the mini-batch (the last mini-batch is partial)."""
        return self.settings.train_batch_size % self.settings.ppo_mini_batch_size != 0

    def accumulation_steps(self, micro: int | None) -> int | None:
        """Gradient-accumulation steps of the actor's per-GPU mini-batch at ``micro`` (None: dynamic)."""
        return self.mini_per_gpu // micro if micro else None

    def log_prob_passes(self, micro: int | None) -> int | None:
        """Forward passes of the per-GPU log-prob batch at ``micro`` (None: dynamic)."""
        return math.ceil(self.log_prob_per_gpu / micro) if micro else None
