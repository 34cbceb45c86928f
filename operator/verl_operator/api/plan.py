"""The planner's output values: violations, the plan and the result, with the JSON contract of ``plan -o json``.

They live in the API package because they are part of the API: ``status.plan`` of a VerlJob is a
:class:`Plan`, ``status.violations`` a list of :class:`Violation`, and the CRD's status schema is generated
from them. Optional numbers default to None, so a plan read back from the API server (where a JSON merge
patch drops null members) parses again.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import AliasChoices, Field

from verl_operator.api import limits as L
from verl_operator.api._plan_generated import BatchingSettings
from verl_operator.api.base import ApiModel

#: Candidate node names a plan lists (the count is always there): a plan, and the ``status.plan`` that holds
#: it, stay the same size on a cluster of any size (a list of every node was 57 KB at 5000 nodes).
CANDIDATE_SAMPLE = 5
#: Excluded nodes a plan lists with their reasons (the count is always there), for the same reason.
EXCLUDED_IN_PLAN = 20


class Violation(ApiModel):
    """One reason a job cannot run as specified.

    Attributes:
        field: The spec field (``spec.data.trainBatchSize``) or override (``spec.overrides[data.x]``) to change.
        rule: A stable rule identifier (``batch-divisible-by-world``), documented in ``docs/planner.md``.
        message: What is wrong, with every factor of the arithmetic.
        suggestions: The nearest valid values or the changes that would make it valid.
    """

    field: str = Field(description="The spec field or override to change.")
    rule: str = Field(description="Stable rule identifier (docs/planner.md).")
    message: str = Field(description="What is wrong, with every factor of the arithmetic.")
    suggestions: list[str] = Field(default_factory=list, description="The nearest valid values.")

    def one_line(self) -> str:
        """``field: message (suggestions: a; b)``: the form of status messages, events and admission denials."""
        text = f"{self.field}: {self.message}"
        return f"{text} (suggestions: {'; '.join(self.suggestions)})" if self.suggestions else text


class RolloutPlan(ApiModel):
    """The rollout layout: the engine (vLLM, SGLang or TensorRT-LLM), its replicas and their KV cache."""

    mode: str = Field(description="Rollout mode in the verl dialect (sync = SPMD, async = server).")
    name: str = Field(default="vllm", description="Rollout engine.")
    tensor_parallel_size: int = Field(description="The rollout engine's tensor parallel size per replica.")
    replicas: int = Field(
        description="Rollout replicas (GPUs / (tensorParallelSize x rollout data_parallel_size))."
    )
    prompts_per_replica: float = Field(description="Prompts each replica generates per step.")
    sequences_per_replica: float = Field(
        description="Sequences (prompts x n) each replica generates per step."
    )
    gpu_memory_utilization: float = Field(
        description=(
            "gpu_memory_utilization: the fraction of GPU memory vLLM (or SGLang's mem_fraction_static) may take; "
            "TensorRT-LLM: the fraction of the memory free after the weights load."
        )
    )
    max_model_len: int = Field(description="Longest sequence (prompt + response) in tokens.")
    kv_cache_tokens_per_replica: int = Field(description="Tokens the KV cache of one replica holds.")


class BatchingPlan(BatchingSettings):
    """Batch sizes and the derived per-GPU numbers: the settings as chosen (``BatchingSettings``, from the
    settings registry's rows) and what the mesh derives from them."""

    trajectories_per_step: int = Field(description="trainBatchSize x rolloutN.")
    mini_batch_per_gpu: int = Field(description="Sequences of one mini-batch on each GPU.")
    gradient_accumulation_steps: int | None = Field(
        default=None, description="Micro-batches per mini-batch on each GPU."
    )
    log_prob_passes_per_gpu: int | None = Field(
        default=None, description="Log-prob forwards per GPU per step."
    )
    mini_batches_per_step: int = Field(description="PPO mini-batches per step.")


class MemoryPhase(ApiModel):
    """One phase's per-GPU estimate: its parts in GiB and the peak (safety factor applied to estimated parts)."""

    peak_gib: float = Field(
        description="Peak GiB per GPU.",
        serialization_alias="peakGiB",
        validation_alias=AliasChoices("peakGiB"),
    )
    parts_gib: dict[str, float] = Field(
        description="The parts of the peak, in GiB.",
        serialization_alias="partsGiB",
        validation_alias=AliasChoices("partsGiB"),
    )


class MemoryPlan(ApiModel):
    """Per-GPU memory estimate of the three phases against the GPU's memory."""

    gpu_memory_gib: float = Field(
        description="GPU memory in GiB.",
        serialization_alias="gpuMemoryGiB",
        validation_alias=AliasChoices("gpuMemoryGiB"),
    )
    rollout_peak_gib: float = Field(
        description="Peak GiB per GPU while generating.",
        serialization_alias="rolloutPeakGiB",
        validation_alias=AliasChoices("rolloutPeakGiB"),
    )
    train_peak_gib: float = Field(
        description="Peak GiB per GPU while training.",
        serialization_alias="trainPeakGiB",
        validation_alias=AliasChoices("trainPeakGiB"),
    )
    log_prob_peak_gib: float = Field(
        description="Peak GiB per GPU while computing log-probs.",
        serialization_alias="logProbPeakGiB",
        validation_alias=AliasChoices("logProbPeakGiB"),
    )
    safety_factor: float = Field(description="Factor applied to the estimated parts.")
    tokens_per_sequence: int = Field(
        default=0,
        description=(
            "Tokens the estimate takes per sequence in a micro-batch: maxPromptLength + maxResponseLength, or "
            "with padding removed the data's mean lengths where spec.data gives them."
        ),
    )
    rollout: MemoryPhase = Field(description="The rollout phase.")
    train: MemoryPhase = Field(description="The training phase.")
    log_prob: MemoryPhase = Field(description="The log-prob phase.")


class PaddingPlan(ApiModel):
    """Zero-weight samples the trainer adds per step (verl >= 0.7 pads instead of failing)."""

    padded_trajectories: int = Field(description="Zero-weight trajectories added per step.")
    waste_fraction: float = Field(description="Share of the padded batch that is padding.")


class NodePoolPlan(ApiModel):
    """The node group the plan is for."""

    gpu_product: str = Field(description="nvidia.com/gpu.product of the pool.")
    gpu_memory_mib: int = Field(description="GPU memory in MiB.")
    nvlink_domain_size: int = Field(description="GPUs per NVLink domain on a node.")
    eligible_nodes: int = Field(description="Nodes of the pool.")
    excluded: dict[str, str] = Field(
        description=f"Excluded nodes and why: the first {EXCLUDED_IN_PLAN} in natural name order."
    )
    excluded_count: int = Field(default=0, description="Nodes excluded in all.")
    product_selector: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "The node label naming the pool's GPU product as its nodes carry it (GPU Feature Discovery's "
            "nvidia.com/gpu.product, or a cloud's label), the nodeSelector of pods a scheduler places; empty "
            "when no label names it."
        ),
    )


