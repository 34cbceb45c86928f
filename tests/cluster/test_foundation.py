"""The local control plane is real: schema validation, scheduling, GC, RBAC, webhooks, kwok's pod lifecycle."""

from __future__ import annotations

import argparse
import base64
import http.server
import json
import os
import ssl
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from cluster.polling import wait_for
from verl_devtools.commands import devcluster as devcluster_command
from verl_devtools.devcluster import DevCluster, certs
from verl_devtools.devcluster.ports import listening
from verl_devtools.devcluster.process import alive
from verl_operator.clusters import labels as L


def gpu_pod(
    name: str, gpus: int, node_selector: dict[str, str] | None = None, **annotations: str
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations},
        "spec": {
            "restartPolicy": "Never",
            "nodeSelector": node_selector or {},
            "containers": [
                {
                    "name": "main",
                    "image": "registry.invalid/verl:test",
                    "resources": {"limits": {L.GPU_RESOURCE: str(gpus)}},
                }
            ],
        },
    }


# -- API server: structural schemas -------------------------------------------------------------------


def crd(group: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {"name": "v1", "served": True, "storage": True, "schema": {"openAPIV3Schema": schema}}
            ],
        },
    }


STRUCTURAL = {
    "type": "object",
    "properties": {"spec": {"type": "object", "properties": {"size": {"type": "integer"}}}},
}


@pytest.mark.parametrize(
    ("schema", "rejected_because"),
    [
        pytest.param(STRUCTURAL, None, id="structural-accepted"),
        pytest.param({"properties": {"spec": {"type": "object"}}}, "type: Required value", id="no-root-type"),
        pytest.param(
            {"type": "object", "properties": {"spec": {"properties": {"size": {"type": "integer"}}}}},
            "type: Required value",
            id="field-without-type",
        ),
        pytest.param(
            {"type": "object", "properties": {"spec": {"type": "object", "anyOf": [{"type": "object"}]}}},
            "anyOf[0].type: Forbidden",
            id="type-inside-anyof",
        ),
    ],
)
def test_api_server_accepts_only_structural_crd_schemas(
    kube: client.ApiClient, schema: dict[str, Any], rejected_because: str | None
) -> None:
    api = client.ApiextensionsV1Api(kube)
    group = f"t{uuid.uuid4().hex[:8]}.verl-operator.io"
    if rejected_because is None:
        created = api.create_custom_resource_definition(crd(group, schema))
        api.delete_custom_resource_definition(created.metadata.name)
        return
    with pytest.raises(ApiException) as caught:
        api.create_custom_resource_definition(crd(group, schema))
    assert caught.value.status == 422
    assert rejected_because in caught.value.body


# -- scheduler + kwok ---------------------------------------------------------------------------------


