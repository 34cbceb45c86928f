"""Queue order and node loss against the real control plane.

Nine 4-node jobs wait and a later 1-node job waits behind them; a deleted node restarts its job at once,
naming the node; a NotReady node is named on its job. Five simulated 8-GPU nodes of their own (profile
``queue-h100``, selected by every job of the module), one operator process for the module.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client

from cluster.polling import wait_for
from cluster.test_operator_jobs import Jobs, job
from verl_devtools.devcluster import DevCluster
from verl_devtools.devcluster.localrun import LocalOperator, install_crd
from verl_devtools.devcluster.profiles import node_group_like
from verl_operator.clusters.labels import PROFILE
from verl_operator.clusters.profile import parse_profile

pytestmark = pytest.mark.timeout(240)

NAME = "queue-h100"
NODES = 5
QUEUE_NODES = {
    "name": NAME,
    "nodeGroups": [
        node_group_like("dgx-h100", namePrefix="qh", count=NODES, zone="us-east-1b", racks=["rack-q1"])
    ],
}
ONLY_THESE = {"nodeSelector": {PROFILE: NAME}}
KWOK_MANAGED = "kwok.x-k8s.io/node"


@pytest.fixture(scope="module")
def operator(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalOperator]:
    """The module's nodes and one operator process with its own managed webhook."""
    devcluster.apply_profile(parse_profile(QUEUE_NODES))
    install_crd(devcluster.kubeconfig)
    op = LocalOperator(
        devcluster.kubeconfig,
        tmp_path_factory.mktemp("operator"),
        webhook_name=f"pytest-queue-{os.getpid()}.verl-operator.io",
    )
    op.start()
    try:
        yield op
    finally:
        op.stop()
        print(op.log_tail(80))
        devcluster.remove_profile(NAME)


@pytest.fixture
def jobs(operator: LocalOperator, kube: client.ApiClient, kubectl: Any, namespace: str) -> Iterator[Jobs]:
    helper = Jobs(kube, kubectl, namespace)
    yield helper
    for item in helper.custom.list_namespaced_custom_object(
        "verl-operator.io", "v1alpha1", namespace, "verljobs"
    )["items"]:
        helper.delete(item["metadata"]["name"])
    helper.core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
    wait_for(lambda: not helper.core.list_namespaced_pod(namespace).items or None, "pods gone", 60)


def placed_reason(status: dict[str, Any]) -> str | None:
    conds = {c["type"]: c for c in status.get("conditions") or []}
    return conds.get("Placed", {}).get("reason")


def test_a_later_one_node_job_waits_behind_nine_queued_four_node_jobs(jobs: Jobs) -> None:
    assert jobs.apply(job("running", 32, 8, resources=ONLY_THESE)).returncode == 0
    jobs.wait_phase("running", "Running")
    big = [f"big-{i}" for i in range(9)]
    for name in big:
        applied = jobs.apply(job(name, 32, 8, resources=ONLY_THESE))
        assert applied.returncode == 0, applied.stderr
        time.sleep(0.05)  # distinct creation times (whole seconds in the API server: the name breaks ties)
    for name in big:
        jobs.wait_phase(name, "Pending")
    time.sleep(1.1)  # the small job is created in a later second than every big one
    assert jobs.apply(job("small", 8, 8, resources=ONLY_THESE)).returncode == 0
    status = wait_for(
        lambda: (s := jobs.status("small")).get("phase") == "Pending" and placed_reason(s) == "Queued" and s,
        "small queued",
        30,
    )
    assert status["reason"] == "Queued"
    assert f"queued behind {jobs.ns}/big-0" in status["message"]
    assert any(e.reason == "Queued" for e in jobs.events("small"))
    for _ in range(6):  # it fits the free node, yet it stays off it
        assert jobs.pods("small") == [] and jobs.phase("small") == "Pending"
        time.sleep(0.25)
    # The running job ends: the head of the queue takes four nodes; the small job still waits behind big-1.
    jobs.delete("running")
    jobs.wait_phase("big-0", "Running", timeout=60)
    assert all(jobs.phase(name) == "Pending" for name in big[1:])
    status = wait_for(
        lambda: (
            (s := jobs.status("small")).get("message", "").startswith(f"queued behind {jobs.ns}/big-1") and s
        ),
        "small queued behind big-1",
        30,
    )
    assert jobs.pods("small") == []


def node_ready(jobs: Jobs, node: str, ready: bool) -> None:
    """Stop or restart the node's simulated kubelet: kwok manages only nodes annotated ``kwok.x-k8s.io/node:
    fake``; without it the node is marked ``Ready=Unknown``, as the node lifecycle controller does when a
    kubelet stops reporting, and kwok marks it Ready again once the annotation is back."""
    if ready:
        jobs.core.patch_node(node, {"metadata": {"annotations": {KWOK_MANAGED: "fake"}}})
        return
    jobs.core.patch_node(node, {"metadata": {"annotations": {KWOK_MANAGED: None}}})
    ready_unknown = {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}
    jobs.core.patch_node_status(node, {"status": {"conditions": [ready_unknown]}})


