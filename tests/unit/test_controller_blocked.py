"""Pods the cluster cannot take now, and names taken by objects the job does not own.

A 403 that is not Pod Security (a missing ServiceAccount or PriorityClass, an exceeded quota) or a 409 for an
object the job does not own: the job gives its GPUs back at once (pods deleted, placement and reservation
released), is ``Pending`` with a reason and a message naming the object and the cause, writes nothing while
it waits, and is placed again by itself once the retry comes due (at once when its spec changes or the
operator is told something in its way changed). The operator never overwrites, adopts or deletes an object
whose owner references do not name the job.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from test_controller_transitions import HEAD, NAME, NS, SPEC, UID, WORKER, World, spec_becomes

from verl_operator.api.spec import VerlJobSpec
from verl_operator.api.status import parse_status
from verl_operator.controller.decide import (
    BLOCKED_RETRY_MAX_SECONDS,
    BLOCKED_RETRY_SECONDS,
    blocked_retry_due,
)
from verl_operator.controller.pipeline import (
    PASSTHROUGH_MARK,
    children_of,
    launch_overrides,
    plan_and_place,
    status_plan,
)
from verl_operator.controller.queue import waiting_entry
from verl_operator.controller.refused import ChildBlocked, classify, name_taken
from verl_operator.controller.snapshot import Snapshot, gpus_in_use, pod_usage_entry

SA_MISSING = (
    f'pods "{HEAD}" is forbidden: error looking up service account {NS}/trainer: serviceaccount "trainer" '
    "not found"
)
PC_MISSING = f'pods "{HEAD}" is forbidden: no PriorityClass with name urgent was found'
QUOTA = (
    f'pods "{HEAD}" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=8, '
    "used: requests.nvidia.com/gpu=0, limited: requests.nvidia.com/gpu=4"
)
POD = {"kind": "Pod", "metadata": {"name": HEAD, "namespace": NS}}


@pytest.mark.parametrize(
    ("status", "message", "verdict", "reason", "blocker", "denies"),
    [
        pytest.param(
            403, SA_MISSING, "blocked", "ServiceAccountNotFound", f"ServiceAccount {NS}/trainer", True
        ),
        pytest.param(403, PC_MISSING, "blocked", "PriorityClassNotFound", "PriorityClass urgent", True),
        pytest.param(403, QUOTA, "blocked", "QuotaExceeded", f"ResourceQuota {NS}/gpus", True),
        pytest.param(
            403,
            QUOTA.replace("limited: requests.nvidia.com/gpu=4", "limited: requests.nvidia.com/gpu=16"),
            "blocked",
            "QuotaExceeded",
            f"ResourceQuota {NS}/gpus",
            False,
            id="quota-used-by-others-now-is-not-denied-at-admission",
        ),
        pytest.param(
            403,
            "pods is forbidden: namespace is being terminated",
            "blocked",
            "PodsForbidden",
            f"Pod {NS}/{HEAD}",
            True,
        ),
        pytest.param(403, 'violates PodSecurity "restricted:latest"', "refused", None, None, True),
        pytest.param(422, "spec.containers[0].image: Required value", "refused", None, None, True),
        pytest.param(500, "etcd is busy", None, None, None, None),
        pytest.param(429, "too many requests", None, None, None, None),
    ],
)
def test_a_create_refusal_is_read_as_final_blocked_or_retryable(
    status: int,
    message: str,
    verdict: str | None,
    reason: str | None,
    blocker: str | None,
    denies: bool | None,
) -> None:
    got = classify(status, message, POD)
    if verdict is None:
        assert got is None
        return
    assert got is not None and got.denies_admission is denies
    assert isinstance(got, ChildBlocked) is (verdict == "blocked")
    if isinstance(got, ChildBlocked):
        assert (got.reason, got.blocker) == (reason, blocker)
        assert got.summary().startswith(f"{blocker} ") and got.api_message == message


def owned(uid: str) -> dict[str, Any]:
    return {"ownerReferences": [{"kind": "VerlJob", "name": NAME, "uid": uid}]}


def test_a_name_is_taken_unless_the_owner_uid_is_the_jobs() -> None:
    manifest = {"kind": "ConfigMap", "metadata": {"name": f"{NAME}-launch", "namespace": NS, **owned(UID)}}
    assert name_taken({"metadata": {"name": f"{NAME}-launch", **owned(UID)}}, manifest) is None
    for other in ({}, owned("uid-another-job-of-the-same-name")):
        taken = name_taken({"metadata": {"name": f"{NAME}-launch", **other}}, manifest)
        assert taken is not None and taken.reason == "NameTaken"
        assert taken.blocker == f"ConfigMap {NS}/{NAME}-launch" and taken.denies_admission


# ---- the reconciler: one row per situation -------------------------------------------------------------


def conditions(world: World) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in world.status().get("conditions", [])}


def foreign(kind: str, name: str, **extra: Any) -> Callable[[World], None]:
    """An object the job does not own holds one of its children's names."""

    def step(world: World) -> None:
        world.kube.add({"kind": kind, "metadata": {"name": name, "namespace": NS}, **extra})

    return step


