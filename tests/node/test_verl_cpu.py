"""verl 0.6.1's own trainer runs a VerlJob on real nodes: a head and a worker pod with one stand-in GPU each,
the launcher injected, Ray formed over the pod network, verl's workers in both pods, two real GRPO steps on
CPU (the real-verl tier's tiny model and CPU shim; ``verl_cpu.py`` says how the pods get verl). The job
reaches Succeeded with verl's own step count in its status, and deleting it leaves nothing. A job verl
refuses at run time (its train file does not exist) ends Failed with verl's own error."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest
import yaml
from kubernetes import client

from cluster.polling import wait_for
from node.conftest import Run
from node.test_ray_job import pods_of, wait_phase
from node.verl_cpu import HostVerl, verl_cpu_job
from verl_devtools.devcluster.nodenet import POD_CIDR

GROUP, VERSION, PLURAL = "verl-operator.io", "v1alpha1", "verljobs"
#: A job takes 1-2 min on an idle 2-core machine (Ray's start in two pods, model init, two steps).
JOB_SECONDS = 900

pytestmark = pytest.mark.timeout(1500)


def _apply(kubectl: Run, namespace: str, job: dict[str, Any]) -> None:
    kubectl(["apply", "-n", namespace, "-f", "-"], input=yaml.safe_dump(job), check=True)


def _head_log(kube: client.ApiClient, namespace: str, pods: dict[str, Any]) -> str:
    return str(
        client.CoreV1Api(kube).read_namespaced_pod_log(pods["head"].metadata.name, namespace, container="ray")
    )


def _children_left(kube: client.ApiClient, namespace: str, name: str) -> list[str]:
    selector = f"verl-operator.io/job={name}"
    core = client.CoreV1Api(kube)
    found = [
        *(
            f"pod/{p.metadata.name}"
            for p in core.list_namespaced_pod(namespace, label_selector=selector).items
        ),
        *(
            f"service/{s.metadata.name}"
            for s in core.list_namespaced_service(namespace, label_selector=selector).items
        ),
        *(
            f"configmap/{c.metadata.name}"
            for c in core.list_namespaced_config_map(namespace, label_selector=selector).items
        ),
    ]
    return found


def test_verl_trains_two_steps_across_a_head_and_a_worker_pod(
    operator_release: dict[str, Any],
    test_image: str,
    host_verl: HostVerl,
    kubectl: Run,
    kube: client.ApiClient,
    namespace: str,
) -> None:
    _apply(kubectl, namespace, verl_cpu_job("verl-grpo", test_image, host_verl))
    started = time.monotonic()
    status = wait_phase(kube, namespace, "verl-grpo", {"Succeeded", "Failed"}, timeout=JOB_SECONDS)
    elapsed = time.monotonic() - started
    pods = {p.metadata.labels["verl-operator.io/role"]: p for p in pods_of(kube, namespace, "verl-grpo")}
    head_log = _head_log(kube, namespace, pods)
    assert status["phase"] == "Succeeded", f"{json.dumps(status, indent=1)}\n{head_log[-6000:]}"
    assert set(pods) == {"head", "worker"}
    prefix = POD_CIDR.split(".0.0/")[0] + "."
    worker_ip = pods["worker"].status.pod_ip
    assert worker_ip.startswith(prefix) and pods["head"].status.pod_ip.startswith(prefix)
    # verl's own lines, printed by its driver in the head pod: the steps and the trainer's total.
    assert "(TaskRunner pid=" in head_log and "step:2 - " in head_log, head_log[-6000:]
    [step_line] = [line for line in head_log.splitlines() if "step:2 - " in line]
    assert "timing_s/update_actor:" in step_line and "timing_s/ref:" in step_line, step_line
    # verl's workers ran in both pods: Ray tags the lines of an actor on another node with that node's IP.
    assert f"ip={worker_ip})" in head_log, "no verl worker output from the worker pod"
    # The head's termination message carries verl's step count into the job's status.
    head_state = pods["head"].status.container_statuses[0].state.terminated
    assert head_state.exit_code == 0 and "verl finished at step 2 of 2" in head_state.message
    assert status["message"] == "the verl run finished: verl finished at step 2 of 2", status
    assert status["plan"]["nnodes"] == 2, status["plan"]
    progress = status.get("progress") or {}
    print(f"2 verl steps on real nodes in {elapsed:.0f}s; status.progress: {json.dumps(progress)}")
    print("\n".join(line for line in head_log.splitlines() if "step:" in line))
    # Deleting the job removes its pods, Service and launch ConfigMap.
    client.CustomObjectsApi(kube).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, PLURAL, "verl-grpo"
    )
    wait_for(
        lambda: not _children_left(kube, namespace, "verl-grpo"),
        "the job's pods, Service and ConfigMap to be deleted",
        timeout=120,
        interval=1,
    )


def test_a_job_verl_refuses_at_run_time_fails_with_verls_error(
    operator_release: dict[str, Any],
    test_image: str,
    host_verl: HostVerl,
    kubectl: Run,
    kube: client.ApiClient,
    namespace: str,
) -> None:
    """The planner and the webhook cannot know the train file is missing; verl's dataset loader refuses it."""
    missing = host_verl.assets / "data" / "absent.parquet"
    _apply(kubectl, namespace, verl_cpu_job("verl-no-data", test_image, host_verl, train_file=missing))
    status = wait_phase(kube, namespace, "verl-no-data", {"Succeeded", "Failed"}, timeout=JOB_SECONDS)
    assert status["phase"] == "Failed", json.dumps(status, indent=1)
    assert status["reason"] == "VerlFailed", status
    error = f"verl exited with code 1 at step 0: FileNotFoundError: Unable to find '{missing}'"
    assert error in status["message"], status
