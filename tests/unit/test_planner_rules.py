"""Every rule: one case that passes and one that fails, with the message's arithmetic and suggestions."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import make_problem, make_settings
from test_planner_engines import ENGINE_CASES
from test_planner_megatron import MEGATRON_CASES

from verl_operator.api.plan import Violation
from verl_operator.planner import arith, rules, rules_critic, rules_rollout
from verl_operator.planner.inputs import Problem, Settings
from verl_operator.planner.mesh import Mesh

problem = make_problem
settings = make_settings


def apply(rule: rules.Rule, p: Problem, s: Settings) -> list[Violation]:
    """``rule`` on the candidate's mesh, built once as the search builds it."""
    return rule(p, Mesh.of(p, s))


CASES = [
    # (rule, problem overrides, settings overrides, expected rule id or None)
    pytest.param(rules.batch_divisible_by_world, {}, {}, None, id="batch-world-ok"),
    pytest.param(
        rules.batch_divisible_by_world,
        {},
        {"world": 6, "train_batch_size": 64, "rollout_n": 1},
        "batch-divisible-by-world",
        id="batch-world-64x1-on-6",
    ),
    pytest.param(
        rules.batch_divisible_by_world,
        {"version": "0.6"},
        {"world": 6, "train_batch_size": 64, "rollout_n": 1, "dynamic_batch_size": True},
        "batch-divisible-by-dp",
        id="batch-dp-0.6-dynamic",
    ),
    pytest.param(
        rules.batch_divisible_by_world,
        {"version": "0.6"},
        {"world": 8, "train_batch_size": 4, "rollout_n": 1, "rollout_tp": 2, "dynamic_batch_size": True},
        "batch-divisible-by-dp",
        id="batch-0.6-dynamic-4-over-8-dp",
    ),
    pytest.param(
        rules.batch_divisible_by_world,
        {"version": "0.6"},
        {
            "world": 8,
            "train_batch_size": 4,
            "rollout_n": 1,
            "rollout_tp": 2,
            "sequence_parallel_size": 2,
            "dynamic_batch_size": True,
        },
        None,
        id="batch-0.6-dynamic-4-over-sp2-tp2",
    ),
    pytest.param(
        rules.batch_divisible_by_world,
        {},
        {"world": 6, "train_batch_size": 64, "rollout_n": 1, "dynamic_batch_size": True},
        None,
        id="batch-0.9-dynamic-pads",
    ),
    pytest.param(rules.mini_batch_le_train_batch, {}, {}, None, id="mini-le-train-ok"),
    pytest.param(
        rules.mini_batch_le_train_batch,
        {},
        {"ppo_mini_batch_size": 2048},
        "mini-batch-le-train-batch",
        id="mini-gt-train",
    ),
    pytest.param(rules.sp_divides_world, {}, {"sequence_parallel_size": 4}, None, id="sp-world-ok"),
    pytest.param(
        rules.sp_divides_world,
        {},
        {"world": 6, "sequence_parallel_size": 4},
        "sp-divides-world",
        id="sp-4-on-6",
    ),
    pytest.param(rules.sp_heads, {}, {"sequence_parallel_size": 2}, None, id="sp-heads-ok"),
    pytest.param(rules.sp_heads, {}, {"sequence_parallel_size": 8}, "sp-heads", id="sp-8-vs-28-heads"),
    pytest.param(rules.fsdp_size_valid, {}, {"fsdp_size": 4}, None, id="fsdp-4-of-8"),
    pytest.param(rules.fsdp_size_valid, {}, {"fsdp_size": 3}, "fsdp-size", id="fsdp-3-of-8"),
    pytest.param(rules_rollout.rollout_tp_divides_world, {}, {"rollout_tp": 4}, None, id="tp-world-ok"),
    pytest.param(
        rules_rollout.rollout_tp_divides_world,
        {},
        {"world": 6, "rollout_tp": 4},
        "rollout-tp-divides-world",
        id="tp-4-on-6",
    ),
    pytest.param(rules_rollout.rollout_tp_heads, {}, {"rollout_tp": 4}, None, id="tp-heads-ok"),
    pytest.param(
        rules_rollout.rollout_tp_heads, {}, {"rollout_tp": 8}, "rollout-tp-heads", id="tp-8-vs-28-heads"
    ),
    pytest.param(
        rules_rollout.rollout_replica_node,
        {},
        {"world": 16, "nnodes": 2, "rollout_tp": 16},
        None,
        id="replica-2-nodes",
    ),
    pytest.param(
        rules_rollout.rollout_replica_node,
        {},
        {"world": 12, "nnodes": 2, "gpus_per_node": 6, "rollout_tp": 4},
        "rollout-replica-node",
        id="replica-straddles",
    ),
    pytest.param(
        rules_rollout.batched_tokens_cover_model_len,
        {"version": "0.6", "max_num_batched_tokens": 8192},
        {},
        None,
        id="batched-tokens-ok",
    ),
    pytest.param(rules_rollout.max_model_len_covers_prompt, {}, {}, None, id="model-len-unpinned"),
    pytest.param(
        rules_rollout.max_model_len_covers_prompt,
        {"max_prompt_length": 1024, "max_model_len": 1024},
        {},
        None,
        id="model-len-holds-the-prompt",
    ),
    pytest.param(
        rules_rollout.max_model_len_covers_prompt,
        {"max_prompt_length": 1024, "max_model_len": 1023},
        {},
        "max-model-len",
        id="model-len-below-the-prompt",
    ),
    pytest.param(rules_rollout.rollout_response_length, {}, {}, None, id="response-length-unpinned"),
    pytest.param(
        rules_rollout.rollout_response_length,
        {"max_response_length": 1024},
        {"rollout_response_length": 1024},
        None,
        id="response-length-as-data",
    ),
    pytest.param(
        rules_rollout.rollout_response_length,
        {"max_response_length": 1024},
        {"rollout_response_length": 512},
        None,
        id="response-length-shorter",
    ),
    pytest.param(
        rules_rollout.rollout_response_length,
        {"max_response_length": 1024},
        {"rollout_response_length": 1025},
        "rollout-response-length",
        id="response-length-longer",
    ),
    pytest.param(rules_rollout.rollout_prompt_length, {}, {}, None, id="prompt-length-unpinned"),
    pytest.param(
        rules_rollout.rollout_prompt_length,
        {"max_prompt_length": 1024},
        {"rollout_prompt_length": 1024},
        None,
        id="prompt-length-as-data",
    ),
    pytest.param(
        rules_rollout.rollout_prompt_length,
        {"max_prompt_length": 1024},
        {"rollout_prompt_length": 512},
        None,
        id="prompt-length-shorter",
    ),
    pytest.param(
        rules_rollout.rollout_prompt_length,
        {"max_prompt_length": 1024},
        {"rollout_prompt_length": 1025},
        "rollout-prompt-length",
        id="prompt-length-longer",
    ),
    pytest.param(
        rules_rollout.batched_tokens_cover_model_len,
        {"version": "0.6", "max_num_batched_tokens": 8192, "max_response_length": 16384},
        {},
        "batched-tokens-model-len",
        id="batched-tokens-below-model-len-0.6",
    ),
    pytest.param(
        rules_rollout.batched_tokens_cover_model_len,
        {"version": "0.9", "max_num_batched_tokens": 8192, "max_response_length": 16384},
        {},
        None,
        id="batched-tokens-0.9-chunks",
    ),
    pytest.param(
        rules_rollout.rollout_expert_parallel, {"rollout_ep": 4}, {"rollout_tp": 4}, None, id="ep-equals-tp"
    ),
    pytest.param(
        rules_rollout.rollout_expert_parallel,
        {"rollout_ep": 8},
        {"rollout_tp": 4},
        "rollout-expert-parallel",
        id="ep-not-tp",
    ),
    pytest.param(
        rules_rollout.nvlink_groups,
        {"nvlink_required": True, "nvlink_domain": 8},
        {"rollout_tp": 4},
        None,
        id="nvlink-ok",
    ),
    pytest.param(
        rules_rollout.nvlink_groups,
        {"nvlink_required": True, "nvlink_domain": 1},
        {"rollout_tp": 2},
        "nvlink-domain",
        id="nvlink-pcie",
    ),
    pytest.param(
        rules_rollout.nvlink_groups, {"nvlink_domain": 1}, {"rollout_tp": 2}, None, id="nvlink-preferred"
    ),
    pytest.param(rules_rollout.max_model_len, {}, {}, None, id="max-len-ok"),
    pytest.param(
        rules_rollout.max_model_len, {"max_response_length": 40000}, {}, "max-model-len", id="max-len-over"
    ),
    pytest.param(
        rules_rollout.max_model_len,
        {"max_response_length": 40000, "max_position_embeddings": 65536},
        {},
        None,
        id="max-len-override-config",
    ),
    pytest.param(rules.mini_batch_per_gpu, {}, {}, None, id="mini-per-gpu-ok"),
    pytest.param(
        rules.mini_batch_per_gpu,
        {},
        {"world": 6, "train_batch_size": 60, "ppo_mini_batch_size": 10, "rollout_n": 1},
        "mini-batch-per-gpu",
        id="mini-10-on-6",
    ),
    pytest.param(rules.micro_divides_mini, {}, {}, None, id="micro-ok"),
    pytest.param(
        rules.micro_divides_mini,
        {},
        {"ppo_micro_batch_size_per_gpu": 48},
        "micro-divides-mini",
        id="micro-48-of-160",
    ),
    pytest.param(
        rules.micro_divides_mini,
        {},
        {"ppo_micro_batch_size_per_gpu": None},
        "micro-batch-required",
        id="micro-missing",
    ),
    pytest.param(rules.log_prob_micro_divides, {}, {}, None, id="lp-micro-ok"),
    pytest.param(
        rules.log_prob_micro_divides,
        {},
        {"log_prob_micro_batch_size_per_gpu": 48},
        "log-prob-micro-divides",
        id="lp-micro-48-of-640",
    ),
    pytest.param(
        rules.log_prob_micro_divides,
        {"version": "0.6"},
        {"log_prob_micro_batch_size_per_gpu": 48},
        None,
        id="lp-micro-0.6-splits-unevenly",
    ),
    pytest.param(rules_critic.critic_mesh, {"needs_critic": True}, {}, None, id="critic-mesh-ok"),
    pytest.param(
        rules_critic.critic_mesh,
        {"needs_critic": True, "critic_sequence_parallel_size": 3},
        {},
        "critic-sp",
        id="critic-sp-3-on-8",
    ),
    pytest.param(
        rules_critic.critic_mesh,
        {"needs_critic": True},
        {"world": 6, "train_batch_size": 60, "ppo_mini_batch_size": 10, "rollout_n": 1},
        "mini-batch-per-gpu",
        id="critic-mini-10-on-6",
    ),
    pytest.param(
        rules_critic.critic_micro_divides_mini,
        {"needs_critic": True},
        # actor per-GPU mini 1280 / 4 = 320 takes 64; the critic's 1280 / 8 = 160 does not
        {"sequence_parallel_size": 2, "critic_ppo_micro_batch_size_per_gpu": 64},
        "micro-divides-mini",
        id="critic-micro-uses-its-own-dp",
    ),
    pytest.param(
        rules_critic.critic_micro_divides_mini,
        {"needs_critic": True},
        {"critic_ppo_micro_batch_size_per_gpu": 32},
        None,
        id="critic-micro-ok",
    ),
    pytest.param(
        rules_critic.critic_micro_divides_mini,
        {"needs_critic": True},
        {"critic_ppo_micro_batch_size_per_gpu": 48},
        "micro-divides-mini",
        id="critic-micro-48",
    ),
    pytest.param(
        rules.dynamic_token_budget,
        {},
        {"dynamic_batch_size": True, "max_token_len_per_gpu": 3072},
        None,
        id="token-budget-ok",
    ),
    pytest.param(
        rules.dynamic_token_budget,
        {},
        {"dynamic_batch_size": True, "max_token_len_per_gpu": 1024},
        "dynamic-token-budget",
        id="token-budget-below-one-sequence",
    ),
    pytest.param(
        rules.dynamic_token_budget,
        {},
        {"dynamic_batch_size": True, "max_token_len_per_gpu": 1024, "sequence_parallel_size": 2},
        None,
        id="token-budget-times-sp",
    ),
    pytest.param(
        rules.sp_remove_padding,
        {"use_remove_padding": None},
        {"sequence_parallel_size": 2},
        None,
        id="sp-padding-ok",
    ),
    pytest.param(
        rules.sp_remove_padding,
        {"use_remove_padding": False},
        {"sequence_parallel_size": 2},
        "sp-remove-padding",
        id="sp-without-remove-padding",
    ),
]


