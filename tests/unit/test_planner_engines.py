"""The rollout engines (vLLM, SGLang, TensorRT-LLM) and the multi-turn agent loop: each engine rule with a
passing and a failing row, the engine x mode x release table verl registers, and the emitted override list."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import make_nodes, make_problem, make_settings, make_spec

from verl_operator.api.spec import VerlJobSpec
from verl_operator.commands.plan import load_nodes
from verl_operator.planner import plan_job, rules, rules_engines, rules_rollout
from verl_operator.planner.mesh import Mesh

ROOT = Path(__file__).parents[2]
ARR = "actor_rollout_ref"

#: (rule, problem overrides, settings overrides, expected rule id or None); test_planner_rules counts these.
ENGINE_CASES = [
    pytest.param(
        rules_engines.trtllm_moe_split,
        {"rollout_name": "trtllm", "rollout_ep": 2, "rollout_moe_tp": 2},
        {"rollout_tp": 4},
        None,
        id="trtllm-moe-2x2-tp4",
    ),
    pytest.param(
        rules_engines.trtllm_moe_split,
        {"rollout_name": "trtllm", "rollout_ep": 2, "rollout_moe_tp": 2},
        {"rollout_tp": 2},
        "rollout-moe-tp",
        id="trtllm-moe-2x2-tp2",
    ),
    pytest.param(
        rules_engines.trtllm_moe_split,
        {"rollout_name": "trtllm", "rollout_ep": 4},
        {"rollout_tp": 2},
        None,
        id="trtllm-ep-alone-derives-moe-tp",
    ),
    pytest.param(
        rules_engines.sglang_spmd_model_len,
        {"version": "0.6", "rollout_name": "sglang", "rollout_mode": "sync", "max_model_len": 1536},
        {},
        None,
        id="sglang-spmd-len-equal",
    ),
    pytest.param(
        rules_engines.sglang_spmd_model_len,
        {"version": "0.6", "rollout_name": "sglang", "rollout_mode": "sync", "max_model_len": 1024},
        {},
        "max-model-len",
        id="sglang-spmd-len-below-seq",
    ),
    pytest.param(
        rules_engines.sglang_spmd_model_len,
        {"version": "0.6", "rollout_name": "vllm", "rollout_mode": "sync", "max_model_len": 1024},
        {},
        None,
        id="vllm-spmd-len-below-seq-not-checked",
    ),
    # The vLLM rules that change with the engine.
    pytest.param(
        rules_rollout.rollout_expert_parallel,
        {"rollout_name": "trtllm", "rollout_ep": 4},
        {"rollout_tp": 2},
        None,
        id="ep-rule-exempts-trtllm",
    ),
    pytest.param(
        rules_rollout.rollout_expert_parallel,
        {"rollout_name": "sglang", "rollout_ep": 4},
        {"rollout_tp": 2},
        "rollout-expert-parallel",
        id="ep-rule-holds-for-sglang",
    ),
    pytest.param(
        rules_rollout.rollout_expert_parallel,
        {"rollout_name": "sglang", "rollout_ep": 4, "rollout_dp": 2},
        {"rollout_tp": 2},
        None,
        id="ep-equals-tp-x-dp",
    ),
    # Data parallelism inside a replica (rollout.data_parallel_size).
    pytest.param(
        rules_engines.rollout_data_parallel,
        {"rollout_name": "sglang", "rollout_dp": 2},
        {"rollout_tp": 2},
        None,
        id="sglang-dp2-tp2-8gpus",
    ),
    pytest.param(
        rules_engines.rollout_data_parallel,
        {"rollout_name": "sglang", "rollout_dp": 3},
        {"rollout_tp": 2},
        "rollout-data-parallel",
        id="sglang-dp3-tp2-does-not-divide-8",
    ),
    pytest.param(
        rules_engines.rollout_data_parallel,
        {"rollout_name": "vllm", "rollout_dp": 4},
        {"rollout_tp": 2},
        None,
        id="vllm-dp4-tp2-one-node",
    ),
    pytest.param(
        rules_engines.rollout_data_parallel,
        {"rollout_name": "vllm", "rollout_dp": 2},
        {"rollout_tp": 2},
        "rollout-data-parallel",
        id="vllm-dp-replica-below-a-node",
    ),
    pytest.param(
        rules_engines.rollout_data_parallel,
        {"rollout_name": "trtllm", "rollout_dp": 2},
        {"rollout_tp": 2},
        "rollout-data-parallel",
        id="trtllm-takes-no-dp",
    ),
    pytest.param(
        rules_engines.rollout_data_parallel,
        {"version": "0.6", "rollout_name": "sglang", "rollout_mode": "sync", "rollout_dp": 2},
        {"rollout_tp": 2},
        "rollout-data-parallel",
        id="sglang-0.6-spmd-takes-no-dp",
    ),
    pytest.param(
        rules_engines.rollout_data_parallel,
        {"version": "0.6", "rollout_name": "sglang", "rollout_mode": "async", "rollout_dp": 2},
        {"rollout_tp": 2},
        None,
        id="sglang-0.6-server-dp2",
    ),
    pytest.param(
        rules_rollout.batched_tokens_cover_model_len,
        {
            "version": "0.6",
            "rollout_name": "sglang",
            "max_num_batched_tokens": 8192,
            "max_response_length": 16384,
        },
        {},
        None,
        id="batched-tokens-not-sglang",
    ),
    pytest.param(
        rules_rollout.max_model_len,
        {"version": "0.6", "rollout_name": "sglang", "max_model_len": 40000},
        {},
        None,
        id="max-len-sglang-0.6-compares-prompt-plus-response",
    ),
    pytest.param(
        rules_rollout.max_model_len,
        {"version": "0.9", "rollout_name": "sglang", "max_model_len": 40000},
        {},
        "max-model-len",
        id="max-len-sglang-0.9-pinned-over-positions",
    ),
]


@pytest.mark.parametrize(("rule", "pkw", "skw", "expected"), ENGINE_CASES)
def test_engine_rule(
    rule: rules.Rule, pkw: dict[str, Any], skw: dict[str, Any], expected: str | None
) -> None:
    p, s = make_problem(**pkw), make_settings(**skw)
    violations = rule(p, Mesh.of(p, s))
    if expected is None:
        assert violations == []
    else:
        assert {v.rule for v in violations} == {expected}
        assert all(v.field and v.message and v.suggestions for v in violations)


def test_engine_rules_are_checked() -> None:
    assert {
        rules_engines.trtllm_moe_split,
        rules_engines.sglang_spmd_model_len,
        rules_engines.rollout_data_parallel,
    } <= set(rules.RULES)


def test_rollout_dp_message_shows_the_arithmetic_and_the_sizes_that_fit() -> None:
    p = make_problem(rollout_name="sglang", rollout_dp=3)
    [v] = rules_engines.rollout_data_parallel(p, Mesh.of(p, make_settings(rollout_tp=2)))
    assert v.message == (
        "8 GPUs are not divisible by the replica's tensorParallelSize 2 x 3 = 6; a replica of 2 x 3 = 6 GPUs "
        "would straddle nodes of 8 GPUs"
    )
    assert v.suggestions == ["use data_parallel_size 2 or 4"]


def test_rollout_dp_plans_fewer_replicas() -> None:
    result = _plan(
        "0.9", {"name": "sglang", "tensorParallelSize": 2}, [f"{ARR}.rollout.data_parallel_size=2"]
    )
    assert result.feasible, [v.one_line() for v in result.violations]
    assert result.plan.rollout.replicas == 2  # 8 GPUs / (TP 2 x DP 2)
    assert f"{ARR}.rollout.data_parallel_size=2" in result.plan.overrides


@pytest.mark.parametrize(
    ("override", "refused"),
    [
        pytest.param(f"++{ARR}.rollout.sglang_rollout_mode=server", True, id="rollout-field-verl-lacks"),
        pytest.param(f"+{ARR}.rollout.server.timeout=60", False, id="server-is-a-RolloutConfig-field"),
        pytest.param(f"++{ARR}.rollout.engine_kwargs.sglang.foo=1", False, id="open-mapping"),
        pytest.param(f"++{ARR}.model.foo_bar=1", True, id="model-field-verl-lacks"),
        pytest.param(f"{ARR}.rollout.multi_turn.max_user_turns=2", False, id="a-key-of-the-config"),
    ],
)
def test_added_fields_of_verls_dataclasses(override: str, refused: bool) -> None:
    result = _plan("0.9", {"name": "sglang"}, [override])
    rules_hit = {v.rule for v in result.violations}
    assert ("override-dataclass-field" in rules_hit) == refused, [v.one_line() for v in result.violations]
    if refused:
        [v] = [v for v in result.violations if v.rule == "override-dataclass-field"]
        assert v.field.startswith("spec.overrides[0]") and "constructor refuses it" in v.message


def test_moe_split_message_shows_the_arithmetic() -> None:
    p = make_problem(rollout_name="trtllm", rollout_ep=2, rollout_moe_tp=2)
    [v] = rules_engines.trtllm_moe_split(p, Mesh.of(p, make_settings(rollout_tp=2)))
    assert (
        v.message == "moe_tensor_parallel_size 2 x expert_parallel_size 2 = 4 != rollout tensorParallelSize 2"
    )
    assert v.suggestions == ["use tensorParallelSize 4", "or moe_tensor_parallel_size 1"]


def _plan(version: str, rollout: dict[str, Any], overrides: list[str] = ()) -> Any:  # type: ignore[assignment]
    spec = make_spec(8, verl={"image": "example.com/verl:x", "version": version}, rollout=rollout)
    spec = spec.model_copy(update={"overrides": list(overrides)})
    return plan_job(VerlJobSpec.model_validate(spec.model_dump(by_alias=True)), make_nodes(1))


def _rules(result: Any) -> set[str]:
    return {v.rule for v in result.violations}


# (release, spec.rollout, overrides, expected violation rule or None): verl's registry
# (0.6.1 workers/rollout/base.py:81-86, 0.9.1 base.py:89-93) and the engine keys' rules.
ENGINE_MODE_CASES = [
    pytest.param("0.6", {"name": "sglang"}, [], None, id="0.6-sglang-spmd"),
    pytest.param("0.6", {"name": "sglang", "mode": "server"}, [], None, id="0.6-sglang-server"),
    pytest.param("0.6", {}, [f"{ARR}.rollout.name=sglang"], None, id="0.6-sglang-by-override"),
    pytest.param("0.6", {"name": "trtllm"}, [], "rollout-engine-mode", id="0.6-trtllm-refused"),
    pytest.param(
        "0.6",
        {"mode": "server"},
        [f"{ARR}.rollout.name=trtllm"],
        "rollout-engine-mode",
        id="0.6-trtllm-async",
    ),
    pytest.param("0.9", {"name": "sglang"}, [], None, id="0.9-sglang"),
    pytest.param("0.9", {"name": "trtllm"}, [], None, id="0.9-trtllm"),
    pytest.param("0.9", {"name": "trtllm", "mode": "spmd"}, [], "rollout-mode", id="0.9-trtllm-sync"),
    pytest.param("0.9", {}, [f"{ARR}.rollout.name=hf"], "rollout-name", id="0.9-hf"),
    pytest.param(
        "0.9", {"name": "sglang"}, [f"{ARR}.rollout.name=vllm"], "override-conflict", id="spec-vs-override"
    ),
    pytest.param(
        "0.9",
        {"name": "vllm"},
        [f"+{ARR}.rollout.moe_tensor_parallel_size=2"],
        "rollout-moe-tp",
        id="0.9-moe-tp-not-trtllm",
    ),
    pytest.param(
        "0.9",
        {"name": "trtllm"},
        [f"{ARR}.rollout.disaggregation.enabled=True"],
        "rollout-disaggregation",
        id="0.9-disaggregation-trtllm",
    ),
    pytest.param(
        "0.9",
        {"name": "sglang"},
        [f"{ARR}.rollout.multi_turn.enable=True", f"{ARR}.rollout.multi_turn.tool_config_path=[a, b]"],
        "override-type",
        id="0.9-tool-config-list",
    ),
    pytest.param(
        "0.9",
        {"name": "sglang"},
        [
            f"{ARR}.rollout.multi_turn.enable=True",
            f"{ARR}.rollout.multi_turn.max_assistant_turns=5",
            f"{ARR}.rollout.multi_turn.tool_config_path=/tools.yaml",
            f"{ARR}.rollout.agent.default_agent_loop=tool_agent",
        ],
        None,
        id="0.9-sglang-multi-turn",
    ),
]


@pytest.mark.parametrize(("version", "rollout", "overrides", "expected"), ENGINE_MODE_CASES)
def test_engine_and_mode(
    version: str, rollout: dict[str, Any], overrides: list[str], expected: str | None
) -> None:
    result = _plan(version, rollout, overrides)
    if expected is None:
        assert result.violations == [], [v.one_line() for v in result.violations]
        name = rollout.get("name") or next(
            (o.split("=", 1)[1] for o in overrides if o.startswith(f"{ARR}.rollout.name=")), "vllm"
        )
        assert result.plan.rollout.name == name
        emitted = [o for o in result.plan.overrides if o.startswith(f"{ARR}.rollout.name=")]
        assert emitted == [f"{ARR}.rollout.name={name}"]
        # The user's multi-turn and agent-loop keys pass through verbatim, after the planner's.
        for item in overrides:
            if "multi_turn" in item or ".agent." in item:
                assert item in result.plan.overrides
    else:
        assert expected in _rules(result), [v.one_line() for v in result.violations]


def test_trtllm_on_0_6_names_the_field_and_the_fix() -> None:
    [v] = _plan("0.6", {"name": "trtllm"}).violations
    assert v.field == "spec.rollout.name"
    assert "verl 0.6 has no TensorRT-LLM rollout" in v.message
    assert "workers/rollout/base.py:81-86" in v.message
    assert v.suggestions == ["use rollout name sglang or vllm", "or set spec.verl.version: '0.9'"]


def test_multi_turn_with_0_6_spmd_vllm_warns() -> None:
    result = _plan("0.6", {}, [f"{ARR}.rollout.multi_turn.enable=True"])
    assert result.violations == []
    assert any("multi_turn.enable=True" in w for w in result.warnings)
    raw = [f"{ARR}.rollout.multi_turn.enable=True", "data.return_raw_chat=True"]
    assert all("multi_turn" not in w for w in _plan("0.6", {"name": "sglang"}, raw).warnings)


def test_multi_turn_sglang_spmd_without_raw_chat_warns() -> None:
    result = _plan("0.6", {"name": "sglang"}, [f"{ARR}.rollout.multi_turn.enable=True"])
    assert result.violations == []
    assert any("data.return_raw_chat=True" in w and "line 1432" in w for w in result.warnings)


@pytest.mark.parametrize(
    ("version", "fmt", "warns"),
    [
        pytest.param("0.9", "hermes", False, id="hermes"),
        pytest.param("0.9", "kimi", False, id="kimi-0.9"),
        pytest.param("0.6", "kimi", True, id="kimi-not-in-0.6"),
        pytest.param("0.9", "qwen", True, id="qwen-no-parser"),
    ],
)
def test_multi_turn_format_is_a_tool_parser_of_the_release(version: str, fmt: str, warns: bool) -> None:
    overrides = [f"{ARR}.rollout.multi_turn.enable=True", f"{ARR}.rollout.multi_turn.format={fmt}"]
    result = _plan(
        version, {"name": "sglang", "mode": "server"} if version == "0.6" else {"name": "sglang"}, overrides
    )
    assert any(f"format={fmt} is not a tool parser" in w for w in result.warnings) == warns, result.warnings


@pytest.mark.parametrize(
    "override",
    [
        f"{ARR}.rollout.multi_turn.max_user_turns=2",
        f"{ARR}.rollout.agent.num_workers=4",
        f"{ARR}.rollout.agent.agent_loop_config_path=/etc/loops.yaml",
        f"{ARR}.rollout.agent.default_agent_loop=tool_agent",
        f"{ARR}.rollout.multi_turn.format=hermes",
    ],
)
def test_multi_turn_and_agent_loop_keys_pass_through(override: str) -> None:
    result = _plan("0.9", {"name": "sglang"}, [override])
    assert result.feasible and override in result.plan.overrides


@pytest.mark.parametrize(
    ("overrides", "warns"),
    [
        pytest.param([f"{ARR}.rollout.agent.default_agent_loop=tool_agent"], False, id="registered"),
        pytest.param([f"{ARR}.rollout.agent.default_agent_loop=my_loop"], True, id="unknown"),
        pytest.param(
            [
                f"{ARR}.rollout.agent.default_agent_loop=my_loop",
                f"{ARR}.rollout.agent.agent_loop_config_path=/l.yaml",
            ],
            False,
            id="named-by-a-config-file",
        ),
    ],
)
def test_default_agent_loop_is_one_verl_can_find(overrides: list[str], warns: bool) -> None:
    result = _plan("0.9", {"name": "sglang"}, overrides)
    assert result.feasible
    assert any("default_agent_loop=my_loop is not an agent loop" in w for w in result.warnings) == warns


def test_multi_turn_keys_are_type_checked() -> None:
    result = _plan("0.9", {"name": "sglang"}, [f"{ARR}.rollout.multi_turn.max_user_turns=many"])
    assert any("max_user_turns" in v.field for v in result.violations)


@pytest.mark.parametrize(
    ("job", "cluster", "engine"),
    [
        ("sglang-multiturn-dgx.yaml", "dgx-h100.yaml", "sglang"),
        ("trtllm-grpo-dgx.yaml", "dgx-h100.yaml", "trtllm"),
    ],
)
def test_engine_example_jobs_plan_on_the_shipped_profile(job: str, cluster: str, engine: str) -> None:
    doc = yaml.safe_load((ROOT / "examples" / "jobs" / job).read_text())
    result = plan_job(
        VerlJobSpec.model_validate(doc["spec"]), load_nodes(ROOT / "examples" / "clusters" / cluster)
    )
    assert result.violations == [], [v.one_line() for v in result.violations]
    assert result.plan.rollout.name == engine
    assert f"{ARR}.rollout.name={engine}" in result.plan.overrides
    assert f"{ARR}.rollout.mode=async" in result.plan.overrides


def _memory(engine: str, gmu: float) -> Any:
    from verl_operator.planner.search_memory import memory_inputs

    p = make_problem(rollout_name=engine, gpu_memory_bytes=80 * 1024**3)
    s = make_settings(gpu_memory_utilization=gmu)
    return memory_inputs(p, Mesh.of(p, s))


def test_trtllm_fraction_is_of_the_memory_free_after_the_weights() -> None:
    from verl_operator.planner import memory

    m = _memory("trtllm", 0.5)
    est = memory.estimate(m)
    free = m.gpu_memory_bytes - sum(memory.resident_state(m).values()) - memory.CUDA_RESERVE_BYTES
    free -= 2 * m.params / m.rollout_tp
    assert est.kv_cache_bytes == pytest.approx(0.5 * free)
    assert est.rollout.exact == {
        "trtllmWeights": 2 * m.params / m.rollout_tp,
        "trtllmKvCache": est.kv_cache_bytes,
    }
    # SGLang's mem_fraction_static is a fraction of the total, as vLLM's.
    assert memory.estimate(_memory("sglang", 0.5)).rollout.exact == {"vllmBudget": 0.5 * m.gpu_memory_bytes}


@pytest.mark.parametrize("engine", ["vllm", "sglang", "trtllm"])
def test_the_largest_fraction_fits_and_one_step_more_does_not(engine: str) -> None:
    from verl_operator.planner import memory

    gmu = memory.max_gpu_memory_utilization(_memory(engine, 0.5), cap=1.0)
    assert 0 < gmu < 1
    assert memory.estimate(_memory(engine, gmu)).rollout.peak_bytes <= 80 * 1024**3
    assert memory.estimate(_memory(engine, round(gmu + 0.05, 2))).rollout.peak_bytes > 80 * 1024**3
