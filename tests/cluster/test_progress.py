"""Progress and stalls against the real control plane: the launcher's progress endpoint fed by a stand-in
that prints verl's real console lines (tests/cluster/verl_standin.py), read by the operator process into
status.progress, kubectl's printer columns, the per-job metrics, then a Stalled condition when it stops.

The job's pods are kwok's; the head pod's IP is set to 127.0.0.1 (kwok gives a pod its IP once), where the
test serves the head's endpoint with the launcher's own tracker and server.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from cluster.polling import wait_for
from verl_devtools.devcluster import DevCluster
from verl_devtools.devcluster.localrun import LocalOperator
from verl_launcher.processes import Child
from verl_launcher.progress import ProgressTracker
from verl_launcher.progress_server import ProgressServer

GROUP, VERSION, PLURAL = "verl-operator.io", "v1alpha1", "verljobs"
STANDIN = Path(__file__).with_name("verl_standin.py")

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[ProgressTracker, int]]:
    """The head's tracker and its progress endpoint on 127.0.0.1 (the port read back)."""
    tracker = ProgressTracker()
    server = ProgressServer(tracker.progress, host="127.0.0.1", port=0).start()
    yield tracker, server.port
    server.stop()


@pytest.fixture(scope="module")
def operator(
    devcluster: DevCluster,
    dgx: None,
    served: tuple[ProgressTracker, int],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[LocalOperator]:
    op = LocalOperator(
        devcluster.kubeconfig,
        tmp_path_factory.mktemp("operator"),
        webhook_name=None,
        extra_args=(f"--progress-port={served[1]}",),
    )
    op.start()
    yield op
    op.stop()
    print(op.log_tail(60))


def job(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "VerlJob",
        "metadata": {"name": name},
        "spec": {
            "verl": {"image": "ghcr.io/example/verl:0.9.1"},
            "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
            "data": {"trainBatchSize": 64},
            "rollout": {"responsesPerPrompt": 4},
            "resources": {"gpus": 8, "gpusPerNode": 8},
            "monitoring": {
                "statusIntervalSeconds": 5,
                "stall": {"firstStepSeconds": 30, "minStepSeconds": 30, "stepFactor": 2, "action": "none"},
            },
        },
    }


def test_steps_reach_status_columns_and_metrics_then_a_hang_is_stalled(
    kube: client.ApiClient,
    kubectl: Any,
    namespace: str,
    operator: LocalOperator,
    served: tuple[ProgressTracker, int],
) -> None:
    head = served[0]
    custom, core = client.CustomObjectsApi(kube), client.CoreV1Api(kube)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job("steps"))

    def status() -> dict[str, Any]:
        obj: Any = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "steps")
        return dict(obj.get("status") or {})

    wait_for(lambda: status().get("phase") == "Running", "job Running", 60)
    pods = core.list_namespaced_pod(namespace, label_selector="verl-operator.io/role=head").items
    assert len(pods) == 1
    core.patch_namespaced_pod_status(pods[0].metadata.name, namespace, {"status": {"podIP": "127.0.0.1"}})

    # Before the first step: Ray forming, then verl started.
    head.enter("RayFormed")
    head.enter("VerlStarted")
    wait_for(
        lambda: (status().get("progress") or {}).get("launchPhase") == "VerlStarted", "launch phase read", 30
    )
    condition = {c["type"]: c for c in status()["conditions"]}["Progressing"]
    assert (condition["status"], condition["reason"]) == ("True", "VerlStarted")

    def feed(line: str) -> None:
        head.feed(line)

    # The published step (93.52 s, gen 24.53 s) 40 times faster: 2.338 s steps, gen 26% of them.
    verl = Child([sys.executable, str(STANDIN), "300", "3", "40"], dict(os.environ), on_line=feed)
    try:
        wait_for(lambda: (status().get("progress") or {}).get("step") == 3, "step 3 in status", 30)
        progress = status()["progress"]
        assert (progress["totalSteps"], progress["stepSeconds"]) == (300, 2.338)
        assert progress["phases"]["gen"] == pytest.approx(24.533 / 40, abs=1e-3)
        # ETA: 297 steps left x 2.338 s = 694 s.
        assert progress["columns"] == {
            "step": "3/300",
            "stepTime": "2.3s",
            "generation": "26%",
            "eta": "11m34s",
        }
        table = kubectl(["get", "verljobs", "-n", namespace]).stdout
        assert "STEP TIME" in table and "GEN %" in table and "3/300" in table and "11m34s" in table
        text = operator.metrics()
        assert f'verl_operator_job_step{{verljob="steps",verljob_namespace="{namespace}"}} 3.0' in text
        assert (
            f'verl_operator_job_phase_seconds{{phase="gen",verljob="steps",verljob_namespace="{namespace}"}}'
            in text
        )

        # verl stops printing: no new step within max(2 x 2.338 s, 30 s).
        def stalled() -> dict[str, Any] | None:
            conds = {c["type"]: c for c in status().get("conditions", [])}
            found = conds.get("Stalled")
            return found if found and found["status"] == "True" else None

        found = wait_for(stalled, "Stalled", 60, interval=1.0)
        assert found["reason"] == "NoNewStep"
        assert "last step 3 of 300" in found["message"] and "launch phase Stepping" in found["message"]
        assert status()["phase"] == "Running"  # action none: the job keeps its GPUs, the condition says why
        events = json.loads(kubectl(["get", "events", "-n", namespace, "-o", "json"]).stdout)["items"]
        assert any(e["reason"] == "Stalled" for e in events)
        assert (
            f'verl_operator_job_stalled{{verljob="steps",verljob_namespace="{namespace}"}} 1.0'
            in operator.metrics()
        )
    finally:
        verl.stop(5.0)
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "steps")
    wait_for(
        lambda: f'job="steps",namespace="{namespace}"' not in operator.metrics() or None,
        "per-job series removed",
        30,
    )