class TrainingPlan(ApiModel):
    """The training engine and, for Megatron, its parallel mesh."""

    engine: str = Field(description="fsdp or megatron (verl's ppo_megatron_trainer config).")
    tensor_parallel_size: int = Field(default=1, description="Megatron TP (inside one NVLink domain).")
    pipeline_parallel_size: int = Field(default=1, description="Megatron PP.")
    virtual_pipeline_parallel_size: int | None = Field(default=None, description="Megatron VPP (none: null).")
    context_parallel_size: int = Field(default=1, description="Megatron CP.")
    expert_parallel_size: int = Field(default=1, description="Megatron EP.")
    expert_tensor_parallel_size: int | None = Field(default=None, description="Megatron ETP (null: TP).")
    data_parallel_size: int = Field(
        description="world / (TP x PP x CP) for Megatron; the actor's DP for FSDP."
    )


#: The trainer modes a plan knows: one pool (colocated: verl 0.6's and v1's sync trainer; v1 colocate_async)
#: or two (v1 separate_async, the fully_async and one_step_off trainers). See ``planner/pools.py``.
TrainerMode = Literal["sync", "colocate_async", "separate_async", "fully_async", "one_step_off"]


class PoolPlan(ApiModel):
    """One pool of a trainer mode's GPUs (verl's resource pool of ``nnodes x n_gpus_per_node``)."""

    gpus: int = Field(description="GPUs of the pool.")
    nnodes: int = Field(description="Nodes of the pool (verl's nnodes for it).")
    gpus_per_node: int = Field(description="GPUs of the pool on each node (verl's n_gpus_per_node for it).")
    mesh: str = Field(
        max_length=80,
        description="The pool's mesh: the trainer's dp/sp (FSDP) or tp/pp/cp/dp (Megatron); rollout tp x dp.",
    )
    peak_gib: float | None = Field(
        default=None, description="Estimated peak memory of one of the pool's GPUs (null: not estimated)."
    )
    memory_gib: dict[str, float] = Field(
        default_factory=dict,
        max_length=8,
        description="The parts of the peak: a rollout GPU holds no optimizer, a trainer GPU of a mode without "
        "hybrid replicas no KV cache.",
    )


class RolloutPoolPlan(PoolPlan):
    """The standalone rollout pool: inference replicas only (no optimizer, no training state)."""

    tensor_parallel_size: int = Field(description="Rollout TP of each replica (the same as the trainer's).")
    data_parallel_size: int = Field(default=1, description="Rollout DP inside one replica.")
    replicas: int = Field(description="Whole replicas the pool holds: gpus // (TP x DP).")
    idle_gpus: int = Field(
        default=0, description="GPUs left over by the replicas (verl 0.9 leaves them idle; 0.6 refuses)."
    )


