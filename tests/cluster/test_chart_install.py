"""The Helm chart against the real control plane: install, upgrade, uninstall, RBAC and the webhook.

The operator cannot run as a pod here (kwok simulates pods; there is no kubelet and no pod network), so it
runs as a local process in the chart's dev mode (``deployment.enabled=false``, ``webhook.url`` pointing at
it), authenticated with a token of the chart's ServiceAccount only: everything it does goes through the
chart's RBAC, and every admission call goes through the chart's ValidatingWebhookConfiguration and CA.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from cluster.polling import wait_for as _wait_for
from verl_devtools.devcluster import DevCluster, binaries
from verl_devtools.devcluster.ports import ADDRESS_IN_USE, PortTaken, pick_free_ports, serves_certificate
from verl_operator.clusters import labels as L

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "verl-operator"
EXAMPLES = ROOT / "examples" / "jobs"
GROUP, VERSION, PLURAL = "verl-operator.io", "v1alpha1", "verljobs"
CRD_NAME = f"{PLURAL}.{GROUP}"
INSTANCE_LABEL = "app.kubernetes.io/instance"
#: Every kind the chart can create (cluster-scoped ones included): what must be gone after an uninstall.
CHART_KINDS = (
    "deployments,services,secrets,serviceaccounts,configmaps,roles,rolebindings,"
    "clusterroles,clusterrolebindings,validatingwebhookconfigurations"
)

T = TypeVar("T")

#: ``verl-operator`` of this interpreter's environment.
OPERATOR_CMD = [sys.executable, "-m", "verl_operator"]


def wait_for(probe: Callable[[], T | None], what: str, timeout: float = 60.0) -> T:
    """Chart tests wait longer: an operator start with a ServiceAccount token is slower."""
    return _wait_for(probe, what, timeout=timeout, interval=0.3)


Run = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture(scope="module")
def helm(devcluster: DevCluster) -> Run:
    """Run the pinned helm against the session's cluster: ``helm(["list"], check=True)``."""
    exe = str(binaries.ensure(("helm",))["helm"])

    def run(argv: list[str], *, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [exe, f"--kubeconfig={devcluster.kubeconfig}", *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(argv)} failed:\n{proc.stdout}\n{proc.stderr}")
        return proc

    return run


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str

    @property
    def fullname(self) -> str:
        return f"{self.name}-verl-operator"


def plain(kube: client.ApiClient, obj: object) -> dict[str, Any]:
    """A typed client object as the plain camelCase dict the API server sent."""
    data: dict[str, Any] = kube.sanitize_for_serialization(obj)  # type: ignore[no-untyped-call]
    return data


def secret_data(kube: client.ApiClient, namespace: str, name: str) -> dict[str, str]:
    secret = client.CoreV1Api(kube).read_namespaced_secret(name, namespace)
    data: dict[str, str] = plain(kube, secret).get("data") or {}
    return data


def manifest_objects(helm: Run, release: Release) -> list[dict[str, Any]]:
    out = helm(["get", "manifest", release.name, "-n", release.namespace]).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def leftovers(kubectl: Run, release: Release) -> list[str]:
    proc = kubectl(
        ["get", CHART_KINDS, "-A", "-l", f"{INSTANCE_LABEL}={release.name}", "-o", "name"], check=True
    )
    return proc.stdout.split()


def install(helm: Run, release: Release, *sets: str) -> None:
    argv = ["install", release.name, str(CHART), "-n", release.namespace, "--create-namespace", "--wait"]
    for item in sets:
        argv += ["--set", item]
    helm(argv, timeout=180)


@pytest.fixture
def release(helm: Run, kube: client.ApiClient) -> Iterator[Release]:
    """A release name and its own namespace; uninstalled (if still there) and the namespace removed after."""
    suffix = uuid.uuid4().hex[:5]
    rel = Release(name=f"vo{suffix}", namespace=f"verl-system-{suffix}")
    yield rel
    helm(["uninstall", rel.name, "-n", rel.namespace, "--wait"], check=False)
    try:
        client.CoreV1Api(kube).delete_namespace(rel.namespace, propagation_policy="Background")
    except ApiException as exc:
        if exc.status != 404:
            raise


# -- install / upgrade / uninstall -----------------------------------------------------------------------


def test_defaults_install_upgrade_and_uninstall_cleanly(
    helm: Run, kubectl: Run, kube: client.ApiClient, release: Release
) -> None:
    install(helm, release)
    objects = manifest_objects(helm, release)
    assert {o["kind"] for o in objects} >= {
        "Deployment",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Secret",
        "Service",
        "ValidatingWebhookConfiguration",
    }
    # Every rendered object was accepted and stored by the API server.
    for obj in objects:
        ns = ["-n", obj["metadata"].get("namespace", release.namespace)]
        kubectl(["get", obj["kind"].lower(), obj["metadata"]["name"], *ns, "-o", "name"], check=True)
    assert kubectl(["get", "crd", CRD_NAME, "-o", "name"], check=True).stdout.strip()
    core = client.CoreV1Api(kube)
    secret_name = f"{release.fullname}-webhook-tls"
    before = secret_data(kube, release.namespace, secret_name)

    # Upgrade with other values: the webhook CA and certificate survive (lookup), removed objects go away.
    helm(
        [
            "upgrade",
            release.name,
            str(CHART),
            "-n",
            release.namespace,
            "--set",
            "metrics.enabled=false",
            "--wait",
        ]
    )
    assert secret_data(kube, release.namespace, secret_name) == before
    config = client.AdmissionregistrationV1Api(kube).read_validating_webhook_configuration(release.fullname)
    ca_bundle = plain(kube, config)["webhooks"][0]["clientConfig"]["caBundle"]
    assert base64.b64decode(ca_bundle) == base64.b64decode(before["ca.crt"])
    services = [
        s["metadata"]["name"] for s in plain(kube, core.list_namespaced_service(release.namespace))["items"]
    ]
    assert f"{release.fullname}-metrics" not in services
    assert f"{release.fullname}-webhook" in services

    helm(["uninstall", release.name, "-n", release.namespace, "--wait"])
    wait_for(lambda: not leftovers(kubectl, release), "the release's objects to be deleted", 30)
    assert helm(["list", "-n", release.namespace, "-q"]).stdout.strip() == ""
    # CRDs stay, by Helm's design (deleting them would delete every VerlJob).
    assert kubectl(["get", "crd", CRD_NAME, "-o", "name"], check=True).stdout.strip()


# -- the operator with the chart's identity ---------------------------------------------------------------


@dataclass
class LocalOperator:
    process: subprocess.Popen[bytes]
    log: Path
    health_port: int

    def output(self) -> str:
        return self.log.read_text(errors="replace")


def sa_kubeconfig(devcluster: DevCluster, kube: client.ApiClient, release: Release, path: Path) -> Path:
    """A kubeconfig whose only credential is a TokenRequest token of the chart's ServiceAccount."""
    admin = yaml.safe_load(devcluster.kubeconfig.read_text())
    cluster = admin["clusters"][0]["cluster"]
    request: Any = {"spec": {"expirationSeconds": 3600}}
    token = plain(
        kube,
        client.CoreV1Api(kube).create_namespaced_service_account_token(
            release.fullname, release.namespace, request
        ),
    )
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "dev", "cluster": cluster}],
        "users": [{"name": "operator", "user": {"token": token["status"]["token"]}}],
        "contexts": [{"name": "dev", "context": {"cluster": "dev", "user": "operator"}}],
        "current-context": "dev",
    }
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o600)
    return path


