"""Placement of a job of two pools (verl's trainer pool and its standalone rollout pool) as one gang: tables of
which nodes each pool gets, the pods' pool labels, and one Kueue workload for both pools."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_operator.commands.plan import load_nodes
from verl_operator.commands.render import render
from verl_operator.manifests.names import LABEL_INDEX, LABEL_POOL
from verl_operator.placement import NodeCapacity, PlacementRequest, place
from verl_operator.placement.request import request_from_plan
from verl_operator.planner import plan_job
from verl_operator.planner.facts import NETWORK_DOMAINS

ROOT = Path(__file__).parents[2]
H100 = "NVIDIA-H100-80GB-HBM3"
RACK = "network.topology.nvidia.com/leaf"
BLOCK = "network.topology.nvidia.com/spine"
KUEUE_GROUP = "kueue.x-k8s.io/pod-group-name"
KUEUE_COUNT = "kueue.x-k8s.io/pod-group-total-count"


def node(name: str, rack: str, block: str = "s1", gpus: int = 8, nvlink: int | None = None) -> NodeCapacity:
    return NodeCapacity(
        name=name,
        labels={RACK: rack, BLOCK: block},
        gpus=gpus,
        gpu_product=H100,
        nvlink_domain_size=gpus if nvlink is None else nvlink,
    )


def pools_request(trainer: int, rollout: int, gpn: int = 8, **kw: Any) -> PlacementRequest:
    """A two-pool job without a topology policy, as ``request_from_plan`` builds it."""
    return PlacementRequest(
        nnodes=trainer + rollout,
        gpus_per_node=gpn,
        preferred_domains=NETWORK_DOMAINS,
        trainer_nnodes=trainer,
        pool_domains=NETWORK_DOMAINS,
        **kw,
    )


FOUR_RACKS = [node("a0", "a"), node("b0", "b"), node("c0", "c"), node("d0", "d"), node("d1", "d")]


@pytest.mark.parametrize(
    ("nodes", "request_", "used", "trainer", "rollout"),
    [
        pytest.param(
            [node("dgx-0", "a1"), node("dgx-1", "a1"), node("dgx-2", "a2"), node("dgx-3", "a2")],
            pools_request(1, 1),
            {},
            ("dgx-0",),
            ("dgx-1",),
            id="separate-async-16-gpus-one-rack-holds-both-pools-and-the-weight-sync",
        ),
        pytest.param(
            [node("dgx-0", "a1"), node("dgx-1", "a1"), node("dgx-2", "a2"), node("dgx-3", "a2")],
            pools_request(1, 1),
            {"dgx-0": 8},
            ("dgx-2",),
            ("dgx-3",),
            id="a-busy-node-moves-both-pools-to-the-other-rack-not-across-racks",
        ),
        pytest.param(
            [node("dgx-0", "a1"), node("dgx-1", "a1"), node("dgx-2", "a2"), node("dgx-3", "a2")],
            pools_request(2, 1),
            {"dgx-0": 8},
            ("dgx-2", "dgx-3"),
            ("dgx-1",),
            # Best fit by name would give the trainer dgx-1 and dgx-2: a trainer pool over two racks.
            id="separate-async-24-gpus-a-busy-node-the-trainer-keeps-one-rack",
        ),
        pytest.param(
            FOUR_RACKS,
            pools_request(2, 2),
            {},
            ("d0", "d1"),
            ("a0", "b0"),
            # Best fit by name alone would take a0, b0, c0, d0: a trainer pool over two racks.
            id="no-rack-holds-the-job-the-trainer-takes-the-only-rack-that-holds-it",
        ),
        pytest.param(
            [
                node("a0", "a"),
                node("a1", "a"),
                node("b0", "b"),
                node("c0", "c", block="s2"),
                node("d0", "d", block="s2"),
            ],
            pools_request(2, 2, gpn=4),
            {"c0": 4, "d0": 4},
            ("a0", "a1"),
            ("b0", "c0"),
            # Best fit alone would take c0 and d0 (4 GPUs free each); b0 shares the trainer's block.
            id="the-rollout-pool-goes-nearest-the-trainer-first-its-block",
        ),
        pytest.param(
            [
                node("a0", "a"),
                node("a1", "a"),
                node("a2", "a"),
                node("b0", "b"),
                node("b1", "b"),
                node("b2", "b"),
            ],
            pools_request(2, 2),
            {},
            ("a0", "a1"),
            ("a2", "b0"),
            id="the-rollout-pool-fills-the-trainer-rack-before-the-block",
        ),
        pytest.param(
            [node("p0", "a", nvlink=2), node("p1", "a", nvlink=2), node("s0", "a")],
            pools_request(1, 1, nvlink_required=True, nvlink_group_size=2, rollout_replica_gpus=4),
            {},
            ("p0",),
            ("s0",),
            id="nvlink-required-a-tp4-replica-needs-a-node-whose-domain-holds-it",
        ),
        pytest.param(
            [node("s0", "a"), node("p0", "a", nvlink=2), node("p1", "a", nvlink=2)],
            pools_request(1, 1, rollout_replica_gpus=4),
            {},
            ("p0",),
            ("s0",),
            id="nvlink-preferred-the-trainer-leaves-the-linked-node-to-the-rollout",
        ),
    ],
)
def test_two_pool_placement_table(
    nodes: list[NodeCapacity],
    request_: PlacementRequest,
    used: dict[str, int],
    trainer: tuple[str, ...],
    rollout: tuple[str, ...],
) -> None:
    got = place(request_, nodes, used)
    assert got.feasible, got.message
    t = got.trainer_nodes
    assert t == len(trainer)
    assert (got.nodes[:t], got.nodes[t:]) == (trainer, rollout), got.message
    assert f"trainer pool on {', '.join(trainer)}" in got.message


def test_nvlink_required_without_a_node_for_a_replica_waits() -> None:
    nodes = [node("p0", "a", nvlink=2), node("p1", "a", nvlink=2)]
    request_ = pools_request(1, 1, nvlink_required=True, nvlink_group_size=2, rollout_replica_gpus=4)
    got = place(request_, nodes, {})
    assert not got.feasible
    assert got.nodes == ()
    assert (
        "1 of them for the rollout pool with an NVLink domain that holds a replica of 4 GPUs" in got.message
    )


def test_a_one_pool_job_places_as_before() -> None:
    nodes = [node("dgx-0", "a1"), node("dgx-1", "a1"), node("dgx-2", "a2")]
    plain = PlacementRequest(nnodes=2, gpus_per_node=8, preferred_domains=NETWORK_DOMAINS)
    got = place(plain, nodes, {})
    assert got.nodes == ("dgx-0", "dgx-1")
    assert got.trainer_nodes == 0
    assert "pool" not in got.message


def _example(name: str) -> dict[str, Any]:
    loaded = yaml.safe_load((ROOT / "examples" / "jobs" / name).read_text())
    assert isinstance(loaded, dict)
    return loaded


DGX = load_nodes(str(ROOT / "examples" / "clusters" / "dgx-h100.yaml"))


def test_request_from_the_separate_async_plan_names_the_pools() -> None:
    from verl_operator.api.spec import VerlJob

    job = VerlJob.model_validate(_example("async-separate-qwen7b-dgx.yaml"))
    result = plan_job(job.spec, DGX)
    assert result.plan is not None and result.plan.pools is not None
    rollout = result.plan.pools.rollout
    assert rollout is not None
    request_ = request_from_plan(result.plan, job.spec)
    assert (request_.nnodes, request_.trainer_nnodes) == (2, 1)
    assert request_.rollout_replica_gpus == rollout.tensor_parallel_size * rollout.data_parallel_size
    assert request_.pool_domains == NETWORK_DOMAINS


@pytest.mark.parametrize(
    ("example", "pools"),
    [
        ("async-separate-qwen7b-dgx.yaml", ["trainer", "rollout"]),
        ("async-fully-qwen7b-dgx.yaml", ["trainer", "rollout"]),
        ("async-one-step-off-qwen7b-dgx.yaml", ["both", "both"]),
        ("async-colocate-qwen7b-dgx.yaml", ["both"]),
        ("grpo-qwen7b-dgx.yaml", [None, None]),
    ],
)
def test_rendered_pods_carry_their_pool_and_share_one_rack(example: str, pools: list[str | None]) -> None:
    pods = [c for c in render(_example(example), DGX) if c["kind"] == "Pod"]
    pods.sort(key=lambda p: int(p["metadata"]["labels"][LABEL_INDEX]))
    assert [p["metadata"]["labels"].get(LABEL_POOL) for p in pods] == pools
    racks = {n["metadata"]["name"]: n["metadata"]["labels"][RACK] for n in DGX}
    placed = [p["metadata"]["annotations"]["verl-operator.io/node"] for p in pods]
    assert len(set(placed)) == len(pods)
    assert len({racks[n] for n in placed}) == 1  # both pools and the weight sync inside one rack


def test_kueue_gets_one_workload_for_both_pools() -> None:
    job = _example("async-separate-qwen7b-dgx.yaml")
    job["spec"]["scheduling"] = {"queueName": "gpu"}
    pods = [c for c in render(job, DGX) if c["kind"] == "Pod"]
    assert len(pods) == 2
    groups = {p["metadata"]["labels"][KUEUE_GROUP] for p in pods}
    counts = {p["metadata"]["annotations"][KUEUE_COUNT] for p in pods}
    assert len(groups) == 1 and counts == {"2"}
    assert sorted(p["metadata"]["labels"][LABEL_POOL] for p in pods) == ["rollout", "trainer"]
    gpus = {p["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] for p in pods}
    assert gpus == {"8"}  # pods of one size: one gang


@settings(max_examples=150, deadline=None)
@given(
    node_set=st.lists(
        st.tuples(st.sampled_from([4, 8]), st.integers(0, 8), st.sampled_from(["r0", "r1", "r2"])),
        min_size=1,
        max_size=12,
    ),
    trainer=st.integers(1, 3),
    rollout=st.integers(1, 3),
    gpus_per_node=st.sampled_from([2, 4, 8]),
    seed=st.integers(0, 1000),
)
def test_two_pool_placement_invariants(
    node_set: list[tuple[int, int, str]], trainer: int, rollout: int, gpus_per_node: int, seed: int
) -> None:
    """Choosing per pool never loses a gang the one-pool search places, depends on no input order, and keeps
    the trainer pool inside one rack whenever a rack has enough free nodes for it."""
    nodes = [node(f"n{i:02d}", rack, gpus=gpus) for i, (gpus, _, rack) in enumerate(node_set)]
    used = {f"n{i:02d}": min(u, gpus) for i, (gpus, u, _) in enumerate(node_set)}
    request_ = pools_request(trainer, rollout, gpn=gpus_per_node)
    got = place(request_, nodes, used)
    plain = place(
        PlacementRequest(
            nnodes=trainer + rollout, gpus_per_node=gpus_per_node, preferred_domains=NETWORK_DOMAINS
        ),
        nodes,
        used,
    )
    assert got.feasible == plain.feasible
    shuffled = list(nodes)
    random.Random(seed).shuffle(shuffled)
    assert place(request_, shuffled, used) == got, "placement depends on input order"
    if not got.feasible:
        assert got.nodes == () and got.trainer_nodes == 0
        return
    assert len(set(got.nodes)) == len(got.nodes) == trainer + rollout and got.trainer_nodes == trainer
    assert all(n.gpus - used[n.name] >= gpus_per_node for n in nodes if n.name in got.nodes)
    racks = {n.name: n.labels[RACK] for n in nodes}
    fits = [n for n in nodes if n.gpus - used[n.name] >= gpus_per_node]
    if any(sum(1 for n in fits if n.labels[RACK] == r) >= trainer for r in ("r0", "r1", "r2")):
        assert len({racks[n] for n in got.nodes[:trainer]}) == 1, got.message
