"""A 2-node VerlJob on real nodes, on an image with Python and Ray but no verl-launcher: the launcher is
injected from the operator's image, head and worker form one Ray cluster over the pod network, the
launcher's checks pass, the stand-in verl runs with the planned overrides, and the job reaches Succeeded."""

from __future__ import annotations

import json
from typing import Any

import yaml
from kubernetes import client

from cluster.polling import wait_for
from node.conftest import REAL_NODE_TOLERATION, Run
from verl_devtools.devcluster.nodeconfig import REAL_NODE_LABEL
from verl_devtools.devcluster.nodenet import POD_CIDR

GROUP, VERSION, PLURAL = "verl-operator.io", "v1alpha1", "verljobs"


def real_node_job(name: str, image: str, **spec: Any) -> dict[str, Any]:
    """A small GRPO job of 2 nodes x 2 GPUs pinned to the real nodes (requests sized for this machine)."""
    body: dict[str, Any] = {
        "verl": {"image": image, "imagePullPolicy": "Never"},
        "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
        "algorithm": "grpo",
        "data": {"trainBatchSize": 8},
        "rollout": {"responsesPerPrompt": 2},
        "resources": {
            "gpus": 4,
            "gpusPerNode": 2,
            "gpuProduct": "NVIDIA-H100-80GB-HBM3",
            "nodeSelector": {REAL_NODE_LABEL: "true"},
            "tolerations": [REAL_NODE_TOLERATION],
            "cpuPerNode": "200m",
            "memoryPerNode": "1Gi",
            "shmSize": "512Mi",
        },
        "backoffLimit": 0,
    }
    body.update(spec)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "VerlJob", "metadata": {"name": name}, "spec": body}


def apply(kubectl: Run, namespace: str, job: dict[str, Any]) -> None:
    kubectl(["apply", "-n", namespace, "-f", "-"], input=yaml.safe_dump(job), check=True)


def job_status(kube: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    job = client.CustomObjectsApi(kube).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    status: dict[str, Any] = job.get("status") or {}
    return status


def wait_phase(
    kube: client.ApiClient, namespace: str, name: str, phases: set[str], timeout: float
) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        status = job_status(kube, namespace, name)
        return status if status.get("phase") in phases else None

    try:
        return wait_for(reached, f"VerlJob {name} to reach {sorted(phases)}", timeout=timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; last status: {json.dumps(job_status(kube, namespace, name))}") from exc


def pods_of(kube: client.ApiClient, namespace: str, name: str) -> list[Any]:
    return (
        client.CoreV1Api(kube)
        .list_namespaced_pod(namespace, label_selector=f"verl-operator.io/job={name}")
        .items
    )


def test_two_node_job_forms_one_ray_cluster_and_succeeds(
    operator_release: dict[str, Any], test_image: str, kubectl: Run, kube: client.ApiClient, namespace: str
) -> None:
    apply(kubectl, namespace, real_node_job("ray-2node", test_image))
    status = wait_phase(kube, namespace, "ray-2node", {"Succeeded", "Failed"}, timeout=420)
    pods = {p.metadata.labels["verl-operator.io/role"]: p for p in pods_of(kube, namespace, "ray-2node")}
    core = client.CoreV1Api(kube)
    head_log = core.read_namespaced_pod_log(pods["head"].metadata.name, namespace, container="ray")
    assert status["phase"] == "Succeeded", f"{json.dumps(status, indent=1)}\n{head_log[-3000:]}"
    # Two real nodes, two pods on the pod network, each with the launcher copied in by the init container.
    assert {p.spec.node_name for p in pods.values()} == {"real-0", "real-1"}
    prefix = POD_CIDR.split(".0.0/")[0] + "."
    assert all(p.status.pod_ip.startswith(prefix) for p in pods.values())
    for pod in pods.values():
        [init] = pod.status.init_container_statuses
        assert init.name == "install-launcher" and init.state.terminated.exit_code == 0
        assert pod.spec.containers[0].command[:2] == ["python3", "/opt/verl-launcher/verl-launcher.pyz"]
    # The stand-in verl saw both Ray nodes (head and worker pod IPs) with the planned GPUs and overrides.
    [seen_line] = [line for line in head_log.splitlines() if "stand-in verl: {" in line]
    seen = json.loads(seen_line.split("stand-in verl: ", 1)[1])
    assert seen["aliveNodes"] == 2 and seen["nnodes"] == 2 and seen["gpus"] == 4
    assert sorted(seen["nodeIps"]) == sorted(p.status.pod_ip for p in pods.values())
    # Every planned override reached verl's command line (the launcher may add its own, e.g. for resuming).
    assert set(status["plan"]["overrides"]) <= set(seen["overrides"]), seen["overrides"]
    assert "step:2 -" in head_log
    # The head's real termination message carries the launcher's outcome into the job's status.
    head_state = pods["head"].status.container_statuses[0].state.terminated
    assert head_state.exit_code == 0
    assert "verl finished at step 2 of 2" in head_state.message
    assert status["message"] == "the verl run finished: verl finished at step 2 of 2", status


def test_an_image_with_its_own_launcher_runs_it_when_injection_is_off(
    operator_release: dict[str, Any],
    launcher_test_image: str,
    kubectl: Run,
    kube: client.ApiClient,
    namespace: str,
) -> None:
    """``verl.launcher: image``: no init container; the image's own ``verl-launcher`` forms the cluster."""
    job = real_node_job("own-launcher", launcher_test_image)
    job["spec"]["verl"]["launcher"] = "image"
    apply(kubectl, namespace, job)
    status = wait_phase(kube, namespace, "own-launcher", {"Succeeded", "Failed"}, timeout=420)
    pods = pods_of(kube, namespace, "own-launcher")
    assert status["phase"] == "Succeeded", status
    assert len(pods) == 2
    for pod in pods:
        assert not pod.spec.init_containers
        assert pod.spec.containers[0].command == [
            "verl-launcher",
            pod.metadata.labels["verl-operator.io/role"],
        ]
