"""Failure paths with real containers: real exit codes and termination messages reach the job's status, a
killed worker container restarts the Ray cluster per backoffLimit, and a deleted job's pods get SIGTERM and
the launcher stops verl and Ray cleanly within the grace period."""

from __future__ import annotations

import subprocess
import time
from typing import Any

from kubernetes import client

from cluster.polling import wait_for
from node.conftest import Run
from node.test_ray_job import apply, pods_of, real_node_job, wait_phase
from verl_devtools.devcluster import DevCluster


def env(**values: str) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in values.items()]


def running_pod(kube: client.ApiClient, namespace: str, job: str, role: str, log_marker: str) -> Any:
    """The job's pod of ``role`` once its ray container runs and its log shows ``log_marker``."""
    core = client.CoreV1Api(kube)

    def ready() -> Any:
        for pod in pods_of(kube, namespace, job):
            if pod.metadata.labels.get("verl-operator.io/role") != role or pod.status.phase != "Running":
                continue
            try:
                log = core.read_namespaced_pod_log(pod.metadata.name, namespace, container="ray")
            except client.exceptions.ApiException:
                continue
            if log_marker in log:
                return pod
        return None

    return wait_for(ready, f"the {role} of {job} to log {log_marker!r}", timeout=300)


def test_verl_exiting_non_zero_fails_the_job_with_the_launchers_message(
    operator_release: dict[str, Any], test_image: str, kubectl: Run, kube: client.ApiClient, namespace: str
) -> None:
    apply(kubectl, namespace, real_node_job("verl-fails", test_image, env=env(STANDIN_VERL_EXIT="3")))
    status = wait_phase(kube, namespace, "verl-fails", {"Succeeded", "Failed"}, timeout=420)
    assert status["phase"] == "Failed", status
    [head] = [
        p
        for p in pods_of(kube, namespace, "verl-fails")
        if p.metadata.labels["verl-operator.io/role"] == "head"
    ]
    terminated = head.status.container_statuses[0].state.terminated
    assert terminated.exit_code == 10  # the launcher's VerlFailed
    assert '"reason": "VerlFailed"' in terminated.message or '"reason":"VerlFailed"' in terminated.message
    assert "verl exited with code 3 at step 2 of 2" in status["message"], status
    assert status["reason"] == "VerlFailed", status


def test_a_killed_worker_container_restarts_the_ray_cluster_per_backoff_limit(
    realcluster: DevCluster,
    operator_release: dict[str, Any],
    test_image: str,
    kubectl: Run,
    kube: client.ApiClient,
    namespace: str,
) -> None:
    job = real_node_job("worker-killed", test_image, backoffLimit=1, env=env(STANDIN_VERL_SLEEP="10"))
    apply(kubectl, namespace, job)
    running_pod(kube, namespace, "worker-killed", "head", "Total training steps")
    worker = running_pod(kube, namespace, "worker-killed", "worker", "joined the Ray cluster")
    container_id = worker.status.container_statuses[0].container_id.split("://", 1)[1]
    node_dir = realcluster.layout.base / "nodes" / worker.spec.node_name / "containerd"
    killed = subprocess.run(
        [
            "ctr",
            f"--address={node_dir / 'containerd.sock'}",
            "--namespace=k8s.io",
            "tasks",
            "kill",
            "--signal=SIGKILL",
            container_id,
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert killed.returncode == 0, killed.stderr
    status = wait_phase(kube, namespace, "worker-killed", {"Succeeded", "Failed"}, timeout=600)
    assert status["phase"] == "Succeeded", status
    assert status.get("restarts") == 1, status
    # The second Ray cluster's pods carry attempt 1; the first attempt's are gone.
    assert {
        p.metadata.labels["verl-operator.io/attempt"] for p in pods_of(kube, namespace, "worker-killed")
    } == {"1"}
    events = client.CoreV1Api(kube).list_namespaced_event(namespace).items
    assert any("137" in (e.message or "") and "restart" in (e.message or "") for e in events), [
        e.message for e in events
    ]


def test_deleting_the_job_stops_verl_and_ray_cleanly_within_the_grace_period(
    operator_release: dict[str, Any],
    test_image: str,
    kubectl: Run,
    kubectl_command: list[str],
    kube: client.ApiClient,
    namespace: str,
) -> None:
    apply(kubectl, namespace, real_node_job("deleted", test_image, env=env(STANDIN_VERL_SLEEP="300")))
    head = running_pod(kube, namespace, "deleted", "head", "Total training steps")
    grace = head.spec.termination_grace_period_seconds
    # Follow the head's log to its end: the last lines are written after SIGTERM.
    follow = subprocess.Popen(
        [*kubectl_command, "logs", "-f", "-n", namespace, head.metadata.name, "-c", "ray"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    time.sleep(1)
    started = time.monotonic()
    kubectl(["delete", "verljob", "deleted", "-n", namespace, "--wait=false"], check=True)
    wait_for(lambda: not pods_of(kube, namespace, "deleted"), "the job's pods to be gone", timeout=grace + 30)
    elapsed = time.monotonic() - started
    out, _ = follow.communicate(timeout=30)
    assert elapsed < grace, f"pods took {elapsed:.0f}s to stop (grace {grace}s):\n{out[-2000:]}"
    assert "stand-in verl: received SIGTERM" in out, out[-3000:]
    assert "stopping the Ray head" in out, out[-3000:]
    assert "received SIGTERM. Draining" in out, out[-3000:]  # Ray's own clean shutdown of the head node