def test_a_forged_progress_is_replaced_by_the_head_s_reading(
    kube: client.ApiClient,
    namespace: str,
    operator: LocalOperator,
    served: tuple[ProgressTracker, int],
) -> None:
    """``kubectl patch --subresource=status`` of status.progress (another step time, a write time in 2099
    that would hold off every later write): the operator writes the head's reading again at its next read
    and says so in a StatusOverwritten Warning."""
    custom, core = client.CustomObjectsApi(kube), client.CoreV1Api(kube)
    custom.create_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, job("forgedprog"))

    def status() -> dict[str, Any]:
        obj: Any = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "forgedprog")
        return dict(obj.get("status") or {})

    wait_for(lambda: status().get("phase") == "Running", "job Running", 60)
    selector = "verl-operator.io/role=head,verl-operator.io/job=forgedprog"
    (pod,) = core.list_namespaced_pod(namespace, label_selector=selector).items
    core.patch_namespaced_pod_status(pod.metadata.name, namespace, {"status": {"podIP": "127.0.0.1"}})
    own = wait_for(lambda: status().get("progress"), "progress read", 30)
    forged = {
        **own,
        "stepSeconds": 0.001,
        "updatedAt": "2099-01-01T00:00:00Z",
        "columns": {**own.get("columns", {}), "stepTime": "0.0s"},
    }
    custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, PLURAL, "forgedprog", {"status": {"progress": forged}}
    )

    found: Any = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "forgedprog")
    uid = found["metadata"]["uid"]

    def overwritten() -> Any:
        events = core.list_namespaced_event(namespace).items
        return next(
            (e for e in events if e.involved_object.uid == uid and e.reason == "StatusOverwritten"), None
        )

    event = wait_for(overwritten, "a StatusOverwritten event", 30)
    assert f"status.progress (step {own.get('step', 0)}, updated 2099-01-01T00:00:00Z)" in event.message

    def rewritten() -> dict[str, Any] | None:
        progress = status().get("progress") or {}
        return progress if progress.get("updatedAt") != forged["updatedAt"] else None

    progress = wait_for(rewritten, "the head's reading written again", 30)
    assert (progress.get("step"), progress.get("stepSeconds"), progress.get("launchPhase")) == (
        own.get("step"),
        own.get("stepSeconds"),
        own.get("launchPhase"),
    )
    assert progress.get("columns") == own.get("columns")
    assert status()["phase"] == "Running"
    custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, "forgedprog")
