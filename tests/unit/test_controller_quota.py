"""The job-wide quota check at admission (``controller/quota.py``): every ResourceQuota limit the whole job
can never fit (pods, CPU, memory, GPUs, extended resources, requests and limits) denies it, naming the field
and the quota; a quota each pod fits alone is no longer enough."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import make_nodes

from verl_operator.api.spec import VerlJobSpec
from verl_operator.controller.dryrun import job_pods
from verl_operator.controller.quota import job_totals, quota_problems
from verl_operator.controller.webhook import check_admission

SPEC = VerlJobSpec.model_validate(
    {
        "verl": {"image": "example.com/verl:0.9.1"},
        "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
        "resources": {"gpus": 16, "gpusPerNode": 8, "cpuPerNode": "48", "memoryPerNode": "256Gi"},
    }
)


def pods(spec: VerlJobSpec = SPEC) -> list[dict[str, Any]]:
    checked = check_admission(spec.to_wire(), None, make_nodes(3, gpus=8))
    assert checked.plan is not None, checked.problems
    return job_pods("j", "team", spec, checked.plan, None)


def quota(name: str, hard: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "team"}, "spec": {"hard": hard, **spec}}


def test_the_totals_add_every_pod() -> None:
    found = pods()
    totals = job_totals(found)
    assert len(found) == 2
    assert totals["pods"] == 2 and totals["requests.nvidia.com/gpu"] == 16
    assert totals["requests.cpu"] == 96 and totals["cpu"] == 96
    assert totals["requests.memory"] == 2 * 256 * 2**30


@pytest.mark.parametrize(
    ("hard", "line"),
    [
        pytest.param(
            {"pods": "1"},
            "spec.resources.gpusPerNode: the job's 2 Ray pods in all exceed ResourceQuota team/q (pods: 1 < 2)",
            id="pods",
        ),
        pytest.param(
            {"count/pods": "1"},
            "spec.resources.gpusPerNode: the job's 2 Ray pods in all exceed ResourceQuota team/q (count/pods: 1 < 2); "
            "raise the quota or use more GPUs per pod (fewer pods)",
            id="count-pods",
        ),
        pytest.param(
            {"requests.cpu": "64"},
            "spec.resources.cpuPerNode: the job's 2 Ray pods' requests.cpu (96 in all) exceed ResourceQuota team/q "
            "(requests.cpu: 64 < 96); raise the quota or lower spec.resources.cpuPerNode",
            id="requests-cpu",
        ),
        pytest.param(
            {"requests.memory": "300Gi"},
            "spec.resources.memoryPerNode: the job's 2 Ray pods' requests.memory (512Gi in all) exceed",
            id="requests-memory",
        ),
        pytest.param(
            {"requests.nvidia.com/gpu": "12"},
            "spec.resources.gpus: the job's 16 GPUs in all exceed ResourceQuota team/q (requests.nvidia.com/gpu: 12 < 16)",
            id="gpus",
        ),
        pytest.param({"memory": "1Ti"}, None, id="memory-fits"),
        pytest.param({"pods": "2", "requests.nvidia.com/gpu": "16"}, None, id="exactly-fits"),
    ],
)
def test_a_limit_the_whole_job_never_fits(hard: dict[str, str], line: str | None) -> None:
    found = pods()
    problems = quota_problems([quota("q", hard)], job_totals(found), len(found))
    if line is None:
        assert problems == []
    else:
        assert len(problems) == 1 and problems[0].startswith(line), problems


def test_limits_and_extended_resources_count_too() -> None:
    found = pods()
    for pod in found:
        ray = pod["spec"]["containers"][0]["resources"]
        ray.setdefault("limits", {}).update({"rdma/ib": "1", "cpu": "50"})
        ray.setdefault("requests", {})["rdma/ib"] = "1"
    problems = quota_problems(
        [quota("q", {"requests.rdma/ib": "1", "limits.cpu": "64"})], job_totals(found), 2
    )
    assert [p.split(" exceed ")[0] for p in problems] == [
        "spec.resources.cpuPerNode: the job's 2 Ray pods' limits.cpu (100 in all)",
        "spec.resources: the job's 2 Ray pods' requests.rdma/ib (2 in all)",
    ]


@pytest.mark.parametrize(
    ("scope", "priority", "applies"),
    [
        pytest.param({"scopes": ["NotTerminating"]}, None, True, id="not-terminating"),
        pytest.param({"scopes": ["Terminating"]}, None, False, id="terminating"),
        pytest.param(
            {
                "scopeSelector": {
                    "matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]
                }
            },
            "high",
            True,
            id="priority-in",
        ),
        pytest.param(
            {
                "scopeSelector": {
                    "matchExpressions": [{"scopeName": "PriorityClass", "operator": "In", "values": ["high"]}]
                }
            },
            "low",
            False,
            id="priority-other",
        ),
        pytest.param({"scopes": ["SomethingNew"]}, None, False, id="unknown-scope-left-to-the-dry-run"),
    ],
)
def test_scoped_quotas(scope: dict[str, Any], priority: str | None, applies: bool) -> None:
    found = pods()
    problems = quota_problems([quota("q", {"pods": "1"}, **scope)], job_totals(found), 2, priority)
    assert bool(problems) == applies
