"""The plan's Mesh numbers and their consumers agree: the search's report, placement, the pods, ``launch.json``
and the launcher's check of every node, on the shipped cluster profiles and example jobs.

A consumer that derived a number with its own rule would disagree with a plan whose Mesh says otherwise:
``test_consumers_read_the_plan_not_a_rule_of_their_own`` feeds such plans.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import make_nodes, make_spec
from hypothesis import HealthCheck, given, settings
from test_plan_places import jobs

from verl_contract.launch_spec import LaunchSpec
from verl_launcher.check import check_node
from verl_launcher.gpus import Gpu
from verl_launcher.probe import NodeProbe
from verl_launcher.spec import parse_launch_spec
from verl_launcher.topology import Topology
from verl_operator.api.plan import Plan
from verl_operator.api.spec import VerlJobSpec
from verl_operator.commands.plan import load_nodes
from verl_operator.commands.render import RenderError, render
from verl_operator.manifests import LaunchPlan, build_children
from verl_operator.placement import plan_candidates, request_from_plan
from verl_operator.planner import plan_job
from verl_operator.planner.facts import node_facts
from verl_operator.planner.mesh import pod_cpu

ROOT = Path(__file__).parents[2]
CLUSTERS = {p.stem: p for p in sorted((ROOT / "examples" / "clusters").glob("*.yaml"))}
EXAMPLE_JOBS = {
    "gb200-clique": "gb200-nvl72",
    "grpo-qwen7b-dgx": "dgx-h100",
    "l40s-tp2-nvlink": "l40s",
}
MODELS = ("Qwen/Qwen2.5-0.5B-Instruct", "Qwen/Qwen2.5-7B-Instruct")


def _job(spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "verl-operator.io/v1alpha1",
        "kind": "VerlJob",
        "metadata": {"name": "m", "namespace": "default"},
        "spec": spec,
    }


def _table() -> list[tuple[str, dict[str, Any]]]:
    """Jobs per shipped profile: GPU counts, TP, NVLink and CPU pins, both verl lines, the example jobs."""
    cases = []
    for cluster in CLUSTERS:
        for gpus in (1, 2, 4, 8, 16):
            for tp, nvlink, cpu, version in (
                (None, None, None, "0.9"),
                (2, "required", None, "0.6"),
                (4, "required", "40", "0.9"),
                (8, "required", None, "0.9"),
                (1, None, "9500m", "0.6"),
            ):
                spec: dict[str, Any] = {
                    "verl": {"image": "verl:x", "version": version},
                    "model": {"path": MODELS[0] if gpus <= 4 else MODELS[1]},
                    "resources": {"gpus": gpus},
                }
                if tp is not None:
                    spec["rollout"] = {"tensorParallelSize": tp}
                if nvlink is not None:
                    spec["placement"] = {"nvlink": nvlink}
                if cpu is not None:
                    spec["resources"]["cpuPerNode"] = cpu
                cases.append((cluster, _job(spec)))
    for name, cluster in EXAMPLE_JOBS.items():
        job = yaml.safe_load((ROOT / "examples" / "jobs" / f"{name}.yaml").read_text())
        job["metadata"]["namespace"] = "default"
        cases.append((cluster, job))
    return cases


@functools.cache
def _nodes(cluster: str) -> list[dict[str, Any]]:
    return load_nodes(str(CLUSTERS[cluster]))


def _plan_of(cluster: str, job: dict[str, Any]) -> Plan | None:
    return plan_job(VerlJobSpec.model_validate(job["spec"]), _nodes(cluster)).plan


def _row_id(cluster: str, job: dict[str, Any]) -> str:
    spec = job["spec"]
    res = spec["resources"]
    tp = (spec.get("rollout") or {}).get("tensorParallelSize")
    nvlink = (spec.get("placement") or {}).get("nvlink", "any")
    return f"{cluster}-{job['metadata']['name']}-{res['gpus']}gpu-tp{tp}-nvlink-{nvlink}-cpu{res.get('cpuPerNode')}"


def _feasible_rows() -> list[Any]:
    """The rows that plan (``test_the_table_plans_on_every_profile`` keeps them many, on every profile)."""
    return [
        pytest.param(cluster, job, id=_row_id(cluster, job))
        for cluster, job in _table()
        if _plan_of(cluster, job) is not None
    ]


def _probe(node: dict[str, Any], plan: Plan) -> NodeProbe:
    """What the launcher sees in a pod of ``plan`` on ``node``: the pod's GPUs, NVLinked within the node's domains."""
    facts = node_facts(node)
    domain = facts.nvlink_domain_size
    gpus = plan.gpus_per_node
    links = tuple(
        tuple("X" if i == j else ("NV12" if i // domain == j // domain else "SYS") for j in range(gpus))
        for i in range(gpus)
    )
    name = facts.gpu_product.replace("-", " ")  # nvidia-smi's spelling of the label
    return NodeProbe(
        node=facts.name,
        gpus=tuple(Gpu(i, name, facts.gpu_memory_mib) for i in range(gpus)),
        topology=Topology(gpus, links),
    )


def _launch_spec(children: list[dict[str, Any]]) -> LaunchSpec:
    configmap = next(c for c in children if c["kind"] == "ConfigMap")
    return parse_launch_spec(json.loads(configmap["data"]["launch.json"]))


@pytest.mark.parametrize(("cluster", "job"), _feasible_rows())
def test_every_consumer_uses_the_plans_mesh(cluster: str, job: dict[str, Any]) -> None:
    nodes = _nodes(cluster)
    spec = VerlJobSpec.model_validate(job["spec"])
    plan = _plan_of(cluster, job)
    assert plan is not None

    # The search's report: the Mesh's numbers, checked against their definitions.
    b = plan.batching
    assert plan.world_size == plan.nnodes * plan.gpus_per_node
    assert plan.data_parallel_size == plan.world_size // plan.sequence_parallel_size
    assert plan.rollout.replicas == plan.world_size // plan.rollout.tensor_parallel_size
    assert b.mini_batch_per_gpu == b.ppo_mini_batch_size * b.rollout_n // plan.data_parallel_size
    if b.ppo_micro_batch_size_per_gpu is not None:
        assert b.mini_batch_per_gpu % b.ppo_micro_batch_size_per_gpu == 0
    group = max(plan.rollout.tensor_parallel_size, plan.sequence_parallel_size)
    assert plan.nvlink_group_size == (group if spec.placement.nvlink == "required" else 1)
    assert plan.nvlink_group_per_node == min(plan.nvlink_group_size, plan.gpus_per_node)
    assert plan.cpu_per_node == (spec.resources.cpu_per_node or str(3 * plan.gpus_per_node + 2))

    # Placement asks for the plan's pods and NVLink group.
    request = request_from_plan(plan, spec)
    assert (request.nnodes, request.gpus_per_node, request.nvlink_group_size) == (
        plan.nnodes,
        plan.gpus_per_node,
        plan.nvlink_group_size,
    )

    # The pods: one per planned node, the plan's GPUs and CPUs each.
    children = render(job, nodes)
    pods = [c for c in children if c["kind"] == "Pod"]
    assert len(pods) == plan.nnodes
    for pod in pods:
        res = pod["spec"]["containers"][0]["resources"]
        assert res["limits"]["nvidia.com/gpu"] == res["requests"]["nvidia.com/gpu"] == str(plan.gpus_per_node)
        assert res["requests"]["cpu"] == plan.cpu_per_node

    # launch.json and the launcher's check of every chosen node.
    launch = _launch_spec(children)
    assert (launch.nnodes, launch.gpus_per_node, launch.total_gpus) == (
        plan.nnodes,
        plan.gpus_per_node,
        plan.world_size,
    )
    assert launch.expect.nvlink_group_size == plan.nvlink_group_per_node
    assert launch.expect.require_nvlink is (spec.placement.nvlink == "required")
    by_name = {n["metadata"]["name"]: n for n in nodes}
    for pod in pods:
        node = by_name[pod["metadata"]["annotations"]["verl-operator.io/node"]]
        assert check_node(_probe(node, plan), launch) == []


def test_the_table_plans_on_every_profile() -> None:
    # The skips above must not hide a profile: each has feasible rows, and those with NVLink have
    # feasible rows with ``nvlink: required`` (L40S nodes have no NVLink, PCIe A100s bridged pairs only).
    feasible: dict[str, int] = {}
    nvlink: dict[str, int] = {}
    for cluster, job in _table():
        if _plan_of(cluster, job) is not None:
            feasible[cluster] = feasible.get(cluster, 0) + 1
            if (job["spec"].get("placement") or {}).get("nvlink") == "required":
                nvlink[cluster] = nvlink.get(cluster, 0) + 1
    assert set(feasible) == set(CLUSTERS), feasible
    assert set(nvlink) >= set(CLUSTERS) - {"l40s"}, nvlink
    assert sum(feasible.values()) >= 60, feasible


def test_a_group_spanning_nodes_passes_the_launchers_check() -> None:
    # gb200-clique: rollout TP 8 over nodes of 4 GPUs in one clique. Each node's 4 GPUs are one NVLink domain; the
    # launch spec once asked the launcher for aligned groups of 8 on a 4-GPU node and every launch failed.
    nodes = load_nodes(str(CLUSTERS["gb200-nvl72"]))
    job = yaml.safe_load((ROOT / "examples" / "jobs" / "gb200-clique.yaml").read_text())
    plan = plan_job(VerlJobSpec.model_validate(job["spec"]), nodes).plan
    assert plan is not None and (plan.nvlink_group_size, plan.gpus_per_node) == (8, 4)
    children = render(job, nodes)
    launch = _launch_spec(children)
    assert launch.expect.nvlink_group_size == 4
    candidates = plan_candidates(
        plan, VerlJobSpec.model_validate(job["spec"]), [node_facts(n) for n in nodes]
    )
    node = next(n for n in nodes if n["metadata"]["name"] in candidates)
    assert check_node(_probe(node, plan), launch) == []


def _dgx_plan(**spec: Any) -> tuple[VerlJobSpec, Plan]:
    nodes = load_nodes(str(CLUSTERS["dgx-h100"]))
    parsed = VerlJobSpec.model_validate(
        {"verl": {"image": "verl:x"}, "model": {"path": "Qwen/Qwen2.5-7B-Instruct"}, **spec}
    )
    plan = plan_job(parsed, nodes).plan
    assert plan is not None
    return parsed, plan


@pytest.mark.parametrize(
    ("update", "cpu", "gpus", "nvlink"),
    [
        pytest.param({"cpu_per_node": "7"}, "7", 8, 4, id="cpu"),
        pytest.param({"nvlink_group_per_node": 2}, "26", 8, 2, id="nvlink-per-node"),
        pytest.param({"gpus_per_node": 4, "nnodes": 4}, "26", 4, 4, id="gpus-per-node"),
        # A plan of an earlier release has neither field: the Mesh's rules give the same values.
        pytest.param({"cpu_per_node": None, "nvlink_group_per_node": None}, "26", 8, 4, id="earlier-plan"),
    ],
)
def test_consumers_read_the_plan_not_a_rule_of_their_own(
    update: dict[str, Any], cpu: str, gpus: int, nvlink: int
) -> None:
    spec, plan = _dgx_plan(
        resources={"gpus": 16}, rollout={"tensorParallelSize": 4}, placement={"nvlink": "required"}
    )
    assert (plan.cpu_per_node, plan.gpus_per_node, plan.nvlink_group_per_node) == ("26", 8, 4)
    changed = plan.model_copy(update=update)
    launch_plan = LaunchPlan.from_plan(changed, spec, nodes=[f"n{i}" for i in range(changed.nnodes)])
    children = build_children(
        {"metadata": {"name": "m", "namespace": "default", "uid": "u"}}, spec, launch_plan, 0
    )
    pods = [c for c in children if c["kind"] == "Pod"]
    assert len(pods) == changed.nnodes
    for pod in pods:
        requests = pod["spec"]["containers"][0]["resources"]["requests"]
        assert (requests["cpu"], requests["nvidia.com/gpu"]) == (cpu, str(gpus))
    launch = _launch_spec(children)
    assert (launch.gpus_per_node, launch.expect.nvlink_group_size) == (gpus, nvlink)
    assert request_from_plan(changed, spec).gpus_per_node == gpus


@pytest.mark.parametrize(
    ("cpu", "feasible"), [(None, True), ("200", True), ("224", True), ("225", False), ("224001m", False)]
)
def test_the_node_filter_and_the_pods_use_one_cpu_request(cpu: str | None, feasible: bool) -> None:
    # The profile's nodes offer 224 CPUs: a pod asking more has no candidate; one that fits asks exactly that.
    nodes = load_nodes(str(CLUSTERS["dgx-h100"]))
    assert {node_facts(n).cpu_millicores for n in nodes} == {224_000}
    resources: dict[str, Any] = {"gpus": 8} if cpu is None else {"gpus": 8, "cpuPerNode": cpu}
    job = _job(
        {"verl": {"image": "verl:x"}, "model": {"path": "Qwen/Qwen2.5-7B-Instruct"}, "resources": resources}
    )
    result = plan_job(VerlJobSpec.model_validate(job["spec"]), nodes)
    assert result.feasible is feasible, result.violations
    if not feasible:
        assert [v.rule for v in result.violations] == ["not-enough-gpus"]
        return
    assert result.plan is not None
    assert result.plan.cpu_per_node == pod_cpu(cpu, 8) == (cpu or "26")
    pods = [c for c in render(job, nodes) if c["kind"] == "Pod"]
    assert {p["spec"]["containers"][0]["resources"]["requests"]["cpu"] for p in pods} == {pod_cpu(cpu, 8)}


@pytest.mark.parametrize(
    "scheduling", [{"queueName": "gpu-queue"}, {"scheduler": "volcano"}], ids=["kueue", "volcano"]
)
@pytest.mark.parametrize("model", MODELS)
def test_pods_another_scheduler_places_keep_to_the_planned_pool(
    scheduling: dict[str, str], model: str
) -> None:
    # On the mixed profile (H100, L40S, A100 PCIe) without a gpuProduct in the spec, the plan is for one pool and
    # launch.json expects that pool's product. Kueue and Volcano choose the nodes themselves: the pods' node
    # selector names the same product, or a pod could land on another pool and fail the launcher's check.
    nodes = _nodes("mixed")
    spec = VerlJobSpec.model_validate(
        {
            "verl": {"image": "verl:x"},
            "model": {"path": model},
            "resources": {"gpus": 8},
            "scheduling": scheduling,
        }
    )
    plan = plan_job(spec, nodes).plan
    assert plan is not None
    launch_plan = LaunchPlan.from_plan(plan, spec)
    children = build_children(
        {"metadata": {"name": "m", "namespace": "default", "uid": "u"}}, spec, launch_plan, 0
    )
    launch = _launch_spec(children)
    assert launch.expect.gpu_product == plan.node_pool.gpu_product
    pods = [c for c in children if c["kind"] == "Pod"]
    assert len(pods) == plan.nnodes
    for pod in pods:
        assert "affinity" not in pod["spec"], "the other scheduler chooses the nodes"
        assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": plan.node_pool.gpu_product}


@pytest.mark.parametrize("cluster", sorted(CLUSTERS))
def test_a_feasible_plan_passes_the_launchers_check_on_every_chosen_node(cluster: str) -> None:
    # For generated specs (products in any spelling, pinned TP, NVLink required or not) on every shipped profile:
    # plan feasible on an empty cluster => each rendered pod asks the plan's GPUs and CPUs, and the launcher's
    # check of the node it is placed on, against that pod's launch.json, finds nothing.
    nodes = _nodes(cluster)
    by_name = {n["metadata"]["name"]: n for n in nodes}

    @settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(job=jobs(nodes))
    def check(job: dict[str, Any]) -> None:
        plan = plan_job(VerlJobSpec.model_validate(job["spec"]), nodes).plan
        if plan is None:
            return
        children = render(job, nodes)
        launch = _launch_spec(children)
        assert launch.expect.nvlink_group_size == plan.nvlink_group_per_node
        for pod in (c for c in children if c["kind"] == "Pod"):
            requests = pod["spec"]["containers"][0]["resources"]["requests"]
            assert (requests["cpu"], requests["nvidia.com/gpu"]) == (
                plan.cpu_per_node,
                str(plan.gpus_per_node),
            )
            node = by_name[pod["metadata"]["annotations"]["verl-operator.io/node"]]
            assert check_node(_probe(node, plan), launch) == []

    check()


@pytest.mark.parametrize(
    ("cliques", "tp", "placed_in"),
    [
        pytest.param((4,), 8, "c0", id="one-clique"),
        pytest.param((3, 4), 8, "c1", id="the-clique-of-four"),
        pytest.param((4, 4), 4, None, id="groups-inside-nodes"),
        # Groups of 8 (two nodes) fit two cliques of two nodes each, but placement keeps a job whose group spans
        # nodes in one clique: the planner once called this feasible, and it then waited for capacity forever.
        pytest.param((2, 2), 8, "infeasible", id="two-cliques-of-two"),
        pytest.param((3, 3), 8, "infeasible", id="two-cliques-of-three"),
    ],
)
def test_the_planner_and_placement_agree_on_nvlink_cliques(
    cliques: tuple[int, ...], tp: int, placed_in: str | None
) -> None:
    nodes = [
        node
        for i, count in enumerate(cliques)
        for node in make_nodes(
            count, 4, "NVIDIA-GB200", 189471, labels={"nvidia.com/gpu.clique": f"c{i}"}, prefix=f"c{i}"
        )
    ]
    spec = make_spec(
        16,
        model="Qwen/Qwen2.5-32B-Instruct",
        rollout={"tensorParallelSize": tp},
        placement={"nvlink": "required"},
    )
    result = plan_job(spec, nodes)
    if placed_in == "infeasible":
        assert not result.feasible
        assert "nvlink-domain" in {v.rule for v in result.violations}
        return
    assert result.plan is not None, result.violations
    job = _job(spec.model_dump(mode="json", by_alias=True, exclude_unset=True))
    try:
        pods = [c for c in render(job, nodes) if c["kind"] == "Pod"]
    except RenderError as exc:  # a feasible plan on an empty cluster must place
        pytest.fail(f"feasible but not placed: {exc}")
    placed = {p["metadata"]["annotations"]["verl-operator.io/node"] for p in pods}
    assert len(placed) == result.plan.nnodes == 4
    if placed_in is not None:
        assert {name.split("-")[0] for name in placed} == {placed_in}
