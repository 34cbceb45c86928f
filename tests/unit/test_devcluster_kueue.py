"""Kueue next to a devcluster: its webhook configurations rewritten for a local manager, its configuration."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import yaml

from verl_devtools.devcluster import binaries
from verl_devtools.devcluster.kueue import configuration, webhook_configurations
from verl_devtools.devcluster.tools import KUEUE, buildinfo_version

#: The shape of Kueue's config/components/webhook/manifests.yaml (v0.17.0): one configuration of each kind,
#: webhooks for Kueue's objects, pods and other integrations, each naming the in-cluster Service.
MANIFESTS = """---
apiVersion: admissionregistration.k8s.io/v1
kind: MutatingWebhookConfiguration
metadata:
  name: mutating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate-kueue-x-k8s-io-v1beta2-clusterqueue}
  failurePolicy: Fail
  name: mclusterqueue.kb.io
  rules:
  - apiGroups: [kueue.x-k8s.io]
    apiVersions: [v1beta2]
    operations: [CREATE]
    resources: [clusterqueues]
  sideEffects: None
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate-batch-v1-job}
  failurePolicy: Fail
  name: mjob.kb.io
  rules:
  - apiGroups: [batch]
    apiVersions: [v1]
    operations: [CREATE]
    resources: [jobs]
  sideEffects: None
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /mutate--v1-pod}
  failurePolicy: Fail
  name: mpod.kb.io
  rules:
  - apiGroups: [""]
    apiVersions: [v1]
    operations: [CREATE]
    resources: [pods]
  sideEffects: None
---
apiVersion: admissionregistration.k8s.io/v1
kind: ValidatingWebhookConfiguration
metadata:
  name: validating-webhook-configuration
webhooks:
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /validate--v1-pod}
  failurePolicy: Fail
  name: vpod.kb.io
  rules:
  - apiGroups: [""]
    apiVersions: [v1]
    operations: [CREATE, UPDATE]
    resources: [pods]
  sideEffects: None
- admissionReviewVersions: [v1]
  clientConfig:
    service: {name: webhook-service, namespace: system, path: /validate-ray-io-v1-raycluster}
  failurePolicy: Fail
  name: vraycluster.kb.io
  rules:
  - apiGroups: [ray.io]
    apiVersions: [v1]
    operations: [CREATE, UPDATE]
    resources: [rayclusters]
  sideEffects: None
"""
CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_webhooks_keep_pods_and_kueues_objects_and_reach_the_local_manager() -> None:
    mutating, validating = webhook_configurations(MANIFESTS, 40123, CA, "kueue-demo")
    assert (mutating["kind"], mutating["metadata"]) == (
        "MutatingWebhookConfiguration",
        {"name": "kueue-demo-mutating"},
    )
    assert validating["metadata"] == {"name": "kueue-demo-validating"}
    assert [h["name"] for h in mutating["webhooks"]] == ["mclusterqueue.kb.io", "mpod.kb.io"]
    assert [h["name"] for h in validating["webhooks"]] == ["vpod.kb.io"]
    pod = mutating["webhooks"][1]
    assert pod["clientConfig"] == {
        "url": "https://127.0.0.1:40123/mutate--v1-pod",
        "caBundle": base64.b64encode(CA).decode(),
    }
    assert pod["objectSelector"] == {
        "matchExpressions": [{"key": "kueue.x-k8s.io/queue-name", "operator": "Exists"}]
    }, "a pod without a queue never waits for Kueue"
    assert pod["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", "kueue-system"]
    assert "objectSelector" not in mutating["webhooks"][0], "Kueue's own objects are always reviewed"


def test_manifests_without_a_pod_webhook_are_refused() -> None:
    docs = list(yaml.safe_load_all(MANIFESTS))
    docs[1]["webhooks"] = [docs[1]["webhooks"][1]]  # only the RayCluster webhook is left
    with pytest.raises(ValueError, match="ValidatingWebhookConfiguration: no webhook for pods"):
        webhook_configurations(yaml.safe_dump_all(docs), 1, CA, "x")


def test_configuration_runs_the_pod_integration_out_of_cluster(tmp_path: Path) -> None:
    config = configuration(1001, 1002, 1003, tmp_path)
    assert config["apiVersion"] == "config.kueue.x-k8s.io/v1beta2"
    assert config["integrations"] == {"frameworks": ["pod"]}
    assert config["internalCertManagement"] == {"enable": False}
    assert config["webhook"] == {"host": "127.0.0.1", "port": 1001, "certDir": str(tmp_path)}
    assert config["metrics"]["bindAddress"] == "127.0.0.1:1002"
    assert config["health"]["healthProbeBindAddress"] == "127.0.0.1:1003"
    assert config["leaderElection"] == {"leaderElect": False}
    # Kueue refuses a selector that matches kube-system or its own namespace when the pod integration is on.
    excluded = config["managedJobsNamespaceSelector"]["matchExpressions"][0]
    assert excluded["operator"] == "NotIn" and set(excluded["values"]) == {"kube-system", config["namespace"]}


def test_the_manager_is_a_pinned_binary_checked_by_its_build_information() -> None:
    tool = KUEUE.tools[0]
    assert binaries.GROUP_OF["kueue"] is KUEUE and tool.version_argv == ()
    info = f"kueue: go1.26.8\n\tdep\tsigs.k8s.io/kueue\t{tool.version}\th1:x=\n"
    assert buildinfo_version(info, tool.module) == tool.version
