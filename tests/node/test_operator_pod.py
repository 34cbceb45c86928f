"""The operator installed by its Helm chart runs as a pod on a real node: its image is the one the project
builds, its probes pass, and the API server reaches its webhook through the chart's Service (kube-proxy)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kubernetes import client

from cluster.polling import wait_for
from node.conftest import OPERATOR_NAMESPACE, RELEASE, Run
from verl_devtools.devcluster import projectimages

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "jobs"


def test_the_operator_runs_as_a_pod_under_its_service_account(
    operator_release: dict[str, Any], kube: client.ApiClient
) -> None:
    pod = client.CoreV1Api(kube).read_namespaced_pod(
        operator_release["pod"].metadata.name, OPERATOR_NAMESPACE
    )
    assert pod.spec.node_name.startswith("real-"), pod.spec.node_name
    assert pod.spec.service_account_name == RELEASE
    statuses = {s.name: s for s in pod.status.container_statuses}
    assert set(statuses) == {"operator", "webhook-relay"}
    status = statuses["operator"]
    assert status.image == projectimages.operator_image()
    assert status.ready and status.restart_count == 0, status
    # The webhook relay (same image) is ready: it answers while a replica's webhook server does.
    relay = statuses["webhook-relay"]
    assert relay.image == status.image and relay.ready and relay.restart_count == 0, relay
    # The image runs as its non-root user; the container really runs (a real containerd image id).
    assert pod.spec.security_context.run_as_user == 65532
    assert status.image_id.startswith("sha256:") or "@sha256:" in status.image_id


def test_an_invalid_job_is_rejected_by_the_webhook_behind_the_service(
    operator_release: dict[str, Any], kubectl: Run, namespace: str
) -> None:
    hooks = json.loads(kubectl(["get", "validatingwebhookconfigurations", "-o", "json"], check=True).stdout)
    [hook] = [h for item in hooks["items"] for h in item["webhooks"] if "verljob" in h["name"]]
    assert hook["clientConfig"]["service"]["namespace"] == OPERATOR_NAMESPACE
    assert "url" not in hook["clientConfig"]
    applied = kubectl(["apply", "-n", namespace, "-f", str(EXAMPLES / "rejected-batch-size.yaml")])
    assert applied.returncode != 0
    assert "denied the request" in applied.stderr
    assert "spec.data.trainBatchSize" in applied.stderr and "96 or 112" in applied.stderr


def test_a_valid_job_is_planned_by_the_operator_pod(
    operator_release: dict[str, Any], kubectl: Run, kube: client.ApiClient, namespace: str
) -> None:
    kubectl(["apply", "-n", namespace, "-f", str(EXAMPLES / "grpo-qwen7b-dgx.yaml")], check=True)
    custom = client.CustomObjectsApi(kube)

    def planned() -> dict[str, Any] | None:
        job = custom.get_namespaced_custom_object(
            "verl-operator.io", "v1alpha1", namespace, "verljobs", "grpo-qwen7b"
        )
        status: dict[str, Any] = job.get("status") or {}
        return status if status.get("plan") else None

    status = wait_for(planned, "the operator pod to plan the job", timeout=60)
    assert status["plan"]["nnodes"] == 2
    assert any(c["type"] == "Planned" and c["status"] == "True" for c in status["conditions"])
