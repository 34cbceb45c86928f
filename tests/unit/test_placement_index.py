"""The node index and the snapshot memo: placement as ``place`` answers it, a bounded status on 5000 nodes,
candidate nodes read from the nodes (also after a restart), plans reused until the node facts change."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import make_node, make_nodes, make_spec
from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import scale_support as S
from verl_operator.api.spec import VerlJobSpec
from verl_operator.api.status import VerlJobStatus, parse_status
from verl_operator.clusters.profile import node_manifests, parse_profile
from verl_operator.controller.cache import WatchCache
from verl_operator.controller.decide import place_job
from verl_operator.controller.observed import Observed
from verl_operator.controller.queue import waiting_entry
from verl_operator.controller.snapshot import Snapshot, SnapshotMemo, node_capacity
from verl_operator.controller.webhook import check_admission
from verl_operator.placement import NodeCapacity, PlacementRequest, place
from verl_operator.placement.index import NodeIndex
from verl_operator.planner import plan_job
from verl_operator.planner.budget import Budget
from verl_operator.planner.facts import node_facts

H100, L40S, RACK = "NVIDIA-H100-80GB-HBM3", "NVIDIA-L40S", "rack"


# ---- NodeIndex answers as place() does ------------------------------------------------------------------


@st.composite
def scenes(
    draw: st.DrawFn,
) -> tuple[list[NodeCapacity], dict[str, int], PlacementRequest, frozenset[str]]:
    count = draw(st.integers(0, 12))
    cluster = []
    for i in range(count):
        labels = {RACK: draw(st.sampled_from(["a", "b"]))} if draw(st.booleans()) else {}
        if draw(st.booleans()):
            labels["pool"] = "rl"
        cluster.append(
            NodeCapacity(
                name=f"n{draw(st.integers(0, 99)):02d}-{i}",
                labels=labels,
                gpus=draw(st.sampled_from([4, 8])),
                gpu_product=draw(st.sampled_from([H100, L40S, None])),
                nvlink_domain_size=draw(st.sampled_from([1, 2, 4, 8])),
                clique=draw(st.sampled_from([None, "c1", "c2"])),
                schedulable=draw(st.booleans()) or draw(st.booleans()),
            )
        )
    draw(st.randoms()).shuffle(cluster)
    used = {n.name: draw(st.sampled_from([0, 2, 4, 8])) for n in cluster}
    names = sorted(n.name for n in cluster)
    request = PlacementRequest(
        nnodes=draw(st.integers(1, 4)),
        gpus_per_node=draw(st.sampled_from([2, 4, 8])),
        candidates=frozenset(draw(st.sets(st.sampled_from(names))))
        if names and draw(st.booleans())
        else None,
        gpu_product=draw(st.sampled_from([None, H100, L40S])),
        node_selector={"pool": "rl"} if draw(st.booleans()) else {},
        nvlink_required=draw(st.booleans()),
        nvlink_group_size=draw(st.sampled_from([1, 2, 4, 8, 16])),
        topology_key=RACK if draw(st.booleans()) else None,
        topology_policy=draw(st.sampled_from([None, "required", "preferred"])),
        preferred_domains=draw(st.sampled_from([(), (RACK,), ("block", RACK)])),
    )
    closed = frozenset(draw(st.sets(st.sampled_from(names)))) if names else frozenset()
    return cluster, used, request, closed


@settings(max_examples=400, deadline=None)
@given(scenes())
def test_the_index_places_as_place_does(
    scene: tuple[list[NodeCapacity], dict[str, int], PlacementRequest, frozenset[str]],
) -> None:
    cluster, used, request, closed = scene
    index = NodeIndex(cluster)
    expected = place(request, [n for n in cluster if n.name not in closed], used)
    assert index.place(request, used, closed=closed) == expected
    # Asked again (its screens kept), and with no nodes closed.
    assert index.place(request, used, closed=closed) == expected
    assert index.place(request, used) == place(request, cluster, used)


def test_the_index_screens_a_request_shape_once() -> None:
    cluster = [NodeCapacity(name=f"n{i}", gpus=8, gpu_product=H100) for i in range(4)]
    index = NodeIndex(cluster)
    one = PlacementRequest(nnodes=1, gpus_per_node=8, gpu_product=H100)
    two = PlacementRequest(nnodes=2, gpus_per_node=8, gpu_product=H100)
    assert index.screened(one) is index.screened(two)  # the node count is not part of the shape
    assert index.screened(one) is not index.screened(PlacementRequest(nnodes=1, gpus_per_node=4))


# ---- a bounded status ----------------------------------------------------------------------------------


def scale_snapshot(nodes: int, memo: SnapshotMemo | None = None) -> Snapshot:
    """``nodes`` DGX H100 nodes of the scale benchmark's profile, a quarter of them taken by other jobs."""
    facts = [node_facts(m) for m in node_manifests(parse_profile(S.scale_profile(nodes)))]
    reserved = [(f"other-{i}", (facts[i].name,), 8) for i in range(0, nodes, 4)]
    return Snapshot(
        nodes=facts,
        pod_entries=[],
        reservations=reserved,
        capacities=[node_capacity(f) for f in facts],
        facts_version=1 if memo is not None else None,
        memo=memo,
    )


