"""Queue order and the backfill rule (``controller.queue``), pure: tables, the nine-job case, a property."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verl_operator.controller.queue import (
    NO_PRIORITIES,
    Priorities,
    Waiting,
    ahead_of,
    hold_for,
    rank,
    usable_nodes,
    waiting_entry,
)
from verl_operator.placement import NodeCapacity, PlacementRequest, place

H100, L40S = "NVIDIA-H100-80GB-HBM3", "NVIDIA-L40S"


def nodes(count: int, gpus: int = 8, product: str = H100, prefix: str = "gpu") -> list[NodeCapacity]:
    return [NodeCapacity(name=f"{prefix}-{i}", gpus=gpus, gpu_product=product) for i in range(count)]


def waiting(
    name: str,
    nnodes: int,
    gpus: int = 8,
    *,
    created: str = "",
    cls: str | None = None,
    product: str | None = None,
) -> Waiting:
    request = PlacementRequest(nnodes=nnodes, gpus_per_node=gpus, gpu_product=product)
    return Waiting(key=f"ns/{name}", uid=name, priority_class=cls, created=created, request=request)


def used_on(names: list[str], gpus: int = 8) -> dict[str, int]:
    return {n: gpus for n in names}


# ---- the order ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("queue", "expected"),
    [
        pytest.param(
            [
                waiting("b", 1, created="2026-01-02T00:00:00Z"),
                waiting("a", 1, created="2026-01-01T00:00:00Z"),
            ],
            ["ns/a", "ns/b"],
            id="older-first",
        ),
        pytest.param(
            [
                waiting("old", 1, created="2026-01-01T00:00:00Z"),
                waiting("hi", 1, created="2026-02-01T00:00:00Z", cls="high"),
            ],
            ["ns/hi", "ns/old"],
            id="priority-before-age",
        ),
        pytest.param(
            [
                waiting("low", 1, created="2026-01-01T00:00:00Z", cls="low"),
                waiting("none", 1, created="2026-02-01T00:00:00Z"),
            ],
            ["ns/none", "ns/low"],
            id="a-negative-class-goes-after-no-class",
        ),
        pytest.param(
            [
                waiting("b", 1, created="2026-01-01T00:00:00Z"),
                waiting("a", 1, created="2026-01-01T00:00:00Z"),
            ],
            ["ns/a", "ns/b"],
            id="same-time-by-name",
        ),
        pytest.param(
            [
                waiting("x", 1, created="2026-01-01T00:00:00Z", cls="missing"),
                waiting("y", 1, created="2026-01-02T00:00:00Z"),
            ],
            ["ns/x", "ns/y"],
            id="an-unknown-class-is-priority-0",
        ),
    ],
)
def test_queue_order(queue: list[Waiting], expected: list[str]) -> None:
    priorities = Priorities(values={"high": 1000, "low": -10})
    last = rank(-(10**9), "9999", "~")  # ranked after everyone
    assert [w.key for w in ahead_of(queue, last, "me", priorities)] == expected


def test_only_jobs_ranked_before_come_ahead_and_never_the_job_itself() -> None:
    queue = [
        waiting("early", 1, created="2026-01-01T00:00:00Z"),
        waiting("me", 1, created="2026-01-02T00:00:00Z"),
        waiting("late", 1, created="2026-01-03T00:00:00Z"),
    ]
    mine = rank(0, "2026-01-02T00:00:00Z", "ns/me")
    assert [w.key for w in ahead_of(queue, mine, "me", NO_PRIORITIES)] == ["ns/early"]


@pytest.mark.parametrize(
    ("priorities", "name", "value"),
    [
        (Priorities(values={"a": 5}), "a", 5),
        (Priorities(values={"a": 5}), "b", 0),
        (Priorities(values={"a": 5}), None, 0),
        (Priorities(values={"a": 5, "d": 7}, default=7), None, 7),
    ],
)
def test_priority_of_a_class_name(priorities: Priorities, name: str | None, value: int) -> None:
    assert priorities.of(name) == value


# ---- what the jobs ahead hold ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cluster", "used", "ahead", "held", "extra_used", "holders"),
    [
        pytest.param(nodes(4), {}, [], set(), {}, [], id="empty-queue-holds-nothing"),
        pytest.param(
            nodes(4),
            {},
            [waiting("a", 2)],
            set(),
            {"gpu-0": 8, "gpu-1": 8},
            ["ns/a"],
            id="a-job-ahead-that-fits-takes-its-gpus-first",
        ),
        pytest.param(
            nodes(4),
            used_on(["gpu-0", "gpu-1"]),
            [waiting("a", 3)],
            {"gpu-0", "gpu-1", "gpu-2", "gpu-3"},
            {},
            ["ns/a"],
            id="a-blocked-job-ahead-holds-every-node-it-can-use",
        ),
        pytest.param(
            nodes(2) + nodes(2, 48, L40S, "l40s"),
            used_on(["gpu-0"]),
            [waiting("a", 2, product=H100)],
            {"gpu-0", "gpu-1"},
            {},
            ["ns/a"],
            id="nodes-the-blocked-job-cannot-use-stay-open",
        ),
        pytest.param(
            nodes(4),
            {},
            [waiting("huge", 5)],
            set(),
            {},
            [],
            id="a-job-too-large-for-the-idle-cluster-holds-nothing",
        ),
        pytest.param(
            nodes(4),
            used_on(["gpu-0"]),
            [waiting("a", 4), waiting("b", 1)],
            {"gpu-0", "gpu-1", "gpu-2", "gpu-3"},
            {},
            ["ns/a"],
            id="behind-a-blocked-job-nothing-else-is-counted",
        ),
        pytest.param(
            nodes(4),
            used_on(["gpu-0"]),
            [waiting("a", 2), waiting("b", 2)],
            {"gpu-0", "gpu-1", "gpu-2", "gpu-3"},
            {"gpu-1": 8, "gpu-2": 8},
            ["ns/a", "ns/b"],
            id="the-first-fits-the-second-is-blocked-on-the-rest",
        ),
    ],
)
def test_hold_for(
    cluster: list[NodeCapacity],
    used: dict[str, int],
    ahead: list[Waiting],
    held: set[str],
    extra_used: dict[str, int],
    holders: list[str],
) -> None:
    hold = hold_for(ahead, cluster, used)
    assert hold.held == frozenset(held)
    assert {n: g for n, g in hold.used.items() if used.get(n) != g} == extra_used
    assert list(hold.holders) == holders


def test_nine_queued_four_node_jobs_keep_a_later_one_node_job_off_the_free_node() -> None:
    """The issue's case: 5 nodes, a running 4-node job, nine 4-node jobs waiting, then a 1-node job."""
    cluster = nodes(5)
    used = used_on(["gpu-0", "gpu-1", "gpu-2", "gpu-3"])  # the running job
    queue = [waiting(f"big-{i}", 4, created=f"2026-01-01T00:00:0{i}Z") for i in range(9)]
    small = PlacementRequest(nnodes=1, gpus_per_node=8)
    assert place(small, cluster, used).feasible  # it would fit the free node
    ahead = ahead_of(queue, rank(0, "2026-01-01T00:01:00Z", "ns/small"), "small", NO_PRIORITIES)
    assert len(ahead) == 9
    hold = hold_for(ahead, cluster, used)
    assert hold.holders == ("ns/big-0",)
    assert not place(small, [n for n in cluster if n.name not in hold.held], hold.used).feasible