def test_eight_gpu_pod_is_bound_to_a_dgx_node_and_runs(kube: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(kube)
    core.create_namespaced_pod(namespace, gpu_pod("trainer", 8, {L.GPU_MACHINE: "DGX-H100"}))

    def running() -> client.V1Pod | None:
        pod = core.read_namespaced_pod("trainer", namespace)
        return pod if pod.status.phase == "Running" else None

    pod = wait_for(running, "the 8-GPU pod to run")
    node = core.read_node(pod.spec.node_name)
    assert node.metadata.labels[L.GPU_PRODUCT] == "NVIDIA-H100-80GB-HBM3"
    assert node.status.allocatable[L.GPU_RESOURCE] == "8"
    assert pod.status.pod_ip and pod.status.host_ip
    assert [s.state.running is not None for s in pod.status.container_statuses] == [True]


def test_scheduler_counts_gpus_two_full_nodes_then_pending(kube: client.ApiClient, namespace: str) -> None:
    """The session profile has two DGX H100 nodes: two 8-GPU pods take one each, a third cannot fit."""
    core = client.CoreV1Api(kube)
    dgx = {L.GPU_MACHINE: "DGX-H100", L.PROFILE: "mixed"}
    for name in ("a", "b"):
        core.create_namespaced_pod(namespace, gpu_pod(name, 8, dgx))

    def both_bound() -> set[str] | None:
        nodes = {core.read_namespaced_pod(n, namespace).spec.node_name for n in ("a", "b")}
        return nodes if None not in nodes else None

    assert len(wait_for(both_bound, "both 8-GPU pods to be bound")) == 2
    core.create_namespaced_pod(namespace, gpu_pod("c", 8, dgx))
    reason = wait_for(
        lambda: _unschedulable_message(core, "c", namespace), "the third pod to be unschedulable"
    )
    assert f"Insufficient {L.GPU_RESOURCE}" in reason


def _unschedulable_message(core: client.CoreV1Api, name: str, namespace: str) -> str | None:
    pod = core.read_namespaced_pod(name, namespace)
    for condition in pod.status.conditions or []:
        if (
            condition.type == "PodScheduled"
            and condition.status == "False"
            and condition.reason == "Unschedulable"
        ):
            return str(condition.message)
    return None


def test_nine_gpu_pod_stays_pending_with_the_schedulers_reason(
    kube: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube)
    core.create_namespaced_pod(namespace, gpu_pod("too-big", 9))
    message = wait_for(
        lambda: _unschedulable_message(core, "too-big", namespace), "an Unschedulable condition"
    )
    assert f"Insufficient {L.GPU_RESOURCE}" in message
    events = wait_for(
        lambda: [
            e
            for e in core.list_namespaced_event(namespace).items
            if e.reason == "FailedScheduling" and e.involved_object.name == "too-big"
        ],
        "a FailedScheduling event",
    )
    assert f"Insufficient {L.GPU_RESOURCE}" in events[0].message
    pod = core.read_namespaced_pod("too-big", namespace)
    assert (pod.status.phase, pod.spec.node_name) == ("Pending", None)


@pytest.mark.parametrize(
    ("exit_code", "expected"),
    [pytest.param(None, 1, id="default-exit-1"), pytest.param("137", 137, id="oom-killed-137")],
)
def test_annotated_pod_fails_like_a_crashed_process(
    kube: client.ApiClient, namespace: str, exit_code: str | None, expected: int
) -> None:
    core = client.CoreV1Api(kube)
    core.create_namespaced_pod(namespace, gpu_pod("worker", 4))
    wait_for(
        lambda: core.read_namespaced_pod("worker", namespace).status.phase == "Running", "the pod to run"
    )
    annotations = {L.SIMULATE: "fail"}
    if exit_code is not None:
        annotations[L.SIMULATE_EXIT_CODE] = exit_code
    core.patch_namespaced_pod("worker", namespace, {"metadata": {"annotations": annotations}})

    def failed() -> client.V1Pod | None:
        pod = core.read_namespaced_pod("worker", namespace)
        return pod if pod.status.phase == "Failed" else None

    pod = wait_for(failed, "the annotated pod to fail")
    terminated = pod.status.container_statuses[0].state.terminated
    assert (terminated.exit_code, terminated.reason) == (expected, "Error")


# -- controller-manager: garbage collection ------------------------------------------------------------


def test_deleting_the_owner_garbage_collects_its_configmap(kube: client.ApiClient, namespace: str) -> None:
    core = client.CoreV1Api(kube)
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "owned", "ownerReferences": [ref]}})
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "bystander"}})
    core.delete_namespaced_config_map("owner", namespace, propagation_policy="Background")

    def names() -> set[str]:
        return {c.metadata.name for c in core.list_namespaced_config_map(namespace).items}

    wait_for(lambda: "owned" not in names(), "the owned ConfigMap to be garbage-collected")
    assert "bystander" in names()


# -- API server: ServiceAccount tokens and RBAC ---------------------------------------------------------


