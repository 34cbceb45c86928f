"""Megatron plans pass verl's own config code in both releases.

Specs that select the Megatron engine (dense and MoE models, pinned and searched TP/PP, with and without a
critic, static and dynamic batch size) are planned on shipped cluster profiles; each feasible plan's command
line, as the launcher builds it (``python3 -m verl.trainer.main_ppo --config-name=ppo_megatron_trainer
<overrides>``), is composed by verl's Hydra config and checked by verl's own code (``verl_runner.py``:
``validate_config``, the dataclasses, the rollout registry) in the environment of its release. The planner's
Megatron sizes must be the ones verl composes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from plan_sample import RELEASE, model_shape
from verl_client import CheckRequest, VerlRunner

ROOT = Path(__file__).parents[2]
ARR = "actor_rollout_ref"
#: (label, spec sections, cluster profile)
CASES: list[tuple[str, dict[str, Any], str]] = [
    ("dense-searched", {"parallelism": {"engine": "megatron"}}, "dgx-h100.yaml"),
    (
        "dense-32b-searched",
        {"model": {"path": "Qwen/Qwen2.5-32B-Instruct"}, "parallelism": {"engine": "megatron"}},
        "dgx-h100.yaml",
    ),
    (
        "dense-tp2-pp2-ppo",
        {
            "algorithm": "ppo",
            "parallelism": {"megatron": {"tensorParallelSize": 2, "pipelineParallelSize": 2}},
        },
        "dgx-h100.yaml",
    ),
    (
        "dense-strategy-override-dynamic",
        {
            "batching": {"dynamicBatchSize": True},
            "overrides": [
                f"{ARR}.actor.strategy=megatron",
                f"{ARR}.actor.megatron.tensor_model_parallel_size=4",
            ],
        },
        "dgx-h100.yaml",
    ),
    (
        "dense-config-name-vpp",
        {
            "overrides": [
                "--config-name=ppo_megatron_trainer",
                f"{ARR}.actor.megatron.pipeline_model_parallel_size=2",
                f"{ARR}.actor.megatron.virtual_pipeline_model_parallel_size=2",
                f"{ARR}.ref.megatron.pipeline_model_parallel_size=2",
                f"{ARR}.ref.megatron.virtual_pipeline_model_parallel_size=2",
            ]
        },
        "dgx-h100.yaml",
    ),
    (
        "moe-ep8",
        {
            "model": {"path": "Qwen/Qwen3-30B-A3B"},
            "parallelism": {"megatron": {"expertParallelSize": 8}},
        },
        "dgx-h100.yaml",
    ),
    ("dense-gb200", {"parallelism": {"engine": "megatron"}}, "gb200-nvl72.yaml"),
]


def _spec(version: str, sections: dict[str, Any]) -> Any:
    from verl_operator.api.spec import VerlJobSpec

    doc: dict[str, Any] = {
        "verl": {"image": "example.com/verl", "version": version},
        "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
        "algorithm": "grpo",
        "data": {"trainBatchSize": 64, "maxPromptLength": 512, "maxResponseLength": 1024},
        "resources": {"gpus": 16},
    }
    for key, value in sections.items():
        doc[key] = {**doc.get(key, {}), **value} if isinstance(value, dict) else value
    doc["rollout"] = {"responsesPerPrompt": 8}
    return VerlJobSpec.model_validate(doc)


def _nodes(profile: str) -> list[dict[str, Any]]:
    from verl_operator.clusters.profile import node_manifests, read_profile

    return node_manifests(read_profile(ROOT / "examples" / "clusters" / profile))


@pytest.mark.parametrize("line", sorted(RELEASE))
def test_megatron_plans_pass_verl(verl_runners: dict[str, VerlRunner], line: str) -> None:
    from verl_operator.manifests.launchspec import LaunchPlan, entrypoint
    from verl_operator.planner.job import plan_job

    requests, planned = [], []
    for label, sections, profile in CASES:
        spec = _spec(line, sections)
        result = plan_job(spec, _nodes(profile))
        assert result.plan is not None, (label, result.violations)
        assert result.plan.training is not None and result.plan.training.engine == "megatron", label
        argv = (*entrypoint(LaunchPlan.from_plan(result.plan, spec).training_engine), *result.plan.overrides)
        keys = (
            *tuple(
                f"{section}.megatron.{k}"
                for section in (f"{ARR}.actor", f"{ARR}.ref")
                for k in (
                    "tensor_model_parallel_size",
                    "pipeline_model_parallel_size",
                    "expert_model_parallel_size",
                )
            ),
            f"{ARR}.actor.strategy",
        )
        requests.append(
            CheckRequest(f"{line}-{label}", argv=argv, model_shape=model_shape(spec), read_keys=keys)
        )
        planned.append((label, result.plan))
    # A control that must fail: the first plan with TP 3, which 16 GPUs do not divide by (verl's
    # validate_config), so a pass above is verl's judgement of the Megatron keys, not a check that skips them.
    bad = tuple(
        o.replace("tensor_model_parallel_size=", "tensor_model_parallel_size=3#").split("#")[0]
        if "megatron.tensor_model_parallel_size=" in o
        else o
        for o in requests[0].argv
    )
    requests.append(CheckRequest(f"{line}-control-tp3", argv=bad, model_shape=requests[0].model_shape))
    *results, control = verl_runners[RELEASE[line]].check(requests)
    assert not control.ok and "divisible" in (control.error or ""), control
    failures = [
        f"{label}: {r.stage} {r.error_type}: {r.error}\n  {' '.join(plan.overrides)}"
        for (label, plan), r in zip(planned, results, strict=True)
        if not r.ok
    ]
    assert not failures, "\n".join(failures)
    for (label, plan), r in zip(planned, results, strict=True):
        t = plan.training
        assert r.values is not None and t is not None
        assert r.values[f"{ARR}.actor.strategy"] == "megatron", label
        for section in (f"{ARR}.actor", f"{ARR}.ref"):
            assert r.values[f"{section}.megatron.tensor_model_parallel_size"] == t.tensor_parallel_size, label
            assert r.values[f"{section}.megatron.pipeline_model_parallel_size"] == t.pipeline_parallel_size, (
                label
            )
            assert r.values[f"{section}.megatron.expert_model_parallel_size"] == t.expert_parallel_size, label
