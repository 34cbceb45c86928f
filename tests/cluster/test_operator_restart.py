"""Restart safety and the controller-side checks, each with an operator process of its own (no webhook).

The restart test slows pod creation down (``VERL_OPERATOR_CREATE_DELAY_SECONDS``), kills the operator with
SIGKILL while it is creating a job's pods, starts a new one and checks that the job ends with exactly its
pods: no duplicate, no orphan, all pinned to the placement written before the first pod was created.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from cluster.polling import wait_for
from verl_devtools.devcluster import DevCluster
from verl_devtools.devcluster.jobs import verljob
from verl_devtools.devcluster.localrun import LocalOperator
from verl_operator.clusters.labels import PROFILE
from verl_operator.controller.reconcile import CREATE_DELAY_ENV

ROOT = Path(__file__).resolve().parents[2]
GROUP, VERSION, PLURAL = "verl-operator.io", "v1alpha1", "verljobs"

pytestmark = pytest.mark.timeout(180)


def make_job(name: str, gpus: int, **spec: Any) -> dict[str, Any]:
    return verljob(name, gpus, resources={"nodeSelector": {PROFILE: "dgx-h100"}}, **spec)


def status_of(custom: client.CustomObjectsApi, ns: str, name: str) -> dict[str, Any]:
    try:
        obj: Any = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
    except ApiException as exc:
        if exc.status == 404:
            return {}
        raise
    return dict(obj.get("status") or {})


def in_phase(custom: client.CustomObjectsApi, ns: str, name: str, phase: str) -> dict[str, Any] | None:
    status = status_of(custom, ns, name)
    return status if status.get("phase") == phase else None


def test_killed_mid_creation_never_duplicates_or_orphans_a_pod(
    devcluster: DevCluster, dgx: None, kube: client.ApiClient, kubectl: Any, namespace: str, tmp_path: Path
) -> None:
    core, custom = client.CoreV1Api(kube), client.CustomObjectsApi(kube)

    def pods() -> list[client.V1Pod]:
        return core.list_namespaced_pod(namespace, label_selector="verl-operator.io/job=restart").items

    slow = LocalOperator(
        devcluster.kubeconfig, tmp_path / "first", webhook_name=None, env={CREATE_DELAY_ENV: "3"}
    )
    slow.start()
    try:
        applied = kubectl(["apply", "-n", namespace, "-f", "-"], input=json.dumps(make_job("restart", 32)))
        assert applied.returncode == 0, applied.stderr
        wait_for(lambda: len(pods()) >= 1 or None, "the first pod", 30)
        slow.kill()
    finally:
        slow.stop()
    created = pods()
    assert 1 <= len(created) < 4, "killed in the middle of creating the 4 pods"
    assert all(p.spec.scheduling_gates for p in created), "no pod is released before all exist"
    placement = status_of(custom, namespace, "restart")["placement"]

    fresh = LocalOperator(devcluster.kubeconfig, tmp_path / "second", webhook_name=None)
    fresh.start()
    try:
        wait_for(lambda: status_of(custom, namespace, "restart").get("phase") == "Running", "Running", 30)
        for _ in range(6):  # a few more reconcile passes must not add anything
            final = pods()
            assert len(final) == 4
            time.sleep(0.25)
    finally:
        fresh.stop()
    names = sorted(p.metadata.name for p in final)
    assert names == ["restart-r0-head", "restart-r0-worker-1", "restart-r0-worker-2", "restart-r0-worker-3"]
    assert {p.metadata.uid for p in created} <= {p.metadata.uid for p in final}, "existing pods were kept"
    by_index = {int(p.metadata.labels["verl-operator.io/node-index"]): p.spec.node_name for p in final}
    assert [by_index[i] for i in range(4)] == placement["nodes"], "pods sit where the placement said"
    assert status_of(custom, namespace, "restart")["placement"]["nodes"] == placement["nodes"]


def test_without_the_webhook_the_controller_marks_an_invalid_job(
    devcluster: DevCluster, dgx: None, kube: client.ApiClient, kubectl: Any, namespace: str, tmp_path: Path
) -> None:
    core, custom = client.CoreV1Api(kube), client.CustomObjectsApi(kube)
    operator = LocalOperator(devcluster.kubeconfig, tmp_path, webhook_name=None)
    operator.start()
    try:
        bad = make_job("bad", 16, data={"trainBatchSize": 100}, rollout={"responsesPerPrompt": 1})
        applied = kubectl(["apply", "-n", namespace, "-f", "-"], input=json.dumps(bad))
        assert applied.returncode == 0, "no webhook: the API server admits it"
        status = wait_for(
            lambda: in_phase(custom, namespace, "bad", "Invalid"),
            "phase Invalid",
            30,
        )
        valid = {c["type"]: c for c in status["conditions"]}["Valid"]
        assert valid["status"] == "False" and valid["reason"] == "PlanInfeasible"
        assert "use trainBatchSize 96 or 112" in valid["message"]
        assert status["violations"][0]["field"] == "spec.data.trainBatchSize"
        stalled = {c["type"]: c for c in status["conditions"]}["Stalled"]
        assert stalled["status"] == "True"
        wait_for(  # the event is posted right after the status write
            lambda: [
                e
                for e in core.list_namespaced_event(namespace).items
                if e.involved_object.name == "bad" and e.type == "Warning" and e.reason == "PlanInfeasible"
            ],
            "the PlanInfeasible event",
            10,
        )
        time.sleep(1)
        assert core.list_namespaced_pod(namespace).items == []
        assert (
            core.list_namespaced_config_map(namespace, label_selector="verl-operator.io/job=bad").items == []
        )

        # Fixing the spec (a new generation) makes it valid and placed.
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, PLURAL, "bad", {"spec": {"data": {"trainBatchSize": 96}}}
        )
        status = wait_for(
            lambda: in_phase(custom, namespace, "bad", "Running"),
            "Running after the fix",
            30,
        )
        assert status["observedGeneration"] == 2 and "violations" not in status
    finally:
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "bad")
        operator.stop()
