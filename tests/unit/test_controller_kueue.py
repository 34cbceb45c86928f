"""A job handed to Kueue: what the reconciler makes of Kueue's gate, its Workload and its eviction (tables).

The pods are changed here as Kueue changes them on a real cluster (its admission gate, its
``TerminationTarget`` condition before it deletes them, the Workload's conditions); ``tests/cluster/
test_kueue.py`` runs the same situations against a real Kueue.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from conftest import make_nodes
from fakekube import FakeKube

from verl_operator.controller.kueue import ADMISSION_GATE, POLL_SECONDS, poll_due
from verl_operator.controller.reconcile import JobReconciler
from verl_operator.controller.status import format_time

NS, NAME, UID = "team", "j", "uid-j"
T0 = 1_800_000_000.0
SPEC: dict[str, Any] = {
    "verl": {"image": "example.com/verl:0.9.1"},
    "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
    "resources": {"gpus": 16},
    "scheduling": {"queueName": "gpu"},
    "backoffLimit": 1,
}
QUOTA = (
    "couldn't assign flavors to pod set main: insufficient quota for nvidia.com/gpu in flavor h100, "
    "previously considered podsets requests (0) + current podset request (16) > maximum capacity (8)"
)
EVICTED = (
    "Preempted to accommodate a workload (UID: u-2, JobUID: u-3) due to prioritization in the ClusterQueue"
)


class World:
    """A fake API server with two 8-GPU nodes, the reconciler and what Kueue did to the pods."""

    def __init__(self, spec: dict[str, Any] = SPEC) -> None:
        self.kube = FakeKube()
        nodes = make_nodes(2, 8)
        self.reconciler = JobReconciler(self.kube, lambda: self.kube.snapshot(nodes), lambda: T0)
        meta = {
            "name": NAME,
            "namespace": NS,
            "uid": UID,
            "generation": 1,
            "creationTimestamp": format_time(T0),
        }
        self.kube.add(
            {"apiVersion": "verl-operator.io/v1alpha1", "kind": "VerlJob", "metadata": meta, "spec": spec}
        )

    def reconcile(self, times: int = 1) -> dict[str, Any]:
        for _ in range(times):
            self.reconciler.reconcile(NS, NAME)
        return dict((self.kube.get_job(NS, NAME) or {}).get("status") or {})

    def pods(self) -> dict[str, dict[str, Any]]:
        return self.kube.pods()


def kueue_gates(w: World) -> None:
    """Kueue's webhook: every pod of the queue carries the admission gate."""
    for pod in w.pods().values():
        pod["spec"]["schedulingGates"] = [{"name": ADMISSION_GATE}]


def workload(reserved: str | None = QUOTA, evicted: str | None = None) -> Callable[[World], None]:
    def put(w: World) -> None:
        conds = []
        if reserved is not None:
            conds.append(
                {"type": "QuotaReserved", "status": "False", "reason": "Pending", "message": reserved}
            )
        if evicted is not None:
            conds.append({"type": "Evicted", "status": "True", "reason": "Preempted", "message": evicted})
        w.kube.add(
            {
                "kind": "Workload",
                "metadata": {"name": f"{NAME}-r0", "namespace": NS},
                "status": {"conditions": conds},
            }
        )

    return put


def admitted_and_running(w: World) -> None:
    """Kueue removed its gate; the scheduler bound the pods; they run."""
    for i, pod in enumerate(w.pods().values()):
        pod["spec"].pop("schedulingGates", None)
        pod["spec"]["nodeName"] = f"node-{i}"
        pod["status"] = {"phase": "Running"}


def kueue_evicts(w: World) -> None:
    """Kueue's Stop: the TerminationTarget condition on every pod, then their deletion (held by its finalizer)."""
    for pod in w.pods().values():
        pod["status"].setdefault("conditions", []).append(
            {"type": "TerminationTarget", "status": "True", "reason": "WorkloadEvicted", "message": EVICTED}
        )
        pod["metadata"]["deletionTimestamp"] = format_time(T0 + 5)


def pods_vanish(w: World) -> None:
    for name in list(w.pods()):
        w.kube.objects.pop(("Pod", NS, name))


@pytest.mark.parametrize(
    ("steps", "phase", "reason", "message"),
    [
        pytest.param([kueue_gates, workload()], "Pending", "NotAdmitted", QUOTA, id="gated-quota-message"),
        pytest.param(
            [kueue_gates],
            "Pending",
            "NotAdmitted",
            "Kueue has not created the pod group's Workload yet",
            id="no-workload",
        ),
        pytest.param(
            [kueue_gates, workload(reserved=None)],
            "Pending",
            "NotAdmitted",
            "not evaluated",
            id="not-evaluated",
        ),
        pytest.param(
            [kueue_gates, admitted_and_running], "Running", "AllPodsRunning", "2 Ray pods", id="admitted"
        ),
        pytest.param(
            [kueue_gates, admitted_and_running, kueue_evicts], "Pending", "Preempted", EVICTED, id="evicted"
        ),
        pytest.param(
            [kueue_gates, admitted_and_running, pods_vanish, workload(reserved=None, evicted=EVICTED)],
            "Pending",
            "Preempted",
            EVICTED,
            id="evicted-pods-already-gone",
        ),
        pytest.param(
            [kueue_gates, admitted_and_running, pods_vanish],
            "Pending",
            "Restarting",
            "disappeared",
            id="lost-not-kueue",
        ),
    ],
)
def test_what_kueue_did_becomes_the_jobs_status(
    steps: list[Callable[[World], None]], phase: str, reason: str, message: str
) -> None:
    world = World()
    world.reconcile(2)  # placed (handed off), then every pod created
    assert set(world.pods()) == {f"{NAME}-r0-head", f"{NAME}-r0-worker-1"}
    for step in steps:
        step(world)
    status = world.reconcile()
    assert (status["phase"], status["reason"]) == (phase, reason), status["message"]
    assert message in status["message"]
    if reason in ("NotAdmitted", "Preempted"):
        placed = next(c for c in status["conditions"] if c["type"] == "Placed")
        assert (placed["status"], placed["reason"]) == ("False", reason) and message in placed["message"]