# ---- the queue entry of a VerlJob --------------------------------------------------------------------

SPEC: dict[str, Any] = {
    "verl": {"image": "example.com/verl:0.9.1"},
    "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
    "resources": {"gpus": 16},
}


def body(planned: dict[str, Any], *, spec: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "j", "namespace": "ns", "uid": "u", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": spec if spec is not None else SPEC,
        "status": {"phase": "Pending", "plan": planned, **status},
    }


@pytest.fixture(scope="module")
def planned() -> dict[str, Any]:
    from conftest import make_nodes

    from verl_operator.api.spec import VerlJobSpec
    from verl_operator.planner import plan_job

    result = plan_job(VerlJobSpec.model_validate(SPEC), make_nodes(2, 8))
    assert result.plan is not None
    return dict(result.to_json_dict()["plan"])


def test_a_pending_job_without_a_plan_is_in_the_queue_with_its_spec(planned: dict[str, Any]) -> None:
    job = body(planned)
    del job["status"]["plan"]
    entry = waiting_entry(job)
    assert entry is not None and entry.request is None and entry.spec is not None
    assert entry.spec.resources.gpus == 16


def test_a_job_ahead_without_a_plan_is_planned_on_todays_nodes() -> None:
    """A job that waited for nodes holds what it needs once today's nodes can host it again."""
    cluster = nodes(5)
    unplanned = Waiting(key="ns/victim", uid="victim", priority_class=None, created="", request=None)
    big = PlacementRequest(nnodes=5, gpus_per_node=8)
    assert hold_for([unplanned], cluster, {}).holders == ()  # nothing to plan it with: holds nothing
    hold = hold_for([unplanned], cluster, {}, lambda w: big)
    assert hold.holders == ("ns/victim",) and all(hold.used[n.name] == 8 for n in cluster)
    assert hold_for([unplanned], cluster, {}, lambda w: None).holders == ()  # still no plan


