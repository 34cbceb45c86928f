"""verl's config keys per release line: which override keys the planner reads, and the override list it emits.

Both spellings of a setting are accepted as input for every version (users paste scripts from several verl
releases); the output uses the target version's spelling:

- 0.6 (SPMD rollout): ``actor_rollout_ref.rollout.mode=sync``; Ulysses SP in
  ``actor_rollout_ref.actor.ulysses_sequence_parallel_size`` (the worker reads it there).
- 0.9 (server rollout): ``rollout.mode=async`` (``sync`` raises), ``rollout.name=vllm`` (no default), SP in
  ``actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size`` (and the ref's ``fsdp_config``), the
  ``_per_gpu`` micro-batch forms only (global forms are no longer converted).
Both: ``use_remove_padding=True`` when SP > 1, log-prob dynamic batch size equal to the actor's,
``rollout.max_model_len`` = prompt + response unless pinned (0.9 would otherwise use the model's full
``max_position_embeddings``, whose KV cache may not fit), and ``rollout.max_num_batched_tokens`` at least
``max_model_len`` in 0.6 (its SPMD rollout rejects less with chunked prefill on).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from verl_operator.planner.inputs import Settings
from verl_operator.planner.overrides import Override, Value, format_value

ARR = "actor_rollout_ref"

#: Override key -> logical planner input. Keys mapped to one input must agree.
INPUT_KEYS: dict[str, str] = {
    "data.train_batch_size": "train_batch_size",
    "data.max_prompt_length": "max_prompt_length",
    "data.max_response_length": "max_response_length",
    "data.train_files": "train_files",
    "data.val_files": "val_files",
    f"{ARR}.model.path": "model_path",
    "critic.model.path": "critic_model_path",
    "algorithm.adv_estimator": "adv_estimator",
    "trainer.nnodes": "nnodes",
    "trainer.n_gpus_per_node": "n_gpus_per_node",
    f"{ARR}.rollout.n": "rollout_n",
    f"{ARR}.rollout.name": "rollout_name",
    f"{ARR}.rollout.mode": "rollout_mode",
    f"{ARR}.rollout.tensor_model_parallel_size": "rollout_tp",
    f"{ARR}.rollout.gpu_memory_utilization": "gpu_memory_utilization",
    f"{ARR}.rollout.max_model_len": "max_model_len",
    f"{ARR}.rollout.max_num_batched_tokens": "max_num_batched_tokens",
    f"{ARR}.actor.ulysses_sequence_parallel_size": "sequence_parallel_size",
    f"{ARR}.actor.fsdp_config.ulysses_sequence_parallel_size": "sequence_parallel_size",
    f"{ARR}.ref.ulysses_sequence_parallel_size": "sequence_parallel_size",
    f"{ARR}.ref.fsdp_config.ulysses_sequence_parallel_size": "sequence_parallel_size",
    f"{ARR}.actor.fsdp_config.fsdp_size": "fsdp_size",
    f"{ARR}.actor.ppo_mini_batch_size": "ppo_mini_batch_size",
    f"{ARR}.actor.ppo_micro_batch_size_per_gpu": "ppo_micro_batch_size_per_gpu",
    f"{ARR}.actor.ppo_micro_batch_size": "ppo_micro_batch_size_global",
    f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu": "log_prob_micro_batch_size_per_gpu",
    f"{ARR}.ref.log_prob_micro_batch_size_per_gpu": "log_prob_micro_batch_size_per_gpu",
    f"{ARR}.rollout.log_prob_micro_batch_size": "log_prob_micro_batch_size_global",
    f"{ARR}.ref.log_prob_micro_batch_size": "log_prob_micro_batch_size_global",
    f"{ARR}.actor.use_dynamic_bsz": "dynamic_batch_size",
    f"{ARR}.rollout.log_prob_use_dynamic_bsz": "dynamic_batch_size",
    f"{ARR}.ref.log_prob_use_dynamic_bsz": "dynamic_batch_size",
    "critic.use_dynamic_bsz": "dynamic_batch_size",
    f"{ARR}.actor.ppo_max_token_len_per_gpu": "max_token_len_per_gpu",
    f"{ARR}.rollout.log_prob_max_token_len_per_gpu": "log_prob_max_token_len_per_gpu",
    f"{ARR}.ref.log_prob_max_token_len_per_gpu": "log_prob_max_token_len_per_gpu",
    f"{ARR}.actor.fsdp_config.param_offload": "param_offload",
    f"{ARR}.actor.fsdp_config.optimizer_offload": "optimizer_offload",
    f"{ARR}.model.use_remove_padding": "use_remove_padding",
    "critic.ppo_micro_batch_size_per_gpu": "critic_ppo_micro_batch_size_per_gpu",
    "critic.ppo_micro_batch_size": "critic_ppo_micro_batch_size_global",
}

#: Keys the planner reads (memory model, strategy checks) but passes through unchanged.
READ_KEYS: dict[str, str] = {
    f"{ARR}.model.lora_rank": "lora_rank",
    f"{ARR}.model.override_config.max_position_embeddings": "max_position_embeddings",
    f"{ARR}.model.enable_gradient_checkpointing": "gradient_checkpointing",
    f"{ARR}.actor.use_kl_loss": "use_kl_loss",
    f"{ARR}.actor.entropy_coeff": "entropy_coeff",
    "algorithm.use_kl_in_reward": "use_kl_in_reward",
    f"{ARR}.ref.fsdp_config.param_offload": "ref_param_offload",
    f"{ARR}.actor.strategy": "actor_strategy",
    "critic.strategy": "critic_strategy",
    "critic.enable": "critic_enable",
    f"{ARR}.rollout.enable_chunked_prefill": "enable_chunked_prefill",
    f"{ARR}.rollout.max_num_seqs": "max_num_seqs",
    f"{ARR}.rollout.expert_parallel_size": "rollout_ep",
    f"{ARR}.rollout.pipeline_model_parallel_size": "rollout_pp",
    f"{ARR}.rollout.data_parallel_size": "rollout_dp",
    "critic.ppo_max_token_len_per_gpu": "critic_max_token_len_per_gpu",
    "critic.model.fsdp_config.param_offload": "critic_param_offload",
    "critic.model.fsdp_config.optimizer_offload": "critic_optimizer_offload",
    "critic.ppo_mini_batch_size": "critic_ppo_mini_batch_size",
    "critic.ulysses_sequence_parallel_size": "critic_sequence_parallel_size",
    "critic.model.fsdp_config.ulysses_sequence_parallel_size": "critic_sequence_parallel_size",
}


def rollout_mode_value(version: str) -> str:
    """verl's ``rollout.mode`` for a release line: ``sync`` (SPMD, 0.6) or ``async`` (server, 0.9)."""
    return "sync" if version == "0.6" else "async"