def write_webhook_tls(kube: client.ApiClient, release: Release, directory: Path) -> Path:
    """The chart-generated serving certificate and key, for the local webhook server."""
    data = secret_data(kube, release.namespace, f"{release.fullname}-webhook-tls")
    directory.mkdir()
    for key in ("tls.crt", "tls.key"):
        (directory / key).write_bytes(base64.b64decode(data[key]))
    return directory


def start_operator(
    helm: Run, release: Release, kubeconfig: Path, tls_dir: Path, log: Path, *scope: str, attempts: int = 5
) -> LocalOperator:
    """The operator running locally, its webhook the one the chart's configuration calls.

    Its ports are picked free and bound by the process; another program can take one in between (then the
    API server's review call met a foreign listener: "tls: first record does not look like a TLS handshake").
    An attempt counts only once the webhook port presents the chart's serving certificate, which proves the
    operator itself holds it for as long as it runs; a lost race (the bind failed, or another listener
    answers) stops the attempt, and the next one points the chart's webhook at new ports.
    """
    cert = (tls_dir / "tls.crt").read_bytes()
    for attempt in range(attempts):
        ports = pick_free_ports(("health", "webhook"))
        helm(
            ["upgrade", release.name, str(CHART), "-n", release.namespace, "--reuse-values", "--wait",
             "--set", f"webhook.url=https://127.0.0.1:{ports['webhook']}"],
            timeout=180,
        )  # fmt: skip
        argv = [
            *OPERATOR_CMD,
            "run",
            f"--kubeconfig={kubeconfig}",
            *scope,
            f"--health-port={ports['health']}",
            f"--webhook-port={ports['webhook']}",
            f"--webhook-cert={tls_dir / 'tls.crt'}",
            f"--webhook-key={tls_dir / 'tls.key'}",
            "--resync-seconds=1",
        ]
        env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
        attempt_log = log.with_name(f"{log.stem}-{attempt}{log.suffix}")
        with attempt_log.open("wb") as out:
            process = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        operator = LocalOperator(process, attempt_log, ports["health"])

        def serving(operator: LocalOperator = operator, webhook: int = ports["webhook"]) -> bool:
            if operator.process.poll() is not None:
                if ADDRESS_IN_USE in operator.output().lower():
                    raise PortTaken(operator.output())
                raise AssertionError(
                    f"the operator exited with {operator.process.returncode}:\n{operator.output()}"
                )
            own = serves_certificate(webhook, cert)
            if own is False:
                raise PortTaken(f"another program answers on the webhook port {webhook}")
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{operator.health_port}/healthz", timeout=1
                ) as resp:
                    return bool(own and resp.status == 200)
            except OSError:
                return False

        try:
            wait_for(serving, "the operator's health endpoint and its webhook", 60)
        except PortTaken:
            stop_operator(operator)
            continue
        return operator
    raise AssertionError(f"the operator lost the race for its ports {attempts} times")