def refusing(message: str) -> Callable[[World], None]:
    def step(world: World) -> None:
        world.kube.refuse_pods = message

    return step


FOREIGN_CM = foreign("ConfigMap", f"{NAME}-launch", data={"mine": "keep me"})
FOREIGN_SVC = foreign("Service", f"{NAME}-ray", spec={"clusterIP": "10.0.0.9", "selector": {"app": "web"}})
FOREIGN_SA = foreign("ServiceAccount", f"{NAME}-ray")
FOREIGN_HEAD = foreign("Pod", HEAD, spec={"containers": []}, status={"phase": "Running"})

BLOCKED_ROWS = [
    pytest.param(
        refusing(SA_MISSING), "ServiceAccountNotFound", f"ServiceAccount {NS}/trainer does not exist", id="sa"
    ),
    pytest.param(
        refusing(PC_MISSING), "PriorityClassNotFound", "PriorityClass urgent does not exist", id="pc"
    ),
    pytest.param(refusing(QUOTA), "QuotaExceeded", f"ResourceQuota {NS}/gpus is exceeded", id="quota"),
    pytest.param(
        FOREIGN_HEAD, "NameTaken", f"Pod {NS}/{HEAD} exists and is not owned by the job", id="head-pod"
    ),
    pytest.param(FOREIGN_CM, "NameTaken", f"ConfigMap {NS}/{NAME}-launch exists", id="configmap"),
    pytest.param(FOREIGN_SVC, "NameTaken", f"Service {NS}/{NAME}-ray exists", id="service"),
    pytest.param(FOREIGN_SA, "NameTaken", f"ServiceAccount {NS}/{NAME}-ray exists", id="serviceaccount"),
]


@pytest.mark.parametrize(("setup", "reason", "names"), BLOCKED_ROWS)
def test_pods_that_cannot_be_created_now_release_the_gpus_and_name_the_cause(
    setup: Callable[[World], None], reason: str, names: str
) -> None:
    world = World()
    setup(world)
    before = {k: json.dumps(v, sort_keys=True) for k, v in world.kube.objects.items()}
    world.submit(SPEC)
    world.reconcile()  # placed
    assert UID in world.reconciler.reservations.decided
    world.reconcile()  # the children: blocked
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Pending", reason), status.get("message")
    assert names in status["message"] and "holds no GPUs" in status["message"]
    # The pods never ran (gated): the same attempt is placed again, and its launcher still starts fresh.
    assert "placement" not in status and status.get("attempt", 0) == 0
    assert conditions(world)["Placed"] == ("False", reason)
    assert conditions(world)["PodsCreatable"] == ("False", reason)
    assert [(t, r) for t, r, _ in world.kube.events][-1] == ("Warning", reason)
    assert UID not in world.reconciler.reservations.decided
    mine = [n for n, p in world.kube.pods().items() if (p["metadata"].get("ownerReferences") or [])]
    assert mine == [], "no pod of the job is left holding GPUs"
    for key, text in before.items():  # the other object is neither changed, adopted nor deleted
        assert json.dumps(world.kube.objects.get(key), sort_keys=True) == text
    assert waiting_entry(world.job() or {}) is None, "a blocked job keeps no GPUs from the queue either"