def placed_status(snap: Snapshot, index: int) -> VerlJobStatus:
    job = S.verljob(index, "ns")
    job["metadata"].update(uid=f"u{index}", generation=1, creationTimestamp="2026-01-01T00:00:00Z")
    seen = Observed(job=job, status=VerlJobStatus(), snapshot=snap, reserved=snap.reservations, now=1.0)
    transition = place_job(seen, VerlJobSpec.model_validate(job["spec"]))
    assert transition.status is not None and transition.status.phase == "Starting"
    return transition.status


def wire_bytes(status: VerlJobStatus) -> int:
    return len(json.dumps(status.to_wire(), separators=(",", ":")))


@pytest.fixture(scope="module")
def large() -> Snapshot:
    return scale_snapshot(5000, SnapshotMemo())


def test_a_placed_jobs_status_on_5000_nodes_is_under_8_kb(large: Snapshot) -> None:
    status = placed_status(large, 3)  # 8 nodes: the largest job of the benchmark's mix
    assert status.plan is not None and status.plan.candidate_node_count == 5000
    assert len(status.plan.candidate_nodes_sample) == 5
    assert wire_bytes(status) < 8 * 1024, wire_bytes(status)


def test_the_plan_is_the_same_size_on_16_and_5000_nodes(large: Snapshot) -> None:
    small = placed_status(scale_snapshot(16), 3).plan
    big = placed_status(large, 3).plan
    assert small is not None and big is not None
    size = len(json.dumps(small.to_wire())), len(json.dumps(big.to_wire()))
    assert abs(size[0] - size[1]) <= 16, size  # the counts' digits


def test_a_plan_lists_a_bounded_number_of_excluded_nodes() -> None:
    nodes = make_nodes(2) + [make_node(f"cordoned-{i}", unschedulable=True) for i in range(100)]
    plan = plan_job(make_spec(16), nodes).plan
    assert plan is not None
    assert plan.node_pool.excluded_count == 100 and len(plan.node_pool.excluded) == 20
    assert list(plan.node_pool.excluded)[:3] == ["cordoned-0", "cordoned-1", "cordoned-2"]  # natural order


# ---- candidates from the nodes, also for a plan read back after a restart --------------------------------


