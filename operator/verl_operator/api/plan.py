"""The planner's output values: violations, the plan and the result, with the JSON contract of ``plan -o json``.

They live in the API package because they are part of the API: ``status.plan`` of a VerlJob is a
:class:`Plan`, ``status.violations`` a list of :class:`Violation`, and the CRD's status schema is generated
from them. Optional numbers default to None, so a plan read back from the API server (where a JSON merge
patch drops null members) parses again.
"""

from __future__ import annotations

from typing import Any

from pydantic import AliasChoices, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)


class Violation(_Frozen):
    """One reason a job cannot run as specified.

    Attributes:
        field: The spec field (``spec.data.trainBatchSize``) or override (``spec.overrides[data.x]``) to change.
        rule: A stable rule identifier (``batch-divisible-by-world``), documented in ``docs/planner.md``.
        message: What is wrong, with every factor of the arithmetic.
        suggestions: The nearest valid values or the changes that would make it valid.
    """

    field: str
    rule: str
    message: str
    suggestions: list[str] = Field(default_factory=list)

    def one_line(self) -> str:
        """``field: message (suggestions: a; b)``: the form of status messages, events and admission denials."""
        text = f"{self.field}: {self.message}"
        return f"{text} (suggestions: {'; '.join(self.suggestions)})" if self.suggestions else text


class RolloutPlan(_Frozen):
    """The vLLM rollout layout."""

    mode: str
    name: str = "vllm"
    tensor_parallel_size: int
    replicas: int
    prompts_per_replica: float
    sequences_per_replica: float
    gpu_memory_utilization: float
    max_model_len: int
    kv_cache_tokens_per_replica: int


class BatchingPlan(_Frozen):
    """Batch sizes and the derived per-GPU numbers."""

    train_batch_size: int
    rollout_n: int
    trajectories_per_step: int
    ppo_mini_batch_size: int
    mini_batch_per_gpu: int
    ppo_micro_batch_size_per_gpu: int | None = None
    gradient_accumulation_steps: int | None = None
    log_prob_micro_batch_size_per_gpu: int | None = None
    log_prob_passes_per_gpu: int | None = None
    dynamic_batch_size: bool
    max_token_len_per_gpu: int | None = None
    log_prob_max_token_len_per_gpu: int | None = None
    mini_batches_per_step: int


class MemoryPhase(_Frozen):
    """One phase's per-GPU estimate: its parts in GiB and the peak (safety factor applied to estimated parts)."""

    peak_gib: float = Field(serialization_alias="peakGiB", validation_alias=AliasChoices("peakGiB"))
    parts_gib: dict[str, float] = Field(
        serialization_alias="partsGiB", validation_alias=AliasChoices("partsGiB")
    )


class MemoryPlan(_Frozen):
    """Per-GPU memory estimate of the three phases against the GPU's memory."""

    gpu_memory_gib: float = Field(
        serialization_alias="gpuMemoryGiB", validation_alias=AliasChoices("gpuMemoryGiB")
    )
    rollout_peak_gib: float = Field(
        serialization_alias="rolloutPeakGiB", validation_alias=AliasChoices("rolloutPeakGiB")
    )
    train_peak_gib: float = Field(
        serialization_alias="trainPeakGiB", validation_alias=AliasChoices("trainPeakGiB")
    )
    log_prob_peak_gib: float = Field(
        serialization_alias="logProbPeakGiB", validation_alias=AliasChoices("logProbPeakGiB")
    )
    safety_factor: float
    rollout: MemoryPhase
    train: MemoryPhase
    log_prob: MemoryPhase


class PaddingPlan(_Frozen):
    """Zero-weight samples the trainer adds per step (verl >= 0.7 pads instead of failing)."""

    padded_trajectories: int
    waste_fraction: float


class NodePoolPlan(_Frozen):
    """The node group the plan is for."""

    gpu_product: str
    gpu_memory_mib: int
    nvlink_domain_size: int
    eligible_nodes: int
    excluded: dict[str, str]


class Plan(_Frozen):
    """A complete, valid layout of the job on the cluster's GPUs."""

    verl_version: str
    nodes: list[str]
    nnodes: int
    gpus_per_node: int
    candidate_nodes: list[str]
    nvlink_group_size: int
    world_size: int
    data_parallel_size: int
    sequence_parallel_size: int
    fsdp_size: int
    rollout: RolloutPlan
    batching: BatchingPlan
    memory: MemoryPlan
    padding: PaddingPlan
    node_pool: NodePoolPlan
    overrides: list[str]


class PlanResult(_Frozen):
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
        among ``candidateNodes``).
        """
        return self.model_dump(mode="json", by_alias=True)
