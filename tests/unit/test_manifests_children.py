"""The pure child builders: snapshots (whole manifests) plus the contract's rules checked field by field.

Regenerate the snapshots after an intended change with
``VERL_OPERATOR_UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest tests/unit/test_manifests_children.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_operator.api.spec import VerlJobSpec
from verl_operator.manifests import (
    ChildNames,
    LaunchPlan,
    build_children,
    build_head_pod,
    build_launch_configmap,
    build_service,
    build_worker_pod,
)

SNAPSHOTS = Path(__file__).parent / "snapshots"
JOB = {"metadata": {"name": "demo", "namespace": "team-a", "uid": "1111-2222"}}
PLAN = LaunchPlan(
    verl_version="0.9",
    nnodes=2,
    gpus_per_node=8,
    overrides=("algorithm.adv_estimator=grpo", "trainer.nnodes=2", "trainer.n_gpus_per_node=8"),
    nvlink_group_size=2,
    require_nvlink=True,
    gpu_product="NVIDIA-H100-80GB-HBM3",
    gpu_memory_mib=81559,
    nodes=("dgx-0", "dgx-1"),
)


def make_spec(**overrides: Any) -> VerlJobSpec:
    base: dict[str, Any] = {
        "verl": {"image": "registry.example/verl:0.9.1"},
        "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
        "resources": {"gpus": 16, "gpusPerNode": 8},
        "placement": {"nvlink": "required"},
        "checkpoint": {"dir": "/checkpoints/demo"},
    }
    for key, value in overrides.items():
        base[key] = {**base.get(key, {}), **value} if isinstance(value, dict) else value
    return VerlJobSpec.model_validate(base)


def check_snapshot(name: str, value: Any) -> None:
    """``value`` equals the checked-in snapshot ``name``; a missing snapshot fails (it is written only when
    asked for, so deleting one never passes)."""
    path = SNAPSHOTS / f"{name}.yaml"
    text = yaml.safe_dump(value, sort_keys=True)
    regenerate = f"VERL_OPERATOR_UPDATE_SNAPSHOTS=1 .venv/bin/python -m pytest {_caller_file()}"
    if os.environ.get("VERL_OPERATOR_UPDATE_SNAPSHOTS") == "1":
        path.write_text(text)
    if not path.exists():
        pytest.fail(f"snapshot {path} is missing; write it with: {regenerate}")
    assert text == path.read_text(), f"{path} differs; regenerate with: {regenerate}"


def _caller_file() -> str:
    """The test file that checks the snapshot (pytest names the running test ``path::name (phase)``)."""
    return os.environ.get("PYTEST_CURRENT_TEST", Path(__file__).name).split("::")[0]


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in pod["spec"]["containers"][0]["env"]}


def test_children_snapshot() -> None:
    check_snapshot("children-dgx-2x8", build_children(JOB, make_spec(), PLAN, attempt=0))


def test_launch_spec_follows_the_contract() -> None:
    cm = build_launch_configmap(JOB, make_spec(), PLAN)
    assert cm["metadata"]["name"] == "demo-launch"
    doc = json.loads(cm["data"]["launch.json"])
    assert doc["apiVersion"] == "verl-operator.io/v1alpha1" and doc["kind"] == "LaunchSpec"
    assert doc["job"] == {"name": "demo", "namespace": "team-a", "uid": "1111-2222"}
    assert doc["head"] == {"host": "demo-head-0.demo-ray.team-a.svc", "port": 6379, "dashboardPort": 8265}
    assert doc["entrypoint"] == ["python3", "-m", "verl.trainer.main_ppo"]
    assert doc["overrides"] == list(PLAN.overrides)
    assert doc["expect"] == {
        "gpuProduct": "NVIDIA-H100-80GB-HBM3",
        "gpuMemoryMiB": 81559,
        "requireNvlink": True,
        "nvlinkGroupSize": 2,
    }
    assert doc["checkpoint"] == {"dir": "/checkpoints/demo", "resume": True}
    assert set(doc["timeouts"]) == {"clusterReadySeconds", "workerJoinSeconds"}
    assert (doc["nnodes"], doc["gpusPerNode"], doc["verlVersion"]) == (2, 8, "0.9")


def test_service_is_headless_and_resolves_the_head_host() -> None:
    svc = build_service(JOB)
    head = build_head_pod(JOB, make_spec(), PLAN, attempt=0)
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"] is True
    assert all(head["metadata"]["labels"][k] == v for k, v in svc["spec"]["selector"].items())
    host = f"{head['spec']['hostname']}.{head['spec']['subdomain']}.team-a.svc"
    assert (
        host
        == json.loads(build_launch_configmap(JOB, make_spec(), PLAN)["data"]["launch.json"])["head"]["host"]
    )


@pytest.mark.parametrize(
    ("index", "role", "node", "name"),
    [
        pytest.param(0, "head", "dgx-0", "demo-r3-head", id="head-on-node-0"),
        pytest.param(1, "worker", "dgx-1", "demo-r3-worker-1", id="worker-1"),
    ],
)
def test_pod_contract(index: int, role: str, node: str, name: str) -> None:
    spec = make_spec(
        env=[{"name": "HF_HOME", "value": "/cache"}, {"name": "VERL_OPERATOR_ROLE", "value": "x"}]
    )
    pod = (
        build_head_pod(JOB, spec, PLAN, attempt=3)
        if index == 0
        else build_worker_pod(JOB, spec, PLAN, index=index, attempt=3)
    )
    meta, pspec = pod["metadata"], pod["spec"]
    container = pspec["containers"][0]
    assert meta["name"] == name
    assert (
        meta["labels"]["verl-operator.io/job"] == "demo" and meta["labels"]["verl-operator.io/role"] == role
    )
    assert (
        meta["ownerReferences"][0]["uid"] == "1111-2222" and meta["ownerReferences"][0]["controller"] is True
    )
    assert container["command"] == ["verl-launcher", role]
    assert isinstance(container["command"], list) and "args" not in container
    env = env_of(pod)
    assert env["VERL_LAUNCH_SPEC"] == "/etc/verl-operator/launch.json"
    assert env["VERL_OPERATOR_ROLE"] == role, "a user env var must not override the operator's"
    assert env["VERL_OPERATOR_ATTEMPT"] == "3" and env["HF_HOME"] == "/cache"
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    assert env["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert "RAY_ADDRESS" not in env
    req = container["resources"]["requests"]
    assert req["nvidia.com/gpu"] == "8" == container["resources"]["limits"]["nvidia.com/gpu"]
    assert int(req["cpu"]) >= 3 * 8, "verl's placement group needs 3 CPUs per GPU"
    assert pspec["schedulingGates"] == [{"name": "verl-operator.io/gang"}]
    terms = pspec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert terms == [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}]
    shm = next(v for v in pspec["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert pspec["restartPolicy"] == "Never"


def test_one_pod_per_node_and_names_are_deterministic() -> None:
    plan = LaunchPlan(verl_version="0.9", nnodes=4, gpus_per_node=4, overrides=(), nodes=("a", "b", "c", "d"))
    first = build_children(JOB, make_spec(resources={"gpus": 16, "gpusPerNode": 4}), plan, attempt=1)
    again = build_children(JOB, make_spec(resources={"gpus": 16, "gpusPerNode": 4}), plan, attempt=1)
    assert first == again
    pods = [c for c in first if c["kind"] == "Pod"]
    assert [p["metadata"]["annotations"]["verl-operator.io/node"] for p in pods] == ["a", "b", "c", "d"]
    assert len({p["metadata"]["name"] for p in pods}) == 4
    assert sum(int(p["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"]) for p in pods) == 16


@pytest.mark.parametrize(
    ("scheduling", "gated", "extra"),
    [
        pytest.param(
            {"queueName": "gpu-queue"}, False, ("kueue.x-k8s.io/queue-name", "gpu-queue"), id="kueue"
        ),
        pytest.param({"scheduler": "volcano"}, False, ("schedulerName", "volcano"), id="volcano"),
        pytest.param({}, True, None, id="builtin"),
    ],
)
def test_scheduler_handoff(scheduling: dict[str, str], gated: bool, extra: tuple[str, str] | None) -> None:
    plan = LaunchPlan(verl_version="0.9", nnodes=2, gpus_per_node=8, overrides=())
    children = build_children(JOB, make_spec(scheduling=scheduling), plan, attempt=0)
    pod = next(c for c in children if c["kind"] == "Pod")
    assert ("schedulingGates" in pod["spec"]) is gated
    if extra is not None:
        key, value = extra
        assert pod["metadata"]["labels"].get(key, pod["spec"].get(key)) == value
    podgroups = [c for c in children if c["kind"] == "PodGroup"]
    assert len(podgroups) == (1 if scheduling.get("scheduler") == "volcano" else 0)
    if podgroups:
        assert podgroups[0]["spec"]["minMember"] == 2


def test_worker_index_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"worker index 2 outside 1\.\.1"):
        build_worker_pod(JOB, make_spec(), PLAN, index=2, attempt=0)


def test_child_names() -> None:
    names = ChildNames("demo", "ns")
    assert (names.configmap, names.service, names.pod(0, 0), names.pod(2, 5)) == (
        "demo-launch",
        "demo-ray",
        "demo-r0-head",
        "demo-r2-worker-5",
    )


@settings(max_examples=60, deadline=None)
@given(nnodes=st.integers(1, 12), gpus_per_node=st.sampled_from([1, 2, 4, 8]), attempt=st.integers(0, 5))
def test_children_invariants(nnodes: int, gpus_per_node: int, attempt: int) -> None:
    nodes = tuple(f"node-{i}" for i in range(nnodes))
    plan = LaunchPlan(
        verl_version="0.9", nnodes=nnodes, gpus_per_node=gpus_per_node, overrides=(), nodes=nodes
    )
    spec = make_spec(resources={"gpus": nnodes * gpus_per_node, "gpusPerNode": gpus_per_node})
    pods = [c for c in build_children(JOB, spec, plan, attempt) if c["kind"] == "Pod"]
    assert len(pods) == nnodes, "one pod per node"
    assert [p["metadata"]["labels"]["verl-operator.io/role"] for p in pods].count("head") == 1
    assert pods[0]["metadata"]["labels"]["verl-operator.io/role"] == "head", "the head is node 0"
    assert len({p["metadata"]["name"] for p in pods}) == nnodes
    assert len({p["spec"]["hostname"] for p in pods}) == nnodes
    pinned = [p["metadata"]["annotations"]["verl-operator.io/node"] for p in pods]
    assert pinned == list(nodes)
    total = sum(int(p["spec"]["containers"][0]["resources"]["requests"]["nvidia.com/gpu"]) for p in pods)
    assert total == nnodes * gpus_per_node
    assert all(len(p["metadata"]["name"]) <= 63 for p in pods)


@pytest.mark.parametrize(
    "user_tolerations",
    [
        pytest.param([], id="no-user-tolerations"),
        pytest.param(
            [{"key": "team", "operator": "Equal", "value": "rl", "effect": "NoSchedule"}], id="user-tol"
        ),
    ],
)
def test_pods_tolerate_every_taint_the_planner_treats_as_tolerated(
    user_tolerations: list[dict[str, str]],
) -> None:
    """The planner keeps nodes tainted with the GPU keys eligible; the pods must then really tolerate them."""
    from verl_operator.planner.cluster import TOLERATED_TAINT_KEYS

    spec = make_spec(resources={"tolerations": user_tolerations})
    pods = [build_head_pod(JOB, spec, PLAN, attempt=0)]
    pods += [build_worker_pod(JOB, spec, PLAN, index=i, attempt=0) for i in range(1, len(PLAN.nodes))]
    for pod in pods:
        tolerations = pod["spec"]["tolerations"]
        for key in TOLERATED_TAINT_KEYS:
            taint = {"key": key, "value": "present", "effect": "NoSchedule"}
            assert any(t.get("operator") == "Exists" and t.get("key") == taint["key"] for t in tolerations), (
                f"{pod['metadata']['name']} does not tolerate {taint}"
            )
        assert all(t in tolerations for t in user_tolerations)