def test_a_pending_planned_job_is_in_the_queue(planned: dict[str, Any]) -> None:
    entry = waiting_entry(body(planned))
    assert entry is not None
    assert (entry.key, entry.uid, entry.created) == ("ns/j", "u", "2026-01-01T00:00:00Z")
    assert (entry.request.nnodes, entry.request.gpus_per_node) == (2, 8)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"status": {"phase": "Starting"}}, id="placed"),
        pytest.param({"status": {"placement": {"attempt": 0, "nodes": ["gpu-0"]}}}, id="has-a-placement"),
        pytest.param({"status": {"phase": "Invalid"}}, id="invalid"),
        pytest.param({"spec": {**SPEC, "suspend": True}}, id="suspended"),
        pytest.param({"spec": {**SPEC, "scheduling": {"queueName": "q"}}}, id="handed-to-kueue"),
        pytest.param({"spec": {**SPEC, "resources": {"gpus": "many"}}}, id="spec-does-not-parse"),
        pytest.param({"metadata": {"deletionTimestamp": "2026-01-01T00:00:01Z"}}, id="being-deleted"),
    ],
)
def test_jobs_not_in_the_queue(planned: dict[str, Any], change: dict[str, Any]) -> None:
    job = body(planned)
    for part, values in change.items():
        job[part] = {**job[part], **values} if part != "spec" else values
    assert waiting_entry(job) is None


# ---- the property: a job placed on what is left delays no job ahead of it ------------------------------


@st.composite
def scenes(draw: st.DrawFn) -> tuple[list[NodeCapacity], dict[str, int], list[Waiting], PlacementRequest]:
    count = draw(st.integers(1, 6))
    cluster = [
        NodeCapacity(name=f"n{i}", gpus=8, gpu_product=draw(st.sampled_from([H100, L40S])))
        for i in range(count)
    ]
    used = {n.name: draw(st.sampled_from([0, 4, 8])) for n in cluster}
    ahead = [
        waiting(
            f"a{i}",
            draw(st.integers(1, 4)),
            draw(st.sampled_from([4, 8])),
            product=draw(st.sampled_from([None, H100, L40S])),
        )
        for i in range(draw(st.integers(0, 4)))
    ]
    job = PlacementRequest(nnodes=draw(st.integers(1, 3)), gpus_per_node=draw(st.sampled_from([4, 8])))
    return cluster, used, ahead, job


@settings(max_examples=300, deadline=None)
@given(scenes())
def test_a_backfilled_job_delays_no_job_ahead(
    scene: tuple[list[NodeCapacity], dict[str, int], list[Waiting], PlacementRequest],
) -> None:
    cluster, used, ahead, job = scene
    hold = hold_for(ahead, cluster, used)
    chosen = place(job, [n for n in cluster if n.name not in hold.held], hold.used)
    if not chosen.feasible:
        return
    # The job and the jobs ahead that fit now, where the hold put them, fit the nodes together.
    total = dict(hold.used)
    for name in chosen.nodes:
        total[name] = total.get(name, 0) + job.gpus_per_node
    assert all(total.get(n.name, 0) <= n.gpus for n in cluster if used.get(n.name, 0) <= n.gpus)
    # No node a blocked job ahead could use (one that fits an idle cluster, not today's free GPUs) is touched.
    for w in ahead:
        if place(w.request, cluster, {}).feasible and not place(w.request, cluster, used).feasible:
            assert not set(chosen.nodes) & usable_nodes(w.request, cluster), (w, chosen.nodes)