class PoolsPlan(ApiModel):
    """How a trainer mode uses the job's GPUs: the trainer pool, the rollout pool and the batch invariants.

    Bounded: a fixed set of members and at most a few invariants, whatever the job's size.
    """

    mode: TrainerMode = Field(description="The trainer mode (trainer.v1.trainer_mode or the entry point's).")
    entrypoint: str = Field(
        max_length=L.MAX_MODULE, description="The module verl runs (spec.verl.entrypoint)."
    )
    trainer: PoolPlan = Field(description="The trainer pool (actor, reference, critic).")
    rollout: RolloutPoolPlan | None = Field(
        default=None, description="The standalone rollout pool (null: the rollout shares the trainer's GPUs)."
    )
    nodes: int = Field(description="Nodes of the whole job (both pools).")
    shared_nodes: bool = Field(
        default=False,
        description="Both pools on the same nodes (same node count, their GPUs per node fit one node).",
    )
    split: Literal["pinned", "measured", "model", "single"] = Field(
        description=(
            "Where the split came from: the spec (resources.rolloutGpus or the pool keys: pinned), a previous "
            "run's measured phase times (measured), the throughput model (model), or one pool (single)."
        )
    )
    model_rollout_fraction: float | None = Field(
        default=None,
        description="The throughput model's balanced share of rollout GPUs (null when not computed).",
    )
    measured_rollout_fraction: float | None = Field(
        default=None,
        description="The balanced share of rollout GPUs from a previous run's phase times (null: none given).",
    )
    split_basis: str | None = Field(
        default=None,
        max_length=L.MAX_SPLIT_BASIS,
        description="How the measured balance was read (the run's phase seconds and pools).",
    )
    invariants: dict[str, int] = Field(
        default_factory=dict,
        max_length=8,
        description="The mode's batch numbers (parameterSyncStep, requireBatches, trainerBatch, ...).",
    )


class Plan(ApiModel):
    """A complete, valid layout of the job on the cluster's GPUs."""

    verl_version: str = Field(description="verl release line the plan is written for.")
    nodes: list[str] = Field(
        description="The first nnodes candidate nodes (the operator places on free ones)."
    )
    nnodes: int = Field(
        description="Nodes (Ray pods) of the job (trainer.nnodes; with two pools, both pools' nodes: pools.nodes)."
    )
    gpus_per_node: int = Field(
        description="GPUs each pod holds (trainer.n_gpus_per_node; with two pools, both pools' GPUs of a node)."
    )
    cpu_per_node: str | None = Field(
        default=None,
        description=(
            "CPU request of each pod: resources.cpuPerNode, else verl's placement group (3 per GPU) + 2; "
            "candidate nodes that report CPUs offer it (null in plans of earlier releases)."
        ),
    )
    candidate_node_count: int = Field(
        description=(
            "Nodes the job may run on (of the node pool, with the GPUs, CPUs and memory of a pod); placement "
            "reads them from its node snapshot, so the status stays the same size on any cluster."
        )
    )
    candidate_nodes_sample: list[str] = Field(
        default_factory=list,
        max_length=CANDIDATE_SAMPLE,
        description=f"The first candidate nodes in natural name order (at most {CANDIDATE_SAMPLE}).",
    )
    nvlink_group_size: int = Field(
        description="GPUs that must share an NVLink domain (max of rollout TP and SP)."
    )
    nvlink_group_per_node: int | None = Field(
        default=None,
        description=(
            "GPUs of each node in one NVLink group: nvlinkGroupSize, or gpusPerNode when a group spans "
            "nodes of one NVLink clique (null in plans of earlier releases)."
        ),
    )
    world_size: int = Field(description="GPUs in all (with two pools: the trainer pool's).")
    data_parallel_size: int = Field(description="Data parallel size of the actor.")
    sequence_parallel_size: int = Field(description="Ulysses sequence parallel size.")
    fsdp_size: int = Field(description="FSDP shard group size (-1 = the whole world).")
    rollout: RolloutPlan = Field(description="The rollout layout (engine, replicas, KV cache).")
    batching: BatchingPlan = Field(description="Batch sizes and the derived per-GPU numbers.")
    memory: MemoryPlan = Field(description="Per-GPU memory estimate.")
    padding: PaddingPlan = Field(description="Padding the trainer adds per step.")
    node_pool: NodePoolPlan = Field(description="The node group the plan is for.")
    overrides: list[str] = Field(description="The full verl override list.")
    training: TrainingPlan | None = Field(
        default=None,
        description="The training engine and its mesh (null: FSDP, or plans of earlier releases).",
    )
    pools: PoolsPlan | None = Field(
        default=None,
        description=(
            "The trainer mode's pools (null: verl's colocated trainer on all GPUs). With two pools the plan's "
            "own mesh, batching and memory are the trainer pool's."
        ),
    )


class PlanResult(ApiModel):
    """The planner's answer: a plan, or the violations that say what to change.

    ``feasible`` is true exactly when there are no violations and a plan is present.
    """

    feasible: bool
    violations: list[Violation] = Field(default_factory=list)
    warnings: list[str] = Field(default_factory=list)
    plan: Plan | None = None

    def to_json_dict(self) -> dict[str, Any]:
        """The JSON contract of ``verl-operator plan -o json`` (camelCase keys).

        ``plan.nodes`` lists the first ``nnodes`` candidate nodes (the operator places pods on free ones
        among the ``candidateNodeCount`` candidates, read from its node snapshot).
        """
        return self.model_dump(mode="json", by_alias=True)
