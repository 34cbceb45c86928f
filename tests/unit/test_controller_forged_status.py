"""A status patched by hand is never obeyed: a finished phase while the attempt's pods still run is derived
again from the pods (the forged phase overwritten, the pods kept, a ``StatusOverwritten`` Warning event)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
from fakekube import FakeKube
from test_controller_transitions import (
    HEAD,
    NAME,
    NS,
    RUNNING,
    SPEC,
    T0,
    UID,
    WORKER,
    World,
    pods_are,
    with_spec,
)

from verl_operator.api.status import parse_status
from verl_operator.controller.derived import contradicted_attempt, rederive
from verl_operator.controller.observed import Observed
from verl_operator.controller.reconcile import JobReconciler
from verl_operator.controller.status import format_time
from verl_operator.manifests.names import LABEL_ATTEMPT


def forge(world: World, **status: Any) -> None:
    """What ``kubectl patch vj --subresource=status --type=merge`` does."""
    world.kube.objects[("VerlJob", NS, NAME)]["status"].update(status)


def running() -> World:
    world = World()
    world.submit(SPEC)
    for step in RUNNING:
        step(world)
    world.reconcile()
    assert world.status()["phase"] == "Running"
    return world


def test_a_forged_succeeded_phase_is_overwritten_and_the_pods_kept() -> None:
    world = running()
    forge(world, phase="Succeeded", completionTime="2027-01-15T08:00:00Z")
    world.reconcile()
    status = world.status()
    assert (status["phase"], status["reason"]) == ("Running", "AllPodsRunning")
    assert "completionTime" not in status
    assert sorted(world.kube.pods()) == sorted([HEAD, WORKER])
    (event,) = [e for e in world.kube.events if e[1] == "StatusOverwritten"]
    assert "status.phase Succeeded was not written by the operator: 2 pods of attempt 0 still run" in event[2]


def test_a_forged_failed_phase_is_overwritten_too() -> None:
    world = running()
    forge(world, phase="Failed", reason="PodFailed")
    world.reconcile()
    assert world.status()["phase"] == "Running"
    assert len(world.kube.pods()) == 2


def test_a_forged_phase_on_a_job_that_did_end_ends_it_by_the_pods() -> None:
    world = running()
    pods_are("Succeeded", HEAD, exit_code=0)(world)
    forge(world, phase="Failed")
    world.reconcile()
    assert world.status()["phase"] == "Succeeded"
    assert sorted(world.kube.pods()) == [HEAD]  # the worker stopped, as for any success


def test_the_operator_s_own_finished_phase_is_kept() -> None:
    world = running()
    pods_are("Succeeded", HEAD, exit_code=0)(world)
    world.reconcile()
    assert world.status()["phase"] == "Succeeded"
    writes = len(world.kube.writes)
    world.reconcile()
    assert world.status()["phase"] == "Succeeded" and len(world.kube.writes) == writes


# -- the attempt and the placement's attempt patched together -------------------------------------------------


def forge_attempt(world: World, attempt: int) -> None:
    """``kubectl patch`` of ``status.attempt`` and ``status.placement.attempt`` together."""
    status = world.kube.objects[("VerlJob", NS, NAME)]["status"]
    status["attempt"] = attempt
    status["placement"]["attempt"] = attempt


def restarted_once() -> World:
    """A running job whose first attempt failed: attempt 1 runs (pods ``j-r1-...``)."""
    world = World()
    world.submit(with_spec(backoffLimit=3))
    for step in RUNNING:
        step(world)
    world.reconcile()
    pods_are("Failed", HEAD)(world)
    world.reconcile()
    assert (world.status()["phase"], world.status()["attempt"]) == ("Pending", 1)
    for step in RUNNING:
        step(world)
    world.reconcile()
    assert world.status()["phase"] == "Running" and sorted(world.kube.pods()) == [R1_HEAD, R1_WORKER]
    return world


R1_HEAD, R1_WORKER = f"{NAME}-r1-head", f"{NAME}-r1-worker-1"


@pytest.mark.parametrize(
    ("make", "forged", "pods"),
    [
        pytest.param(running, 5, [HEAD, WORKER], id="raised"),
        pytest.param(restarted_once, 0, [R1_HEAD, R1_WORKER], id="lowered"),
    ],
)
def test_a_forged_attempt_with_its_placement_is_derived_from_the_pods(
    make: Callable[[], World], forged: int, pods: list[str]
) -> None:
    """Read as written, the running pods would be deleted as another attempt's and the job started again."""
    world = make()
    attempt = world.status().get("attempt", 0)
    uids = {n: p["metadata"]["uid"] for n, p in world.kube.pods().items()}
    writes = len(world.kube.writes)
    forge_attempt(world, forged)
    world.reconcile()
    status = world.status()
    placed = status["placement"].get("attempt", 0)
    assert (status["phase"], status.get("attempt", 0), placed) == ("Running", attempt, attempt)
    assert {n: p["metadata"]["uid"] for n, p in world.kube.pods().items()} == uids
    assert sorted(world.kube.pods()) == sorted(pods)
    assert [w for w in world.kube.writes[writes:] if w[0] != "patch_status"] == []
    (event,) = [e for e in world.kube.events if e[1] == "StatusOverwritten"]
    assert (
        f"status.attempt and status.placement.attempt {forged}: the job's running pods are attempt {attempt}"
        in (event[2])
    )
    assert ("read_job", NAME) in world.kube.requests and ("list_pods", NAME) in world.kube.requests
    world.reconcile()  # derived once: the next pass reads nothing from the API server itself
    assert len([e for e in world.kube.events if e[1] == "StatusOverwritten"]) == 1


