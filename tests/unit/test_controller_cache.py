"""The watch cache, the timers and the event-driven runtime (no cluster: objects as the watch delivers them)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from conftest import make_node
from hypothesis import given
from hypothesis import strategies as st

from verl_operator.controller.cache import WatchCache, plain_copy, reservation
from verl_operator.controller.runtime import Runtime
from verl_operator.controller.timers import MARGIN_SECONDS, next_due
from verl_operator.manifests.names import LABEL_JOB


def with_rv(obj: dict[str, Any], rv: int) -> dict[str, Any]:
    obj.setdefault("metadata", {})["resourceVersion"] = str(rv)
    return obj


def gpu_pod(
    name: str, node: str, *, job: str | None = "j1", phase: str = "Running", rv: int = 1
) -> dict[str, Any]:
    labels = {LABEL_JOB: job} if job else {}
    return {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "labels": labels,
            "resourceVersion": str(rv),
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "ray", "resources": {"requests": {"nvidia.com/gpu": "8"}}}],
        },
        "status": {"phase": phase},
    }


def verljob(
    name: str, phase: str | None = None, nodes: tuple[str, ...] = (), rv: int = 1, **spec: Any
) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if phase:
        status["phase"] = phase
    if nodes:
        status["placement"] = {"nodes": list(nodes), "gpusPerNode": 8, "attempt": 0}
    return {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": str(rv)},
        "spec": spec,
        "status": status,
    }


def test_a_heartbeat_changes_no_fact_and_wakes_nothing() -> None:
    cache = WatchCache()
    node = make_node("n1")
    assert cache.put_node(node) is True
    beat = make_node("n1")
    beat["status"]["conditions"][0]["lastHeartbeatTime"] = "2026-12-01T10:00:00Z"
    assert cache.put_node(beat) is False
    assert cache.node_fact_changes == 1
    relabelled = make_node("n1", labels={"network.topology.nvidia.com/leaf": "rack-2"})
    assert cache.put_node(relabelled) is True
    assert (
        cache.facts_of("n1") is not None
        and cache.facts_of("n1").labels["network.topology.nvidia.com/leaf"] == "rack-2"
    )  # type: ignore[union-attr]
    assert cache.snapshot().node_capacities()[0].labels["network.topology.nvidia.com/leaf"] == "rack-2"
    assert cache.drop_node("n1") is True
    assert cache.node_list() == []


@pytest.mark.parametrize(
    ("first", "second", "freed"),
    [
        pytest.param("Running", "Running", False, id="still-running"),
        pytest.param("Running", "Failed", True, id="failed-frees"),
        pytest.param("Running", "Succeeded", True, id="succeeded-frees"),
        pytest.param("Failed", "Failed", False, id="already-free"),
    ],
)
def test_pod_phase_changes_free_capacity(first: str, second: str, freed: bool) -> None:
    cache = WatchCache()
    cache.put_pod(gpu_pod("p", "n1", phase=first, rv=1))
    assert cache.put_pod(gpu_pod("p", "n1", phase=second, rv=2)) is freed


def test_job_pods_are_kept_by_job_and_older_events_are_ignored() -> None:
    cache = WatchCache()
    cache.put_pod(gpu_pod("b", "n2", rv=5))
    cache.put_pod(gpu_pod("a", "n1", rv=6))
    cache.put_pod(gpu_pod("other", "n3", job=None, rv=7))
    assert [p["metadata"]["name"] for p in cache.job_pods("ns", "j1")] == ["a", "b"]
    cache.put_pod(gpu_pod("a", "n1", phase="Pending", rv=4))  # an older event after a newer write
    assert cache.job_pods("ns", "j1")[0]["status"]["phase"] == "Running"
    assert sorted(e[0] for e in cache.snapshot().pod_entries) == ["n1", "n2", "n3"]
    assert cache.drop_pod(gpu_pod("a", "n1")) is True
    assert [p["metadata"]["name"] for p in cache.job_pods("ns", "j1")] == ["b"]


def test_reads_are_copies() -> None:
    cache = WatchCache()
    cache.put_job(verljob("j1", "Running", ("n1",)))
    got = cache.job("ns", "j1")
    assert got is not None
    got["status"]["phase"] = "Failed"
    assert cache.job("ns", "j1")["status"]["phase"] == "Running"  # type: ignore[index]


def test_version_reads_copy_nothing_and_a_view_keeps_what_was_read() -> None:
    """The progress fast path's reads: the pods' versions (a change shows) and the job as stored (a later
    event stores a new object; the one read stays as it was)."""
    cache = WatchCache()
    cache.put_pod(gpu_pod("b", "n2", rv=5))
    cache.put_pod(gpu_pod("a", "n1", rv=6))
    assert cache.job_pod_versions("ns", "j1") == [("a", "6"), ("b", "5")]
    cache.put_pod(gpu_pod("b", "n2", phase="Failed", rv=8))
    assert cache.job_pod_versions("ns", "j1") == [("a", "6"), ("b", "8")]
    assert cache.job_pod_versions("ns", "nothing") == []
    cache.put_job(verljob("j1", "Running", ("n1",), rv=3))
    seen = cache.job_view("ns", "j1")
    assert seen is not None and seen["metadata"]["resourceVersion"] == "3"
    cache.put_job(verljob("j1", "Failed", ("n1",), rv=4))
    assert seen["status"]["phase"] == "Running"
    assert cache.job_view("ns", "j1")["status"]["phase"] == "Failed"  # type: ignore[index]
    cache.drop_job(("ns", "j1"))
    assert cache.job_view("ns", "j1") is None


@pytest.mark.parametrize(
    ("before", "after", "freed"),
    [
        pytest.param(("Starting", ("n1",)), ("Running", ("n1",)), False, id="running"),
        pytest.param(("Running", ("n1",)), ("Succeeded", ("n1",)), True, id="finished"),
        pytest.param(("Running", ("n1",)), ("Pending", ()), True, id="restarting"),
        pytest.param(("Pending", ()), ("Pending", ()), False, id="still-waiting"),
        pytest.param(("Running", ("n1",)), ("Suspended", ()), True, id="suspended"),
    ],
)
def test_jobs_giving_gpus_back(
    before: tuple[str, tuple[str, ...]], after: tuple[str, tuple[str, ...]], freed: bool
) -> None:
    cache = WatchCache()
    cache.put_job(verljob("j1", *before, rv=1))
    assert cache.put_job(verljob("j1", *after, rv=2)) is freed


def test_snapshot_reservations_and_waiting_jobs() -> None:
    cache = WatchCache()
    cache.put_job(verljob("placed", "Running", ("n1", "n2")))
    cache.put_job(verljob("waiting", "Pending"))
    cache.put_job(verljob("new"))
    cache.put_job(verljob("done", "Succeeded", ("n3",)))
    snap = cache.snapshot()
    assert snap.reservations == [("uid-placed", ("n1", "n2"), 8)]
    assert snap.live_jobs == frozenset({"ns/placed", "ns/waiting", "ns/new", "ns/done"})
    assert cache.waiting_for_capacity() == [("ns", "new"), ("ns", "waiting")]
    assert reservation(verljob("x", "Starting", ("n9",))) == ("uid-x", ("n9",), 8)
    assert cache.drop_job(("ns", "placed")) is True
    assert cache.drop_job(("ns", "waiting")) is False


START, DONE = "2026-12-01T12:00:00Z", "2026-12-01T13:00:00Z"
T_START = 1796126400.0  # 2026-12-01T12:00:00Z
T_DONE = T_START + 3600


@pytest.mark.parametrize(
    ("job", "due"),
    [
        pytest.param(
            {
                "spec": {"ttlSecondsAfterFinished": 30},
                "status": {"phase": "Succeeded", "completionTime": DONE},
            },
            T_DONE + 30 + MARGIN_SECONDS,
            id="ttl",
        ),
        pytest.param(
            {"spec": {}, "status": {"phase": "Failed", "completionTime": DONE}}, None, id="finished-no-ttl"
        ),
        pytest.param(
            {"spec": {"activeDeadlineSeconds": 60}, "status": {"phase": "Running", "startTime": START}},
            T_START + 60 + MARGIN_SECONDS,
            id="deadline",
        ),
        pytest.param(
            {"spec": {"activeDeadlineSeconds": 60}, "status": {"phase": "Suspended", "startTime": START}},
            None,
            id="suspended",
        ),
        pytest.param({"spec": {"activeDeadlineSeconds": 60}, "status": {}}, None, id="not-started"),
        pytest.param(
            {"spec": {}, "status": {"phase": "Running", "startTime": START}}, None, id="no-deadline"
        ),
    ],
)
def test_next_due(job: dict[str, Any], due: float | None) -> None:
    assert next_due(job) == due


class FakeReconciler:
    """Records passes; each takes ``seconds``; fails if one job is ever reconciled twice at once."""

    def __init__(self, seconds: float = 0.05) -> None:
        self.seconds = seconds
        self.calls: list[tuple[str, str]] = []
        self.active: set[tuple[str, str]] = set()
        self.peak = 0
        self.overlap_of_one_job = False
        self.lock = threading.Lock()

    def reconcile(self, namespace: str, name: str) -> None:
        key = (namespace, name)
        with self.lock:
            self.overlap_of_one_job |= key in self.active
            self.active.add(key)
            self.calls.append(key)
            self.peak = max(self.peak, len(self.active))
        time.sleep(self.seconds)
        with self.lock:
            self.active.discard(key)


async def _drive(
    runtime: Runtime, fake: FakeReconciler, seconds: float, workers: int, resync: float = 600.0
) -> None:
    runtime.mark_ready()
    task = asyncio.create_task(runtime.run(fake, resync, workers))  # type: ignore[arg-type]
    await asyncio.sleep(seconds)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_jobs_run_concurrently_but_one_job_never_twice_at_once() -> None:
    runtime, fake = Runtime(), FakeReconciler(seconds=0.1)

    async def main() -> None:
        for i in range(8):
            runtime.enqueue(("ns", f"j{i}"))
        driver = asyncio.create_task(_drive(runtime, fake, 0.8, workers=4))
        for _ in range(5):  # the same job queued again while it runs: one more pass, never two at once
            await asyncio.sleep(0.02)
            runtime.enqueue(("ns", "j0"))
        await driver

    asyncio.run(main())
    assert fake.peak == 4
    assert not fake.overlap_of_one_job
    assert {k for k in fake.calls} == {("ns", f"j{i}") for i in range(8)}
    assert 2 <= fake.calls.count(("ns", "j0")) <= 3


def test_free_workers_take_jobs_in_the_queue_order_and_a_busy_runtime_orders_nothing() -> None:
    runtime, fake = Runtime(), FakeReconciler(seconds=0.05)
    ordered: list[tuple[str, str]] = []

    def order(key: tuple[str, str]) -> tuple[int, str]:
        ordered.append(key)
        return (0, key[1])

    runtime.cache.order = order  # type: ignore[assignment,method-assign]

    async def main() -> None:
        for i in reversed(range(6)):
            runtime.enqueue(("ns", f"j{i}"))
        driver = asyncio.create_task(_drive(runtime, fake, 0.6, workers=1))
        for _ in range(40):  # events while the only worker is busy: each wakes the loop
            await asyncio.sleep(0.002)
            runtime.enqueue(("ns", "j0"))
        await driver

    asyncio.run(main())
    assert list(dict.fromkeys(fake.calls)) == [("ns", f"j{i}") for i in range(6)]  # j0 again after its pass
    assert len(ordered) <= 2 * (6 + 5 + 4 + 3 + 2 + 1), "ordered only when a worker was free"


def test_idle_runtime_reconciles_nothing_until_the_resync() -> None:
    runtime, fake = Runtime(), FakeReconciler()
    runtime.cache.put_job(verljob("j1", "Running", ("n1",)))

    asyncio.run(_drive(runtime, fake, 0.6, workers=2, resync=0.25))
    # t=0 (the first resync), t=0.25 and t=0.5: three passes in 0.6 s (two on a loaded machine), none between.
    assert 2 <= fake.calls.count(("ns", "j1")) <= 3


def test_a_scheduled_wakeup_fires_once() -> None:
    runtime, fake = Runtime(), FakeReconciler(seconds=0.0)
    runtime.cache.put_job(verljob("j1", "Running", ("n1",)))

    async def main() -> None:
        driver = asyncio.create_task(_drive(runtime, fake, 0.7, workers=1))
        await asyncio.sleep(0.1)
        calls = len(fake.calls)  # the initial resync
        at = time.time() + 0.3
        runtime.schedule(("ns", "j1"), at)
        runtime.schedule(("ns", "j1"), at)  # asked twice (two passes computed the same due time): one wake-up
        runtime.schedule(("ns", "j1"), time.time() - 5)  # already past: ignored
        await asyncio.sleep(0.15)
        assert len(fake.calls) == calls
        await driver

    asyncio.run(main())
    assert fake.calls.count(("ns", "j1")) == 2  # the resync, then the wake-up: no busy loop


def test_jobs_on_a_node_are_the_placed_ones() -> None:
    cache = WatchCache()
    cache.put_job(verljob("a", "Running", ("n1", "n2")))
    cache.put_job(verljob("b", "Starting", ("n2",)))
    cache.put_job(verljob("c", "Succeeded", ("n2",)))
    cache.put_job(verljob("d", "Pending"))
    assert cache.jobs_on_node("n2") == [("ns", "a"), ("ns", "b")]
    assert cache.jobs_on_node("n1") == [("ns", "a")]
    assert cache.jobs_on_node("n9") == []


def test_priority_classes_order_the_queue_and_a_default_applies_to_jobs_naming_none() -> None:
    cache = WatchCache()
    assert cache.put_priority_class({"metadata": {"name": "high"}, "value": 1000}) is True
    assert cache.put_priority_class({"metadata": {"name": "high"}, "value": 1000}) is False  # unchanged
    assert cache.put_priority_class({"metadata": {"name": "std"}, "value": 10, "globalDefault": True})
    prio = cache.priorities()
    assert (prio.of("high"), prio.of(None), prio.of("nope")) == (1000, 10, 0)
    assert cache.drop_priority_class("std") is True
    assert cache.priorities().of(None) == 0
    assert cache.drop_priority_class("std") is False


def planned_job(name: str, rv: int, created: str, **status: Any) -> dict[str, Any]:
    from verl_operator.api.spec import VerlJobSpec
    from verl_operator.planner import plan_job

    spec = {
        "verl": {"image": "example.com/verl:0.9.1"},
        "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
        "resources": {"gpus": 8},
    }
    plan = plan_job(VerlJobSpec.model_validate(spec), [make_node("n1", 8)]).to_json_dict()["plan"]
    job = verljob(name, rv=rv, **spec)
    job["metadata"]["creationTimestamp"] = created
    job["status"] = {"phase": "Pending", "plan": plan, **status}
    return job


def test_a_job_leaving_the_queue_wakes_the_jobs_behind_and_queued_jobs_run_in_order() -> None:
    cache = WatchCache()
    assert cache.put_job(planned_job("late", 1, "2026-01-02T00:00:00Z")) is False  # entering wakes nobody
    assert cache.put_job(planned_job("early", 1, "2026-01-01T00:00:00Z")) is False
    cache.put_job(verljob("placed", "Running", ("n1",)))
    keys = [("ns", "late"), ("ns", "early"), ("ns", "placed")]
    assert sorted(keys, key=cache.order) == [("ns", "placed"), ("ns", "early"), ("ns", "late")]
    assert [w.key for w in cache.snapshot().queue] == ["ns/late", "ns/early"]
    again = planned_job("early", 2, "2026-01-01T00:00:00Z", message="still waiting")
    assert cache.put_job(again) is False  # the same entry: nothing to wake
    placed = planned_job("early", 3, "2026-01-01T00:00:00Z", placement={"nodes": ["n1"], "attempt": 0})
    placed["status"]["phase"] = "Starting"
    assert cache.put_job(placed) is True  # left the queue
    assert cache.drop_job(("ns", "late")) is True  # a queued job deleted


class _Raw:
    """The API answering every request with ``status``."""

    def __init__(self, status: int) -> None:
        self.status = status

    def request(self, *args: Any, **kwargs: Any) -> Any:
        from kubernetes.client.exceptions import ApiException

        raise ApiException(status=self.status, reason="test")


@pytest.mark.parametrize(("code", "raises"), [(404, False), (409, True), (500, True)])
def test_a_status_patch_of_a_job_deleted_meanwhile_is_dropped(code: int, raises: bool) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from verl_operator.controller.cache import CachedKube

    kube = CachedKube(client.ApiClient(), WatchCache())
    kube.raw = _Raw(code)  # type: ignore[assignment]
    if raises:
        with pytest.raises(ApiException):
            kube.patch_status("ns", "gone", {"phase": "Pending"})
    else:
        kube.patch_status("ns", "gone", {"phase": "Pending"})


def test_cached_objects_leave_out_managed_fields() -> None:
    cache = WatchCache()
    pod = gpu_pod("p", "n1")
    pod["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    job = verljob("j1", "Running", ("n1",))
    job["metadata"]["managedFields"] = [{"manager": "verl-operator"}]
    cache.put_pod(pod)
    cache.put_job(job)
    assert "managedFields" not in cache.job_pods("ns", "j1")[0]["metadata"]
    assert "managedFields" not in cache.job("ns", "j1")["metadata"]  # type: ignore[index]
    assert cache.job("ns", "j1")["metadata"]["uid"] == "uid-j1"  # type: ignore[index]
    assert "managedFields" in pod["metadata"], "the watched object itself is not changed"


def test_a_wake_is_kept_when_the_operators_own_write_stored_the_change_first() -> None:
    cache = WatchCache()
    cache.put_job(verljob("j1", "Running", ("n1",), rv=1))
    assert cache.take_wake() is False
    finished = verljob("j1", "Succeeded", ("n1",), rv=2)
    assert cache.put_job(finished) is True  # the status write's response
    assert cache.put_job(finished) is False  # its watch event: nothing new...
    assert cache.take_wake() is True  # ...but the wake is still due, once
    assert cache.take_wake() is False


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=30,
)


def _containers(value: Any) -> list[int]:
    if isinstance(value, dict):
        return [id(value), *(i for v in value.values() for i in _containers(v))]
    if isinstance(value, list):
        return [id(value), *(i for v in value for i in _containers(v))]
    return []


@given(_JSON)
def test_plain_copy_is_a_deep_copy_of_json(value: Any) -> None:
    copied = plain_copy(value)
    assert copied == value
    assert not set(_containers(copied)) & set(_containers(value)), "no dict or list is shared"


def test_a_write_response_after_the_deleted_event_does_not_bring_a_pod_back() -> None:
    """The operator's own write (a gate removal) answered after the watch showed the pod deleted: the late
    response is ignored, so the pod's GPUs stay free (no later event would ever drop it again)."""
    cache = WatchCache()
    cache.put_pod(gpu_pod("p", "n1", rv=3))
    assert cache.drop_pod(gpu_pod("p", "n1", rv=4)) is True
    assert cache.put_pod(gpu_pod("p", "n1", rv=3)) is False
    assert cache.snapshot().pod_entries == [] and cache.job_pods("ns", "j1") == []
    other = gpu_pod("p", "n1", rv=9)  # a new pod of the same name: a new uid
    other["metadata"]["uid"] = "uid-p-2"
    cache.put_pod(other)
    assert len(cache.snapshot().pod_entries) == 1