def stop_operator(operator: LocalOperator) -> None:
    if operator.process.poll() is None:
        os.killpg(operator.process.pid, signal.SIGTERM)
        try:
            operator.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(operator.process.pid, signal.SIGKILL)
            operator.process.wait(timeout=10)


@dataclass(frozen=True)
class DevMode:
    release: Release
    operator: LocalOperator
    sa_kubeconfig: Path


@pytest.fixture
def dev_mode(
    helm: Run, devcluster: DevCluster, kube: client.ApiClient, release: Release, tmp_path: Path
) -> Iterator[DevMode]:
    """The chart in dev mode and the operator running locally as the chart's ServiceAccount."""
    install(helm, release, "deployment.enabled=false", "webhook.url=https://127.0.0.1:1")
    tls_dir = write_webhook_tls(kube, release, tmp_path / "tls")
    kubeconfig = sa_kubeconfig(devcluster, kube, release, tmp_path / "operator.kubeconfig")
    # As the chart's pods run it: reconciling only while holding the chart's Lease, through the chart's Role.
    election = (
        "--leader-elect",
        f"--leader-election-namespace={release.namespace}",
        f"--leader-election-id={release.fullname}",
    )
    operator = start_operator(
        helm, release, kubeconfig, tls_dir, tmp_path / "operator.log", "--all-namespaces", *election
    )
    try:
        yield DevMode(release, operator, kubeconfig)
    finally:
        stop_operator(operator)


def apply_example(kubectl: Run, name: str, namespace: str) -> subprocess.CompletedProcess[str]:
    return kubectl(["apply", "-n", namespace, "-f", str(EXAMPLES / name)])


def job_object(kube: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    api = client.CustomObjectsApi(kube)
    return plain(kube, api.get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name))


def argocd_health(obj: dict[str, Any]) -> str:
    """Argo CD's health of a live VerlJob: docs/argocd-health.lua run by Lua 5.1 with ``obj`` as a global."""
    import lupa.lua51 as lua51

    runtime = lua51.LuaRuntime()

    def to_lua(value: Any) -> Any:
        if isinstance(value, dict):
            return runtime.table_from({k: to_lua(v) for k, v in value.items()})
        if isinstance(value, list):
            return runtime.table_from([to_lua(v) for v in value])
        return value

    runtime.globals().obj = to_lua(obj)
    hs = runtime.execute((ROOT / "docs" / "argocd-health.lua").read_text())
    return str(hs["status"])


def job_status(kube: client.ApiClient, namespace: str, name: str) -> dict[str, Any]:
    obj = plain(
        kube,
        client.CustomObjectsApi(kube).get_namespaced_custom_object(GROUP, VERSION, namespace, PLURAL, name),
    )
    status: dict[str, Any] = obj.get("status") or {}
    return status