def test_a_preempted_job_requeues_as_the_next_attempt_without_counting_a_restart() -> None:
    world = World()
    world.reconcile(2)
    kueue_gates(world)
    admitted_and_running(world)
    world.reconcile()
    kueue_evicts(world)
    status = world.reconcile()
    assert status["attempt"] == 1 and status.get("restarts", 0) == 0 and "placement" not in status
    assert not world.pods(), "the evicted pods are deleted"
    assert ("Warning", "Preempted") in [(t, r) for t, r, _ in world.kube.events]
    status = world.reconcile(2)  # handed to Kueue again: the next pod group
    assert set(world.pods()) == {f"{NAME}-r1-head", f"{NAME}-r1-worker-1"}
    labels = {p["metadata"]["labels"]["kueue.x-k8s.io/pod-group-name"] for p in world.pods().values()}
    assert labels == {f"{NAME}-r1"}
    for pod in world.pods().values():  # the operator retries, not Kueue: the group ends when its pods end
        assert pod["metadata"]["annotations"]["kueue.x-k8s.io/retriable-in-group"] == "false"
        assert pod["metadata"]["annotations"]["kueue.x-k8s.io/pod-group-total-count"] == "2"
    assert world.kube.get_job(NS, NAME)["spec"] == SPEC  # type: ignore[index]
    kueue_gates(world)
    status = world.reconcile()
    assert status["reason"] == "NotAdmitted" and status.get("restarts", 0) == 0
    preempted = next(c for c in status["conditions"] if c["type"] == "Preempted")
    assert preempted["status"] == "True" and EVICTED in preempted["message"], "kept while attempt 1 waits"
    admitted_and_running(world)
    status = world.reconcile()
    preempted = next(c for c in status["conditions"] if c["type"] == "Preempted")
    assert (status["reason"], preempted["status"]) == ("Admitted", "False")


def test_the_workload_is_read_only_while_kueue_holds_or_removed_the_pods() -> None:
    world = World()
    world.reconcile(2)
    admitted_and_running(world)
    world.reconcile(3)
    assert not [r for r in world.kube.requests if r[0] == "read_workload"]
    builtin = World({k: v for k, v in SPEC.items() if k != "scheduling"})
    builtin.reconcile(3)
    assert not [r for r in builtin.kube.requests if r[0] == "read_workload"]
    kueue_gates(world)
    world.reconcile()
    assert [r for r in world.kube.requests if r[0] == "read_workload"] == [("read_workload", f"{NAME}-r0")]


@pytest.mark.parametrize(
    ("status", "due"),
    [
        pytest.param({"phase": "Pending", "reason": "NotAdmitted"}, T0 + POLL_SECONDS, id="waits-for-kueue"),
        pytest.param({"phase": "Running", "reason": "AllPodsRunning"}, None, id="running"),
        pytest.param(
            {"phase": "Pending", "reason": "Preempted"}, None, id="preempted-is-placed-again-at-once"
        ),
        pytest.param({"phase": "Failed", "reason": "NotAdmitted"}, None, id="finished"),
    ],
)
def test_only_a_job_waiting_for_kueues_admission_is_polled(status: dict[str, Any], due: float | None) -> None:
    assert poll_due({"status": status}, T0) == due


@pytest.mark.parametrize(
    ("policy", "annotation"),
    [
        pytest.param("required", "kueue.x-k8s.io/podset-required-topology", id="required"),
        pytest.param("preferred", "kueue.x-k8s.io/podset-preferred-topology", id="preferred"),
        pytest.param(None, None, id="no-topology-rule"),
    ],
)
def test_the_topology_rule_is_handed_to_kueues_topology_aware_scheduling(
    policy: str | None, annotation: str | None
) -> None:
    rack = "network.topology.nvidia.com/leaf"
    placement = {"topologyKey": rack, "topologyPolicy": policy} if policy else {}
    world = World({**SPEC, "placement": placement})
    world.reconcile(2)
    for pod in world.pods().values():
        topology = {k: v for k, v in pod["metadata"]["annotations"].items() if k.endswith("-topology")}
        assert topology == ({annotation: rack} if annotation else {})
        assert "affinity" not in pod["spec"], "Kueue chooses the nodes"


def test_admission_after_waiting_sets_placed_and_then_running() -> None:
    world = World()
    world.reconcile(2)
    kueue_gates(world)
    workload()(world)
    assert world.reconcile()["reason"] == "NotAdmitted"
    admitted_and_running(world)
    status = world.reconcile()
    placed = next(c for c in status["conditions"] if c["type"] == "Placed")
    assert (status["phase"], status["reason"]) == ("Starting", "Admitted")
    assert (placed["status"], placed["reason"]) == ("True", "Admitted") and f"{NAME}-r0" in placed["message"]
    status = world.reconcile()
    placed = next(c for c in status["conditions"] if c["type"] == "Placed")
    assert status["phase"] == "Running" and (placed["status"], placed["reason"]) == ("True", "Admitted")