def blocked_world(message: str = SA_MISSING) -> World:
    world = World()
    world.kube.refuse_pods = message
    world.submit(SPEC)
    world.reconcile()
    world.reconcile()
    assert world.status()["reason"] == "ServiceAccountNotFound"
    return world


def test_a_blocked_job_writes_nothing_until_its_retry() -> None:
    world = blocked_world()
    writes, events, requests = len(world.kube.writes), len(world.kube.events), len(world.kube.requests)
    world.now += BLOCKED_RETRY_SECONDS - 1
    world.reconcile()
    world.reconcile()
    assert world.kube.writes[writes:] == [] and world.kube.events[events:] == []
    assert world.kube.requests[requests:] == []


def test_a_blocked_job_proceeds_by_itself_once_the_cause_is_gone() -> None:
    world = blocked_world()
    events = len(world.kube.events)
    world.now += BLOCKED_RETRY_SECONDS
    world.reconcile()  # placed again (no event: the warning said enough)
    world.reconcile()  # still missing: refused again, released again; no new event either
    assert world.status()["reason"] == "ServiceAccountNotFound"
    assert world.kube.events[events:] == [], "the same cause is not announced again at every retry"
    world.kube.refuse_pods = None  # the ServiceAccount is created
    world.now += BLOCKED_RETRY_SECONDS
    world.reconcile()
    assert (world.status()["phase"], world.status()["reason"]) == ("Starting", "Placed")
    world.reconcile()
    assert world.status()["reason"] == "PodsCreated" and len(world.kube.pods()) == 2
    assert "PodsCreatable" not in conditions(world)


def test_a_blocked_job_is_tried_at_once_when_told_or_when_its_spec_changes() -> None:
    world = blocked_world()
    world.kube.refuse_pods = None
    world.reconciler.retry_now = lambda namespace, name: (namespace, name) == (NS, NAME)
    world.reconcile()
    assert world.status()["phase"] == "Starting"
    world = blocked_world()
    world.kube.refuse_pods = None
    spec_becomes({**SPEC, "backoffLimit": 1})(world)
    world.reconcile()
    assert world.status()["phase"] == "Starting"


def test_the_runtime_wakes_a_blocked_job_when_its_retry_is_due() -> None:
    world = blocked_world()
    job = world.job() or {}
    due = blocked_retry_due(job)
    assert due is not None and world.now < due <= world.now + BLOCKED_RETRY_SECONDS + 1
    world.kube.refuse_pods = None
    world.now = due
    world.reconcile()
    assert blocked_retry_due(world.job() or {}) is None


def test_the_retries_of_a_blocked_job_back_off_to_a_minute() -> None:
    world = blocked_world()
    waits = []
    for _ in range(7):
        due = blocked_retry_due(world.job() or {})
        assert due is not None
        waits.append(due - 1.0 - world.now)  # the runtime wakes it a second after it is due
        world.now = due - 1.0
        world.reconcile()  # placed again
        world.reconcile()  # blocked again
    assert waits == [10.0, 10.0, 20.0, 40.0, 60.0, 60.0, 60.0]
    assert (
        BLOCKED_RETRY_MAX_SECONDS == 60.0 and f"tried again in {waits[-1]:.0f}s" in world.status()["message"]
    )
    assert [r for _, r, _ in world.kube.events].count("ServiceAccountNotFound") == 1