def job_pods(kube: client.ApiClient, namespace: str, job: str) -> list[dict[str, Any]]:
    listed = client.CoreV1Api(kube).list_namespaced_pod(
        namespace, label_selector=f"verl-operator.io/job={job}"
    )
    pods: list[dict[str, Any]] = plain(kube, listed)["items"]
    return pods


@pytest.fixture
def example_job(kubectl: Run, kube: client.ApiClient, namespace: str) -> Iterator[Callable[[str], str]]:
    """Apply an example VerlJob into the test namespace; deleted (and its pods waited for) afterwards.

    The operator reserves the nodes of a Running job until the job is gone, so the next test must not
    start before the pods and the job are deleted.
    """
    applied: list[str] = []

    def apply(filename: str) -> str:
        doc = yaml.safe_load((EXAMPLES / filename).read_text())
        proc = kubectl(["apply", "-n", namespace, "-f", str(EXAMPLES / filename)])
        assert proc.returncode == 0, proc.stderr
        applied.append(doc["metadata"]["name"])
        return str(doc["metadata"]["name"])

    yield apply
    for name in applied:
        kubectl(["delete", "verljob", name, "-n", namespace, "--wait=true", "--timeout=60s"])
        wait_for(
            lambda name=name: not job_pods(kube, namespace, name),  # type: ignore[misc]
            f"the pods of {name} to be deleted",
            60,
        )


def test_the_operator_token_is_the_service_account_not_admin(dev_mode: DevMode, kubectl: Run) -> None:
    whoami = kubectl(
        ["--kubeconfig", str(dev_mode.sa_kubeconfig), "auth", "whoami", "-o", "json"], check=True
    )
    user = json.loads(whoami.stdout)["status"]["userInfo"]["username"]
    assert user == f"system:serviceaccount:{dev_mode.release.namespace}:{dev_mode.release.fullname}"
    for verb, resource, allowed in (
        ("create", "pods", "yes"),
        ("create", "clusterroles", "no"),
        ("get", "secrets", "no"),
        ("create", "validatingwebhookconfigurations", "no"),
    ):
        proc = kubectl(["--kubeconfig", str(dev_mode.sa_kubeconfig), "auth", "can-i", verb, resource, "-A"])
        assert proc.stdout.strip() == allowed, (verb, resource, proc.stdout, proc.stderr)


