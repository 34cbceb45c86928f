"""The planner's views of the settings registry: written by ``make settings`` from
``api/settings_registry.py`` (``api/settings_codegen.py``); do not edit (a unit test fails on drift).
"""

from __future__ import annotations

from dataclasses import dataclass

from verl_operator.planner.overrides import Value

#: The settings every candidate keeps as pinned (``search="keep"``).
KEPT: tuple[str, ...] = (
    "rollout_response_length",
    "rollout_prompt_length",
)


@dataclass(frozen=True, kw_only=True)
class Chosen:
    """The settings of one candidate: chosen by the search or kept as pinned (``search`` rows)."""

    train_batch_size: int
    rollout_n: int
    rollout_tp: int
    gpu_memory_utilization: float
    rollout_response_length: int | None = None
    rollout_prompt_length: int | None = None
    sequence_parallel_size: int
    fsdp_size: int
    param_offload: bool
    optimizer_offload: bool
    ppo_mini_batch_size: int
    dynamic_batch_size: bool
    max_token_len_per_gpu: int | None = None
    log_prob_max_token_len_per_gpu: int | None = None
    ppo_micro_batch_size_per_gpu: int | None = None
    log_prob_micro_batch_size_per_gpu: int | None = None
    critic_ppo_micro_batch_size_per_gpu: int | None = None
    megatron_tp: int = 1
    megatron_pp: int = 1
    megatron_vpp: int | None = None
    megatron_cp: int = 1
    megatron_ep: int = 1
    megatron_etp: int | None = None


@dataclass(frozen=True)
class Fixed:
    """The pinned values with their types checked, None: the planner decides (``search`` rows)."""

    train_batch_size: int | None = None
    rollout_n: int | None = None
    rollout_tp: int | None = None
    gpu_memory_utilization: float | None = None
    rollout_response_length: int | None = None
    rollout_prompt_length: int | None = None
    sequence_parallel_size: int | None = None
    fsdp_size: int | None = None
    param_offload: bool | None = None
    optimizer_offload: bool | None = None
    ppo_mini_batch_size: int | None = None
    dynamic_batch_size: bool | None = None
    max_token_len_per_gpu: int | None = None
    log_prob_max_token_len_per_gpu: int | None = None
    ppo_micro_batch_size_per_gpu: int | None = None
    log_prob_micro_batch_size_per_gpu: int | None = None
    critic_ppo_micro_batch_size_per_gpu: int | None = None
    ppo_micro_batch_size_global: int | None = None
    log_prob_micro_batch_size_global: int | None = None
    critic_ppo_micro_batch_size_global: int | None = None
    megatron_tp: int | None = None
    megatron_pp: int | None = None
    megatron_vpp: int | None = None
    megatron_cp: int | None = None
    megatron_ep: int | None = None
    megatron_etp: int | None = None


@dataclass(frozen=True, kw_only=True)
class Held:
    """The job's settings the search holds fixed (``held`` rows): the base of ``planner.inputs.Problem``."""

    adv_estimator: str
    model_path: str
    train_files: Value | None = None
    val_files: Value | None = None
    max_prompt_length: int
    max_response_length: int
    rollout_name: str = "vllm"
    rollout_mode: str | None = None
    max_model_len: int | None = None
    max_num_batched_tokens: int
    use_remove_padding: bool | None = None
    critic_model_path: str | None = None
    max_position_embeddings: int | None = None
    gradient_checkpointing: bool = True
    ref_param_offload: bool = False
    enable_chunked_prefill: bool = True
    max_num_seqs: int = 256
    rollout_ep: int | None = None
    rollout_dp: int | None = None
    critic_max_token_len_per_gpu: int | None = None
    critic_sequence_parallel_size: int = 1
    rollout_moe_tp: int | None = None
    training_engine: str = "fsdp"
    megatron_sequence_parallel: bool | None = None
