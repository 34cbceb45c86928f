"""The chart's topology-probe DaemonSet against the real control plane: the API server stores it, its pod
passes the ``restricted`` Pod Security level, and its ServiceAccount can patch a Node's labels and nothing else.

The devcluster runs no DaemonSet controller and kwok simulates pods (no nvidia-smi runs), so the probe pod is
checked by admitting its template as a Pod (server-side dry run), and the label patch is sent the way the
launcher sends it (``verl_launcher.labels``), with a TokenRequest token of the probe's ServiceAccount.
"""

from __future__ import annotations

import subprocess
import urllib.error
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from verl_devtools.devcluster import DevCluster, binaries
from verl_launcher import labels as launcher_labels
from verl_operator.clusters import labels as L

CHART = Path(__file__).resolve().parents[2] / "charts" / "verl-operator"

Run = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture
def probe_release(devcluster: DevCluster, kube: client.ApiClient) -> Iterator[tuple[str, str]]:
    """A release with only the probe (no operator pod, no webhook) in a namespace that enforces the
    ``restricted`` Pod Security level: (release, namespace); removed after."""
    helm = str(binaries.ensure(("helm",))["helm"])
    suffix = uuid.uuid4().hex[:5]
    name, namespace = f"vp{suffix}", f"verl-probe-{suffix}"

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [helm, f"--kubeconfig={devcluster.kubeconfig}", *argv],
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )

    sets = [
        "deployment.enabled=false",
        "webhook.enabled=false",
        "metrics.enabled=false",
        "topologyProbe.enabled=true",
        "topologyProbe.image.repository=registry.example/verl",
        "topologyProbe.image.tag=test",
    ]
    argv = ["install", name, str(CHART), "-n", namespace]
    for item in sets:
        argv += ["--set", item]
    body: Any = {
        "metadata": {"name": namespace, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}
    }
    client.CoreV1Api(kube).create_namespace(body)
    try:
        proc = run(*argv)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        yield name, namespace
    finally:
        run("uninstall", name, "-n", namespace, "--wait")
        try:
            client.CoreV1Api(kube).delete_namespace(namespace, propagation_policy="Background")
        except ApiException as exc:
            if exc.status != 404:
                raise


def plain(kube: client.ApiClient, obj: object) -> dict[str, Any]:
    """A typed client object as the plain camelCase dict the API server sent."""
    data: dict[str, Any] = kube.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
    return data


def probe_token(kube: client.ApiClient, namespace: str, account: str) -> str:
    request: Any = {"spec": {"expirationSeconds": 600}}
    response = client.CoreV1Api(kube).create_namespaced_service_account_token(account, namespace, request)
    token: str = plain(kube, response)["status"]["token"]
    return token


def node_label(kube: client.ApiClient, node: str, key: str) -> str | None:
    labels: dict[str, str] = plain(kube, client.CoreV1Api(kube).read_node(node))["metadata"].get("labels", {})
    return labels.get(key)


