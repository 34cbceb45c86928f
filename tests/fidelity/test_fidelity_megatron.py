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


#: Model types judged by verl 0.6.1's own Megatron registry: the catalog's, and others users train, dense
#: (Qwen2.5-7B's numbers) and mixture-of-experts (Qwen3-30B-A3B's).
DENSE_TYPES = ("llama", "qwen2", "qwen3", "gemma", "gemma2", "mistral", "phi3")
MOE_TYPES = ("qwen3_moe", "qwen2_moe", "mixtral")


def test_verl_0_6s_megatron_registry_builds_what_the_planner_accepts(
    verl_runners: dict[str, VerlRunner],
) -> None:
    """Rule megatron-model against verl 0.6.1's ``hf_to_mcore_config`` lookup (``verl_runner_megatron``'s
    ``megatron_model`` stage): each model type's Megatron spec is refused by the planner exactly when verl's
    registry has no converter for its architecture; verl gets the command line of the same spec's Qwen plan."""
    from verl_operator.api.spec import VerlJobSpec
    from verl_operator.manifests.launchspec import LaunchPlan, entrypoint
    from verl_operator.planner import catalog
    from verl_operator.planner.job import plan_job

    nodes = _nodes("dgx-h100.yaml")
    requests, verdicts = [], {}
    for types, model in ((DENSE_TYPES, "Qwen/Qwen2.5-7B-Instruct"), (MOE_TYPES, "Qwen/Qwen3-30B-A3B")):
        base = _spec("0.6", {"model": {"path": model}, "parallelism": {"engine": "megatron"}})
        planned = plan_job(base, nodes)
        assert planned.plan is not None, planned.violations
        argv = (
            *entrypoint(LaunchPlan.from_plan(planned.plan, base).training_engine),
            *planned.plan.overrides,
        )
        entry = catalog.lookup(model)
        assert entry is not None
        for model_type in types:
            shape = {**entry.shape.to_wire(), "modelType": model_type}
            doc = base.model_dump(mode="json", by_alias=True, exclude_none=True)
            doc["model"] = {"path": f"/models/{model_type}", "shape": shape}
            result = plan_job(VerlJobSpec.model_validate(doc), nodes)
            rules = {v.rule for v in result.violations}
            assert result.feasible or rules == {"megatron-model"}, (model_type, result.violations)
            verdicts[model_type] = result.feasible
            requests.append(CheckRequest(model_type, argv=argv, model_shape=shape))
    results = {r.id: r for r in verl_runners[RELEASE["0.6"]].check(requests)}
    for model_type, accepted in verdicts.items():
        r = results[model_type]
        assert r.ok or r.stage == "megatron_model", (model_type, r)
        assert r.ok == accepted, (model_type, accepted, r.stage, r.error_type, r.error)
    # both verdicts occur: the registry builds Qwen, Llama and Mixtral, not Gemma, Mistral or Phi-3
    assert {t for t, ok in verdicts.items() if not ok} == {"gemma", "gemma2", "mistral", "phi3"}