def test_a_name_taken_job_runs_once_the_other_object_is_gone() -> None:
    world = World()
    FOREIGN_HEAD(world)
    world.submit(SPEC)
    world.reconcile()
    world.reconcile()
    assert world.status()["reason"] == "NameTaken" and HEAD in world.kube.pods()
    world.now += BLOCKED_RETRY_SECONDS
    world.reconcile()
    world.reconcile()
    assert world.status()["reason"] == "NameTaken", "blocked while the other pod holds the name"
    world.kube.objects.pop(("Pod", NS, HEAD))
    world.now += BLOCKED_RETRY_SECONDS
    world.reconcile()
    world.reconcile()
    assert world.status()["reason"] == "PodsCreated"
    assert {n: bool(p["metadata"].get("ownerReferences")) for n, p in world.kube.pods().items()} == {
        HEAD: True,
        WORKER: True,
    }


def test_an_unowned_pod_that_carries_the_jobs_label_is_never_deleted() -> None:
    world = World()
    labels = {"verl-operator.io/job": NAME, "verl-operator.io/attempt": "9"}
    world.kube.add(
        {"kind": "Pod", "metadata": {"name": "lookalike", "namespace": NS, "labels": labels}, "status": {}}
    )
    world.submit(SPEC)
    for _ in range(3):
        world.reconcile()
    assert world.status()["phase"] == "Starting" and sorted(world.kube.pods()) == [HEAD, WORKER, "lookalike"]
    spec_becomes({**SPEC, "suspend": True})(world)
    world.reconcile()
    assert world.status()["phase"] == "Suspended"
    assert list(world.kube.pods()) == ["lookalike"], "the job's own pods go; the look-alike stays"


def test_a_failed_status_write_leaves_no_reservation() -> None:
    world = World()
    world.submit(SPEC)

    def too_large(namespace: str, name: str, status: Any) -> None:
        raise RuntimeError("etcdserver: request is too large")

    world.kube.patch_status = too_large  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="too large"):
        world.reconcile()
    assert UID not in world.reconciler.reservations.decided


# ---- handed-off pods count; the status stays bounded -----------------------------------------------------


def test_bound_pods_handed_to_kueue_or_volcano_count_in_the_placement() -> None:
    def pod(name: str, labels: dict[str, str], scheduler: str | None = None) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "nodeName": "gpu-0",
            "containers": [{"resources": {"requests": {"nvidia.com/gpu": "8"}}}],
        }
        if scheduler:
            spec["schedulerName"] = scheduler
        meta = {"name": name, "namespace": NS, "uid": name, "labels": labels}
        return {"metadata": meta, "spec": spec, "status": {"phase": "Running"}}

    job = {"verl-operator.io/job": "q"}
    entries = [
        pod_usage_entry(pod("kueue", {**job, "kueue.x-k8s.io/queue-name": "gpu"})),
        pod_usage_entry(pod("volcano", job, scheduler="volcano")),
        pod_usage_entry(pod("builtin", job)),
    ]
    used = gpus_in_use([e for e in entries if e is not None], [], live_jobs=frozenset({f"{NS}/q"}))
    assert used == {"gpu-0": 16}, "the builtin pod counts through its job's reservation instead"


#: The largest user input the schema takes: 128 + 128 data files of 1,000 characters, 256 overrides of 2,000.
HUGE = {
    **SPEC,
    "data": {
        "trainFiles": [f"/data/train/{i:03d}/" + "x" * 970 + ".parquet" for i in range(128)],
        "valFiles": [f"/data/val/{i:03d}/" + "v" * 970 + ".parquet" for i in range(128)],
    },
    "overrides": [f"+trainer.custom_{i}=" + "y" * 1980 for i in range(256)],
}