def test_a_plan_read_back_from_status_places_only_on_its_candidates() -> None:
    """The tainted node is the best fit by free GPUs but not a candidate (the spec does not tolerate the
    taint, which placement's own screens do not read): the plan read back from status, without a list of
    candidates, still keeps the job off it."""
    taint = [{"key": "dedicated", "value": "infer", "effect": "NoSchedule"}]
    nodes = [
        node_facts(make_node("gpu-0")),
        node_facts(make_node("gpu-1")),
        node_facts(make_node("gpu-2", taints=taint)),
    ]
    spec = make_spec(8)
    plan = plan_job(spec, nodes).plan
    assert plan is not None and plan.candidate_node_count == 2
    status = VerlJobStatus(phase="Pending", plan=plan)
    job = {
        "metadata": {"name": "j", "namespace": "ns", "uid": "u", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": spec.to_wire(),
        "status": json.loads(json.dumps(status.to_wire())),  # as the API server returns it
    }
    read = parse_status(job["status"]).plan
    assert read == plan
    snap = Snapshot(
        nodes=nodes, pod_entries=[], reservations=[], capacities=[node_capacity(n) for n in nodes]
    )
    used = {"gpu-0": 4, "gpu-1": 4}  # only the tainted node has 8 GPUs free
    request = snap.request(read, spec)
    assert request.candidates == frozenset({"gpu-0", "gpu-1"})
    assert not snap.node_index().place(request, used).feasible
    anywhere = replace(request, candidates=None)
    assert place(anywhere, snap.node_capacities(), used).nodes == ("gpu-2",)
    # The queue's entry of the job reads the same candidates from the nodes.
    entry = waiting_entry(job)
    assert entry is not None and entry.plan == plan and entry.request is not None
    assert snap.request(entry.plan, entry.spec).candidates == frozenset({"gpu-0", "gpu-1"})  # type: ignore[arg-type]


# ---- the memo: a plan per spec and node facts version ----------------------------------------------------


def test_the_memo_plans_a_spec_once_per_version_of_the_node_facts() -> None:
    memo = SnapshotMemo()
    nodes = [node_facts(n) for n in make_nodes(2)]
    spec, other = make_spec(8), make_spec(16)
    first = memo.plan(1, spec, nodes)
    assert memo.plan(1, spec, nodes) is first and (memo.plans_computed, memo.plans_reused) == (1, 1)
    memo.plan(1, other, nodes)
    assert memo.plans_computed == 2
    fewer = nodes[:1]
    assert memo.plan(2, other, fewer) == plan_job(other, fewer)  # facts changed: planned again
    assert memo.plans_computed == 3


def test_the_watch_cache_versions_the_node_facts() -> None:
    cache = WatchCache()
    node = make_node("gpu-0")
    cache.put_node(node)
    version = cache.snapshot().facts_version
    cache.put_node({**node, "status": {**node["status"], "heartbeat": "later"}})  # no fact changed
    assert cache.snapshot().facts_version == version
    cache.put_node(make_node("gpu-0", unschedulable=True))
    assert cache.snapshot().facts_version == version + 1
    cache.drop_node("gpu-0")
    assert cache.snapshot().facts_version == version + 2
    cache.drop_node("gpu-0")  # unknown: nothing changed
    snap = cache.snapshot()
    assert snap.facts_version == version + 2 and snap.memo is cache.memo


def test_a_placement_reuses_the_plan_of_its_spec(large: Snapshot) -> None:
    memo = large.memo
    assert memo is not None
    placed_status(large, 1)
    computed = memo.plans_computed
    placed_status(large, 5)  # the same spec (2 nodes) under another name
    assert memo.plans_computed == computed


# ---- admission reviews share the memo ---------------------------------------------------------------------


def test_a_review_and_a_reconcile_plan_a_spec_once() -> None:
    cache = WatchCache()
    for node in make_nodes(2):
        cache.put_node(node)
    spec = make_spec(16)
    body = spec.to_wire()
    reviewed = check_admission(body, None, (), planner=cache.plan)
    assert reviewed == check_admission(body, None, make_nodes(2))  # the same answer as planning anew
    assert cache.memo.plans_computed == 1
    assert check_admission(body, None, (), planner=cache.plan) == reviewed and cache.memo.plans_computed == 1
    planned = cache.snapshot().plan(spec).plan  # the reconcile's
    assert planned is not None and planned.model_dump(mode="json", by_alias=True) == reviewed.plan
    assert cache.memo.plans_computed == 1 and cache.memo.plans_reused == 2
    cache.put_node(make_node("gpu-2"))  # a new node: planned again
    check_admission(body, None, (), planner=cache.plan)
    assert cache.memo.plans_computed == 2


def test_a_plan_cut_short_by_the_reviews_budget_is_not_kept() -> None:
    cache = WatchCache()
    cache.put_node(make_node("gpu-0"))
    spec = make_spec(8)
    cut = cache.plan(spec, Budget(steps=1))  # a budget that ends before the plan does
    assert [v.rule for v in cut.violations] == ["plan-too-large"]
    assert cache.plan(spec).feasible and cache.memo.plans_computed == 2
