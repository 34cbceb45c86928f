"""Properties of every plan, checked with arithmetic written here from verl's rules (not the planner's code)."""

from __future__ import annotations

import math
from typing import Any

from conftest import make_nodes, make_spec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_operator.api.plan import Plan
from verl_operator.placement import plan_candidates
from verl_operator.planner import plan_job, rules
from verl_operator.planner.catalog import lookup
from verl_operator.planner.facts import node_facts
from verl_operator.planner.overrides import parse_override

MODELS = [
    "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen/Qwen2.5-3B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct",
    "Qwen/Qwen3-8B",
    "Qwen/Qwen2.5-32B-Instruct",
    "meta-llama/Llama-3.1-8B-Instruct",
    "deepseek-ai/deepseek-llm-7b-chat",
    "google/gemma-2-2b-it",
    "Qwen/Qwen3-30B-A3B",
]
GPUS = [("NVIDIA-H100-80GB-HBM3", 81559), ("NVIDIA-L40S", 46068), ("NVIDIA-H200", 143771)]
ARR = "actor_rollout_ref"


@st.composite
def jobs(draw: st.DrawFn) -> tuple[Any, list[dict[str, Any]]]:
    product, memory = draw(st.sampled_from(GPUS))
    gpn = draw(st.sampled_from([1, 2, 4, 8]))
    count = draw(st.integers(1, 6))
    nodes = make_nodes(count, gpn, product, memory)
    used_nodes = draw(st.integers(1, count))
    gpus = used_nodes * draw(st.sampled_from([d for d in (1, 2, 4, 8) if d <= gpn]))
    kw: dict[str, Any] = {"verl": {"image": "x", "version": draw(st.sampled_from(["0.6", "0.9"]))}}
    data: dict[str, Any] = {
        "maxPromptLength": draw(st.sampled_from([256, 512, 1024])),
        "maxResponseLength": draw(st.sampled_from([256, 1024, 4096])),
    }
    if draw(st.booleans()):
        data["trainBatchSize"] = draw(st.integers(1, 512))
    kw["data"] = data
    rollout: dict[str, Any] = {}
    if draw(st.booleans()):
        rollout["responsesPerPrompt"] = draw(st.integers(1, 8))
    if draw(st.booleans()):
        rollout["tensorParallelSize"] = draw(st.sampled_from([1, 2, 4]))
    kw["rollout"] = rollout
    if draw(st.booleans()):
        kw["parallelism"] = {"sequenceParallelSize": draw(st.sampled_from([1, 2, 4]))}
    batching: dict[str, Any] = {}
    if draw(st.booleans()):
        batching["dynamicBatchSize"] = True
    elif draw(st.booleans()):
        batching["ppoMicroBatchSizePerGpu"] = draw(st.sampled_from([1, 2, 4, 8]))
    if draw(st.booleans()):
        batching["ppoMiniBatchSize"] = draw(st.integers(1, 256))
    kw["batching"] = batching
    kw["algorithm"] = draw(st.sampled_from(["grpo", "ppo"]))
    # Pasted verl overrides: either spelling of SP, a deprecated global micro-batch, unrelated keys.
    pasted = draw(
        st.lists(
            st.sampled_from(
                [
                    f"{ARR}.actor.ulysses_sequence_parallel_size=2",
                    f"{ARR}.actor.fsdp_config.ulysses_sequence_parallel_size=2",
                    f"{ARR}.actor.ppo_micro_batch_size=16",
                    f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=4",
                    f"{ARR}.actor.use_kl_loss=True",
                    f"{ARR}.model.enable_gradient_checkpointing=True",
                    "trainer.total_epochs=15",
                    "trainer.logger=['console']",
                ]
            ),
            max_size=3,
            unique=True,
        )
    )
    kw["overrides"] = pasted
    if draw(st.booleans()):
        kw["placement"] = {"nvlink": "required"}
    spec = make_spec(gpus, model=draw(st.sampled_from(MODELS)), **kw)
    return spec, nodes