def token_kubeconfig(devcluster: DevCluster, token: str, path: Path) -> Path:
    admin = yaml.safe_load(devcluster.kubeconfig.read_text())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "dev", "cluster": admin["clusters"][0]["cluster"]}],
        "users": [{"name": "probe", "user": {"token": token}}],
        "contexts": [{"name": "dev", "context": {"cluster": "dev", "user": "probe"}}],
        "current-context": "dev",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def test_probe_daemonset_is_admitted_and_may_only_label_nodes(
    devcluster: DevCluster,
    kube: client.ApiClient,
    kubectl: Run,
    probe_release: tuple[str, str],
    tmp_path: Path,
) -> None:
    release, namespace = probe_release
    account = f"{release}-verl-operator-topology-probe"
    core, apps = client.CoreV1Api(kube), client.AppsV1Api(kube)

    # The API server stored the DaemonSet as the chart rendered it.
    ds = apps.read_namespaced_daemon_set(account, namespace)
    template = plain(kube, ds)["spec"]["template"]
    [probe] = template["spec"]["initContainers"]
    assert [*probe["command"], *probe["args"]] == [
        "verl-launcher",
        "probe",
        "--label-node",
        "--format=labels",
    ]
    assert {
        "name": "NODE_NAME",
        "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}},
    } in (probe["env"])
    assert template["spec"]["serviceAccountName"] == account
    assert template["spec"]["nodeSelector"] == {L.GPU_PRESENT: "true"}

    # Its pod, placed on a GPU node as the DaemonSet controller would, passes Pod Security "restricted"...
    listed = plain(kube, core.list_node(label_selector=f"{L.GPU_PRESENT}=true"))["items"]
    gpu_nodes: list[str] = sorted(n["metadata"]["name"] for n in listed)
    assert gpu_nodes
    pod: Any = {
        "metadata": {"generateName": "probe-"},
        "spec": {**template["spec"], "nodeName": gpu_nodes[0]},
    }
    core.create_namespaced_pod(namespace, pod, dry_run="All")
    # ... and the same pod running as root is refused: the admission check is live.
    rooted: Any = {**pod, "spec": {**pod["spec"], "securityContext": {"runAsUser": 0}}}
    with pytest.raises(ApiException) as refused_pod:
        core.create_namespaced_pod(namespace, rooted, dry_run="All")
    assert refused_pod.value.status == 403 and "PodSecurity" in str(refused_pod.value.body)

    token = probe_token(kube, namespace, account)
    config = token_kubeconfig(devcluster, token, tmp_path / "probe.kubeconfig")

    def as_probe(*argv: str) -> subprocess.CompletedProcess[str]:
        result: subprocess.CompletedProcess[str] = kubectl([f"--kubeconfig={config}", *argv])
        return result

    assert as_probe("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}").stdout == (
        f"system:serviceaccount:{namespace}:{account}"
    )
    for verb, resource, allowed in [
        ("get", "nodes", "yes"),
        ("patch", "nodes", "yes"),
        ("list", "nodes", "no"),
        ("update", "nodes", "no"),
        ("delete", "nodes", "no"),
        ("list", "pods", "no"),
        ("get", "secrets", "no"),
    ]:
        assert as_probe("auth", "can-i", verb, resource).stdout.strip() == allowed, (verb, resource)

    # A real label patch, sent as the launcher sends it, with the probe's token only.
    node = gpu_nodes[0]
    before = node_label(kube, node, L.NVLINK_DOMAIN_SIZE)
    cluster = yaml.safe_load(devcluster.kubeconfig.read_text())["clusters"][0]["cluster"]
    patch = launcher_labels.build_patch(cluster["server"], node, {L.NVLINK_DOMAIN_SIZE: "3"})
    try:
        assert launcher_labels.send_patch(patch, token, cluster["certificate-authority"]) == 200
        assert node_label(kube, node, L.NVLINK_DOMAIN_SIZE) == "3"
        # Without the token the same request is refused: the grant is the ServiceAccount's.
        with pytest.raises(urllib.error.HTTPError) as refused:
            launcher_labels.send_patch(patch, None, cluster["certificate-authority"])
        assert refused.value.code in (401, 403)
    finally:
        restore: Any = {"metadata": {"labels": {L.NVLINK_DOMAIN_SIZE: before}}}
        core.patch_node(node, restore)
    assert node_label(kube, node, L.NVLINK_DOMAIN_SIZE) == before

    # Real requests beyond the grant are forbidden (dry-run: authorization runs, nothing would change).
    denied = as_probe("delete", "node", node, "--dry-run=server")
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower(), denied.stderr
    denied = as_probe("get", "pods", "-A")
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower(), denied.stderr
    denied = as_probe("get", "nodes")
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower(), denied.stderr
    assert node in kubectl(["get", "node", node, "-o", "name"], check=True).stdout