def test_a_deleted_node_restarts_its_job_at_once_naming_the_node(jobs: Jobs, devcluster: DevCluster) -> None:
    """``kubectl delete node`` under a Running job: the node watch shows it at once; the job restarts (per
    ``backoffLimit``) on the nodes that are left, and the event names the node."""
    assert jobs.apply(job("victim", 32, 8, resources=ONLY_THESE, backoffLimit=2)).returncode == 0
    jobs.wait_phase("victim", "Running")
    node = jobs.status("victim")["placement"]["nodes"][-1]
    deleted_at = time.monotonic()
    jobs.core.delete_node(node)
    try:
        restarted = wait_for(
            lambda: [e for e in jobs.events("victim") if e.reason == "Restarting"], "the Restarting event", 15
        )
        took = time.monotonic() - deleted_at
        assert f"node {node} of pod victim-r0-" in restarted[0].message, restarted[0].message
        assert "was deleted" in restarted[0].message
        assert took < 10, f"the restart came {took:.1f}s after the node was deleted"
        wait_for(
            lambda: (s := jobs.status("victim")).get("phase") == "Running" and s.get("attempt") == 1,
            "victim Running again",
            60,
        )
        status = jobs.status("victim")
        assert status["restarts"] == 1 and node not in status["placement"]["nodes"]
    finally:
        devcluster.apply_profile(parse_profile(QUEUE_NODES))  # the node is back for the next test


def test_a_notready_node_is_named_on_the_job_at_once(jobs: Jobs) -> None:
    assert jobs.apply(job("steady", 8, 8, resources=ONLY_THESE, backoffLimit=1)).returncode == 0
    jobs.wait_phase("steady", "Running")
    node = jobs.status("steady")["placement"]["nodes"][0]
    node_ready(jobs, node, False)
    try:
        status = wait_for(
            lambda: (s := jobs.status("steady")).get("reason") == "NodeNotReady" and s, "NodeNotReady", 15
        )
        assert status["phase"] == "Running"
        assert status["message"].startswith(f"node {node} of pod steady-r0-head is NotReady")
        ready = {c["type"]: c for c in status["conditions"]}["Ready"]
        assert (ready["status"], ready["reason"]) == ("False", "NodeNotReady")
        assert any(e.reason == "NodeNotReady" and node in e.message for e in jobs.events("steady"))
        assert len(jobs.pods("steady")) == 1  # the pods are kept
    finally:
        node_ready(jobs, node, True)
    status = wait_for(
        lambda: (s := jobs.status("steady")).get("reason") == "AllPodsRunning" and s, "Running again", 15
    )
    assert status.get("restarts", 0) == 0 and status.get("attempt", 0) == 0


def test_on_a_shrunken_cluster_the_job_and_nine_queued_jobs_stay_pending(
    jobs: Jobs, devcluster: DevCluster
) -> None:
    """The issue's node loss: a Running 5-node job loses a node; nine queued 5-node jobs wait for it too.

    On the shrunken cluster the job (restarted at once) and the nine wait in ``Pending`` with ``Valid=True``,
    none ``Invalid``; when the node returns, one of the ten runs again and the others wait.
    """
    everything = NODES * 8
    assert jobs.apply(job("victim", everything, 8, resources=ONLY_THESE, backoffLimit=2)).returncode == 0
    jobs.wait_phase("victim", "Running")
    queued = [f"queued-{i}" for i in range(9)]
    for name in queued:
        assert jobs.apply(job(name, everything, 8, resources=ONLY_THESE)).returncode == 0
    for name in queued:
        jobs.wait_phase(name, "Pending")
    node = jobs.status("victim")["placement"]["nodes"][-1]
    jobs.core.delete_node(node)
    try:
        wait_for(lambda: jobs.status("victim").get("restarts") == 1, "victim restarted", 15)
        time.sleep(2)  # several passes of every job on the shrunken cluster
        for name in ["victim", *queued]:
            status = jobs.status(name)
            assert status.get("phase") == "Pending", (name, status)
            valid = {c["type"]: c for c in status.get("conditions") or []}["Valid"]
            assert valid["status"] == "True", (name, valid)
            assert not [e for e in jobs.events(name) if e.reason == "PlanInfeasible"], name
    finally:
        devcluster.apply_profile(parse_profile(QUEUE_NODES))  # the node is back
    # The cluster holds one of the ten again: one runs, the others wait, none is Invalid.
    names = ["victim", *queued]
    wait_for(lambda: [n for n in names if jobs.phase(n) == "Running"], "one of the ten Running", 60)
    phases = sorted(str(jobs.phase(n)) for n in names)
    assert phases == ["Pending"] * 9 + ["Running"], phases
