"""The Megatron training engine: its selection, its rules (a pass and a fail row each), the search's
TP/PP choice, the emitted keys of both dialects and the launcher's config name."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import make_nodes, make_problem, make_settings, make_spec

from verl_operator.api.plan import Violation
from verl_operator.api.spec import ModelShape
from verl_operator.manifests.launchspec import LaunchPlan, entrypoint
from verl_operator.planner import megatron, rules, rules_megatron
from verl_operator.planner.inputs import Problem, Settings
from verl_operator.planner.job import plan_job
from verl_operator.planner.megatron_options import MegatronOptions
from verl_operator.planner.mesh import Mesh

ARR = "actor_rollout_ref"
TP_KEY = f"{ARR}.actor.megatron.tensor_model_parallel_size"
PP_KEY = f"{ARR}.actor.megatron.pipeline_model_parallel_size"

#: A small MoE shape: 48 layers, 32 heads, 4 KV heads, 128 experts (Qwen3-30B-A3B's numbers).
MOE = ModelShape.model_validate(
    {
        "modelType": "qwen3_moe",
        "layers": 48,
        "hiddenSize": 2048,
        "attentionHeads": 32,
        "kvHeads": 4,
        "headDim": 128,
        "intermediateSize": 6144,
        "vocabSize": 151936,
        "maxPositionEmbeddings": 40960,
        "numExperts": 128,
        "numExpertsPerTok": 8,
        "moeIntermediateSize": 768,
    }
)


def problem(**kw: Any) -> Problem:
    return make_problem(training_engine="megatron", **kw)


def settings(**kw: Any) -> Settings:
    return make_settings(**kw)


def apply(rule: rules.Rule, p: Problem, s: Settings) -> list[Violation]:
    return rule(p, Mesh.of(p, s))


#: (rule, problem overrides, settings overrides, expected rule id or None). Qwen2.5-7B: 28 layers, 28 heads,
#: 4 KV heads; 8 GPUs, batch 1024 x 5, mini-batch 256, micro-batch 16.
MEGATRON_CASES = [
    pytest.param(
        rules_megatron.world_divisible, {}, {"megatron_tp": 4, "megatron_pp": 2}, None, id="world-ok"
    ),
    pytest.param(
        rules_megatron.world_divisible,
        {},
        {"megatron_tp": 2, "megatron_pp": 3},
        "megatron-world-divisible",
        id="world-8-over-tp2-pp3",
    ),
    pytest.param(
        rules_megatron.world_divisible,
        {},
        {"megatron_tp": 2, "megatron_cp": 3},
        "megatron-world-divisible",
        id="world-8-over-tp2-cp3",
    ),
    pytest.param(rules_megatron.heads_divisible, {}, {"megatron_tp": 4}, None, id="heads-tp4-ok"),
    pytest.param(
        rules_megatron.heads_divisible, {}, {"megatron_tp": 8}, "megatron-tp-heads", id="kv-heads-4-over-tp8"
    ),
    pytest.param(
        rules_megatron.heads_divisible,
        {},
        {"megatron_tp": 3, "world": 6},
        "megatron-tp-heads",
        id="heads-28-over-tp3",
    ),
    pytest.param(rules_megatron.layers_divisible, {}, {"megatron_pp": 4}, None, id="layers-pp4-ok"),
    pytest.param(
        rules_megatron.layers_divisible,
        {},
        {"megatron_pp": 8},
        "megatron-layers-divisible",
        id="layers-28-pp8",
    ),
    pytest.param(
        rules_megatron.layers_divisible,
        {},
        {"megatron_pp": 2, "megatron_vpp": 7},
        None,
        id="layers-pp2-vpp7-ok",
    ),
    pytest.param(
        rules_megatron.layers_divisible,
        {},
        {"megatron_pp": 2, "megatron_vpp": 4},
        "megatron-layers-divisible",
        id="layers-28-pp2-vpp4",
    ),
    pytest.param(
        rules_megatron.vpp_needs_pp, {}, {"megatron_pp": 2, "megatron_vpp": 2}, None, id="vpp-with-pp2-ok"
    ),
    pytest.param(
        rules_megatron.vpp_needs_pp,
        {},
        {"megatron_pp": 1, "megatron_vpp": 2},
        "megatron-vpp-needs-pp",
        id="vpp-with-pp1",
    ),
    pytest.param(
        rules_megatron.vpp_needs_pp,
        {},
        {"megatron_pp": 1, "megatron_vpp": 1},
        "megatron-vpp-needs-pp",
        id="vpp1-with-pp1",  # megatron-core refuses any virtual pipeline size with PP 1
    ),
    pytest.param(
        rules_megatron.expert_tp_sequence_parallel,
        {"shape": MOE, "megatron_sequence_parallel": False},
        {"megatron_ep": 2, "megatron_tp": 2},
        "megatron-ep-tp-sequence-parallel",
        id="ep2-tp2-without-sequence-parallel",
    ),
    pytest.param(
        rules_megatron.expert_tp_sequence_parallel,
        {"shape": MOE, "megatron_sequence_parallel": False},
        {"megatron_ep": 2, "megatron_tp": 1},
        None,
        id="ep2-tp1-without-sequence-parallel-ok",
    ),
    pytest.param(
        rules_megatron.expert_tp_sequence_parallel,
        {"shape": MOE},
        {"megatron_ep": 2, "megatron_tp": 2},
        None,
        id="ep2-tp2-sequence-parallel-default-ok",
    ),
    pytest.param(
        rules_megatron.experts_divisible, {"shape": MOE}, {"megatron_ep": 8}, None, id="experts-ep8-ok"
    ),
    pytest.param(
        rules_megatron.experts_divisible,
        {"shape": MOE},
        {"megatron_ep": 3, "world": 6},
        "megatron-experts-divisible",
        id="experts-128-over-ep3",
    ),
    pytest.param(
        rules_megatron.experts_divisible,
        {"shape": MOE},
        {"megatron_ep": 8, "megatron_tp": 2},
        "megatron-expert-mesh",
        id="ep8-etp2-over-8-ranks",
    ),
    pytest.param(
        rules_megatron.experts_divisible,
        {"shape": MOE},
        {"megatron_ep": 8, "megatron_tp": 2, "megatron_etp": 1},
        None,
        id="ep8-etp1-ok",
    ),
    pytest.param(
        rules_megatron.experts_divisible, {}, {"megatron_ep": 2}, "megatron-ep-needs-moe", id="ep-on-dense"
    ),
    pytest.param(
        rules_megatron.tp_nvlink, {"nvlink_required": True}, {"megatron_tp": 4}, None, id="tp-in-domain-ok"
    ),
    pytest.param(
        rules_megatron.ep_nvlink,
        {"shape": MOE, "nvlink_required": True},
        {"megatron_ep": 8, "world": 16, "nnodes": 2},
        None,
        id="ep8-in-domain-ok",
    ),
    pytest.param(
        rules_megatron.ep_nvlink,
        {"shape": MOE, "nvlink_required": True},
        {"megatron_ep": 16, "world": 16, "nnodes": 2},
        "megatron-ep-nvlink",
        id="ep16-over-8-gpu-nodes",
    ),
    pytest.param(
        rules_megatron.ep_nvlink,
        {"shape": MOE, "nvlink_required": False},
        {"megatron_ep": 16, "world": 16, "nnodes": 2},
        None,
        id="ep16-nvlink-preferred-ok",
    ),
    pytest.param(
        rules_megatron.tp_nvlink,
        {"nvlink_required": True, "nvlink_domain": 2},
        {"megatron_tp": 4},
        "megatron-tp-nvlink",
        id="tp4-over-domain-2",
    ),
    pytest.param(rules_megatron.minimal_batch, {}, {"megatron_tp": 2}, None, id="minimal-batch-ok"),
    pytest.param(
        rules_megatron.minimal_batch,
        {},
        # DP 8 / 2 = 4, micro 16: 4 x 16 = 64 does not divide 100 x 5 = 500
        {"megatron_tp": 2, "train_batch_size": 100, "ppo_mini_batch_size": 100},
        "megatron-minimal-batch",
        id="minimal-batch-500-over-64",
    ),
    pytest.param(
        rules_megatron.uniform_recompute_chunks,
        {
            "megatron_options": MegatronOptions(
                recompute_granularity="full", recompute_method="uniform", recompute_num_layers=7
            )
        },
        {"megatron_pp": 4},
        None,
        id="uniform-chunk-7-of-7-ok",
    ),
    pytest.param(
        rules_megatron.uniform_recompute_chunks,
        {
            "megatron_options": MegatronOptions(
                recompute_granularity="full", recompute_method="uniform", recompute_num_layers=2
            )
        },
        {"megatron_pp": 4},
        "megatron-recompute-chunks",
        id="uniform-chunks-of-2-past-7",
    ),
    pytest.param(
        rules_megatron.uniform_recompute_chunks,
        {
            "megatron_options": MegatronOptions(
                recompute_granularity="full", recompute_method="block", recompute_num_layers=2
            )
        },
        {"megatron_pp": 4},
        None,
        id="block-recompute-ok",
    ),
    pytest.param(rules_megatron.megatron_dtype, {"dtype": "bfloat16"}, {}, None, id="dtype-bf16-ok"),
    pytest.param(rules_megatron.megatron_dtype, {"dtype": "float16"}, {}, "megatron-dtype", id="dtype-fp16"),
    pytest.param(
        rules_megatron.dynamic_cp_vpp,
        {"megatron_options": MegatronOptions(dynamic_cp=True)},
        {"megatron_pp": 2},
        None,
        id="dynamic-cp-without-vpp-ok",
    ),
    pytest.param(
        rules_megatron.dynamic_cp_vpp,
        {"megatron_options": MegatronOptions(dynamic_cp=True)},
        {"megatron_pp": 2, "megatron_vpp": 2},
        "megatron-dynamic-cp",
        id="dynamic-cp-with-vpp",
    ),
    # The batch rules on Megatron's DP = world / (TP x PP x CP): 8 / (2 x 2) = 2 ranks.
    pytest.param(
        rules.mini_batch_per_gpu,
        {},
        {"megatron_tp": 2, "megatron_pp": 2, "ppo_mini_batch_size": 2, "rollout_n": 1, "train_batch_size": 8},
        None,
        id="mini-2-over-dp2-ok",
    ),
    pytest.param(
        rules.mini_batch_per_gpu,
        {},
        {"megatron_tp": 2, "megatron_pp": 2, "ppo_mini_batch_size": 3, "rollout_n": 1, "train_batch_size": 9},
        "mini-batch-per-gpu",
        id="mini-3-over-dp2",
    ),
    pytest.param(
        rules.micro_divides_mini,
        {},
        # per-GPU mini-batch 256 x 5 / 2 = 640; micro 48 does not divide it
        {"megatron_tp": 2, "megatron_pp": 2, "ppo_micro_batch_size_per_gpu": 48},
        "micro-divides-mini",
        id="micro-48-of-640",
    ),
    pytest.param(
        rules.micro_divides_mini,
        {},
        {"megatron_tp": 2, "megatron_pp": 2, "ppo_micro_batch_size_per_gpu": 64},
        None,
        id="micro-64-of-640-ok",
    ),
    pytest.param(
        rules.dynamic_token_budget,
        {},
        {"megatron_tp": 2, "dynamic_batch_size": True, "max_token_len_per_gpu": 1024},
        "dynamic-token-budget",
        id="budget-below-a-sequence",
    ),
    pytest.param(
        rules.dynamic_token_budget,
        {},
        {
            "megatron_tp": 2,
            "dynamic_batch_size": True,
            "max_token_len_per_gpu": 4096,
            "log_prob_max_token_len_per_gpu": 4096,
        },
        None,
        id="budget-ok",
    ),
]


@pytest.mark.parametrize(("rule", "pkw", "skw", "expected"), MEGATRON_CASES)
def test_rule(rule: rules.Rule, pkw: dict[str, Any], skw: dict[str, Any], expected: str | None) -> None:
    violations = apply(rule, problem(**pkw), settings(**skw))
    if expected is None:
        assert violations == []
    else:
        assert violations, "expected a violation"
        assert {v.rule for v in violations} == {expected}
        assert all(v.field and v.message and v.suggestions for v in violations)


def test_every_megatron_rule_has_a_table_case() -> None:
    assert set(rules_megatron.RULES) <= {c.values[0] for c in MEGATRON_CASES}
    assert set(rules_megatron.RULES) <= set(rules.RULES)


@pytest.mark.parametrize("rule", rules_megatron.RULES)
def test_megatron_rules_hold_for_an_fsdp_job(rule: rules.Rule) -> None:
    assert apply(rule, make_problem(), make_settings(megatron_tp=3, megatron_pp=5, megatron_ep=7)) == []


def test_world_message_shows_the_arithmetic_and_the_nearest_sizes() -> None:
    [v] = apply(rules_megatron.world_divisible, problem(), settings(megatron_tp=2, megatron_pp=3))
    assert v.field == "spec.parallelism.megatron.tensorParallelSize"
    assert v.message == ("8 GPUs do not divide into TP 2 x PP 3 x CP 1 = 6 model-parallel ranks (8 % 6 = 2)")
    assert v.suggestions == ["use PP 2 or 4"]  # no TP or CP makes 8 divide by TP x 3


def test_heads_message_names_both_counts() -> None:
    [v] = apply(rules_megatron.heads_divisible, problem(version="0.6"), settings(megatron_tp=8))
    assert v.message == (
        "the model's 28 attention heads do not divide by TP 8 (28 % 8 = 4); "
        "the model's 4 KV heads do not divide by TP 8 (4 % 8 = 4)"
    )
    assert v.suggestions == ["use TP 4"]


def test_layers_message_and_suggestions() -> None:
    [v] = apply(rules_megatron.layers_divisible, problem(), settings(megatron_pp=8))
    assert v.message == "the model's 28 layers do not divide into PP 8 = 8 stages (28 % 8 = 4)"
    assert v.suggestions == ["use PP 7 or 14"]


def test_megatron_data_parallel_size() -> None:
    mesh = Mesh.of(problem(), settings(world=16, megatron_tp=2, megatron_pp=2, megatron_cp=2))
    assert mesh.data_parallel_size == mesh.critic_data_parallel_size == 2
    assert mesh.mini_per_gpu == 256 * 5 // 2
    assert mesh.fsdp_shard == 4  # the memory model's state shard: TP x PP
    assert mesh.nvlink_group_size == 2  # the TP group sits inside one NVLink domain


def test_sequence_parallel_with_tp1_is_a_warning() -> None:
    p = problem(megatron_sequence_parallel=True)
    assert rules_megatron.warnings(p, Mesh.of(p, settings(megatron_tp=1)))
    assert rules_megatron.warnings(p, Mesh.of(p, settings(megatron_tp=2))) == []


# -- selection -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "sections",
    [
        pytest.param({"parallelism": {"engine": "megatron"}}, id="spec-engine"),
        pytest.param({"parallelism": {"megatron": {"tensorParallelSize": 2}}}, id="spec-megatron-sizes"),
        pytest.param({"overrides": [f"{ARR}.actor.strategy=megatron"]}, id="strategy"),
        pytest.param({"overrides": [f"{TP_KEY}=2"]}, id="megatron-key"),
        pytest.param({"overrides": ["--config-name ppo_megatron_trainer"]}, id="config-name"),
        pytest.param({"overrides": ["--config-name=ppo_megatron_trainer.yaml"]}, id="config-name-eq"),
    ],
)
def test_the_megatron_engine_is_selected(sections: dict[str, Any]) -> None:
    result = plan_job(make_spec(8, **sections), make_nodes(1))
    assert result.plan is not None, result.violations
    assert result.plan.training is not None and result.plan.training.engine == "megatron"
    assert not any(o.startswith("--") for o in result.plan.overrides)


def test_fsdp_stays_the_default() -> None:
    result = plan_job(make_spec(8), make_nodes(1))
    assert result.plan is not None and result.plan.training is None
    assert not any(".megatron." in o for o in result.plan.overrides)
    assert (
        entrypoint(LaunchPlan.from_plan(result.plan, make_spec(8)).training_engine)[-1]
        == "verl.trainer.main_ppo"
    )


@pytest.mark.parametrize(
    ("sections", "rule"),
    [
        pytest.param(
            {"parallelism": {"engine": "fsdp"}, "overrides": [f"{ARR}.actor.strategy=megatron"]},
            "engine-conflict",
            id="spec-fsdp-strategy-megatron",
        ),
        pytest.param(
            {"overrides": [f"{ARR}.actor.strategy=fsdp", f"{TP_KEY}=2"]},
            "engine-conflict",
            id="strategy-fsdp-megatron-key",
        ),
        pytest.param({"overrides": ["--config-name my_trainer"]}, "config-name", id="other-config"),
        pytest.param(
            {"overrides": [f"{ARR}.actor.strategy=megatron", f"{ARR}.actor.fsdp_config.param_offload=True"]},
            "override-unknown-key",
            id="fsdp-key-in-megatron-config",
        ),
        pytest.param(
            {"overrides": [f"{ARR}.actor.strategy=megatron", f"{TP_KEY}=3"]},
            "megatron-tp-heads",
            id="pinned-tp-checked",
        ),
        pytest.param(
            {"overrides": [f"{TP_KEY}=2", f"{ARR}.ref.megatron.tensor_model_parallel_size=4"]},
            "override-conflict",
            id="actor-ref-tp-disagree",
        ),
    ],
)
def test_megatron_refusals(sections: dict[str, Any], rule: str) -> None:
    result = plan_job(make_spec(8, **sections), make_nodes(1))
    assert not result.feasible
    assert rule in {v.rule for v in result.violations}, result.violations


# -- the plan --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("version", ["0.6", "0.9"])
def test_megatron_plan_keys_in_each_dialect(version: str) -> None:
    spec = make_spec(
        8,
        verl={"image": "x", "version": version},
        algorithm="ppo",
        parallelism={"engine": "megatron", "megatron": {"tensorParallelSize": 2, "pipelineParallelSize": 2}},
    )
    result = plan_job(spec, make_nodes(1))
    assert result.plan is not None, result.violations
    emitted = dict(o.split("=", 1) for o in result.plan.overrides)
    for section in (f"{ARR}.actor", f"{ARR}.ref", "critic"):
        assert emitted[f"{section}.megatron.tensor_model_parallel_size"] == "2"
        assert emitted[f"{section}.megatron.pipeline_model_parallel_size"] == "2"
    assert not [k for k in emitted if "ulysses" in k or "fsdp_config" in k or "fsdp_size" in k]
    assert f"{ARR}.actor.megatron.virtual_pipeline_model_parallel_size" not in emitted  # unset: verl's null
    assert result.plan.data_parallel_size == 2 and result.plan.training is not None
    assert result.plan.training.data_parallel_size == 2
    launch = LaunchPlan.from_plan(result.plan, spec)
    assert entrypoint(launch.training_engine)[-1] == "--config-name=ppo_megatron_trainer"


def test_search_picks_model_parallelism_for_a_model_that_needs_it() -> None:
    """Qwen2.5-32B (64 layers, 40 heads, 8 KV heads) does not fit 80 GB GPUs unsharded: the search picks the
    smallest TP x PP that fits, larger TP first on ties, TP inside the node's NVLink domain (with the weights
    and the optimizer offloaded outside the update, as verl's 32B Megatron scripts do)."""
    spec = make_spec(
        8,
        model="Qwen/Qwen2.5-32B-Instruct",
        parallelism={"engine": "megatron"},
        offload={"params": True, "optimizer": True},
    )
    result = plan_job(spec, make_nodes(1))
    assert result.plan is not None and result.plan.training is not None, result.violations
    t = result.plan.training
    assert t.tensor_parallel_size * t.pipeline_parallel_size > 1
    assert t.tensor_parallel_size >= t.pipeline_parallel_size
    assert result.plan.nvlink_group_size >= t.tensor_parallel_size
    # The same job again gives the same mesh (deterministic).
    again = plan_job(spec, make_nodes(1))
    assert again.plan is not None and again.plan.training == t