def sp_keys(version: str) -> tuple[str, ...]:
    """The keys that carry the Ulysses SP size for actor and ref in this release line."""
    if version == "0.6":
        return (f"{ARR}.actor.ulysses_sequence_parallel_size",)
    return (
        f"{ARR}.actor.fsdp_config.ulysses_sequence_parallel_size",
        f"{ARR}.ref.fsdp_config.ulysses_sequence_parallel_size",
    )


@dataclass(frozen=True)
class Emitted:
    """The planned values that become overrides: the chosen settings plus the job's fixed facts."""

    settings: Settings
    version: str
    model_path: str
    adv_estimator: str
    train_files: Value | None
    val_files: Value | None
    max_prompt_length: int
    max_response_length: int
    max_model_len: int
    max_num_batched_tokens: int
    critic: bool
    rollout_mode: str = ""
    critic_model_path: str | None = None
    dtype: str = "bfloat16"


def emit(planned: Emitted, passthrough: Sequence[Override]) -> list[str]:
    """The full override list for the target version: the planner's keys once each, then the user's others.

    Args:
        planned: The planned values.
        passthrough: User overrides the planner does not own, kept verbatim and in order.
    """
    v = planned.version
    st = planned.settings
    out: list[tuple[str, Any]] = [
        ("algorithm.adv_estimator", planned.adv_estimator),
        (f"{ARR}.model.path", planned.model_path),
    ]
    if planned.train_files is not None:
        out.append(("data.train_files", planned.train_files))
    if planned.val_files is not None:
        out.append(("data.val_files", planned.val_files))
    out += [
        ("data.train_batch_size", st.train_batch_size),
        ("data.max_prompt_length", planned.max_prompt_length),
        ("data.max_response_length", planned.max_response_length),
        ("trainer.nnodes", st.nnodes),
        ("trainer.n_gpus_per_node", st.gpus_per_node),
        (f"{ARR}.rollout.name", "vllm"),
        (f"{ARR}.rollout.mode", planned.rollout_mode or rollout_mode_value(v)),
        (f"{ARR}.rollout.n", st.rollout_n),
        (f"{ARR}.rollout.tensor_model_parallel_size", st.rollout_tp),
        (f"{ARR}.rollout.gpu_memory_utilization", st.gpu_memory_utilization),
    ]
    out.append((f"{ARR}.rollout.max_model_len", planned.max_model_len))
    out.append((f"{ARR}.rollout.max_num_batched_tokens", planned.max_num_batched_tokens))
    out += [(k, st.sequence_parallel_size) for k in sp_keys(v)]
    if st.sequence_parallel_size > 1:
        out.append((f"{ARR}.model.use_remove_padding", True))
    out += [
        (f"{ARR}.actor.fsdp_config.fsdp_size", st.fsdp_size),
        (f"{ARR}.actor.fsdp_config.param_offload", st.param_offload),
        (f"{ARR}.actor.fsdp_config.optimizer_offload", st.optimizer_offload),
        (f"{ARR}.actor.ppo_mini_batch_size", st.ppo_mini_batch_size),
        (f"{ARR}.actor.use_dynamic_bsz", st.dynamic_batch_size),
        (f"{ARR}.rollout.log_prob_use_dynamic_bsz", st.dynamic_batch_size),
        (f"{ARR}.ref.log_prob_use_dynamic_bsz", st.dynamic_batch_size),
    ]
    out += _batch_keys(planned)
    out += dtype_keys(planned)
    rendered = [f"{k}={format_value(val)}" for k, val in out]
    return rendered + [ov.raw.strip() for ov in passthrough]


