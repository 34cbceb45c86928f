"""The search: tie-break order, determinism, node selection and infeasible answers."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import make_node, make_nodes, make_spec

from verl_operator.api.plan import PlanResult
from verl_operator.placement import plan_candidates
from verl_operator.planner import plan_job
from verl_operator.planner.facts import node_facts


def feasible(result: PlanResult) -> Any:
    assert result.feasible, [(v.rule, v.message) for v in result.violations]
    assert result.plan is not None
    return result.plan


def rules_of(result: PlanResult) -> set[str]:
    assert not result.feasible
    return {v.rule for v in result.violations}


def test_tie_break_order() -> None:
    """Each preference of the documented order, checked against the alternative it beats."""
    nodes = make_nodes(1)
    plan = feasible(plan_job(make_spec(8), nodes))
    # 1. smallest SP: SP 1 fits, so it is chosen although SP 2 and 4 are valid too.
    assert plan.sequence_parallel_size == 1
    assert plan_job(make_spec(8, parallelism={"sequenceParallelSize": 2}), nodes).feasible
    # 2. one node: FSDP over the whole world.
    assert plan.fsdp_size == -1
    # 3. mini-batch closest to trainBatchSize / 4.
    assert plan.batching.ppo_mini_batch_size == plan.batching.train_batch_size // 4
    # 4. largest micro-batch that fits: doubling the next divisor up breaks the train estimate.
    micro = plan.batching.ppo_micro_batch_size_per_gpu
    per_gpu = plan.batching.mini_batch_per_gpu
    larger = [d for d in range(micro + 1, per_gpu + 1) if per_gpu % d == 0]
    sp1 = {"sequenceParallelSize": 1}
    pinned = plan_job(make_spec(8, batching={"ppoMicroBatchSizePerGpu": larger[0]}, parallelism=sp1), nodes)
    assert any("train peak" in w for w in pinned.warnings)
    # A pinned micro-batch over the GPU at SP 1 takes the next SP that fits rather than the warning.
    free_sp = plan_job(make_spec(8, batching={"ppoMicroBatchSizePerGpu": larger[0]}), nodes)
    assert feasible(free_sp).sequence_parallel_size > 1
    assert not any("train peak" in w for w in free_sp.warnings)
    # 6. smallest rollout TP that fits: TP 1 for a 7B model on 80 GB.
    assert plan.rollout.tensor_parallel_size == 1
    # 7. largest gpuMemoryUtilization that fits: 0.05 more breaks the rollout estimate.
    gmu = plan.rollout.gpu_memory_utilization
    over = plan_job(make_spec(8, rollout={"gpuMemoryUtilization": round(gmu + 0.05, 2)}), nodes)
    assert "memory-rollout" in rules_of(over)


def test_tie_break_sp_grows_only_when_needed() -> None:
    nodes = make_nodes(1)
    lengths = {"maxPromptLength": 2048, "maxResponseLength": 30000}
    model = "Qwen/Qwen2.5-14B-Instruct"
    plan = feasible(plan_job(make_spec(8, model=model, data=lengths), nodes))
    assert plan.sequence_parallel_size > 1
    smaller = plan_job(
        make_spec(
            8,
            model=model,
            data=lengths,
            parallelism={"sequenceParallelSize": plan.sequence_parallel_size // 2},
        ),
        nodes,
    )
    assert "memory-train" in rules_of(smaller)


def test_tie_break_tp_grows_only_when_needed() -> None:
    nodes = make_nodes(4)
    plan = feasible(plan_job(make_spec(32, model="Qwen/Qwen2.5-72B-Instruct"), nodes))
    tp = plan.rollout.tensor_parallel_size
    assert tp > 1
    half = plan_job(
        make_spec(32, model="Qwen/Qwen2.5-72B-Instruct", rollout={"tensorParallelSize": tp // 2}), nodes
    )
    assert rules_of(half) & {"memory-rollout", "kv-cache-max-model-len"}


def test_tie_break_multi_node_shards_within_a_node_first() -> None:
    plan = feasible(plan_job(make_spec(16), make_nodes(2)))
    assert plan.fsdp_size == 8


def test_deterministic_and_order_independent() -> None:
    nodes = make_nodes(4)
    spec = make_spec(16, model="Qwen/Qwen3-8B")
    first = plan_job(spec, nodes).to_json_dict()
    assert plan_job(spec, list(reversed(nodes))).to_json_dict() == first
    assert first["plan"]["candidateNodeCount"] == 4
    assert first["plan"]["candidateNodesSample"] == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]


@pytest.mark.parametrize(
    ("gpus", "nodes", "gpn", "nnodes"),
    [
        pytest.param(8, make_nodes(2), 8, 1, id="one-full-node"),
        pytest.param(16, make_nodes(3), 8, 2, id="two-full-nodes"),
        pytest.param(6, make_nodes(1), 6, 1, id="part-of-a-node"),
        pytest.param(12, make_nodes(2), 6, 2, id="six-per-node"),
        pytest.param(4, make_nodes(2, gpus=2), 2, 2, id="small-nodes"),
    ],
)
def test_layout_choice(gpus: int, nodes: list[dict[str, Any]], gpn: int, nnodes: int) -> None:
    spec = make_spec(gpus, model="Qwen/Qwen2.5-1.5B-Instruct")
    plan = feasible(plan_job(spec, nodes))
    assert (plan.gpus_per_node, plan.nnodes, plan.world_size) == (gpn, nnodes, gpus)
    candidates = plan_candidates(plan, spec, [node_facts(n) for n in nodes])
    assert len(plan.nodes) == nnodes and set(plan.nodes) <= set(candidates)
    assert plan.candidate_node_count == len(candidates)


def test_pinned_gpus_per_node_is_kept() -> None:
    plan = feasible(
        plan_job(
            make_spec(8, model="Qwen/Qwen2.5-1.5B-Instruct", resources={"gpusPerNode": 4}), make_nodes(2)
        )
    )
    assert (plan.gpus_per_node, plan.nnodes) == (4, 2)


def test_best_fit_pool_prefers_smaller_gpus_that_fit() -> None:
    nodes = make_nodes(1, 8, "NVIDIA-L40S", 46068, prefix="l40s") + make_nodes(1, 8, prefix="h100")
    small = feasible(plan_job(make_spec(8, model="Qwen/Qwen2.5-0.5B-Instruct"), nodes))
    assert small.node_pool.gpu_product == "NVIDIA-L40S"
    big = feasible(plan_job(make_spec(8, model="Qwen/Qwen2.5-32B-Instruct"), nodes))
    assert big.node_pool.gpu_product == "NVIDIA-H100-80GB-HBM3"


def test_excluded_nodes_are_reported() -> None:
    nodes = [
        *make_nodes(1),
        make_node("cordoned", unschedulable=True),
        make_node("cpu", gpus=0, product=None),
    ]
    plan = feasible(plan_job(make_spec(8), nodes))
    assert set(plan.node_pool.excluded) == {"cordoned", "cpu"}


@pytest.mark.parametrize(
    ("spec_kw", "nodes", "rule"),
    [
        pytest.param({"gpus": 24}, make_nodes(2), "not-enough-gpus", id="too-many-gpus"),
        pytest.param(
            {"gpus": 8, "resources": {"gpuProduct": "NVIDIA-H200"}},
            make_nodes(2),
            "no-eligible-nodes",
            id="no-product",
        ),
        pytest.param(
            {"gpus": 8, "model": "org/unknown-model"},
            make_nodes(1),
            "model-shape-required",
            id="unknown-model",
        ),
        pytest.param(
            {"gpus": 6, "data": {"trainBatchSize": 64}, "rollout": {"responsesPerPrompt": 1}},
            make_nodes(1),
            "batch-divisible-by-world",
            id="issue-example",
        ),
        pytest.param(
            {"gpus": 16, "model": "Qwen/Qwen2.5-72B-Instruct"}, make_nodes(2), "memory-train", id="72b-on-16"
        ),
        pytest.param(
            {"gpus": 4, "rollout": {"tensorParallelSize": 2}, "placement": {"nvlink": "required"}},
            make_nodes(1, 4, "NVIDIA-L40S", 46068),
            "nvlink-domain",
            id="nvlink-required-on-pcie",
        ),
        pytest.param(
            {"gpus": 8, "overrides": ["actor_rollout_ref.rollout.mode=sync"]},
            make_nodes(1),
            "rollout-mode",
            id="sync-on-0.9",
        ),
        pytest.param(
            {"gpus": 8, "overrides": ["actor_rollout_ref.actor.strategy=deepspeed"]},
            make_nodes(1),
            "strategy",
            id="unknown-strategy",
        ),
        pytest.param(
            {"gpus": 8, "overrides": ["trainer.nnodes=2", "trainer.n_gpus_per_node=8"]},
            make_nodes(2),
            "resources-agree",
            id="trainer-nnodes-disagrees",
        ),
        pytest.param(
            {"gpus": 8, "rollout": {"responsesPerPrompt": 4}, "overrides": ["actor_rollout_ref.rollout.n=5"]},
            make_nodes(1),
            "override-conflict",
            id="override-vs-field",
        ),
    ],
)
def test_infeasible(spec_kw: dict[str, Any], nodes: list[dict[str, Any]], rule: str) -> None:
    kw = dict(spec_kw)
    gpus = kw.pop("gpus")
    result = plan_job(make_spec(gpus, **kw), nodes)
    assert rule in rules_of(result)
    assert result.plan is None and result.to_json_dict()["plan"] is None


def test_memory_violation_suggests_more_gpus() -> None:
    result = plan_job(make_spec(16, model="Qwen/Qwen2.5-72B-Instruct"), make_nodes(2))
    [v] = [v for v in result.violations if v.rule == "memory-train"]
    suggestion = next(s for s in v.suggestions if "GPUs" in s)
    needed = int(suggestion.split("at least ")[1].split(" ")[0])
    assert plan_job(make_spec(needed, model="Qwen/Qwen2.5-72B-Instruct"), make_nodes(needed // 8)).feasible


def test_nvlink_required_sets_group_size() -> None:
    plan = feasible(
        plan_job(
            make_spec(32, model="Qwen/Qwen2.5-72B-Instruct", placement={"nvlink": "required"}), make_nodes(4)
        )
    )
    assert plan.nvlink_group_size == max(plan.rollout.tensor_parallel_size, plan.sequence_parallel_size)
    preferred = feasible(plan_job(make_spec(32, model="Qwen/Qwen2.5-72B-Instruct"), make_nodes(4)))
    assert preferred.nvlink_group_size == 1


def test_nvlink_clique_spans_nodes() -> None:
    clique = {"nvidia.com/gpu.clique": "cluster-a.1"}
    nodes = make_nodes(4, 4, "NVIDIA-GB200", 189471, labels=clique)
    spec = make_spec(
        16,
        model="Qwen/Qwen2.5-72B-Instruct",
        rollout={"tensorParallelSize": 8},
        placement={"nvlink": "required"},
    )
    plan = feasible(plan_job(spec, nodes))
    assert plan.nvlink_group_size == 8 and plan.node_pool.nvlink_domain_size == 16
    no_clique = make_nodes(4, 4, "NVIDIA-GB200", 189471)
    assert "nvlink-domain" in rules_of(plan_job(spec, no_clique))


def test_topology_required_keeps_one_domain() -> None:
    nodes = make_nodes(2, labels={"rack": "a"}, prefix="a") + make_nodes(1, labels={"rack": "b"}, prefix="b")
    spec = make_spec(
        16,
        model="Qwen/Qwen2.5-1.5B-Instruct",
        placement={"topologyKey": "rack", "topologyPolicy": "required"},
    )
    plan = feasible(plan_job(spec, nodes))
    assert plan.candidate_nodes_sample == ["a-0", "a-1"]
    assert plan_candidates(plan, spec, [node_facts(n) for n in nodes]) == ("a-0", "a-1")
    three = make_spec(
        24,
        model="Qwen/Qwen2.5-1.5B-Instruct",
        placement={"topologyKey": "rack", "topologyPolicy": "required"},
    )
    assert "not-enough-gpus" in rules_of(plan_job(three, nodes))


def test_global_micro_batch_is_converted_or_rejected() -> None:
    ok = feasible(
        plan_job(make_spec(8, overrides=["actor_rollout_ref.actor.ppo_micro_batch_size=64"]), make_nodes(1))
    )
    assert ok.batching.ppo_micro_batch_size_per_gpu == 64 // 8
    tiny_spec = make_spec(
        8,
        parallelism={"sequenceParallelSize": 1},
        overrides=["actor_rollout_ref.actor.ppo_micro_batch_size=4"],
    )
    tiny = plan_job(tiny_spec, make_nodes(1))
    assert "micro-batch-global" in rules_of(tiny)


def test_nodes_without_cpus_for_the_placement_group_are_skipped() -> None:
    few_cpus = make_node("small-cpu")
    few_cpus["status"]["allocatable"]["cpu"] = "16"  # verl needs 3 x 8 + 2 = 26 cores for 8 GPUs
    result = plan_job(make_spec(8), [few_cpus])
    assert "not-enough-gpus" in rules_of(result)
    assert feasible(plan_job(make_spec(4, model="Qwen/Qwen2.5-1.5B-Instruct"), [few_cpus])).gpus_per_node == 4


def test_rollout_expert_parallel_sets_tp() -> None:
    spec = make_spec(
        8, model="Qwen/Qwen3-30B-A3B", overrides=["actor_rollout_ref.rollout.expert_parallel_size=4"]
    )
    assert feasible(plan_job(spec, make_nodes(1))).rollout.tensor_parallel_size == 4


def test_unknown_gpu_memory_asks_for_the_label() -> None:
    result = plan_job(make_spec(8), [make_node("odd", product="Mystery-GPU", memory_mib=None)])
    [v] = result.violations
    assert v.rule == "no-eligible-nodes" and "nvidia.com/gpu.memory" in v.message


def test_candidates_in_natural_name_order() -> None:
    nodes = [make_node(f"gb-{i}", 4, "NVIDIA-GB200", 189471) for i in (10, 2, 1, 0)]
    spec = make_spec(8, model="Qwen/Qwen2.5-1.5B-Instruct")
    plan = feasible(plan_job(spec, nodes))
    assert plan.candidate_nodes_sample == ["gb-0", "gb-1", "gb-2", "gb-10"]
    assert plan_candidates(plan, spec, [node_facts(n) for n in nodes]) == ("gb-0", "gb-1", "gb-2", "gb-10")
    assert plan.nodes == ["gb-0", "gb-1"]


def test_infeasible_everywhere_reports_the_nearest_miss() -> None:
    # 72B on 8 GPUs fits neither pool; among equally far misses the last pool tried (the larger GPUs) is reported.
    nodes = make_nodes(1, 8, prefix="h100") + make_nodes(1, 8, "NVIDIA-H200", 143771, prefix="h200")
    result = plan_job(make_spec(8, model="Qwen/Qwen2.5-72B-Instruct"), nodes)
    [v] = result.violations
    assert v.rule.startswith("memory-") and "140.4 GiB" in v.message


def test_rollout_overrun_suggests_values_that_fit() -> None:
    result = plan_job(make_spec(8, rollout={"gpuMemoryUtilization": 0.9}), make_nodes(1))
    [v] = result.violations
    assert (v.rule, v.field) == ("memory-rollout", "spec.rollout.gpuMemoryUtilization")
    lower = next(s for s in v.suggestions if s.startswith("use gpuMemoryUtilization"))
    gmu = float(lower.split()[2])
    assert plan_job(make_spec(8, rollout={"gpuMemoryUtilization": gmu}), make_nodes(1)).feasible
    offload = next(s for s in v.suggestions if s.startswith("set spec.offload.optimizer"))
    assert "up to 0.9 fits" in offload
    fixed = make_spec(8, rollout={"gpuMemoryUtilization": 0.9}, offload={"optimizer": True})
    assert plan_job(fixed, make_nodes(1)).feasible


def test_kv_cache_shortfall_suggests_a_tp_that_fits() -> None:
    spec = make_spec(32, model="Qwen/Qwen2.5-72B-Instruct", rollout={"tensorParallelSize": 1})
    result = plan_job(spec, make_nodes(4))
    kv = next(v for v in result.violations if v.rule == "kv-cache-max-model-len")
    tp = int(kv.suggestions[0].split()[3])
    better = make_spec(32, model="Qwen/Qwen2.5-72B-Instruct", rollout={"tensorParallelSize": tp})
    assert plan_job(better, make_nodes(4)).feasible


def test_mini_batch_without_a_fitting_divisor_pads() -> None:
    # 60 prompts, n 1, 8 GPUs, dynamic batch size: no divisor of 60 splits over 8 ranks; 16 is closest to 15.
    spec = make_spec(
        8, data={"trainBatchSize": 60}, rollout={"responsesPerPrompt": 1}, batching={"dynamicBatchSize": True}
    )
    result = plan_job(spec, make_nodes(1))
    plan = feasible(result)
    assert plan.batching.ppo_mini_batch_size == 16
    assert plan.padding.padded_trajectories == 4  # 60 -> 64 = lcm(8, 16) x 4
    assert any("pads 60 trajectories to 64" in w for w in result.warnings)


@pytest.mark.parametrize(
    ("override", "rule"),
    [
        pytest.param(
            "actor_rollout_ref.rollout.pipeline_model_parallel_size=2", "rollout-parallelism", id="rollout-pp"
        ),
        pytest.param(
            "actor_rollout_ref.rollout.data_parallel_size=3", "rollout-data-parallel", id="rollout-dp"
        ),
        pytest.param(
            "actor_rollout_ref.rollout.expert_parallel_size=2", "rollout-expert-parallel", id="ep-dense"
        ),
        pytest.param("actor_rollout_ref.rollout.name=hf", "rollout-name", id="hf-engine"),
        pytest.param("data.train_batch_size=${oc.env:BATCH}", "override-type", id="interpolation"),
        pytest.param("~data.train_batch_size", "override-delete-owned", id="delete-owned"),
    ],
)
def test_unsupported_overrides(override: str, rule: str) -> None:
    result = plan_job(make_spec(8, overrides=[override]), make_nodes(1))
    assert rule in rules_of(result)
    assert any("spec.overrides[0]" in v.field for v in result.violations)


def test_critic_micro_batch_follows_the_critic_mesh() -> None:
    # Actor SP 2 (DP 4) and critic SP 1 (DP 8): the critic's per-GPU mini-batch is half the actor's.
    spec = make_spec(8, algorithm="ppo", parallelism={"sequenceParallelSize": 2})
    plan = feasible(plan_job(spec, make_nodes(1)))
    out = dict(o.split("=", 1) for o in plan.overrides)
    critic_micro = int(out["critic.ppo_micro_batch_size_per_gpu"])
    critic_per_gpu = plan.batching.ppo_mini_batch_size * plan.batching.rollout_n // 8
    assert critic_per_gpu % critic_micro == 0
    # Its tokens per GPU (micro x seq / critic SP 1) do not exceed the actor's (micro x seq / 2).
    assert critic_micro <= plan.batching.ppo_micro_batch_size_per_gpu // 2