def test_operator_with_chart_rbac_runs_an_example_job(
    dev_mode: DevMode, example_job: Callable[[str], str], kube: client.ApiClient, namespace: str
) -> None:
    example_job("grpo-qwen7b-dgx.yaml")
    wait_for(
        lambda: job_status(kube, namespace, "grpo-qwen7b").get("phase") == "Running",
        "phase Running",
        120,
    )
    pods = job_pods(kube, namespace, "grpo-qwen7b")
    assert len(pods) == 2  # head + one worker, one per DGX node
    nodes = {n["metadata"]["name"]: n for n in plain(kube, client.CoreV1Api(kube).list_node())["items"]}
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        node = nodes[pod["spec"]["nodeName"]]
        assert node["metadata"]["annotations"].get(L.KWOK_NODE) == L.KWOK_NODE_VALUE
        assert node["metadata"]["labels"]["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"
    # What GitOps tools read from the live object: kstatus conditions and the Argo CD health check.
    job = job_object(kube, namespace, "grpo-qwen7b")
    conditions = {c["type"]: c for c in job["status"]["conditions"]}
    assert job["status"]["observedGeneration"] == job["metadata"]["generation"]
    assert (
        conditions["Ready"]["status"],
        conditions["Reconciling"]["status"],
        conditions["Stalled"]["status"],
    ) == (
        "True",
        "False",
        "False",
    )
    assert argocd_health(job) == "Healthy"
    assert "Forbidden" not in dev_mode.operator.output()
    # It reconciled as the holder of the chart's Lease, created and renewed through the chart's Role.
    rel = dev_mode.release
    lease = client.CoordinationV1Api(kube).read_namespaced_lease(rel.fullname, rel.namespace)
    assert lease.spec.holder_identity and lease.spec.lease_duration_seconds == 15


def test_the_api_server_calls_the_webhook_through_the_chart(
    dev_mode: DevMode, kubectl: Run, namespace: str
) -> None:
    rejected = apply_example(kubectl, "rejected-batch-size.yaml", namespace)
    assert rejected.returncode != 0
    assert 'admission webhook "validate.verljobs.verl-operator.io" denied the request' in rejected.stderr
    assert "spec.data.trainBatchSize" in rejected.stderr or "trainBatchSize" in rejected.stderr
    # A valid job passes the same webhook (dry-run: nothing is stored).
    accepted = kubectl(
        ["apply", "--dry-run=server", "-n", namespace, "-f", str(EXAMPLES / "grpo-qwen7b-dgx.yaml")]
    )
    assert accepted.returncode == 0, accepted.stderr


def test_a_removed_verb_breaks_the_operator(
    dev_mode: DevMode,
    helm: Run,
    example_job: Callable[[str], str],
    kubectl: Run,
    kube: client.ApiClient,
    namespace: str,
) -> None:
    rel = dev_mode.release
    helm(
        [
            "upgrade",
            rel.name,
            str(CHART),
            "-n",
            rel.namespace,
            "--reuse-values",
            "--set",
            "rbac.dropVerbs={create}",
        ]
    )
    role = plain(kube, client.RbacAuthorizationV1Api(kube).read_cluster_role(rel.fullname))
    assert all("create" not in rule["verbs"] for rule in role["rules"])
    # Without create, the operator cannot ask the API server whether the author may create pods (the
    # admission policy's SubjectAccessReview): the webhook fails closed and says why.
    denied = kubectl(["apply", "-n", namespace, "-f", str(EXAMPLES / "grpo-qwen7b-dgx.yaml")])
    assert denied.returncode != 0 and "cannot check whether" in denied.stderr, denied.stderr
    assert 'cannot create resource "subjectaccessreviews"' in denied.stderr, denied.stderr
    assert job_pods(kube, namespace, "grpo-qwen7b") == []
    # The same operator recovers as soon as the verb is back: the failure was the missing verb.
    helm(
        [
            "upgrade",
            rel.name,
            str(CHART),
            "-n",
            rel.namespace,
            "--reuse-values",
            "--set-json",
            "rbac.dropVerbs=[]",
        ]
    )
    example_job("grpo-qwen7b-dgx.yaml")
    try:
        wait_for(
            lambda: job_status(kube, namespace, "grpo-qwen7b").get("phase") == "Running",
            "phase Running after restoring the verb",
            120,
        )
        assert argocd_health(job_object(kube, namespace, "grpo-qwen7b")) == "Healthy"
    except AssertionError as exc:
        status = job_status(kube, namespace, "grpo-qwen7b")
        raise AssertionError(
            f"{exc}\nstatus: {json.dumps(status, indent=1)[:3000]}\n{dev_mode.operator.output()[-6000:]}"
        ) from None


def test_watch_namespace_mode_runs_a_job_with_a_role(
    helm: Run,
    devcluster: DevCluster,
    kube: client.ApiClient,
    release: Release,
    example_job: Callable[[str], str],
    namespace: str,
    tmp_path: Path,
) -> None:
    install(
        helm,
        release,
        "deployment.enabled=false",
        "webhook.url=https://127.0.0.1:1",
        f"watchNamespaces={{{namespace}}}",
    )
    rbac = client.RbacAuthorizationV1Api(kube)
    role = plain(kube, rbac.read_namespaced_role(release.fullname, namespace))
    assert any("pods" in rule["resources"] for rule in role["rules"])
    cluster_role = plain(kube, rbac.read_cluster_role(release.fullname))
    cluster_resources = {r for rule in cluster_role["rules"] for r in rule["resources"]}
    # Cluster-scoped: reads of nodes, the CRD, namespaces and PriorityClasses; the webhook's SubjectAccessReviews.
    assert cluster_resources == {
        "nodes",
        "customresourcedefinitions",
        "namespaces",
        "priorityclasses",
        "subjectaccessreviews",
    }
    tls_dir = write_webhook_tls(kube, release, tmp_path / "tls")
    kubeconfig = sa_kubeconfig(devcluster, kube, release, tmp_path / "operator.kubeconfig")
    operator = start_operator(
        helm, release, kubeconfig, tls_dir, tmp_path / "operator.log", f"--namespace={namespace}"
    )
    try:
        name = example_job("grpo-qwen7b-dgx.yaml")
        wait_for(lambda: job_status(kube, namespace, name).get("phase") == "Running", "phase Running", 120)
        assert len(job_pods(kube, namespace, name)) == 2
        assert "Forbidden" not in operator.output()
    finally:
        stop_operator(operator)