def _batch_keys(planned: Emitted) -> list[tuple[str, Any]]:
    """The micro-batch or token-budget keys (the mode's only), and the critic's."""
    st = planned.settings
    out: list[tuple[str, Any]] = []
    if st.dynamic_batch_size:
        out += [
            (f"{ARR}.actor.ppo_max_token_len_per_gpu", st.max_token_len_per_gpu),
            (f"{ARR}.rollout.log_prob_max_token_len_per_gpu", st.log_prob_max_token_len_per_gpu),
            (f"{ARR}.ref.log_prob_max_token_len_per_gpu", st.log_prob_max_token_len_per_gpu),
        ]
    else:
        out += [
            (f"{ARR}.actor.ppo_micro_batch_size_per_gpu", st.ppo_micro_batch_size_per_gpu),
            (f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu", st.log_prob_micro_batch_size_per_gpu),
            (f"{ARR}.ref.log_prob_micro_batch_size_per_gpu", st.log_prob_micro_batch_size_per_gpu),
        ]
        if planned.critic:
            out.append(("critic.ppo_micro_batch_size_per_gpu", st.critic_ppo_micro_batch_size_per_gpu))
    if planned.critic:
        out.append(("critic.use_dynamic_bsz", st.dynamic_batch_size))
        # verl's default names ~/models/deepseek-llm-7b-chat: a critic without a path fails to build.
        out.append(("critic.model.path", planned.critic_model_path or planned.model_path))
    return out


def dtype_keys(planned: Emitted) -> list[tuple[str, Any]]:
    """``spec.model.dtype: float16``: vLLM's dtype and FSDP's mixed-precision parameter dtype (verl's defaults
    are bfloat16, which GPUs below compute capability 8.0 cannot run). The FSDP workers of both releases take
    the parameter dtype from ``fsdp_config.dtype`` when no ``mixed_precision`` block is given
    (0.6.1 ``workers/fsdp_workers.py`` ``_build_model_optimizer``; 0.9.1 ``workers/config/engine.py``
    ``FSDPEngineConfig.dtype``); the 0.9 critic's engine config is ``critic.fsdp``."""
    if planned.dtype != "float16":
        return []
    out: list[tuple[str, Any]] = [
        (f"{ARR}.rollout.dtype", "float16"),
        (f"{ARR}.actor.fsdp_config.dtype", "float16"),
        (f"{ARR}.ref.fsdp_config.dtype", "float16"),
    ]
    if planned.critic:  # 0.9 only: the planner refuses float16 with a 0.6 critic (planner/job.py)
        out.append(("critic.fsdp.dtype", "float16"))
    return out