@pytest.mark.parametrize(("rule", "pkw", "skw", "expected"), CASES)
def test_rule(rule: rules.Rule, pkw: dict[str, Any], skw: dict[str, Any], expected: str | None) -> None:
    violations = apply(rule, problem(**pkw), settings(**skw))
    if expected is None:
        assert violations == []
    else:
        assert violations, "expected a violation"
        assert {v.rule for v in violations} == {expected}
        assert all(v.field and v.message for v in violations)


def test_every_rule_has_a_table_case() -> None:
    covered = {c.values[0] for c in [*CASES, *ENGINE_CASES, *MEGATRON_CASES]}
    assert set(rules.RULES) <= covered


def test_a_longer_rollout_response_length_shows_both_sequence_lengths() -> None:
    p = problem(max_prompt_length=512, max_response_length=1024)
    [v] = apply(rules_rollout.rollout_response_length, p, settings(rollout_response_length=4096))
    assert v.message == (
        "rollout response_length 4096 exceeds maxResponseLength 1024: the rollout generates 512 + 4096 = 4608 "
        "tokens per sequence, the plan sizes 512 + 1024 = 1536"
    )
    assert v.suggestions == [
        "set spec.data.maxResponseLength to 4096 and drop the override",
        "or use response_length 1024 or less",
    ]