def test_a_status_response_after_the_deleted_event_does_not_bring_a_job_back() -> None:
    cache = WatchCache()
    cache.put_job(verljob("j1", "Running", ("n1",), rv=5))
    assert cache.drop_job(("ns", "j1")) is True
    cache.put_job(verljob("j1", "Running", ("n1",), rv=6))  # a status patch answered just before the delete
    assert cache.job("ns", "j1") is None and cache.snapshot().reservations == []
    again = verljob("j1", rv=20)  # the same name applied again: a new uid
    again["metadata"]["uid"] = "uid-j1-2"
    cache.put_job(again)
    assert cache.job("ns", "j1") is not None


def test_blocked_jobs_wait_for_their_retry_not_for_capacity_and_can_be_retried_at_once() -> None:
    cache = WatchCache()
    blocked = verljob("blocked", "Pending")
    blocked["status"]["reason"] = "ServiceAccountNotFound"
    cache.put_job(blocked)
    cache.put_job(verljob("waiting", "Pending"))
    assert cache.waiting_for_capacity() == [("ns", "waiting")], "capacity does not unblock a missing object"
    runtime = Runtime()
    runtime.cache = cache
    runtime.retry_blocked()  # a PriorityClass changed
    assert runtime.pending == {("ns", "blocked")}
    assert cache.take_retry("ns", "blocked") is True and cache.take_retry("ns", "blocked") is False
    assert cache.take_retry("ns", "waiting") is False


