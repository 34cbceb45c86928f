"""GPU nodes as real clusters label them (GPU Operator, time-slicing, MIG, GKE, Karpenter, a bare label): what
the planner reads from each, and whether and why it refuses it. The fixtures and their sources are in
``data/gpu-nodes.yaml``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import make_spec

from verl_contract.gpu_product import same_product
from verl_operator.planner import plan_job
from verl_operator.planner.cluster import exclusion_reason
from verl_operator.planner.facts import node_facts
from verl_operator.planner.gpu_labels import compute_from_product, read_gpu_labels

FIXTURES: list[dict[str, Any]] = yaml.safe_load(
    (Path(__file__).parent / "data" / "gpu-nodes.yaml").read_text()
)


def _node(fixture: dict[str, Any], name: str | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": name or fixture["id"], "labels": dict(fixture["labels"])},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "96", "memory": "1Ti", **fixture["allocatable"]},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def test_the_fixtures_cover_every_label_style() -> None:
    ids = {f["id"] for f in FIXTURES}
    assert len(ids) == len(FIXTURES), "fixture ids repeat"
    assert all(f.get("source") for f in FIXTURES), "every fixture names its source"
    refused = [f["expect"].get("refused", "") for f in FIXTURES]
    for phrase in ("time-sliced", "MIG", "mixed strategy", "bfloat16", "nvidia.com/gpu.product"):
        assert any(phrase in r for r in refused), phrase
    styles = {k.split("/")[0] for f in FIXTURES for k in f["labels"]}
    assert {"nvidia.com", "cloud.google.com", "karpenter.k8s.aws"} <= styles


@pytest.mark.parametrize("fixture", FIXTURES, ids=[f["id"] for f in FIXTURES])
def test_node_facts_from_real_label_styles(fixture: dict[str, Any]) -> None:
    expect = fixture["expect"]
    facts = node_facts(_node(fixture))
    assert facts.gpus == expect["gpus"]
    assert facts.gpu_product == expect["product"]
    assert (facts.gpu_memory_mib, facts.gpu_memory_source) == (expect["memoryMiB"], expect["memorySource"])
    if "nvlink" in expect:
        assert facts.nvlink_domain_size == expect["nvlink"]
    if "compute" in expect:
        assert facts.compute_capability == tuple(expect["compute"])
    if "physical" in expect:
        assert facts.gpus // facts.gpu_replicas == expect["physical"]
    reason = exclusion_reason(facts, make_spec(gpus=1))
    if "refused" in expect:
        assert reason is not None and expect["refused"] in reason, reason
    else:
        assert reason is None, reason


def test_a_stock_gpu_operator_node_set_plans_a_job() -> None:
    """The GPU Operator writes mig.strategy=single on every node: two such DGX H100 nodes host a 16-GPU job."""
    fixture = next(f for f in FIXTURES if f["id"] == "gpu-operator-dgx-h100")
    nodes = [_node(fixture, f"dgx-{i}") for i in range(2)]
    result = plan_job(make_spec(gpus=16), nodes)
    assert result.feasible, [v.one_line() for v in result.violations]
    assert result.plan is not None and result.plan.nnodes == 2


def test_time_sliced_and_mig_nodes_are_refused_with_their_own_reasons() -> None:
    by_id = {f["id"]: f for f in FIXTURES}
    nodes = [_node(by_id["time-sliced-a100-renamed"], "shared"), _node(by_id["mig-single"], "mig")]
    result = plan_job(make_spec(gpus=8), nodes)
    assert not result.feasible
    text = " ".join(v.one_line() for v in result.violations)
    assert "shared: time-sliced replicas of one GPU" in text and "whole GPUs" in text, text
    assert "mig: MIG 1g.5gb slices" in text, text


def test_float16_runs_where_bfloat16_cannot() -> None:
    t4 = next(f for f in FIXTURES if f["id"] == "t4-bf16")
    facts = node_facts(_node(t4))
    spec = make_spec(gpus=1)
    fp16 = spec.model_copy(update={"model": spec.model.model_copy(update={"dtype": "float16"})})
    assert exclusion_reason(facts, spec) is not None
    assert exclusion_reason(facts, fp16) is None


def test_unknown_gpu_memory_says_which_label_and_takes_the_spec_value() -> None:
    bare = next(f for f in FIXTURES if f["id"] == "bare-present-label")
    facts = node_facts(_node(bare))
    reason = exclusion_reason(facts, make_spec(gpus=1))
    assert (
        reason is not None and "spec.resources.gpuMemoryMiB" in reason and "nvidia.com/gpu.memory" in reason
    )
    spec = make_spec(gpus=8, resources={"gpus": 8, "gpuMemoryMiB": 81920})
    assert exclusion_reason(facts, spec) is None
    result = plan_job(spec, [_node(bare)])
    assert result.feasible, [v.one_line() for v in result.violations]
    assert result.plan is not None and result.plan.node_pool.gpu_memory_mib == 81920


@pytest.mark.parametrize(
    ("labels", "resources", "mig", "sharing"),
    [
        pytest.param({"nvidia.com/mig.strategy": "single"}, {}, None, None, id="strategy-alone-is-not-mig"),
        pytest.param({"nvidia.com/mig.strategy": "mixed"}, {}, None, None, id="mixed-without-slices"),
        pytest.param({}, {"nvidia.com/mig-1g.10gb": "0"}, None, None, id="zero-slices-offered"),
        pytest.param({"nvidia.com/gpu.replicas": "0"}, {}, None, None, id="replicas-0-no-sharing-config"),
        pytest.param({"nvidia.com/gpu.sharing-strategy": "none"}, {}, None, None, id="sharing-none"),
        pytest.param(
            {"nvidia.com/gpu.product": "X-MIG-1g.5gb-SHARED"}, {}, "MIG 1g.5gb", "SHARED", id="mig-shared"
        ),
    ],
)
def test_what_is_and_is_not_mig_or_sharing(
    labels: dict[str, str], resources: dict[str, str], mig: str | None, sharing: str | None
) -> None:
    reading = read_gpu_labels(labels, resources)
    assert (reading.mig is None) == (mig is None) and (mig is None or mig in str(reading.mig))
    assert (reading.sharing is None) == (sharing is None) and (
        sharing is None or sharing in str(reading.sharing)
    )


@pytest.mark.parametrize(
    ("product", "expected"),
    [
        pytest.param("Tesla-V100-SXM2-16GB", (7, 0), id="v100"),
        pytest.param("NVIDIA-A10G", (8, 6), id="a10g-not-a10"),
        pytest.param("NVIDIA-L4", (8, 9), id="l4"),
        pytest.param("NVIDIA-GB200", (10, 0), id="gb200-not-b200"),
        pytest.param("Mystery-9000", None, id="unknown"),
    ],
)
def test_compute_capability_from_the_product(product: str, expected: tuple[int, int] | None) -> None:
    assert compute_from_product(product) == expected


@pytest.mark.parametrize(
    ("cloud", "nvidia_smi"),
    [
        pytest.param("nvidia-h100-80gb", "NVIDIA H100 80GB HBM3", id="gke-h100"),
        pytest.param("nvidia-tesla-t4", "Tesla T4", id="gke-t4"),
        pytest.param("nvidia-tesla-a100", "NVIDIA A100-SXM4-40GB", id="gke-a100"),
        pytest.param("nvidia-l4", "NVIDIA L4", id="gke-l4"),
    ],
)
def test_a_cloud_product_is_what_the_launcher_will_see(cloud: str, nvidia_smi: str) -> None:
    """The product read from a cloud label is the one the launcher's check compares with nvidia-smi's names."""
    product = read_gpu_labels({"cloud.google.com/gke-accelerator": cloud}, {}).product
    assert same_product(product, nvidia_smi), product


def test_float16_flows_into_verls_overrides() -> None:
    t4 = next(f for f in FIXTURES if f["id"] == "t4-bf16")
    spec = make_spec(gpus=4, model="Qwen/Qwen2.5-0.5B-Instruct")
    fp16 = spec.model_copy(update={"model": spec.model.model_copy(update={"dtype": "float16"})})
    result = plan_job(fp16, [_node(t4)])
    assert result.feasible and result.plan is not None, [v.one_line() for v in result.violations]
    overrides = set(result.plan.overrides)
    assert {
        "actor_rollout_ref.rollout.dtype=float16",
        "actor_rollout_ref.actor.fsdp_config.dtype=float16",
        "actor_rollout_ref.ref.fsdp_config.dtype=float16",
    } <= overrides
    bf16 = plan_job(spec, [_node(next(f for f in FIXTURES if f["id"] == "gpu-operator-dgx-h100"))])
    assert bf16.plan is not None and not any("dtype" in o for o in bf16.plan.overrides)


@pytest.mark.parametrize(
    ("fixture_id", "selector"),
    [
        pytest.param("gke-h100", {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}, id="gke"),
        pytest.param("karpenter-p5", {"karpenter.k8s.aws/instance-gpu-name": "h100"}, id="karpenter"),
        pytest.param(
            "gpu-operator-dgx-h100", {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, id="gpu-operator"
        ),
    ],
)
def test_pods_a_scheduler_places_select_the_pool_by_the_label_its_nodes_carry(
    fixture_id: str, selector: dict[str, str]
) -> None:
    """Kueue and Volcano place the pods by their nodeSelector: on nodes without GFD that is the cloud's label."""
    from verl_operator.commands.render import render

    fixture = next(f for f in FIXTURES if f["id"] == fixture_id)
    nodes = [_node(fixture, f"n-{i}") for i in range(2)]
    spec = make_spec(gpus=16).model_dump(mode="json", by_alias=True, exclude_none=True)
    job = {"kind": "VerlJob", "metadata": {"name": "j", "namespace": "ns"}, "spec": spec}
    for scheduling in ({"queueName": "gpus"}, {"scheduler": "volcano"}):
        job["spec"]["scheduling"] = scheduling
        pods = [c for c in render(job, nodes) if c["kind"] == "Pod"]
        assert len(pods) == 2
        for pod in pods:
            assert pod["spec"]["nodeSelector"] == selector, pod["spec"].get("nodeSelector")
