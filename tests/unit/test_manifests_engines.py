"""The Ray pods of each rollout engine, rendered from the engine example jobs' plans: the engine is on every
pod's labels, every pod has its memory-backed /dev/shm, and the launch spec runs the plan's overrides with
the engine the plan chose."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from verl_operator.api.spec import VerlJobSpec
from verl_operator.commands.plan import load_nodes
from verl_operator.manifests import LaunchPlan, build_children
from verl_operator.manifests.children import DEFAULT_SHM
from verl_operator.manifests.names import LABEL_ENGINE
from verl_operator.planner import plan_job

ROOT = Path(__file__).parents[2]


def _children(job_file: str, **spec_update: Any) -> tuple[VerlJobSpec, list[dict[str, Any]]]:
    job = yaml.safe_load((ROOT / "examples" / "jobs" / job_file).read_text())
    doc = {**job["spec"], **spec_update}
    spec = VerlJobSpec.model_validate(doc)
    result = plan_job(spec, load_nodes(str(ROOT / "examples" / "clusters" / "dgx-h100.yaml")))
    assert result.feasible and result.plan is not None, [v.one_line() for v in result.violations]
    nodes = [f"n{i}" for i in range(result.plan.nnodes)]
    plan = LaunchPlan.from_plan(result.plan, spec, nodes)
    return spec, build_children(job, spec, plan, attempt=0)


@pytest.mark.parametrize(
    ("job_file", "engine"),
    [
        ("grpo-qwen7b-dgx.yaml", "vllm"),
        ("sglang-multiturn-dgx.yaml", "sglang"),
        ("trtllm-grpo-dgx.yaml", "trtllm"),
    ],
)
def test_pods_carry_the_engine_and_a_memory_backed_shm(job_file: str, engine: str) -> None:
    _, children = _children(job_file)
    pods = [c for c in children if c["kind"] == "Pod"]
    assert pods
    for pod in pods:
        assert pod["metadata"]["labels"][LABEL_ENGINE] == engine
        [shm] = [v for v in pod["spec"]["volumes"] if v["name"] == "dshm"]
        assert shm["emptyDir"] == {"medium": "Memory", "sizeLimit": DEFAULT_SHM}
        mounts = pod["spec"]["containers"][0]["volumeMounts"]
        assert {"name": "dshm", "mountPath": "/dev/shm"} in mounts
    [configmap] = [c for c in children if c["kind"] == "ConfigMap"]
    launch = next(iter(configmap["data"].values()))
    assert f"actor_rollout_ref.rollout.name={engine}" in launch


def test_the_shm_size_of_the_spec_wins_for_every_engine() -> None:
    spec, _ = _children("sglang-multiturn-dgx.yaml")
    resources = {**spec.resources.to_wire(), "shmSize": "128Gi"}
    _, children = _children("sglang-multiturn-dgx.yaml", resources=resources)
    for pod in (c for c in children if c["kind"] == "Pod"):
        [shm] = [v for v in pod["spec"]["volumes"] if v["name"] == "dshm"]
        assert shm["emptyDir"]["sizeLimit"] == "128Gi"