def check_independently(spec: Any, plan: dict[str, Any], nodes: list[dict[str, Any]]) -> None:
    """verl's rules, restated from verl-constraints.md, on the plan's JSON and its override list."""
    shape = spec.model.shape or lookup(spec.model.path).shape  # type: ignore[union-attr]
    ov: dict[str, Any] = {o.key: o.value for o in (parse_override(x) for x in plan["overrides"])}
    w = plan["worldSize"]
    b, r = plan["batching"], plan["rollout"]
    sp, tp = plan["sequenceParallelSize"], r["tensorParallelSize"]
    dp = w // sp
    version = plan["verlVersion"]
    # The mesh.
    assert w == spec.resources.gpus == plan["nnodes"] * plan["gpusPerNode"]
    assert ov["trainer.nnodes"] * ov["trainer.n_gpus_per_node"] == w
    assert w % sp == 0 and dp * sp == w == plan["dataParallelSize"] * sp
    assert shape.attention_heads % sp == 0 and (shape.kv_heads % sp == 0 or sp % shape.kv_heads == 0)
    assert w % tp == 0 and shape.attention_heads % tp == 0
    gpn = plan["gpusPerNode"]
    assert (tp <= gpn and gpn % tp == 0) or (tp > gpn and tp % gpn == 0)
    f = plan["fsdpSize"]
    assert f == -1 or f >= w or w % f == 0
    assert r["replicas"] * tp == w
    # Batches.
    tb, n, mini = b["trainBatchSize"], b["rolloutN"], b["ppoMiniBatchSize"]
    assert tb >= mini or b["dynamicBatchSize"]  # verl skips the check with dynamic batch size
    assert (mini * n) % dp == 0 and b["miniBatchPerGpu"] == mini * n // dp > 0
    if not b["dynamicBatchSize"]:
        assert (tb * n) % w == 0
        micro = b["ppoMicroBatchSizePerGpu"]
        assert micro and (mini * n // dp) % micro == 0
        assert b["gradientAccumulationSteps"] * micro == mini * n // dp
        if version == "0.9":
            unit = math.lcm(dp, mini * n)
            padded = -(-tb * n // unit) * unit
            assert (padded // dp) % b["logProbMicroBatchSizePerGpu"] == 0
        assert ov[f"{ARR}.actor.ppo_micro_batch_size_per_gpu"] == micro
    else:
        assert b["maxTokenLenPerGpu"] * sp >= spec.data.max_prompt_length + spec.data.max_response_length
        assert ov[f"{ARR}.actor.use_dynamic_bsz"] is True
    assert ov[f"{ARR}.rollout.log_prob_use_dynamic_bsz"] == ov[f"{ARR}.actor.use_dynamic_bsz"]
    assert spec.data.max_prompt_length + spec.data.max_response_length <= shape.max_position_embeddings
    # Dialect.
    assert ov[f"{ARR}.rollout.mode"] == ("sync" if version == "0.6" else "async")
    assert ov[f"{ARR}.rollout.name"] == "vllm"
    sp_key = (
        f"{ARR}.actor.ulysses_sequence_parallel_size"
        if version == "0.6"
        else f"{ARR}.actor.fsdp_config.ulysses_sequence_parallel_size"
    )
    assert ov[sp_key] == sp
    if sp > 1:
        assert ov[f"{ARR}.model.use_remove_padding"] is True
    # The rollout peak does not depend on a pinned micro-batch: it always fits.
    assert plan["memory"]["rolloutPeakGiB"] <= plan["memory"]["gpuMemoryGiB"]
    # Placement: never more GPUs than the chosen nodes hold.
    alloc = {n["metadata"]["name"]: int(n["status"]["allocatable"]["nvidia.com/gpu"]) for n in nodes}
    candidates = plan_candidates(Plan.model_validate(plan), spec, [node_facts(n) for n in nodes])
    assert plan["nnodes"] <= len(candidates) == plan["candidateNodeCount"]
    assert plan["candidateNodesSample"] == list(candidates[:5])
    assert all(alloc[c] >= gpn for c in candidates)
    assert sum(alloc[c] for c in plan["nodes"]) >= w
    if spec.placement.nvlink == "required":
        assert plan["nvlinkGroupSize"] == max(tp, sp)


def check_pins_kept(spec: Any, plan: dict[str, Any]) -> None:
    """Pinned values are never silently changed."""
    pins = [
        (spec.data.train_batch_size, plan["batching"]["trainBatchSize"]),
        (spec.rollout.responses_per_prompt, plan["batching"]["rolloutN"]),
        (spec.rollout.tensor_parallel_size, plan["rollout"]["tensorParallelSize"]),
        (spec.parallelism.sequence_parallel_size, plan["sequenceParallelSize"]),
        (spec.batching.ppo_mini_batch_size, plan["batching"]["ppoMiniBatchSize"]),
        (spec.batching.ppo_micro_batch_size_per_gpu, plan["batching"]["ppoMicroBatchSizePerGpu"]),
    ]
    for pinned, planned in pins:
        if pinned is not None:
            assert pinned == planned


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(jobs())
def test_every_accepted_plan_satisfies_every_rule(job: tuple[Any, list[dict[str, Any]]]) -> None:
    spec, nodes = job
    result = plan_job(spec, nodes)
    data = result.to_json_dict()
    assert data["feasible"] == (data["plan"] is not None) == (not data["violations"])
    if result.feasible:
        has_pinned_micro = (
            spec.batching.ppo_micro_batch_size_per_gpu is not None
            or spec.batching.dynamic_batch_size
            or any("micro_batch_size" in o for o in spec.overrides)
        )
        if not has_pinned_micro:
            mem = data["plan"]["memory"]
            assert (
                max(mem["rolloutPeakGiB"], mem["trainPeakGiB"], mem["logProbPeakGiB"]) <= mem["gpuMemoryGiB"]
            )
        check_independently(spec, data["plan"], nodes)
        check_pins_kept(spec, data["plan"])
    else:
        for v in data["violations"]:
            assert v["field"] and v["rule"] and v["message"]


@settings(max_examples=40, deadline=None)
@given(jobs())
def test_deterministic(job: tuple[Any, list[dict[str, Any]]]) -> None:
    spec, nodes = job
    assert plan_job(spec, nodes).to_json_dict() == plan_job(spec, list(reversed(nodes))).to_json_dict()


@given(st.integers(1, 4096), st.integers(1, 16), st.sampled_from([1, 2, 3, 4, 6, 8, 12, 16, 24, 64, 128]))
def test_batch_suggestions_are_valid(tb: int, n: int, world: int) -> None:
    from test_planner_rules import apply, problem
    from test_planner_rules import settings as make_settings

    violations = apply(
        rules.batch_divisible_by_world,
        problem(),
        make_settings(world=world, train_batch_size=tb, rollout_n=n),
    )
    if tb * n % world == 0:
        assert violations == []
        return
    [v] = violations
    values = [int(x) for x in v.suggestions[0].removeprefix("use trainBatchSize ").split(" or ")]
    assert values and all(x * n % world == 0 for x in values)
    # The nearest: nothing valid lies strictly between them and the rejected value.
    for x in values:
        lo, hi = sorted((x, tb))
        assert not any(t * n % world == 0 for t in range(lo + 1, hi))