@pytest.mark.parametrize("spec", [SPEC, HUGE], ids=["small", "huge-user-input"])
def test_the_status_stays_small_and_the_launch_gets_every_override(spec: dict[str, Any]) -> None:
    from conftest import make_nodes

    parsed = VerlJobSpec.model_validate(spec)
    outcome = plan_and_place(parsed, Snapshot(nodes=make_nodes(2, 8), pod_entries=(), reservations=()))
    assert outcome.plan is not None and outcome.placement is not None
    compact = status_plan(outcome.plan, parsed)
    wire = json.dumps(compact.model_dump(mode="json", by_alias=True))
    assert len(wire) < 8192, len(wire)
    assert launch_overrides(compact, parsed) == list(outcome.plan.overrides)
    if spec is HUGE:
        assert compact.overrides[-1].startswith(f"{PASSTHROUGH_MARK} count=256 ")
    world = World()
    world.submit(spec)
    world.reconcile()
    status = parse_status(world.status())
    assert len(json.dumps(world.status())) < 8192
    assert status.plan is not None
    world.reconcile()
    launch = json.loads(world.kube.objects[("ConfigMap", NS, f"{NAME}-launch")]["data"]["launch.json"])
    assert launch["overrides"] == list(outcome.plan.overrides), "the launcher gets the full argv"
    children = children_of(world.job() or {}, parsed, status)
    assert any(c["kind"] == "ConfigMap" for c in children)
    assert {HEAD, WORKER} <= set(world.kube.pods())


def test_the_status_of_an_invalid_spec_with_huge_user_input_stays_small() -> None:
    """Without a webhook, 256 unknown override keys of 2,000 characters: ``Invalid`` with the first violations,
    each bounded, and a count of the others."""
    world = World()
    world.submit({**SPEC, "overrides": [f"trainer.unknown_{i}=" + "z" * 1980 for i in range(256)]})
    world.reconcile()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Invalid", "PlanInfeasible")
    assert len(json.dumps(status)) < 8192, len(json.dumps(status))
    assert status["violations"][0]["field"].startswith("spec.overrides[0]")
    assert (
        status["violations"][-1]["rule"] == "more-violations"
        and "252 more" in status["violations"][-1]["message"]
    )
    assert "more characters)" in status["message"]


def test_a_quota_below_the_jobs_gpus_says_by_how_much() -> None:
    """Each pod fits the quota, the job does not (the API server refuses the pod that would exceed it): the job
    says what the quota allows, holds no GPUs and waits for the quota to be raised; admission would not deny
    it for that refusal alone (each pod's request fits)."""
    world = World()
    world.kube.refuse_pods = (
        f'pods "{WORKER}" is forbidden: exceeded quota: gpus, requested: requests.nvidia.com/gpu=8, '
        "used: requests.nvidia.com/gpu=8, limited: requests.nvidia.com/gpu=12"
    )
    world.submit(SPEC)
    world.reconcile()
    world.reconcile()
    status = world.status()
    assert status["reason"] == "QuotaExceeded" and world.kube.pods() == {}
    assert "the quota allows 12 GPUs in all, the job needs 16" in status["message"]
    verdict = classify(403, world.kube.refuse_pods, POD)
    assert isinstance(verdict, ChildBlocked) and verdict.transient and not verdict.denies_admission


@pytest.mark.parametrize(
    ("placed", "pods", "attempt"),
    [
        pytest.param(True, [], 2, id="no-pod-created"),
        pytest.param(True, [{"spec": {"schedulingGates": [{"name": "g"}]}}], 2, id="gated-pods-never-ran"),
        pytest.param(True, [{"spec": {"nodeName": "gpu-0"}}], 3, id="a-bound-pod-may-still-hold-its-name"),
        pytest.param(False, [{"spec": {"nodeName": "gpu-0"}}], 2, id="not-placed"),
    ],
)
def test_the_attempt_moves_on_only_past_pods_that_were_bound(
    placed: bool, pods: list[dict[str, Any]], attempt: int
) -> None:
    from verl_operator.controller.decide import next_attempt

    raw: dict[str, Any] = {"attempt": 2}
    if placed:
        raw["placement"] = {"attempt": 2, "nodes": ["gpu-0"]}
    assert next_attempt(parse_status(raw), pods) == attempt
