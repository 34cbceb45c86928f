"""Tokens per sequence in the memory estimate: padding, the data's mean lengths, dynamic batches, entropy."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from conftest import make_nodes, make_problem, make_settings, make_spec

from verl_operator.planner import plan_job
from verl_operator.planner.inputs import Problem

LENGTHS = {"maxPromptLength": 512, "maxResponseLength": 1024}


@pytest.mark.parametrize(
    ("change", "sp", "tokens"),
    [
        pytest.param({"version": "0.6"}, 1, 1536, id="0.6-padded-by-default"),
        pytest.param({"version": "0.6", "mean_prompt_length": 100, "mean_response_length": 300}, 1, 1536,
                     id="0.6-padded-ignores-means"),
        pytest.param({"version": "0.6", "mean_prompt_length": 100, "mean_response_length": 300}, 2, 400,
                     id="0.6-sp-removes-padding"),
        pytest.param({"version": "0.6", "use_remove_padding": True, "mean_response_length": 300}, 1, 812,
                     id="0.6-pinned-remove-padding-one-mean"),
        pytest.param({"version": "0.9"}, 1, 1536, id="0.9-no-means-is-the-maximum"),
        pytest.param({"version": "0.9", "mean_prompt_length": 100, "mean_response_length": 300}, 1, 400,
                     id="0.9-removes-padding-by-default"),
        pytest.param({"version": "0.9", "use_remove_padding": False, "mean_prompt_length": 100}, 1, 1536,
                     id="0.9-pinned-padding"),
        # verl 0.6's Megatron workers pack every micro-batch and never read use_remove_padding.
        pytest.param({"version": "0.6", "training_engine": "megatron", "mean_prompt_length": 100,
                      "mean_response_length": 300}, 1, 400, id="0.6-megatron-always-packs"),
        pytest.param({"version": "0.6", "training_engine": "megatron", "use_remove_padding": False,
                      "mean_response_length": 300}, 1, 812, id="0.6-megatron-ignores-pinned-padding"),
        pytest.param({"version": "0.9", "training_engine": "megatron", "use_remove_padding": False,
                      "mean_prompt_length": 100}, 1, 1536, id="0.9-megatron-pinned-padding"),
    ],
)  # fmt: skip
def test_tokens_per_sequence(change: dict[str, Any], sp: int, tokens: int) -> None:
    p = make_problem(max_prompt_length=512, max_response_length=1024, **change)
    assert p.tokens_per_sequence(sp) == tokens


def test_mean_lengths_shrink_the_train_estimate() -> None:
    nodes = make_nodes(1)
    pinned = {"ppoMicroBatchSizePerGpu": 16}
    worst = plan_job(make_spec(8, data=LENGTHS, batching=pinned), nodes)
    typical = plan_job(
        make_spec(8, data={**LENGTHS, "meanPromptLength": 128, "meanResponseLength": 256}, batching=pinned),
        nodes,
    )
    assert worst.plan is not None and typical.plan is not None
    assert worst.plan.memory.tokens_per_sequence == 1536
    assert typical.plan.memory.tokens_per_sequence == 384
    # Activations and logits are linear in the tokens: a quarter of the tokens, a quarter of those parts.
    for part in ("activations", "logits"):
        ratio = typical.plan.memory.train.parts_gib[part] / worst.plan.memory.train.parts_gib[part]
        assert ratio == pytest.approx(384 / 1536, rel=0.01)


@pytest.mark.parametrize("field", ["meanPromptLength", "meanResponseLength"])
def test_a_mean_above_its_maximum_is_refused(field: str) -> None:
    result = plan_job(make_spec(8, data={**LENGTHS, field: 2000}), make_nodes(1))
    assert not result.feasible
    (v,) = result.violations
    assert (v.field, v.rule) == (f"spec.data.{field}", "mean-length")
    assert "2000 >" in v.message


def test_entropy_term_costs_logit_memory() -> None:
    nodes = make_nodes(1)
    pinned = {"ppoMicroBatchSizePerGpu": 4}
    plain = plan_job(make_spec(8, data=LENGTHS, batching=pinned), nodes)
    entropy = plan_job(
        make_spec(
            8, data=LENGTHS, batching=pinned, overrides=["actor_rollout_ref.actor.entropy_coeff=0.001"]
        ),
        nodes,
    )
    zero = plan_job(
        make_spec(8, data=LENGTHS, batching=pinned, overrides=["actor_rollout_ref.actor.entropy_coeff=0"]),
        nodes,
    )
    assert plain.plan is not None and entropy.plan is not None and zero.plan is not None
    logits = {name: r.plan.memory.train.parts_gib["logits"] for name, r in
              (("plain", plain), ("entropy", entropy), ("zero", zero))}  # fmt: skip
    assert logits["zero"] == logits["plain"]
    assert logits["entropy"] == pytest.approx(logits["plain"] * 7 / 4, rel=0.01)


def test_dynamic_micro_batch_holds_at_most_the_ranks_mini_batch() -> None:
    """A 64k-token budget on a rank whose mini-batch is 20 sequences of 400 tokens packs 8000 tokens."""
    nodes = make_nodes(1)
    spec = make_spec(
        8,
        data={**LENGTHS, "trainBatchSize": 32, "meanPromptLength": 100, "meanResponseLength": 300},
        rollout={"responsesPerPrompt": 5},
        batching={"dynamicBatchSize": True, "ppoMiniBatchSize": 32, "maxTokenLenPerGpu": 65536},
    )
    small = plan_job(spec, nodes)
    assert small.plan is not None
    assert small.plan.batching.mini_batch_per_gpu == 20
    big = plan_job(
        spec.model_copy(
            update={"batching": spec.batching.model_copy(update={"max_token_len_per_gpu": 8000})}
        ),
        nodes,
    )
    assert big.plan is not None
    assert small.plan.memory.train.parts_gib["logits"] == big.plan.memory.train.parts_gib["logits"]


def test_a_pinned_budget_over_the_gpu_takes_the_least_overrun_sharding() -> None:
    """Qwen2-72B full fine-tune on 4 x 8 H800 with a pinned 24,000-token budget (verl's tuning script): HSDP
    over one node exceeds the GPU by far more than whole-world sharding, which verl also defaults to."""
    nodes = make_nodes(4, product="NVIDIA-H800")
    spec = make_spec(
        32,
        model="Qwen/Qwen2-72B-Instruct",
        data={"trainBatchSize": 1024, "maxPromptLength": 512, "maxResponseLength": 512},
        batching={"dynamicBatchSize": True, "ppoMiniBatchSize": 256, "maxTokenLenPerGpu": 24000},
        offload={"params": True, "optimizer": True},
        rollout={"tensorParallelSize": 16, "gpuMemoryUtilization": 0.6},
    )
    result = plan_job(spec, nodes)
    assert result.plan is not None
    assert result.plan.fsdp_size == -1


def test_dynamic_log_prob_budget_shrinks_when_the_forward_pass_does_not_fit() -> None:
    """PPO on Qwen2.5-3B, SP 2, dynamic batch size: the update fits at 64k tokens, the forward-only log-prob
    pass (7 bytes per logit against the update's 4) needs a smaller budget of its own."""
    spec = make_spec(
        8,
        model="Qwen/Qwen2.5-3B-Instruct",
        algorithm="ppo",
        parallelism={"sequenceParallelSize": 2},
        batching={"dynamicBatchSize": True},
    )
    result = plan_job(spec, make_nodes(1))
    assert result.plan is not None, result.violations
    b, m = result.plan.batching, result.plan.memory
    assert b.max_token_len_per_gpu is not None and b.log_prob_max_token_len_per_gpu is not None
    assert b.log_prob_max_token_len_per_gpu < b.max_token_len_per_gpu
    assert m.log_prob_peak_gib <= m.gpu_memory_gib
    keys = [o.split("=")[0] for o in result.plan.overrides]
    assert "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu" in keys


def test_kv_cache_hint_suggests_only_a_tp_the_rollout_rules_accept() -> None:
    """A 32k-token model length on 24 GiB GPUs at gpuMemoryUtilization 0.25: TP 4 gives the KV cache room, but
    on NVLink pairs (nvlink required) the rules forbid TP 4, so the hint must not suggest it."""
    from verl_operator.planner.memory import estimate
    from verl_operator.planner.mesh import Mesh
    from verl_operator.planner.search_memory import memory_inputs, memory_violations

    s = make_settings(rollout_tp=2, gpu_memory_utilization=0.25, param_offload=True, optimizer_offload=True)
    open_ = make_problem(gpu_memory_bytes=24 * 1024**3, max_prompt_length=2048, max_response_length=30000)
    paired = replace(open_, nvlink_required=True, nvlink_domain=2)

    def hints(p: Problem) -> list[str]:
        mesh = Mesh.of(p, s)
        found = memory_violations(p, mesh, estimate(memory_inputs(p, mesh)))
        return [h for v in found if v.rule == "kv-cache-max-model-len" for h in v.suggestions]

    assert any("tensorParallelSize 4" in h for h in hints(open_)), hints(open_)
    assert hints(paired) and not any("tensorParallelSize" in h for h in hints(paired)), hints(paired)
