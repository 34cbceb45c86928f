"""The plan's fields that carry a setting as chosen: written by ``make settings`` from
``api/settings_registry.py`` (``api/settings_codegen.py``); do not edit (a unit test fails on drift).
"""

from __future__ import annotations

from pydantic import Field

from verl_operator.api.base import ApiModel


class BatchingSettings(ApiModel):
    """The settings under ``status.plan.batching``, as chosen (rows with a ``batching.`` plan field); their
    descriptions are the rows'."""

    train_batch_size: int = Field(
        description="Prompts per step (data.train_batch_size); the planner decides if omitted.",
    )
    rollout_n: int = Field(
        description="Responses sampled per prompt: verl's rollout.n (actor_rollout_ref.rollout.n). Named in full because YAML 1.1 readers such as kubectl take a bare n key for the boolean false.",
    )
    ppo_mini_batch_size: int = Field(
        description="Prompts per PPO mini-batch (actor.ppo_mini_batch_size), before x responsesPerPrompt (verl's rollout.n).",
    )
    dynamic_batch_size: bool = Field(
        description="Pack micro-batches by token count (use_dynamic_bsz) instead of sample count.",
    )
    max_token_len_per_gpu: int | None = Field(
        default=None, description="Token budget per GPU with dynamic batch size (ppo_max_token_len_per_gpu)."
    )
    log_prob_max_token_len_per_gpu: int | None = Field(
        default=None, description="Log-prob token budget per GPU with dynamic batch size (rollout and ref)."
    )
    ppo_micro_batch_size_per_gpu: int | None = Field(
        default=None, description="Sequences per GPU per forward/backward (gradient accumulation unit)."
    )
    log_prob_micro_batch_size_per_gpu: int | None = Field(
        default=None, description="Sequences per GPU per log-prob forward (rollout and ref)."
    )
