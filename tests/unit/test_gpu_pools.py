"""Pools by physical GPU model: nodes of one product whose labels come in different styles (GFD's, GKE's,
Karpenter's) and report its memory slightly differently are one pool, so a job uses their idle GPUs; the
nodes of fixtures in ``data/gpu-nodes.yaml``."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import make_spec
from test_controller_transitions import World
from test_gpu_labels import FIXTURES, _node

from verl_operator.planner.cluster import select
from verl_operator.planner.facts import node_facts


def fixture_nodes(fixture_id: str, count: int, prefix: str) -> list[dict[str, Any]]:
    fixture = next(f for f in FIXTURES if f["id"] == fixture_id)
    return [_node(fixture, f"{prefix}-{i}") for i in range(count)]


def test_one_model_in_three_label_styles_is_one_pool() -> None:
    nodes = [
        *fixture_nodes("gpu-operator-dgx-h100", 2, "dgx"),
        *fixture_nodes("gke-h100", 2, "gke"),
        *fixture_nodes("karpenter-p5", 2, "p5"),
        *fixture_nodes("karpenter-g5", 1, "g5"),
    ]
    pools, excluded = select([node_facts(n) for n in nodes], make_spec(gpus=8))
    assert excluded == {}
    by_product = {(p.product, p.memory_mib): [n.name for n in p.nodes] for p in pools}
    # GFD's 81559 MiB (NVML's total), the table's for GKE and Karpenter's nominal 81920: one H100 80GB pool,
    # with the smallest memory; the A10G stays apart
    assert by_product == {
        ("NVIDIA-A10G", 24576): ["g5-0"],
        ("NVIDIA-H100-80GB-HBM3", 81559): ["dgx-0", "dgx-1", "gke-0", "gke-1", "p5-0", "p5-1"],
    }
    assert [p.selector for p in pools if p.product.startswith("NVIDIA-H100")] == [()]  # no one label


def test_a_job_for_its_own_scheduler_keeps_one_product_label_per_pool() -> None:
    nodes = [*fixture_nodes("gpu-operator-dgx-h100", 1, "dgx"), *fixture_nodes("karpenter-p5", 1, "p5")]
    spec = make_spec(gpus=8, scheduling={"queueName": "gpus"})
    pools, _ = select([node_facts(n) for n in nodes], spec)
    assert [[n.name for n in p.nodes] for p in pools] == [["dgx-0"], ["p5-0"]]


def test_memory_far_apart_stays_apart() -> None:
    small = fixture_nodes("gpu-operator-dgx-h100", 1, "small")
    small[0]["metadata"]["labels"]["nvidia.com/gpu.memory"] = "40960"
    big = fixture_nodes("gpu-operator-dgx-h100", 1, "big")
    pools, _ = select([node_facts(n) for n in [*small, *big]], make_spec(gpus=8))
    assert [p.memory_mib for p in pools] == [40960, 81559]


#: An 8-GPU H100 job, by the product name GPU Feature Discovery publishes.
H100_JOB: dict[str, Any] = {
    "verl": {"image": "example.com/verl:0.9.1"},
    "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
    "resources": {"gpus": 8, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
}


def fill_dgx_nodes(world: World, count: int) -> None:
    """Read nodes from the world's own list and fill ``dgx-0`` .. ``dgx-<count-1>`` with running 8-GPU pods."""
    world.reconciler = type(world.reconciler)(
        world.kube, lambda: world.kube.snapshot(world.nodes), lambda: world.now
    )
    for i in range(count):
        world.kube.add(
            {
                "kind": "Pod",
                "metadata": {"name": f"busy-{i}", "namespace": "default", "uid": f"b{i}"},
                "spec": {
                    "nodeName": f"dgx-{i}",
                    "containers": [{"resources": {"requests": {"nvidia.com/gpu": 8}}}],
                },
                "status": {"phase": "Running"},
            }
        )


@pytest.mark.parametrize("idle_style", ["karpenter-p5", "gke-h100"])
def test_idle_h100s_in_another_label_style_take_the_job(idle_style: str) -> None:
    """Six DGX-style H100 nodes full, two more H100 nodes idle in another label style: an 8-GPU H100 job
    is placed on one of those, not left waiting on 'not eligible in the plan'."""
    world = World(
        nodes=[*fixture_nodes("gpu-operator-dgx-h100", 6, "dgx"), *fixture_nodes(idle_style, 2, "idle")]
    )
    fill_dgx_nodes(world, 6)
    world.submit(H100_JOB)
    world.reconcile()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Starting", "Placed"), status["message"]
    assert status["placement"]["nodes"][0].startswith("idle-"), status["placement"]
