"""What verl accepts from pasted launch scripts, the planner plans: repeated keys, 0.6 server rollout, the critic."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import make_nodes, make_spec

from verl_operator.planner import plan_job


def _override(overrides: list[str], key: str) -> list[str]:
    return [o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == key]


def test_a_repeated_key_is_a_warning_and_the_last_value_wins() -> None:
    spec = make_spec(
        overrides=[
            "data.truncation=error",
            "actor_rollout_ref.rollout.n=4",
            "data.truncation=left",
            "actor_rollout_ref.rollout.n=8",
        ]
    )
    result = plan_job(spec, make_nodes(1))
    assert result.feasible, result.violations
    assert result.plan is not None
    assert result.plan.batching.rollout_n == 8
    assert _override(result.plan.overrides, "data.truncation") == ["left"]
    assert _override(result.plan.overrides, "actor_rollout_ref.rollout.n") == ["8"]
    assert any(
        "spec.overrides[0] (data.truncation) is set again by spec.overrides[2]" in w for w in result.warnings
    )
    assert any("spec.overrides[1] (actor_rollout_ref.rollout.n)" in w for w in result.warnings)


@pytest.mark.parametrize(
    ("version", "pin", "mode"),
    [
        ("0.6", [], "sync"),
        ("0.6", ["actor_rollout_ref.rollout.mode=async"], "async"),
        ("0.6", ["actor_rollout_ref.rollout.mode=sync"], "sync"),
        ("0.9", [], "async"),
        ("0.9", ["actor_rollout_ref.rollout.mode=async"], "async"),
    ],
)
def test_rollout_mode_follows_the_pin(version: str, pin: list[str], mode: str) -> None:
    result = plan_job(make_spec(verl={"image": "verl:x", "version": version}, overrides=pin), make_nodes(1))
    assert result.feasible, result.violations
    assert result.plan is not None
    assert result.plan.rollout.mode == mode
    assert _override(result.plan.overrides, "actor_rollout_ref.rollout.mode") == [mode]


def test_spmd_only_rules_skip_the_0_6_server_rollout() -> None:
    # 0.6's SPMD rollout rejects max_num_batched_tokens < max_model_len with chunked prefill; its servers do not.
    base = ["actor_rollout_ref.rollout.max_num_batched_tokens=1024", "data.max_response_length=2048"]
    spmd = plan_job(make_spec(verl={"image": "verl:x", "version": "0.6"}, overrides=base), make_nodes(1))
    server = plan_job(
        make_spec(
            verl={"image": "verl:x", "version": "0.6"},
            overrides=[*base, "actor_rollout_ref.rollout.mode=async"],
        ),
        make_nodes(1),
    )
    assert [v.rule for v in spmd.violations] == ["batched-tokens-model-len"]
    assert server.feasible, server.violations


@pytest.mark.parametrize(
    ("spec_mode", "override", "rule"),
    [
        ("spmd", [], "rollout-mode"),
        (None, ["actor_rollout_ref.rollout.mode=sync"], "rollout-mode"),
    ],
)
def test_sync_is_refused_on_0_9(spec_mode: str | None, override: list[str], rule: str) -> None:
    rollout: dict[str, Any] = {"mode": spec_mode} if spec_mode else {}
    result = plan_job(make_spec(rollout=rollout, overrides=override), make_nodes(1))
    assert [v.rule for v in result.violations] == [rule]


def test_0_6_spec_mode_and_override_must_agree() -> None:
    spec = make_spec(
        verl={"image": "verl:x", "version": "0.6"},
        rollout={"mode": "spmd"},
        overrides=["actor_rollout_ref.rollout.mode=async"],
    )
    assert [v.rule for v in plan_job(spec, make_nodes(1)).violations] == ["override-conflict"]


@pytest.mark.parametrize("version", ["0.6", "0.9"])
def test_ppo_names_the_critic_model(version: str) -> None:
    spec = make_spec(algorithm="ppo", verl={"image": "verl:x", "version": version})
    result = plan_job(spec, make_nodes(1))
    assert result.plan is not None, result.violations
    assert _override(result.plan.overrides, "critic.model.path") == ["Qwen/Qwen2.5-7B-Instruct"]
    grpo = plan_job(make_spec(verl={"image": "verl:x", "version": version}), make_nodes(1))
    assert grpo.plan is not None
    assert _override(grpo.plan.overrides, "critic.model.path") == []


def test_another_critic_model_sizes_the_critic_memory() -> None:
    small = plan_job(
        make_spec(algorithm="ppo", critic={"model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"}}), make_nodes(1)
    )
    same = plan_job(make_spec(algorithm="ppo"), make_nodes(1))
    assert small.plan is not None and same.plan is not None, (small.violations, same.violations)
    assert _override(small.plan.overrides, "critic.model.path") == ["Qwen/Qwen2.5-0.5B-Instruct"]
    assert small.plan.memory.train.parts_gib["critic"] < same.plan.memory.train.parts_gib["critic"] / 5


def test_a_critic_outside_the_catalog_needs_its_shape() -> None:
    result = plan_job(
        make_spec(algorithm="ppo", critic={"model": {"path": "/models/my-critic"}}), make_nodes(1)
    )
    assert [(v.rule, v.field) for v in result.violations] == [
        ("model-shape-required", "spec.critic.model.shape")
    ]


def test_critic_override_and_field_must_agree() -> None:
    spec = make_spec(
        algorithm="ppo",
        critic={"model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"}},
        overrides=["critic.model.path=Qwen/Qwen2.5-3B-Instruct"],
    )
    assert [v.rule for v in plan_job(spec, make_nodes(1)).violations] == ["override-conflict"]


@pytest.mark.parametrize(
    ("version", "override", "rule"),
    [
        pytest.param(
            "0.9", "critic.model.fsdp_config.param_offload=False", "override-unknown-key", id="0.6-key-on-0.9"
        ),
        pytest.param("0.6", "reward_model.use_reward_loop=True", "override-unknown-key", id="new-key-on-0.6"),
        pytest.param("0.9", "trainer.no_such_key=1", "override-unknown-key", id="typo"),
        pytest.param("0.9", "~trainer.no_such_key", "override-unknown-key", id="delete-missing"),
        pytest.param("0.9", "+trainer.nnodes=1", "override-add-existing", id="add-existing"),
        pytest.param("0.9", "+trainer.my_new_key=1", None, id="add-new"),
        pytest.param("0.9", "++trainer.nnodes=1", None, id="add-or-replace"),
        pytest.param("0.9", "++trainer.my_new_key=1", None, id="add-or-replace-new"),
        pytest.param("0.9", "hydra.run.dir=/tmp/x", None, id="hydra-key"),
        pytest.param("0.6", "critic.model.fsdp_config.param_offload=False", None, id="0.6-key-on-0.6"),
    ],
)
def test_override_keys_are_checked_against_the_release_config(
    version: str, override: str, rule: str | None
) -> None:
    result = plan_job(
        make_spec(verl={"image": "verl:x", "version": version}, overrides=[override]), make_nodes(1)
    )
    assert [v.rule for v in result.violations] == ([rule] if rule else []), result.violations


def test_an_unknown_key_suggests_the_release_spelling() -> None:
    spec = make_spec(overrides=["critic.model.fsdp_config.param_offload=False"], algorithm="ppo")
    (violation,) = plan_job(spec, make_nodes(1)).violations
    assert violation.field == "spec.overrides[0] (critic.model.fsdp_config.param_offload)"
    assert "verl 0.9.1" in violation.message
    assert "critic.fsdp.param_offload" in violation.suggestions[0]


@pytest.mark.parametrize("version", ["0.6", "0.9"])
@pytest.mark.parametrize(
    "sections",
    [
        {"algorithm": "ppo"},
        {"parallelism": {"sequenceParallelSize": 2}, "batching": {"dynamicBatchSize": True}},
        {"algorithm": "ppo", "batching": {"dynamicBatchSize": True}},
    ],
)
def test_every_emitted_key_exists_in_the_release_config(version: str, sections: dict[str, Any]) -> None:
    from verl_operator.planner.verl_keys import known_keys

    result = plan_job(make_spec(verl={"image": "verl:x", "version": version}, **sections), make_nodes(1))
    assert result.plan is not None, result.violations
    keys = [o.split("=", 1)[0] for o in result.plan.overrides]
    assert [k for k in keys if k not in known_keys(version)] == []