def test_candidates_order() -> None:
    from verl_operator.planner.inputs import Fixed

    shape = make_problem().shape  # 28 heads, 4 KV heads, 28 layers
    got = [(c.tp, c.pp) for c in megatron.candidates(shape, 8, 8, 8, Fixed())][:5]
    assert got == [(1, 1), (2, 1), (1, 2), (4, 1), (2, 2)]
    pinned = [(c.tp, c.pp) for c in megatron.candidates(shape, 8, 8, 8, Fixed(megatron_tp=2))][:2]
    assert pinned == [(2, 1), (2, 2)]


def test_the_launcher_runs_the_megatron_config() -> None:
    from verl_launcher.verl import build_argv
    from verl_operator.manifests.launchspec import build_launch_spec

    spec = make_spec(8, parallelism={"engine": "megatron"})
    result = plan_job(spec, make_nodes(1))
    assert result.plan is not None, result.violations
    launch = build_launch_spec(
        {"metadata": {"name": "j", "namespace": "d", "uid": "u"}},
        spec,
        LaunchPlan.from_plan(result.plan, spec, nodes=["gpu-0"]),
    )
    argv = build_argv(launch, 0)
    assert argv[:4] == ["python3", "-m", "verl.trainer.main_ppo", "--config-name=ppo_megatron_trainer"]
    assert f"{TP_KEY}={result.plan.training.tensor_parallel_size}" in argv  # type: ignore[union-attr]


def test_megatron_lora_plans_with_a_frozen_base() -> None:
    """``model.lora.rank`` (verl 0.9's Megatron LoRA): the update keeps no optimizer state or gradients for
    the base weights and no reference copy, as verl's own ``examples/grpo_trainer/run_qwen2-7b_math_megatron_lora.sh``
    pins it."""
    kl = f"{ARR}.actor.use_kl_loss=True"
    full = plan_job(make_spec(8, overrides=["--config-name=ppo_megatron_trainer", kl]), make_nodes(1))
    lora = plan_job(
        make_spec(8, overrides=["--config-name=ppo_megatron_trainer", kl, f"{ARR}.model.lora.rank=256"]),
        make_nodes(1),
    )
    assert full.plan is not None and lora.plan is not None, (full.violations, lora.violations)
    f, q = full.plan.memory.train.parts_gib, lora.plan.memory.train.parts_gib
    assert "ref" in f and "ref" not in q
    assert q["optimizer"] < f["optimizer"] / 10 and q["gradients"] < f["gradients"] / 5
