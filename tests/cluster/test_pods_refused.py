"""Pods the API server refuses, seen by an operator without its webhook (the dry run at admission is in
``test_admission_hostile.py``): the job is ``Invalid`` with Pod Security's own message and frees its GPUs."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from cluster.polling import wait_for
from verl_operator.devcluster import DevCluster
from verl_operator.devcluster.localrun import LocalOperator, install_crd

GROUP, VERSION, PLURAL = "verl-operator.io", "v1alpha1", "verljobs"

pytestmark = pytest.mark.timeout(180)


def job(name: str, **security: Any) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "VerlJob",
        "metadata": {"name": name},
        "spec": {
            "verl": {"image": "ghcr.io/example/verl:0.9.1"},
            "model": {"path": "Qwen/Qwen2.5-0.5B-Instruct"},
            "data": {"trainBatchSize": 64},
            "rollout": {"responsesPerPrompt": 4},
            # Both mixed-h100 nodes: the second job can only run once the first frees them.
            "resources": {"gpus": 16, "gpusPerNode": 8, "gpuProduct": "NVIDIA-H100-80GB-HBM3"},
            "security": security,
        },
    }


@pytest.fixture
def restricted(kube: client.ApiClient) -> Iterator[str]:
    name = f"t-refused-{os.urandom(3).hex()}"
    core = client.CoreV1Api(kube)
    labels = {"pod-security.kubernetes.io/enforce": "restricted", "verl-operator.io/test": "true"}
    core.create_namespace({"metadata": {"name": name, "labels": labels}})
    yield name
    custom = client.CustomObjectsApi(kube)
    for item in custom.list_namespaced_custom_object(GROUP, VERSION, name, PLURAL)["items"]:
        custom.delete_namespaced_custom_object(GROUP, VERSION, name, PLURAL, item["metadata"]["name"])
    core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(name).items or None, "pods gone", 30)
    core.delete_namespace(name, propagation_policy="Background")


def test_refused_pods_make_the_job_invalid_and_release_its_gpus(
    devcluster: DevCluster, kube: client.ApiClient, kubectl: Any, restricted: str, tmp_path: Path
) -> None:
    install_crd(devcluster.kubeconfig)
    operator = LocalOperator(devcluster.kubeconfig, tmp_path, webhook_name=None)
    operator.start()
    custom, core = client.CustomObjectsApi(kube), client.CoreV1Api(kube)

    def status(name: str) -> dict[str, Any]:
        obj: Any = custom.get_namespaced_custom_object(GROUP, VERSION, restricted, PLURAL, name)
        return dict(obj.get("status") or {})

    try:
        applied = kubectl(["apply", "-n", restricted, "-f", "-"], input=json.dumps(job("rootful")))
        assert applied.returncode == 0, "no webhook: the API server admits the job"
        refused = wait_for(
            lambda: status("rootful") if status("rootful").get("reason") == "PodsRefused" else None,
            "rootful PodsRefused",
            60,
        )
        assert refused["phase"] == "Invalid" and "violates PodSecurity" in refused["message"]
        assert "runAsNonRoot" in refused["message"] and "placement" not in refused
        events = [
            e for e in core.list_namespaced_event(restricted).items if e.involved_object.name == "rootful"
        ]
        assert any(e.type == "Warning" and e.reason == "PodsRefused" for e in events)
        # Its GPUs are free: a job that passes Pod Security takes the same nodes.
        nonroot = job("nonroot", podSecurityContext={"runAsNonRoot": True, "runAsUser": 1000})
        assert kubectl(["apply", "-n", restricted, "-f", "-"], input=json.dumps(nonroot)).returncode == 0
        wait_for(lambda: status("nonroot").get("phase") == "Running", "nonroot Running", 60)
        assert status("rootful")["phase"] == "Invalid", "a refused job is not retried for the same spec"
    finally:
        operator.stop()
