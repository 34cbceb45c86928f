"""GPU nodes in the label styles of real clusters (profile ``label-styles``) against the real control plane.

A stock GPU Operator labels every GPU node ``nvidia.com/mig.strategy=single`` whether MIG is used or not; jobs
place on such nodes, on a GKE node without GPU Feature Discovery and on a Karpenter-labelled node, while a
time-sliced and a MIG node are refused with their own reasons, and a bare ``nvidia.com/gpu=present`` node
takes a job only when ``spec.resources.gpuMemoryMiB`` gives its GPU memory.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from cluster.operators import webhook_operator
from cluster.polling import wait_for
from verl_devtools.devcluster import DevCluster
from verl_devtools.devcluster.jobs import verljob
from verl_devtools.devcluster.localrun import LocalOperator

GROUP, VERSION, PLURAL = "verl-operator.io", "v1alpha1", "verljobs"
ZONE = {"topology.kubernetes.io/zone": "us-east-1b"}  # the profile's zone: no other test's nodes

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def operator(devcluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalOperator]:
    devcluster.apply_profile("label-styles")
    with webhook_operator(devcluster, tmp_path_factory.mktemp("operator"), "styles", log_lines=60) as op:
        yield op
    devcluster.remove_profile("label-styles")


def styled_job(name: str, gpus: int, selector: dict[str, str], **resources: Any) -> dict[str, Any]:
    return verljob(name, gpus, resources={"nodeSelector": {**ZONE, **selector}, **resources})


def test_label_styles_place_or_are_refused_with_their_reasons(
    operator: LocalOperator, kube: client.ApiClient, kubectl: Any, namespace: str
) -> None:
    custom, core = client.CustomObjectsApi(kube), client.CoreV1Api(kube)

    def status(name: str) -> dict[str, Any]:
        try:
            obj: Any = custom.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
        except ApiException:
            return {}
        return dict(obj.get("status") or {})

    placed = {
        # the stock GPU Operator nodes: GFD's full label set, mig.strategy=single, MIG disabled
        "gpu-operator": (16, {"nvidia.com/mig.strategy": "single", "nvidia.com/mig.config": "all-disabled"}),
        "gke": (8, {"cloud.google.com/gke-accelerator": "nvidia-h100-80gb"}),
        "karpenter": (8, {"karpenter.k8s.aws/instance-gpu-name": "h100"}),
    }
    for name, (gpus, selector) in placed.items():
        applied = kubectl(
            ["apply", "-n", namespace, "-f", "-"], input=json.dumps(styled_job(name, gpus, selector))
        )
        assert applied.returncode == 0, applied.stderr
    for name, (gpus, _) in placed.items():
        wait_for(lambda n=name: status(n).get("phase") == "Running", f"{name} Running ({status(name)})", 60)
        pods = core.list_namespaced_pod(namespace, label_selector=f"verl-operator.io/job={name}").items
        nodes = sorted(p.spec.node_name for p in pods)
        assert len(nodes) == gpus // 8 and all(n.startswith(f"style-{name}-") for n in nodes), nodes

    # Refused at admission, each with its own reason (the webhook plans against the live nodes).
    refused = {
        "time-sliced": ({"kubernetes.io/hostname": "style-time-sliced-0"}, "time-sliced replicas of one GPU"),
        "mig": ({"kubernetes.io/hostname": "style-mig-0"}, "MIG 1g.5gb slices"),
        "bare": ({"kubernetes.io/hostname": "style-bare-0"}, "spec.resources.gpuMemoryMiB"),
    }
    for name, (selector, reason) in refused.items():
        applied = kubectl(
            ["apply", "-n", namespace, "-f", "-"], input=json.dumps(styled_job(name, 8, selector))
        )
        assert applied.returncode != 0 and reason in applied.stderr, (name, applied.stderr)
        assert "mig.strategy" not in applied.stderr, applied.stderr

    # The bare node with its GPU memory given in the spec.
    bare = styled_job("bare", 8, refused["bare"][0], gpuMemoryMiB=81559)
    applied = kubectl(["apply", "-n", namespace, "-f", "-"], input=json.dumps(bare))
    assert applied.returncode == 0, applied.stderr
    wait_for(lambda: status("bare").get("phase") == "Running", f"bare Running ({status('bare')})", 60)
    assert status("bare")["plan"]["nodePool"]["gpuMemoryMib"] == 81559
    for name in [*placed, "bare"]:
        custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name)
    core.delete_collection_namespaced_pod(namespace, grace_period_seconds=0)
