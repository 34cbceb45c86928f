"""Shapes and settings verl, megatron-core or HF refuse at start, refused at admission instead.

Each row plans a job whose start would fail (a top-k beyond the experts, a top-k without experts, dense layers
beyond the model's, key/value heads that do not divide the attention heads, uniform recompute chunks that run
past a pipeline stage, a rollout data parallel size of 0) and checks the rule, the field, the arithmetic and
the suggestion; the ``ok`` rows are the nearest valid inputs, planned.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import catalog_entry, make_nodes

from verl_operator.api.plan import PlanResult
from verl_operator.api.spec import VerlJobSpec
from verl_operator.planner.job import plan_job

TC = "actor_rollout_ref.actor.megatron.override_transformer_config"
MEGATRON = "--config-name=ppo_megatron_trainer"
QWEN7B = catalog_entry("Qwen/Qwen2.5-7B-Instruct").shape.model_dump(by_alias=True, exclude_none=True)
MOE = catalog_entry("Qwen/Qwen3-30B-A3B-Base").shape.model_dump(by_alias=True, exclude_none=True)


def plan(sections: dict[str, Any]) -> PlanResult:
    doc = {"verl": {"image": "example.com/verl:0.9.1"}, "model": {"path": "Qwen/Qwen2.5-7B-Instruct"}}
    spec = VerlJobSpec.model_validate({**doc, "resources": {"gpus": 8}, **sections})
    return plan_job(spec, make_nodes(1))


def shaped(base: dict[str, Any], **changes: Any) -> dict[str, Any]:
    return {"path": "/models/custom", "shape": {**base, **changes}}


def uniform(layers: int) -> list[str]:
    return [
        MEGATRON,
        f"{TC}.recompute_granularity=full",
        f"{TC}.recompute_method=uniform",
        f"{TC}.recompute_num_layers={layers}",
    ]


ROWS = [
    pytest.param(
        {"model": shaped(MOE, numExperts=8, numExpertsPerTok=9)},
        ("model-shape-moe", "spec.model.shape.numExpertsPerTok"),
        ["numExpertsPerTok 9 > numExperts 8"],
        "use numExpertsPerTok 8 or less",
        id="topk-beyond-experts",
    ),
    pytest.param(
        {"model": shaped(QWEN7B, numExpertsPerTok=2)},
        ("model-shape-moe", "spec.model.shape.numExpertsPerTok"),
        ["numExpertsPerTok 2 without numExperts", "planned as dense"],
        "set spec.model.shape.numExperts",
        id="topk-without-experts",
    ),
    pytest.param(
        {"model": shaped(MOE, firstKDenseReplace=60)},
        ("model-shape-moe", "spec.model.shape.firstKDenseReplace"),
        ["firstKDenseReplace 60 > layers 48"],
        "use firstKDenseReplace 48 or less",
        id="dense-layers-beyond-the-model",
    ),
    pytest.param(
        {"model": shaped(QWEN7B, kvHeads=5)},
        ("model-shape-kv-heads", "spec.model.shape.kvHeads"),
        ["attentionHeads 28 is not divisible by kvHeads 5 (28 / 5 = 5.60)"],
        "use kvHeads 4 or 7",
        id="kv-heads-do-not-divide",
    ),
    pytest.param(
        {"model": shaped(QWEN7B, kvHeads=56)},
        ("model-shape-kv-heads", "spec.model.shape.kvHeads"),
        ["attentionHeads 28 is not divisible by kvHeads 56"],
        "use kvHeads 28",
        id="more-kv-heads-than-heads",
    ),
    pytest.param(
        {"critic": {"model": shaped(QWEN7B, kvHeads=3)}, "algorithm": "ppo"},
        ("model-shape-kv-heads", "spec.critic.model.shape.kvHeads"),
        ["attentionHeads 28 is not divisible by kvHeads 3"],
        "use kvHeads 2 or 4",
        id="critic-kv-heads",
    ),
    pytest.param(
        {
            "overrides": [
                *uniform(2),
                "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=4",
            ]
        },
        (
            "megatron-recompute-chunks",
            "spec.overrides (actor_rollout_ref.actor.megatron.override_transformer_config.recompute_num_layers)",
        ),
        ["chunks of recompute_num_layers 2 runs past a stage of 7 layers (PP 4; 7 % 2 = 1)", "layers 6 to 7"],
        "use recompute_num_layers 1 or 7",
        id="uniform-chunks-past-a-stage",
    ),
    pytest.param(
        {"overrides": ["actor_rollout_ref.rollout.data_parallel_size=0"]},
        ("rollout-data-parallel", "spec.overrides[0] (actor_rollout_ref.rollout.data_parallel_size)"),
        ["rollout data_parallel_size 0", "ZeroDivisionError"],
        "use data_parallel_size=1",
        id="rollout-dp-0",
    ),
]


@pytest.mark.parametrize(("sections", "where", "words", "suggestion"), ROWS)
def test_refused_at_admission(
    sections: dict[str, Any], where: tuple[str, str], words: list[str], suggestion: str
) -> None:
    result = plan(sections)
    assert not result.feasible
    found = [v for v in result.violations if (v.rule, v.field) == where]
    assert found, [v.one_line() for v in result.violations]
    (v,) = found
    for word in words:
        assert word in v.message, v.message
    assert any(s.startswith(suggestion) for s in v.suggestions), v.suggestions


@pytest.mark.parametrize(
    "sections",
    [
        pytest.param({"model": shaped(MOE, numExpertsPerTok=8)}, id="topk-equal-to-a-sub-count"),
        pytest.param({"model": shaped(QWEN7B, kvHeads=7)}, id="kv-heads-7-of-28"),
        pytest.param({"model": shaped(MOE, firstKDenseReplace=3)}, id="three-dense-layers"),
        pytest.param(
            {"overrides": [*uniform(7), "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=4"]},
            id="uniform-chunk-of-a-whole-stage",
        ),
        pytest.param({"overrides": uniform(2)}, id="uniform-chunks-the-search-fits"),
    ],
)
def test_the_nearest_valid_inputs_plan(sections: dict[str, Any]) -> None:
    result = plan(sections)
    assert result.feasible, [v.one_line() for v in result.violations]
