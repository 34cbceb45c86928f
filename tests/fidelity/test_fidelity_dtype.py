"""``spec.model.dtype: float16`` reaches verl: the composed config of the planner's overrides has float16 for
vLLM and for FSDP's parameters (actor, ref and, on 0.9, the critic), and bfloat16 (verl's default) otherwise.
A T4 node set (compute capability 7.5) is the cluster: bfloat16 is refused there, float16 planned."""

from __future__ import annotations

from typing import Any

import pytest
from plan_sample import RELEASE, make_node, model_shape
from verl_client import CheckRequest, VerlRunner

planner = pytest.importorskip("verl_operator.planner", reason="verl_operator.planner cannot be imported")

ROLLOUT, ACTOR, REF = (
    "actor_rollout_ref.rollout.dtype",
    "actor_rollout_ref.actor.fsdp_config.dtype",
    "actor_rollout_ref.ref.fsdp_config.dtype",
)


def _spec(version: str, dtype: str, algorithm: str) -> Any:
    from verl_operator.api.spec import VerlJobSpec

    return VerlJobSpec.model_validate(
        {
            "verl": {"image": "example.com/verl:test", "version": version},
            "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct", "dtype": dtype},
            "algorithm": algorithm,
            "resources": {"gpus": 4},
            "data": {"trainFiles": ["/data/train.parquet"], "maxPromptLength": 256, "maxResponseLength": 256},
        }
    )


def _t4_nodes() -> list[dict[str, Any]]:
    nodes = [make_node(f"t4-{i}", 4, "Tesla-T4", 15360) for i in range(2)]
    for node in nodes:
        node["metadata"]["labels"]["nvidia.com/gpu.compute.major"] = "7"
        node["metadata"]["labels"]["nvidia.com/gpu.compute.minor"] = "5"
    return nodes


@pytest.mark.parametrize("version", sorted(RELEASE))
def test_float16_reaches_verls_config(verl_runners: dict[str, VerlRunner], version: str) -> None:
    cases = [("float16", "grpo"), ("bfloat16", "grpo")] + ([("float16", "ppo")] if version == "0.9" else [])
    requests, expected = [], []
    for dtype, algorithm in cases:
        spec = _spec(version, dtype, algorithm)
        nodes = (
            _t4_nodes() if dtype == "float16" else [make_node("h100-0", 8, "NVIDIA-H100-80GB-HBM3", 81559)]
        )
        result = planner.plan_job(spec, nodes)
        assert result.feasible, [v.one_line() for v in result.violations]
        keys = (ROLLOUT, ACTOR, REF) + (("critic.fsdp.dtype",) if algorithm == "ppo" else ())
        requests.append(
            CheckRequest(
                f"{version}-{dtype}-{algorithm}",
                overrides=tuple(result.plan.overrides),
                model_shape=model_shape(spec),
                read_keys=keys,
            )
        )
        expected.append({k: dtype for k in keys})
    results = verl_runners[RELEASE[version]].check(requests)
    for request, result, want in zip(requests, results, expected, strict=True):
        assert result.ok, (request.id, result.stage, result.error)
        assert result.values is not None
        got = {k: str(result.values[k]).replace("bf16", "bfloat16") for k in want}
        assert got == want, request.id


def test_bfloat16_is_refused_on_t4_and_float16_with_a_06_critic() -> None:
    refused = planner.plan_job(_spec("0.9", "bfloat16", "grpo"), _t4_nodes())
    assert not refused.feasible and "bfloat16 needs 8.0" in refused.violations[0].message
    critic = planner.plan_job(_spec("0.6", "float16", "ppo"), _t4_nodes())
    assert not critic.feasible and critic.violations[0].field == "spec.model.dtype"