def test_rbac_restricted_service_account_is_denied(
    devcluster: DevCluster, kube: client.ApiClient, namespace: str
) -> None:
    core = client.CoreV1Api(kube)
    rbac = client.RbacAuthorizationV1Api(kube)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": "reader"}})
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "reader-reads-pods"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
            "subjects": [{"kind": "ServiceAccount", "name": "reader", "namespace": namespace}],
        },
    )
    token = core.create_namespaced_service_account_token(
        "reader", namespace, {"spec": {"expirationSeconds": 600}}
    ).status.token

    configuration = client.Configuration()
    configuration.host = devcluster.status(with_nodes=False).server
    configuration.ssl_ca_cert = str(devcluster.layout.pki / "ca.crt")
    configuration.api_key = {"authorization": f"Bearer {token}"}
    with client.ApiClient(configuration) as as_reader:
        reader = client.CoreV1Api(as_reader)
        # RBAC propagates through an informer: retry the allowed call briefly.
        wait_for(lambda: _allowed(lambda: reader.list_namespaced_pod(namespace)), "the Role to take effect")
        for forbidden in (
            lambda: reader.list_namespaced_secret(namespace),
            lambda: reader.create_namespaced_pod(namespace, gpu_pod("sneaky", 1)),
            lambda: reader.list_namespaced_pod("default"),
        ):
            with pytest.raises(ApiException) as caught:
                forbidden()
            assert caught.value.status == 403
            assert f"system:serviceaccount:{namespace}:reader" in caught.value.body


def _allowed(call: Callable[[], object]) -> bool:
    try:
        call()
    except ApiException as exc:
        if exc.status == 403:
            return False
        raise
    return True


# -- API server: admission webhooks reach a local HTTPS endpoint ----------------------------------------


@pytest.fixture
def denying_webhook(tmp_path: Path) -> Iterator[tuple[int, bytes]]:
    """An HTTPS admission webhook on 127.0.0.1 that denies ConfigMaps named ``forbidden``."""
    ca = certs.write_ca(tmp_path, "webhook-ca")
    serving = certs.write_signed(ca, tmp_path, "webhook", "webhook", server_ips=("127.0.0.1",))

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            request = review["request"]
            allowed = request["name"] != "forbidden"
            answer = {
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": request["uid"],
                    "allowed": allowed,
                    "status": {"code": 403, "message": "denied by the test webhook"},
                },
            }
            body = json.dumps(answer).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(str(serving.cert), str(serving.key))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1], ca.cert.read_bytes()
    finally:
        server.shutdown()
        server.server_close()


def test_admission_webhook_on_a_local_https_endpoint_is_called(
    kube: client.ApiClient, namespace: str, denying_webhook: tuple[int, bytes]
) -> None:
    port, ca_pem = denying_webhook
    admission = client.AdmissionregistrationV1Api(kube)
    name = f"deny-forbidden.{namespace}.verl-operator.io"
    admission.create_validating_webhook_configuration(
        {
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": name,
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 5,
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{port}/validate",
                        "caBundle": base64.b64encode(ca_pem).decode(),
                    },
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["configmaps"],
                        }
                    ],
                }
            ],
        }
    )
    core = client.CoreV1Api(kube)
    try:
        # The webhook configuration reaches the admission chain through an informer: retry briefly.
        def denied() -> str | None:
            try:
                core.create_namespaced_config_map(namespace, {"metadata": {"name": "forbidden"}})
            except ApiException as exc:
                return str(exc.body)
            core.delete_namespaced_config_map("forbidden", namespace)
            return None

        assert "denied by the test webhook" in wait_for(denied, "the webhook to deny")
        core.create_namespaced_config_map(namespace, {"metadata": {"name": "allowed"}})
    finally:
        admission.delete_validating_webhook_configuration(name)


# -- profiles at run time and the instance lifecycle ---------------------------------------------------


def test_a_profiles_nodes_can_be_added_and_removed(
    kube: client.ApiClient, cluster_profile: Callable[[str], list[str]], devcluster: DevCluster
) -> None:
    core = client.CoreV1Api(kube)
    names = cluster_profile("l40s")
    assert names == ["l40s-0", "l40s-1", "l40s-2", "l40s-3"]
    racks = [core.read_node(n).metadata.labels[L.RACK] for n in names]
    assert racks == ["rack-b1", "rack-b1", "rack-b2", "rack-b2"]
    devcluster.remove_profile("l40s")
    assert not core.list_node(label_selector=f"{L.PROFILE}=l40s").items
    assert core.list_node(label_selector=f"{L.PROFILE}=mixed").items


TINY_PROFILE = """
name: tiny
nodeGroups:
  - namePrefix: tiny
    count: 1
    cpu: "4"
    memory: 16Gi
    region: local
    zone: local-a
    racks: [r1]
"""