class LaggingKube(FakeKube):
    """A watch cache whose pod events lag: :meth:`job_pods` shows the pods as they were when :attr:`frozen`
    was taken; :meth:`list_job_pods` reads the API server itself."""

    frozen: list[dict[str, Any]] | None = None

    def job_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        if self.frozen is not None:
            return copy.deepcopy(self.frozen)
        return super().job_pods(namespace, job)

    def list_job_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        self.requests.append(("list_pods", job))
        return super().job_pods(namespace, job)


def test_the_operator_s_own_restart_is_not_undone_by_a_lagging_pod_cache() -> None:
    """The operator deleted the pods of attempt 0 and wrote attempt 1; its cache still shows them running
    when attempt 1 is placed: the pods listed from the API server show them gone, and attempt 1 starts."""
    world = World(kube=LaggingKube())
    world.submit(with_spec(backoffLimit=3))
    for step in RUNNING:
        step(world)
    world.reconcile()
    kube = world.kube
    assert isinstance(kube, LaggingKube)
    kube.frozen = kube.job_pods(NS, NAME)
    pods_are("Failed", HEAD)(world)
    kube.frozen[0]["status"] = {"phase": "Failed"}  # the failure is seen, the deletions that follow are not
    world.reconcile()  # the restart: attempt 1, the pods of attempt 0 deleted
    assert world.status()["attempt"] == 1 and kube.pods() == {}
    kube.frozen[0]["status"] = {"phase": "Running"}  # as if the failed head's pod had been replaced
    for _ in range(3):
        world.reconcile()  # placed, then created
    status = world.status()
    assert (status["attempt"], status["placement"]["attempt"], status["restarts"]) == (1, 1, 1)
    assert sorted(kube.pods()) == [R1_HEAD, R1_WORKER]
    assert not [e for e in kube.events if e[1] == "StatusOverwritten"]


def test_a_new_operator_finds_the_old_attempt_s_pods_terminating_and_starts_the_next() -> None:
    """An operator (or a new leader) starting while the pods of attempt 0 terminate after a restart its
    predecessor wrote: they carry a deletionTimestamp, so attempt 1 is placed and started, not derived."""
    world = World()
    world.submit(with_spec(backoffLimit=3))
    for step in RUNNING:
        step(world)
    world.reconcile()
    terminating = copy.deepcopy(world.kube.pods())
    pods_are("Failed", HEAD)(world)
    world.reconcile()
    world.reconcile()  # attempt 1 placed; the predecessor stops here
    assert world.status()["placement"]["attempt"] == 1
    for pod in terminating.values():
        pod["metadata"]["deletionTimestamp"] = format_time(T0)
        world.kube.add(pod)
    world.reconciler = JobReconciler(world.kube, lambda: world.kube.snapshot(world.nodes), lambda: world.now)
    world.reconcile()
    status = world.status()
    assert (status["attempt"], status["placement"]["attempt"]) == (1, 1)
    assert sorted(world.kube.pods()) == sorted([HEAD, WORKER, R1_HEAD, R1_WORKER])
    assert not [e for e in world.kube.events if e[1] == "StatusOverwritten"]


def pod(name: str, attempt: str, phase: str = "Running", **meta: Any) -> dict[str, Any]:
    labels = {LABEL_ATTEMPT: attempt}
    return {"metadata": {"name": name, "labels": labels, **meta}, "status": {"phase": phase}}


PLACED_AT_1 = {"attempt": 1, "placement": {"attempt": 1, "nodes": ["gpu-0", "gpu-1"]}, "phase": "Running"}


@pytest.mark.parametrize(
    ("pods", "fresh", "derived"),
    [
        pytest.param([pod(HEAD, "0"), pod(WORKER, "0")], True, 0, id="running-pods-of-0"),
        pytest.param([pod(HEAD, "0"), pod(WORKER, "0")], False, None, id="from-a-cache"),
        pytest.param([pod(HEAD, "0", "Failed"), pod(WORKER, "0", "Failed")], True, None, id="finished"),
        pytest.param(
            [pod(HEAD, "0", deletionTimestamp="t"), pod(WORKER, "0", deletionTimestamp="t")],
            True,
            None,
            id="being-deleted",
        ),
        pytest.param([pod(HEAD, "0"), pod(R1_WORKER, "1", "Pending")], True, None, id="one-of-attempt-1"),
        pytest.param([pod(HEAD, "0"), pod(f"{NAME}-r2-worker-1", "2")], True, None, id="two-attempts"),
        pytest.param([pod(R1_HEAD, "0"), pod(WORKER, "0")], True, None, id="a-relabelled-pod"),
        pytest.param([pod(HEAD, "x"), pod(WORKER, "0")], True, None, id="not-a-number"),
        pytest.param([pod(f"{NAME}-r3-head", "3")], True, 3, id="a-later-attempt"),
        pytest.param([], True, None, id="no-pods"),
    ],
)
def test_the_attempt_is_derived_only_from_fresh_running_pods_of_one_other_attempt(
    pods: list[dict[str, Any]], fresh: bool, derived: int | None
) -> None:
    job = {"metadata": {"name": NAME, "namespace": NS, "uid": UID, "creationTimestamp": format_time(T0)}}
    status = parse_status(PLACED_AT_1)
    seen = Observed(job, status, pods, now=T0 + 60, fresh=fresh)
    shown = contradicted_attempt(job, status, pods)
    after, said = rederive(seen)
    if derived is None:
        assert after.status.attempt == 1 and not [s for s in said if s.startswith("status.attempt")]
        if fresh:
            assert shown is None
    else:
        assert shown is not None and shown[0] == derived
        assert (after.status.attempt, after.status.placement.attempt) == (derived, derived)  # type: ignore[union-attr]
        assert said[0].startswith("status.attempt and status.placement.attempt 1: the job's running pods are")
