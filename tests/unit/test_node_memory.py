"""A node must offer the Ray pod's memory request: the planner filters on it as the scheduler will."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import make_nodes, make_spec

from verl_operator.manifests import LaunchPlan
from verl_operator.manifests.children import build_children
from verl_operator.planner import plan_job
from verl_operator.planner.facts import memory_bytes, node_facts


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("2Ti", 2 * 1024**4),
        ("1031828Ki", 1031828 * 1024),
        ("128Gi", 128 * 1024**3),
        ("128G", 128 * 10**9),
        ("1.5Gi", int(1.5 * 1024**3)),
        ("500M", 500 * 10**6),
        ("1e9", 10**9),
        ("123456789", 123456789),
        ("12k", 12000),
        (None, None),
        ("lots", None),
        ("-5Gi", None),
        ("5 Gi", None),
        ("", None),
    ],
)  # fmt: skip
def test_memory_quantities(raw: str | None, expected: int | None) -> None:
    assert memory_bytes(raw) == expected


def _with_memory(nodes: list[dict[str, Any]], memory: str) -> list[dict[str, Any]]:
    for n in nodes:
        n["status"]["allocatable"]["memory"] = memory
    return nodes


def test_nodes_without_the_pods_memory_are_not_candidates() -> None:
    """8-GPU pods request 16Gi per GPU (128Gi): a node with 100Gi allocatable never schedules one."""
    small = _with_memory(make_nodes(1), "100Gi")
    assert node_facts(small[0]).memory_bytes == 100 * 1024**3
    result = plan_job(make_spec(8), small)
    assert not result.feasible
    (v,) = result.violations
    assert v.rule == "not-enough-gpus"
    assert any("128Gi per 8 GPUs" in s and "memoryPerNode" in s for s in v.suggestions), v.suggestions
    # Asking less per pod makes the same nodes candidates again, and the pod asks what was checked.
    fitted = plan_job(make_spec(8, resources={"memoryPerNode": "96Gi"}), small)
    assert fitted.plan is not None, fitted.violations
    # On two such nodes the planner takes 4 GPUs on each (64Gi pods), which they can hold.
    split = plan_job(make_spec(8), _with_memory(make_nodes(2), "100Gi"))
    assert split.plan is not None and split.plan.gpus_per_node == 4


def test_the_pods_request_is_what_the_planner_checked() -> None:
    spec = make_spec(8)
    nodes = _with_memory(make_nodes(2), "128Gi")  # exactly the request
    result = plan_job(spec, nodes)
    assert result.plan is not None, result.violations
    job = {"metadata": {"name": "demo", "namespace": "default", "uid": "1111"}}
    plan = LaunchPlan.from_plan(result.plan, spec, nodes=result.plan.nodes)
    pods = [c for c in build_children(job, spec, plan, 0) if c["kind"] == "Pod"]
    requests = {p["spec"]["containers"][0]["resources"]["requests"]["memory"] for p in pods}
    assert requests == {"128Gi"}
    assert memory_bytes("128Gi") == node_facts(nodes[0]).memory_bytes


def test_nodes_that_report_no_memory_are_not_filtered() -> None:
    nodes = make_nodes(1)
    for n in nodes:
        del n["status"]["allocatable"]["memory"]
        del n["status"]["capacity"]["memory"]
    assert plan_job(make_spec(8), nodes).feasible