def test_up_is_idempotent_and_down_leaves_no_process_or_port(tmp_path: Path) -> None:
    profile = tmp_path / "tiny.yaml"
    profile.write_text(TINY_PROFILE)
    cluster = DevCluster(name=f"pytest-{os.getpid()}-lifecycle", profile=str(profile))
    try:
        cluster.up()
        pids = cluster.pids()
        ports = cluster.ports()
        assert sorted(pids) == sorted(cluster.running_components())
        assert all(alive(pid) for pid in pids.values())
        assert set(listening(ports.values())) >= {ports["apiserver"], ports["etcd_client"]}
        cluster.up()
        assert cluster.pids() == pids, "a second up() must not restart anything"
    finally:
        cluster.down()
    assert not [c for c, pid in pids.items() if alive(pid)]
    assert listening(ports.values()) == []
    assert not cluster.layout.base.exists()
    assert not [p for p in cluster.layout.base.parent.iterdir() if cluster.name in p.name]


# -- the CLI -------------------------------------------------------------------------------------------


def devcluster_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="verl-operator-dev")
    devcluster_command.add_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["devcluster", *argv])
    code: int = args.func(args)
    return code


def test_cli_status_reports_the_live_nodes(
    devcluster: DevCluster, kube: client.ApiClient, capsys: pytest.CaptureFixture[str]
) -> None:
    assert devcluster_cli(["status", "--name", devcluster.name, "-o", "json"]) == 0
    reported = json.loads(capsys.readouterr().out)
    assert reported["running"] is True
    assert {c["name"] for c in reported["components"] if c["running"]} == set(devcluster.pids())
    live = {n.metadata.name: n for n in client.CoreV1Api(kube).list_node().items}
    assert {n["name"] for n in reported["nodes"]} == set(live)
    for row in reported["nodes"]:
        assert str(row["gpus"]) == (live[row["name"]].status.allocatable or {}).get(L.GPU_RESOURCE, "0")

    assert devcluster_cli(["status", "--name", devcluster.name]) == 0
    table = capsys.readouterr().out
    assert "mixed-h100-0" in table and "NVIDIA-H100-80GB-HBM3" in table

    assert devcluster_cli(["env", "--name", devcluster.name]) == 0
    assert capsys.readouterr().out.strip() == f"export KUBECONFIG={devcluster.kubeconfig}"
    assert devcluster_cli(["kubeconfig", "--name", devcluster.name]) == 0
    assert capsys.readouterr().out.strip() == str(devcluster.kubeconfig)


def test_cli_up_on_a_running_instance_restarts_nothing(
    devcluster: DevCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    pids = devcluster.pids()
    assert devcluster_cli(["up", "--name", devcluster.name, "--profile", "mixed"]) == 0
    assert f"export KUBECONFIG={devcluster.kubeconfig}" in capsys.readouterr().out
    assert devcluster.pids() == pids


def test_cli_up_with_an_unknown_profile_starts_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    name = f"pytest-{os.getpid()}-bad-profile"
    assert devcluster_cli(["up", "--name", name, "--profile", "dgx-b300"]) == 1
    assert "unknown profile 'dgx-b300'" in capsys.readouterr().err
    assert DevCluster(name=name).pids() == {}


def test_cli_status_of_a_stopped_instance(capsys: pytest.CaptureFixture[str]) -> None:
    assert devcluster_cli(["status", "--name", f"pytest-{os.getpid()}-never-started"]) == 3
    assert "is not running" in capsys.readouterr().out


def test_a_hand_made_fake_node_becomes_ready_with_default_capacity(kube: client.ApiClient) -> None:
    core = client.CoreV1Api(kube)
    name = f"hand-made-{uuid.uuid4().hex[:6]}"
    core.create_node({"metadata": {"name": name, "annotations": {L.KWOK_NODE: L.KWOK_NODE_VALUE}}})
    try:

        def ready() -> client.V1Node | None:
            node = core.read_node(name)
            conditions = {c.type: c.status for c in (node.status.conditions or [])}
            return node if conditions.get("Ready") == "True" else None

        node = wait_for(ready, "the hand-made node to be Ready")
        assert (node.status.allocatable["cpu"], node.status.allocatable["pods"]) == ("32", "110")
    finally:
        core.delete_node(name)