def test_the_queue_depth_metric_counts_queued_and_running_jobs() -> None:
    from prometheus_client import generate_latest

    from verl_operator.controller.runtime import RUNTIME

    def scraped() -> float:
        line = next(
            x for x in generate_latest().decode().splitlines() if x.startswith("verl_operator_queue_depth ")
        )
        return float(line.split()[1])

    saved = set(RUNTIME.pending), set(RUNTIME.running)
    try:
        RUNTIME.pending.clear()
        RUNTIME.running.clear()
        assert scraped() == 0
        RUNTIME.enqueue(("ns", "a"))
        RUNTIME.enqueue(("ns", "a"))  # queued once
        RUNTIME.running.add(("ns", "b"))
        assert scraped() == 2
        Runtime().enqueue(("ns", "c"))  # another runtime (a test's) is not the operator's
        assert scraped() == 2
    finally:
        RUNTIME.pending.clear()
        RUNTIME.running.clear()
        RUNTIME.pending.update(saved[0])
        RUNTIME.running.update(saved[1])


def test_an_admission_review_waits_for_the_initial_listing_only_while_the_replica_starts() -> None:
    """A review of a replica that has just started waits until the first handler marks the cache ready (it
    would plan on no nodes before); once the start-up window is over, or before kopf started, it does not."""
    runtime = Runtime()
    assert not runtime.await_loaded(5.0)  # kopf not started: nothing to wait for
    runtime.started_at = time.monotonic()
    marker = threading.Timer(0.05, runtime.mark_ready)
    marker.start()
    assert runtime.await_loaded(5.0)  # returned because the cache was marked ready, well inside the window
    marker.join()
    idle = Runtime()
    idle.started_at = time.monotonic() - 10.0  # a cluster that gave no handler an object for 10 s
    assert not idle.await_loaded(5.0)
    assert not idle.loaded.is_set()
