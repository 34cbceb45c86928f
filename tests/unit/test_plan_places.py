"""Property: a plan that is feasible on an empty cluster is placeable there, one Ray pod per planned node.

For generated specs on every shipped cluster profile (``examples/clusters``), ``plan_job`` and ``render``
(plan, place on the idle cluster, build the children) must agree: a feasible plan renders without error, with
``nnodes`` pods on ``nnodes`` distinct nodes of the planned pool, each asking for ``gpusPerNode`` GPUs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from verl_contract.gpu_product import same_product
from verl_operator.api.spec import VerlJobSpec
from verl_operator.commands.plan import load_nodes
from verl_operator.commands.render import render
from verl_operator.placement import plan_candidates
from verl_operator.planner import plan_job
from verl_operator.planner.facts import node_facts

CLUSTERS = sorted((Path(__file__).parents[2] / "examples" / "clusters").glob("*.yaml"))
MODELS = [
    "Qwen/Qwen2.5-0.5B-Instruct",
    "Qwen/Qwen2.5-7B-Instruct",
    "Qwen/Qwen3-8B",
    "Qwen/Qwen2.5-32B-Instruct",
]


@st.composite
def jobs(draw: st.DrawFn, nodes: list[dict[str, Any]]) -> dict[str, Any]:
    total = sum(int(n["status"]["allocatable"].get("nvidia.com/gpu", 0)) for n in nodes)
    products = sorted({n["metadata"]["labels"].get("nvidia.com/gpu.product", "") for n in nodes} - {""})
    spec: dict[str, Any] = {
        "verl": {"image": "verl:x", "version": draw(st.sampled_from(["0.6", "0.9"]))},
        "model": {"path": draw(st.sampled_from(MODELS))},
        "algorithm": draw(st.sampled_from(["grpo", "ppo", "rloo"])),
        "resources": {"gpus": draw(st.sampled_from(sorted({1, 2, 4, 8, 16, 32, total})))},
    }
    if products and draw(st.booleans()):
        # Any spelling of a product in the cluster: the label, nvidia-smi's name, lower case.
        label = draw(st.sampled_from(products))
        spec["resources"]["gpuProduct"] = draw(
            st.sampled_from([label, label.replace("-", " "), label.lower()])
        )
    if draw(st.booleans()):
        spec["rollout"] = {"tensorParallelSize": draw(st.sampled_from([1, 2, 4, 8]))}
    if draw(st.booleans()):
        spec["placement"] = {"nvlink": "required"}
    return {
        "apiVersion": "verl-operator.io/v1alpha1",
        "kind": "VerlJob",
        "metadata": {"name": "p"},
        "spec": spec,
    }


@pytest.mark.parametrize("cluster", CLUSTERS, ids=lambda p: p.stem)
def test_a_feasible_plan_renders_one_pod_per_planned_node(cluster: Path) -> None:
    nodes = load_nodes(str(cluster))

    @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(job=jobs(nodes))
    def check(job: dict[str, Any]) -> None:
        result = plan_job(VerlJobSpec.model_validate(job["spec"]), nodes)
        if not result.feasible or result.plan is None:
            return
        plan = result.plan
        pods = [c for c in render(job, nodes) if c["kind"] == "Pod"]
        placed = [p["metadata"]["annotations"]["verl-operator.io/node"] for p in pods]
        assert len(pods) == plan.nnodes and len(set(placed)) == plan.nnodes, (placed, plan.nnodes)
        facts = [node_facts(n) for n in nodes]
        assert set(placed) <= set(plan_candidates(plan, VerlJobSpec.model_validate(job["spec"]), facts))
        by_name = {n["metadata"]["name"]: n for n in nodes}
        for pod, name in zip(pods, placed, strict=True):
            # The product as the planner reads it (GFD's label without a suffix, or a cloud's label).
            product = node_facts(by_name[name]).gpu_product
            assert product and same_product(product, plan.node_pool.gpu_product)
            limits = pod["spec"]["containers"][0]["resources"]["limits"]
            assert int(limits["nvidia.com/gpu"]) == plan.gpus_per_node

    check()
