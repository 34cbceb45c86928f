"""Every ``Algorithm`` in both dialects: the plan passes verl's own checks, with verl building the critic.

The plans are checked without the runner adding any model path (``fill_model_paths=False``), so a PPO plan
must name ``critic.model.path`` itself: verl's default (``~/models/deepseek-llm-7b-chat``) names no local
folder, and the ``dataclass:critic_model`` stage builds the critic's model config as the release's critic
worker does (verl 0.9.1's ``validate_config`` already builds it). ``test_a_critic_without_its_model_fails``
shows the check can fail.
"""

from __future__ import annotations

from typing import Any

import pytest
from plan_sample import RELEASE, make_node, model_shape
from verl_client import CheckRequest, VerlRunner

from verl_operator.api.spec import Algorithm, VerlJobSpec
from verl_operator.planner import plan_job

NODES = [make_node(f"a{i}", 8, "NVIDIA-H100-80GB-HBM3", 81559) for i in range(2)]
#: Layouts each algorithm is planned in: a plain one, Ulysses SP with dynamic batch size, and 2 nodes.
LAYOUTS: tuple[dict[str, Any], ...] = (
    {"resources": {"gpus": 8}},
    {
        "resources": {"gpus": 8},
        "parallelism": {"sequenceParallelSize": 2},
        "batching": {"dynamicBatchSize": True},
    },
    {"resources": {"gpus": 16}, "critic": {"model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"}}},
)


def _spec(line: str, algorithm: Algorithm, layout: dict[str, Any]) -> VerlJobSpec:
    body: dict[str, Any] = {
        "verl": {"image": "verl:test", "version": line},
        "model": {"path": "Qwen/Qwen2.5-3B-Instruct"},
        "algorithm": algorithm.value,
        **layout,
    }
    if not algorithm.needs_critic:
        body.pop("critic", None)
    return VerlJobSpec.model_validate(body)


@pytest.mark.parametrize("line", sorted(RELEASE))
def test_every_algorithm_plan_passes_verl(verl_runners: dict[str, VerlRunner], line: str) -> None:
    requests: list[CheckRequest] = []
    for algorithm in Algorithm:
        for index, layout in enumerate(LAYOUTS):
            spec = _spec(line, algorithm, layout)
            result = plan_job(spec, NODES)
            assert result.plan is not None, (algorithm, layout, result.violations)
            critic = [o for o in result.plan.overrides if o.startswith("critic.model.path=")]
            assert bool(critic) is algorithm.needs_critic, result.plan.overrides
            requests.append(
                CheckRequest(
                    f"{algorithm.value}-{index}",
                    tuple(result.plan.overrides),
                    (),
                    model_shape(spec),
                    fill_model_paths=False,
                )
            )
    results = verl_runners[RELEASE[line]].check(requests)
    failures = [f"{r.id}: {r.stage}: {r.error_type}: {r.error}" for r in results if not r.ok]
    assert not failures, "\n".join(failures)
    assert len(results) == len(Algorithm) * len(LAYOUTS)


@pytest.mark.parametrize("line", sorted(RELEASE))
def test_a_critic_without_its_model_fails(verl_runners: dict[str, VerlRunner], line: str) -> None:
    spec = _spec(line, Algorithm.PPO, LAYOUTS[0])
    result = plan_job(spec, NODES)
    assert result.plan is not None
    without = tuple(o for o in result.plan.overrides if not o.startswith("critic.model.path="))
    (checked,) = verl_runners[RELEASE[line]].check(
        [CheckRequest("no-critic-path", without, (), model_shape(spec), fill_model_paths=False)]
    )
    # 0.9.1's validate_config already builds the critic's model config; 0.6.1 leaves it to the worker.
    assert not checked.ok and checked.stage in ("validate_config", "dataclass:critic_model"), checked
    assert "deepseek-llm-7b-chat" in (checked.error or ""), checked