def test_issue_example_message() -> None:
    [v] = apply(
        rules.batch_divisible_by_world, problem(), settings(world=6, train_batch_size=64, rollout_n=1)
    )
    assert v.field == "spec.data.trainBatchSize"
    assert v.message == "64 x 1 = 64 trajectories per step is not divisible by 6 GPUs"
    assert v.suggestions == ["use trainBatchSize 60 or 66"]


def test_micro_suggestions_are_divisors() -> None:
    [v] = apply(rules.micro_divides_mini, problem(), settings(ppo_micro_batch_size_per_gpu=48))
    # per-GPU mini = 256 x 5 / 8 = 160; the divisors of 160 nearest 48 are 40 and 80
    assert "160" in v.message
    assert v.suggestions == ["use ppoMicroBatchSizePerGpu 40 or 80"]


@pytest.mark.parametrize(
    ("value", "ok", "expected"),
    [
        pytest.param(64, lambda t: t % 6 == 0, [60, 66], id="both-sides"),
        pytest.param(2, lambda t: t % 5 == 0, [5], id="only-above"),
    ],
)
def test_nearest(value: int, ok: Any, expected: list[int]) -> None:
    assert arith.nearest(value, ok) == expected


def test_nvlink_suggestion_is_the_largest_group_that_fits() -> None:
    [v] = apply(
        rules_rollout.nvlink_groups, problem(nvlink_required=True, nvlink_domain=4), settings(rollout_tp=8)
    )
    assert v.suggestions[0] == "use rollout tensorParallelSize 4"
    assert "NVLink domain of 4 GPUs" in v.message


def test_a_token_budget_too_small_is_said_once_with_a_spec_field() -> None:
    """An unpinned log-prob budget follows the actor's: one violation, named by the spec's field, and the
    suggestion in the same words (not the planner's internal input names)."""
    from conftest import make_nodes, make_spec

    from verl_operator.planner import plan_job

    spec = make_spec(
        gpus=1,
        model="Qwen/Qwen2.5-0.5B-Instruct",
        batching={"dynamicBatchSize": True, "maxTokenLenPerGpu": 1},
    )
    result = plan_job(spec, make_nodes(1))
    budget = [v for v in result.violations if v.rule == "dynamic-token-budget"]
    assert [v.field for v in budget] == ["spec.batching.maxTokenLenPerGpu"]
    assert budget[0].suggestions[0].startswith("use maxTokenLenPerGpu >= ")
