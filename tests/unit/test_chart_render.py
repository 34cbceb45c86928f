"""The Helm chart rendered by the real ``helm`` binary (no cluster): lint, objects, RBAC, certificates."""

from __future__ import annotations

import base64
import ipaddress
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509

from verl_operator.controller.webhook_server import READY_PATH
from verl_operator.policy import AdminPolicy

CHART = Path(__file__).resolve().parents[2] / "charts" / "verl-operator"
#: The cluster version the renders below name explicitly, so they do not depend on the helm build.
KUBE_VERSION = "v1.34.0"
RELEASE = "vo"
NAMESPACE = "verl-system"
FULLNAME = "vo-verl-operator"

#: Verbs a rule of the chart may grant: never a wildcard, never escalate/bind/impersonate.
ALLOWED_VERBS = {"get", "list", "watch", "create", "patch", "delete", "update"}
#: The leader election's Role in the release namespace (the Lease's only grant).
LEASE_ROLE = f"{FULLNAME}-leader-election"


def run_helm(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm, *args], capture_output=True, text=True, timeout=120, check=False)


def render(
    helm: str, *sets: str, values: dict[str, Any] | None = None, tmp: Path | None = None
) -> list[dict[str, Any]]:
    """``helm template`` with ``--set`` pairs (and a values file); the rendered objects."""
    argv = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION]
    for item in sets:
        argv += ["--set", item]
    if values is not None:
        assert tmp is not None
        path = tmp / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        argv += ["--values", str(path)]
    proc = run_helm(helm, *argv)
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, f"expected one {kind}, got {[o['metadata']['name'] for o in found]}"
    return found[0]


def rules(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for obj in objects:
        if obj["kind"] in ("ClusterRole", "Role"):
            for rule in obj.get("rules") or []:
                yield f"{obj['kind']}/{obj['metadata'].get('namespace', '')}/{obj['metadata']['name']}", rule


def container(objects: list[dict[str, Any]], name: str = "operator") -> dict[str, Any]:
    """The operator pod's container ``name``: ``operator`` or ``webhook-relay``."""
    containers = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert {c["name"] for c in containers} <= {"operator", "webhook-relay"}
    [found] = [c for c in containers if c["name"] == name]
    return dict(found)


NON_DEFAULT: dict[str, Any] = {
    "image": {"repository": "registry.example/verl-operator", "tag": "1.2.3", "pullPolicy": "Always"},
    "watchNamespaces": ["team-a", "team-b"],
    "extraArgs": ["--verbose"],
    "extraEnv": [{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}],
    "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}],
    "resources": {"requests": {"cpu": "250m", "memory": "512Mi"}, "limits": {"memory": "2Gi"}},
    "rbac": {"volcano": True},
    "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}}},
    "webhook": {"failurePolicy": "Ignore", "timeoutSeconds": 5},
}


@pytest.mark.parametrize(
    "values",
    [pytest.param({}, id="defaults"), pytest.param(NON_DEFAULT, id="non-default")],
)
def test_lint_strict_passes(helm: str, values: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    proc = run_helm(helm, "lint", "--strict", str(CHART), "--values", str(path))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 chart(s) failed" in proc.stdout


def test_defaults_render_a_cluster_wide_install(helm: str) -> None:
    objects = render(helm)
    kinds = sorted(o["kind"] for o in objects)
    assert kinds == sorted(
        [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Deployment",
            "Service",  # webhook
            "Service",  # the replicas' webhook servers (headless: the relays' peers)
            "Service",  # metrics
            "Secret",  # webhook TLS
            "ConfigMap",  # admission policy
            "ValidatingWebhookConfiguration",
            "PodDisruptionBudget",  # two replicas
            "Role",  # the leader election's Lease
            "RoleBinding",
        ]
    )
    for obj in objects:
        if obj["kind"] not in ("ClusterRole", "ClusterRoleBinding", "ValidatingWebhookConfiguration"):
            assert obj["metadata"]["namespace"] == NAMESPACE, obj["kind"]
    args = container(objects)["command"]
    assert args[:2] == ["verl-operator", "run"]
    assert "--all-namespaces" in args
    assert not [a for a in args if a.startswith("--namespace")]


def test_deployment_is_hardened(helm: str) -> None:
    objects = render(helm)
    deployment = one(objects, "Deployment")
    spec = deployment["spec"]
    assert spec["replicas"] == 2
    # The Lease keeps one reconciler: a rollout replaces one pod after the other, a replica always ready.
    assert spec["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1},
    }
    pod = spec["template"]["spec"]
    assert pod["serviceAccountName"] == FULLNAME
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    ctr = container(objects)
    sc = ctr["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert "add" not in sc["capabilities"]
    assert set(ctr["resources"]["requests"]) == {"cpu", "memory"}
    ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    live = ctr["livenessProbe"]["httpGet"]
    assert (live["path"], ports[live["port"]]) == ("/healthz", 8080)
    # Readiness asks the webhook server itself (its thread answers the reviews the Service routes).
    ready = ctr["readinessProbe"]["httpGet"]
    assert (ready["path"], ports[ready["port"]], ready["scheme"]) == (READY_PATH, 9443, "HTTPS")
    assert f"--health-port={ports['health']}" in ctr["command"]
    assert f"--webhook-port={ports['webhook']}" in ctr["command"]
    # A read-only root filesystem needs a writable /tmp.
    mounts = {m["mountPath"]: m["name"] for m in ctr["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]


def test_non_default_values_reach_the_objects(helm: str, tmp_path: Path) -> None:
    objects = render(helm, values=NON_DEFAULT, tmp=tmp_path)
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    ctr = container(objects)
    assert ctr["image"] == "registry.example/verl-operator:1.2.3"
    assert ctr["imagePullPolicy"] == "Always"
    assert pod["nodeSelector"] == NON_DEFAULT["nodeSelector"]
    assert pod["tolerations"] == NON_DEFAULT["tolerations"]
    assert ctr["resources"] == NON_DEFAULT["resources"]
    assert {"name": "HTTPS_PROXY", "value": "http://proxy:3128"} in ctr["env"]
    assert ctr["command"][-1] == "--verbose"
    assert [a for a in ctr["command"] if a.startswith("--namespace")] == [
        "--namespace=team-a",
        "--namespace=team-b",
    ]
    monitor = one(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    metrics_service = next(
        s for s in by_kind(objects, "Service") if s["metadata"]["name"].endswith("-metrics")
    )
    assert monitor["spec"]["selector"]["matchLabels"].items() <= metrics_service["metadata"]["labels"].items()
    webhook = one(objects, "ValidatingWebhookConfiguration")["webhooks"][0]
    assert webhook["failurePolicy"] == "Ignore"
    assert webhook["timeoutSeconds"] == 5
    assert any("scheduling.volcano.sh" in r["apiGroups"] for _, r in rules(objects))


@pytest.mark.parametrize(
    "sets",
    [
        pytest.param((), id="cluster-wide"),
        pytest.param(("watchNamespaces={a,b}",), id="namespaces"),
        pytest.param(("rbac.volcano=true",), id="volcano"),
    ],
)
def test_rbac_has_no_wildcards_and_only_known_verbs(helm: str, sets: tuple[str, ...]) -> None:
    objects = render(helm, *sets)
    found = list(rules(objects))
    assert found
    for where, rule in found:
        for field in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[field], f"{where}: wildcard in {field}: {rule}"
        assert set(rule["verbs"]) <= ALLOWED_VERBS, f"{where}: {rule}"
        if "update" in rule["verbs"]:
            assert rule["resources"] == ["leases"], f"{where}: update is for the Lease only: {rule}"
        assert "resourceNames" not in rule or rule["resourceNames"]
        # The chart owns the webhook configuration and the operator reads no Secrets.
        assert not {"secrets", "validatingwebhookconfigurations", "clusterroles", "roles"} & set(
            rule["resources"]
        )


def test_namespace_mode_renders_roles_not_a_cluster_wide_grant(helm: str) -> None:
    objects = render(helm, "watchNamespaces={team-a,team-b}")
    roles = [r for r in by_kind(objects, "Role") if r["metadata"]["name"] != LEASE_ROLE]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    bindings = [b for b in by_kind(objects, "RoleBinding") if b["metadata"]["name"] != LEASE_ROLE]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    for role in roles:
        resources = {res for rule in role["rules"] for res in rule["resources"]}
        assert {"verljobs", "verljobs/status", "pods", "configmaps", "services", "events"} <= resources
    # Only read access to cluster-scoped objects stays in the ClusterRole (kopf follows the namespaces), and
    # the webhook's SubjectAccessReviews (create only: they read nothing).
    cluster_role = one(objects, "ClusterRole")
    assert sorted(res for rule in cluster_role["rules"] for res in rule["resources"]) == [
        "customresourcedefinitions",
        "namespaces",
        "nodes",
        "priorityclasses",
        "subjectaccessreviews",
    ]
    for rule in cluster_role["rules"]:
        expected = ["create"] if rule["resources"] == ["subjectaccessreviews"] else ["get", "list", "watch"]
        assert rule["verbs"] == expected
    webhook = one(objects, "ValidatingWebhookConfiguration")["webhooks"][0]
    assert webhook["namespaceSelector"]["matchExpressions"] == [
        {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a", "team-b"]}
    ]


def test_cluster_wide_mode_renders_no_role_but_the_leases(helm: str) -> None:
    objects = render(helm)
    assert [r["metadata"]["name"] for r in by_kind(objects, "Role")] == [LEASE_ROLE]
    resources = {res for _, rule in rules(objects) for res in rule["resources"]}
    assert resources == {
        "nodes",
        "priorityclasses",
        "customresourcedefinitions",
        "verljobs",
        "verljobs/status",
        "pods",
        "services",
        "serviceaccounts",
        "resourcequotas",
        "limitranges",
        "namespaces",
        "configmaps",
        "events",
        "workloads",
        "subjectaccessreviews",
        "leases",
    }
    assert "namespaceSelector" not in one(objects, "ValidatingWebhookConfiguration")["webhooks"][0]


@pytest.mark.parametrize(
    ("verbs", "gone_resource"),
    [
        pytest.param(("create", "patch"), "events", id="create-patch-drop-the-events-rule"),
        pytest.param(("watch",), None, id="watch"),
        pytest.param(("patch",), None, id="patch"),
        pytest.param(("get", "patch"), "verljobs/status", id="get-patch-drop-the-status-rule"),
    ],
)
def test_drop_verbs_removes_the_verbs_everywhere(
    helm: str, verbs: tuple[str, ...], gone_resource: str | None
) -> None:
    full = list(rules(render(helm)))
    dropped = list(rules(render(helm, "rbac.dropVerbs={" + ",".join(verbs) + "}")))
    for verb in verbs:
        assert any(verb in r["verbs"] for _, r in full)
        assert all(verb not in r["verbs"] for _, r in dropped)
    for _, rule in dropped:
        assert rule["verbs"], "a rule left without verbs must not be rendered"
    if gone_resource is not None:
        assert any(gone_resource in r["resources"] for _, r in full)
        assert not any(gone_resource in r["resources"] for _, r in dropped)


def _cert(b64: str) -> x509.Certificate:
    return x509.load_pem_x509_certificate(base64.b64decode(b64))


def test_self_generated_certificate_is_signed_by_the_ca_bundle(helm: str) -> None:
    objects = render(helm)
    secret = one(objects, "Secret")
    assert secret["type"] == "kubernetes.io/tls"
    assert set(secret["data"]) == {"ca.crt", "tls.crt", "tls.key"}
    webhook = one(objects, "ValidatingWebhookConfiguration")["webhooks"][0]
    ca = _cert(webhook["clientConfig"]["caBundle"])
    assert ca == _cert(secret["data"]["ca.crt"])
    serving = _cert(secret["data"]["tls.crt"])
    serving.verify_directly_issued_by(ca)
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    service = webhook["clientConfig"]["service"]
    assert f"{service['name']}.{service['namespace']}.svc" in names.get_values_for_type(x509.DNSName)
    webhook_service = next(s for s in by_kind(objects, "Service") if s["metadata"]["name"] == service["name"])
    assert webhook_service["spec"]["ports"][0]["port"] == service["port"]
    assert webhook_service["spec"]["ports"][0]["targetPort"] == "relay"  # the relay serves the certificate
    assert service["path"] == one_value(helm, "webhook.path")
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    tls_volume = next(v for v in pod["volumes"] if "secret" in v)
    assert tls_volume["secret"]["secretName"] == secret["metadata"]["name"]
    assert webhook["rules"][0]["resources"] == ["verljobs"]
    assert webhook["rules"][0]["operations"] == ["CREATE", "UPDATE"]


def one_value(helm: str, dotted: str) -> Any:
    proc = run_helm(helm, "show", "values", str(CHART))
    assert proc.returncode == 0, proc.stderr
    node: Any = yaml.safe_load(proc.stdout)
    for part in dotted.split("."):
        node = node[part]
    return node


def test_dev_mode_url_points_the_api_server_outside_the_cluster(helm: str) -> None:
    objects = render(helm, "webhook.url=https://127.0.0.1:18443", "deployment.enabled=false")
    assert by_kind(objects, "Deployment") == []
    assert all(not s["metadata"]["name"].endswith("-webhook") for s in by_kind(objects, "Service"))
    webhook = one(objects, "ValidatingWebhookConfiguration")["webhooks"][0]
    assert webhook["clientConfig"]["url"] == "https://127.0.0.1:18443" + one_value(helm, "webhook.path")
    assert "service" not in webhook["clientConfig"]
    secret = one(objects, "Secret")
    serving = _cert(secret["data"]["tls.crt"])
    serving.verify_directly_issued_by(_cert(webhook["clientConfig"]["caBundle"]))
    names = serving.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert ipaddress.ip_address("127.0.0.1") in names.get_values_for_type(x509.IPAddress)


def test_provided_ca_bundle_replaces_the_generated_secret(helm: str) -> None:
    bundle = base64.b64encode(b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n").decode()
    objects = render(helm, "webhook.tls.existingSecret=my-tls", f"webhook.tls.caBundle={bundle}")
    assert by_kind(objects, "Secret") == []
    assert one(objects, "ValidatingWebhookConfiguration")["webhooks"][0]["clientConfig"]["caBundle"] == bundle
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert next(v for v in pod["volumes"] if "secret" in v)["secret"]["secretName"] == "my-tls"


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        pytest.param(
            ("webhook.tls.existingSecret=my-tls",),
            "webhook.tls.existingSecret needs webhook.tls.caBundle",
            id="secret-without-ca",
        ),
        pytest.param(
            ("webhook.tls.caBundle=QUJD",),
            "webhook.tls.caBundle needs webhook.tls.existingSecret",
            id="ca-without-secret",
        ),
    ],
)
def test_incomplete_own_certificate_fails_with_the_reason(
    helm: str, sets: tuple[str, ...], message: str
) -> None:
    argv = ["template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION]
    for item in sets:
        argv += ["--set", item]
    proc = run_helm(helm, *argv)
    assert proc.returncode != 0
    assert message in proc.stderr


def test_dev_mode_with_a_provided_ca_bundle_renders_no_secret(helm: str) -> None:
    objects = render(
        helm, "webhook.url=https://127.0.0.1:9443", "webhook.tls.caBundle=QUJD", "deployment.enabled=false"
    )
    assert by_kind(objects, "Secret") == []
    assert one(objects, "ValidatingWebhookConfiguration")["webhooks"][0]["clientConfig"]["caBundle"] == "QUJD"


@pytest.mark.parametrize(
    ("sets", "issuer_kind", "issuer_name"),
    [
        pytest.param((), "Issuer", f"{FULLNAME}-selfsigned", id="chart-issuer"),
        pytest.param(
            (
                "webhook.certManager.issuerRef.name=corp-ca",
                "webhook.certManager.issuerRef.kind=ClusterIssuer",
            ),
            "ClusterIssuer",
            "corp-ca",
            id="own-issuer",
        ),
    ],
)
def test_cert_manager_mode(helm: str, sets: tuple[str, ...], issuer_kind: str, issuer_name: str) -> None:
    objects = render(helm, "webhook.certManager.enabled=true", *sets)
    assert by_kind(objects, "Secret") == []
    assert len(by_kind(objects, "Issuer")) == (1 if issuer_kind == "Issuer" else 0)
    certificate = one(objects, "Certificate")
    assert certificate["spec"]["issuerRef"] == {"name": issuer_name, "kind": issuer_kind}
    config = one(objects, "ValidatingWebhookConfiguration")
    assert config["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == (
        f"{NAMESPACE}/{certificate['metadata']['name']}"
    )
    assert "caBundle" not in config["webhooks"][0]["clientConfig"]
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert (
        next(v for v in pod["volumes"] if "secret" in v)["secret"]["secretName"]
        == certificate["spec"]["secretName"]
    )
    service = config["webhooks"][0]["clientConfig"]["service"]
    assert f"{service['name']}.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]


def test_webhook_disabled_renders_no_admission_objects(helm: str) -> None:
    objects = render(helm, "webhook.enabled=false", "metrics.enabled=false")
    assert {o["kind"] for o in objects} == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Deployment",
        "PodDisruptionBudget",
        "Role",
        "RoleBinding",
    }
    ctr = container(objects)
    assert not [a for a in ctr["command"] if a.startswith(("--webhook", "--metrics"))]
    assert [p["name"] for p in ctr["ports"]] == ["health"]


def documented_grants() -> tuple[set[tuple[str, str, str]], dict[str, set[tuple[str, str, str]]]]:
    """(group, resource, verb) triples of the table "RBAC verbs the operator uses" in docs/operator.md.

    Returns:
        The unconditional triples, and the conditional ones by the resource of their row (rows that say "only").
    """
    text = (CHART.parents[1] / "docs" / "operator.md").read_text()
    table = text[text.index("## RBAC verbs the operator uses") :].splitlines()
    always: set[tuple[str, str, str]] = set()
    conditional: dict[str, set[tuple[str, str, str]]] = {}
    for line in table:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[1].startswith("`"):
            continue
        groups = [g.strip().strip("`").strip('"') for g in cells[0].split("/")]
        resource = cells[1].strip("`")
        verbs_text = cells[2].split("(", 1)[0]
        triples = {(g, resource, v.strip()) for g in groups for v in verbs_text.split(",") if v.strip()}
        if "(only" in cells[2]:
            conditional[resource] = triples
        else:
            always |= triples
    return always, conditional


def granted(objects: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for _, rule in rules(objects)
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_rbac_grants_exactly_what_the_operator_documents(helm: str) -> None:
    """The two modes together grant the documented table: no more (least privilege), no less."""
    always, conditional = documented_grants()
    assert ("", "pods", "create") in always
    cluster_wide, namespaced = granted(render(helm)), granted(render(helm, "watchNamespaces={a}"))
    assert cluster_wide | namespaced == always
    # Both modes grant the same reads (namespaces, quotas and limit ranges too: the webhook's proofs).
    assert namespaced == cluster_wide
    assert {("", r, "watch") for r in ("namespaces", "resourcequotas", "limitranges")} <= cluster_wide
    # Volcano PodGroups only on request; the webhook configuration never (the chart manages it).
    assert granted(render(helm, "rbac.volcano=true")) == cluster_wide | conditional["podgroups"]
    assert "validatingwebhookconfigurations" in conditional


@pytest.mark.parametrize(
    "sets",
    [
        pytest.param((), id="defaults"),
        pytest.param(("watchNamespaces={team-a,team-b}", "extraArgs={--verbose}"), id="namespaces-verbose"),
        pytest.param(("webhook.enabled=false", "metrics.enabled=false"), id="no-webhook-no-metrics"),
    ],
)
def test_container_args_are_a_valid_verl_operator_run_command_line(helm: str, sets: tuple[str, ...]) -> None:
    """The chart's flags exist in the real CLI: a renamed operator flag fails here, not in a cluster."""
    from verl_operator.cli import build_parser

    objects = render(helm, *sets)
    ctr = container(objects)
    assert ctr["command"][0] == "verl-operator"
    args = build_parser().parse_args(ctr["command"][1:])
    assert args.command == "run"
    ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    assert args.health_port == ports["health"]
    assert args.metrics_port == ports.get("metrics", 0)
    assert args.webhook_port == ports.get("webhook", 0)
    assert args.listen_address == "0.0.0.0"
    mounts = {m["name"]: m["mountPath"] for m in ctr["volumeMounts"]}
    if args.webhook_port:
        assert args.webhook_cert == f"{mounts['webhook-tls']}/tls.crt"
        assert args.webhook_key == f"{mounts['webhook-tls']}/tls.key"
    else:
        assert args.webhook_cert is None
    namespaces = [a.removeprefix("--namespace=") for a in ctr["command"] if a.startswith("--namespace=")]
    assert args.namespace == namespaces
    assert args.all_namespaces is (not namespaces)
    # The webhook configuration belongs to the chart: the operator must not manage one.
    assert args.webhook_managed is None


def test_packaged_chart_holds_the_crd_and_not_the_tooling(helm: str, tmp_path: Path) -> None:
    import tarfile

    proc = run_helm(helm, "package", str(CHART), "--destination", str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    (archive,) = tmp_path.glob("verl-operator-*.tgz")
    with tarfile.open(archive) as tar:
        names = {n.removeprefix("verl-operator/") for n in tar.getnames()}
    assert {"Chart.yaml", "values.yaml", "values.schema.json", "README.md", "templates/NOTES.txt"} <= names
    assert "crds/verl-operator.io_verljobs.yaml" in names
    assert not [n for n in names if n.startswith("scripts/")]
    # The CRD upgrade command of docs/helm.md reads the CRD from the chart.
    crds = run_helm(helm, "show", "crds", str(archive))
    assert crds.returncode == 0, crds.stderr
    (crd,) = [d for d in yaml.safe_load_all(crds.stdout) if d]
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == "verljobs.verl-operator.io"


def test_pinned_helm_assumes_a_current_kubernetes_without_a_cluster(helm: str) -> None:
    """The devcluster's helm compiles in its Kubernetes minor (as helm's release builds do): a plain
    ``go build`` assumes v1.20 and refuses the chart's kubeVersion constraint in ``helm template``/``lint``."""
    if os.environ.get("HELM"):
        pytest.skip("HELM points at a helm that this project did not build")
    proc = run_helm(helm, "template", RELEASE, str(CHART))
    assert proc.returncode == 0, proc.stderr
    assert "kind: Deployment" in proc.stdout
    lint = run_helm(helm, "lint", "--strict", str(CHART))
    assert lint.returncode == 0, lint.stdout + lint.stderr


# The chart: values -> ConfigMap -> the operator's --policy-file.


def test_chart_policy_configmap_holds_the_default_policy(helm: str) -> None:
    objects = render(helm)
    config = next(
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-policy")
    )
    assert AdminPolicy.model_validate(yaml.safe_load(config["data"]["policy.yaml"])) == AdminPolicy()
    assert "--policy-file=/etc/verl-operator/policy/policy.yaml" in container(objects)["command"]
    deployment = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert {"name": "policy", "configMap": {"name": config["metadata"]["name"]}} in deployment["volumes"]


def test_chart_policy_values_reach_the_file_and_the_rbac(helm: str) -> None:
    objects = render(helm, "policy.allowedVolumeTypes={hostPath}", "policy.requirePodCreatePermission=false")
    config = next(
        o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-policy")
    )
    policy = AdminPolicy.model_validate(yaml.safe_load(config["data"]["policy.yaml"]))
    assert policy.allowed_volume_types == ("hostPath",) and not policy.require_pod_create_permission
    assert ("authorization.k8s.io", "subjectaccessreviews", "create") not in granted(objects)
    assert ("authorization.k8s.io", "subjectaccessreviews", "create") in granted(render(helm))


def test_two_replicas_elect_a_leader_spread_over_nodes_and_keep_one_through_a_drain(helm: str) -> None:
    objects = render(helm)
    args = container(objects)["command"]
    assert "--leader-elect" in args
    assert f"--leader-election-id={FULLNAME}" in args
    assert f"--leader-election-namespace={NAMESPACE}" in args
    # Shorter than client-go's 15 s / 10 s: a crashed leader is replaced in under 15 s (docs/benchmarks.md).
    assert "--leader-election-lease-duration=10" in args
    assert "--leader-election-renew-deadline=7" in args
    assert "--leader-election-retry-period=2" in args
    lease_role = one(objects, "Role")
    assert lease_role["metadata"] == {**lease_role["metadata"], "name": LEASE_ROLE, "namespace": NAMESPACE}
    assert lease_role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["get", "create", "update"]}
    ]
    binding = one(objects, "RoleBinding")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": LEASE_ROLE}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FULLNAME, "namespace": NAMESPACE}]
    pod = one(objects, "Deployment")["spec"]["template"]
    selector = one(objects, "Deployment")["spec"]["selector"]["matchLabels"]
    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"] == {"minAvailable": 1, "selector": {"matchLabels": selector}}
    assert selector.items() <= pod["metadata"]["labels"].items()
    (term,) = pod["spec"]["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["weight"] == 100
    assert term["podAffinityTerm"] == {
        "topologyKey": "kubernetes.io/hostname",
        "labelSelector": {"matchLabels": selector},
    }


def test_lease_values_reach_the_args_and_the_role(helm: str) -> None:
    objects = render(
        helm,
        "leaderElection.leaseName=my-lease",
        "leaderElection.namespace=ops",
        "leaderElection.leaseDuration=20",
        "leaderElection.renewDeadline=12",
        "leaderElection.retryPeriod=1",
        "podAntiAffinity=required",
        "podDisruptionBudget.minAvailable=2",
        "replicaCount=3",
    )
    args = container(objects)["command"]
    for arg in (
        "--leader-election-id=my-lease",
        "--leader-election-namespace=ops",
        "--leader-election-lease-duration=20",
        "--leader-election-renew-deadline=12",
        "--leader-election-retry-period=1",
    ):
        assert arg in args
    assert one(objects, "Role")["metadata"]["namespace"] == "ops"
    assert one(objects, "RoleBinding")["metadata"]["namespace"] == "ops"
    assert one(objects, "PodDisruptionBudget")["spec"]["minAvailable"] == 2
    anti = one(objects, "Deployment")["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert list(anti) == ["requiredDuringSchedulingIgnoredDuringExecution"]


def test_one_replica_without_election_is_the_single_instance_of_before(helm: str) -> None:
    objects = render(helm, "replicaCount=1", "leaderElection.enabled=false")
    assert not by_kind(objects, "PodDisruptionBudget") and not by_kind(objects, "Role")
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert "affinity" not in deployment["spec"]["template"]["spec"]
    assert not [a for a in container(objects)["command"] if a.startswith("--leader")]
    # One replica with election (a standby started by hand, say): no PDB (it would block every drain).
    assert not by_kind(render(helm, "replicaCount=1"), "PodDisruptionBudget")


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        pytest.param(
            ("leaderElection.renewDeadline=10",),
            "leaderElection.renewDeadline (10) must be less than leaderElection.leaseDuration (10)",
            id="deadline-not-below-duration",
        ),
        pytest.param(
            ("leaderElection.retryPeriod=6",),
            "leaderElection.renewDeadline (7) must be greater than 1.2 x leaderElection.retryPeriod (6)",
            id="no-renew-fits",
        ),
    ],
)
def test_election_durations_that_cannot_work_fail_with_the_reason(
    helm: str, sets: tuple[str, ...], message: str
) -> None:
    argv = ["template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION]
    for s in sets:
        argv += ["--set", s]
    proc = run_helm(helm, *argv)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    ("sets", "period", "timeout", "threshold"),
    [
        pytest.param((), 2, 2, 2, id="defaults-6s"),
        pytest.param(
            (
                "health.readiness.periodSeconds=1",
                "health.readiness.timeoutSeconds=1",
                "health.readiness.failureThreshold=3",
            ),
            1,
            1,
            3,
            id="set-4s",
        ),
    ],
)
def test_a_lost_replica_leaves_the_webhook_service_within_the_readiness_window(
    helm: str, sets: tuple[str, ...], period: int, timeout: int, threshold: int
) -> None:
    """The webhook's Service routes reviews to ready replicas only, the readiness probe takes a paused or
    killed replica out within period x threshold + timeout seconds, well before liveness restarts it, and
    the webhook stays Fail (never admits a job unchecked) with its 10 s wait."""
    objects = render(helm, *sets)
    ctr = container(objects)
    ready, live = ctr["readinessProbe"], ctr["livenessProbe"]
    assert (ready["periodSeconds"], ready["timeoutSeconds"], ready["failureThreshold"]) == (
        period,
        timeout,
        threshold,
    )
    assert ready["successThreshold"] == 1
    out_of_service = period * threshold + timeout
    restarted = live["periodSeconds"] * live.get("failureThreshold", 3)  # the kubelet's default threshold
    assert out_of_service < restarted, f"{out_of_service}s to leave the Service, {restarted}s to restart"
    service = next(s for s in by_kind(objects, "Service") if s["spec"]["ports"][0]["name"] == "webhook")
    assert service["spec"]["publishNotReadyAddresses"] is False
    pod = one(objects, "Deployment")["spec"]["template"]
    assert service["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    webhook = one(objects, "ValidatingWebhookConfiguration")["webhooks"][0]
    assert webhook["clientConfig"]["service"]["name"] == service["metadata"]["name"]
    assert (webhook["failurePolicy"], webhook["timeoutSeconds"]) == ("Fail", 10)


def test_a_readiness_probe_that_cannot_work_is_refused_by_the_schema(helm: str) -> None:
    proc = run_helm(
        helm,
        "template",
        RELEASE,
        str(CHART),
        "--kube-version",
        KUBE_VERSION,
        "--set",
        "health.readiness.failureThreshold=0",
    )
    assert proc.returncode != 0
    assert "failureThreshold" in proc.stderr


@pytest.mark.parametrize(
    "sets",
    [
        pytest.param(("webhook.enabled=false",), id="no-webhook"),
        pytest.param(("webhook.url=https://127.0.0.1:9443",), id="dev-mode"),
    ],
)
def test_without_an_in_cluster_webhook_readiness_asks_the_health_endpoint(
    helm: str, sets: tuple[str, ...]
) -> None:
    objects = render(helm, *sets)
    ctr = container(objects)
    ports = {p["name"]: p["containerPort"] for p in ctr["ports"]}
    ready = ctr["readinessProbe"]["httpGet"]
    assert (ready["path"], ports[ready["port"]]) == ("/healthz", 8080)
    assert "scheme" not in ready


def _relay_args(command: list[str]) -> Any:
    """The relay's command line as ``verl-operator``'s own parser reads it (``$(POD_IP)`` as the kubelet
    expands it)."""
    from verl_operator.cli import build_parser

    assert command[:2] == ["verl-operator", "webhook-relay"]
    return build_parser().parse_args([a.replace("$(POD_IP)", "10.244.1.7") for a in command[1:]])


def test_the_webhook_relay_fronts_the_replicas_with_the_webhook_certificate(helm: str) -> None:
    """Each operator pod runs the relay next to the operator: the webhook Service routes to it, it serves the
    webhook's certificate, forwards to its own replica first and then to the others by the headless Service of
    their webhook servers (its own address left out), gives up before the API server does, and is probed like
    the operator's webhook server."""
    objects = render(helm)
    pod = one(objects, "Deployment")["spec"]["template"]
    operator, relay = container(objects), container(objects, "webhook-relay")
    assert relay["image"] == operator["image"]
    args = _relay_args(relay["command"])
    relay_port = {p["name"]: p["containerPort"] for p in relay["ports"]}["relay"]
    webhook_port = {p["name"]: p["containerPort"] for p in operator["ports"]}["webhook"]
    assert (args.listen_address, args.port) == ("0.0.0.0", relay_port)
    assert args.backend == [f"https://127.0.0.1:{webhook_port}"]

    # The API server's connection ends at the relay; the relay's peers are the replicas' webhook servers.
    services = {s["metadata"]["name"]: s for s in by_kind(objects, "Service")}
    front = services[f"{FULLNAME}-webhook"]["spec"]
    assert front["ports"][0]["targetPort"] == "relay" and front["publishNotReadyAddresses"] is False
    backends = services[f"{FULLNAME}-webhook-backends"]["spec"]
    assert backends["clusterIP"] == "None" and backends["publishNotReadyAddresses"] is False
    assert backends["selector"].items() <= pod["metadata"]["labels"].items()
    assert backends["ports"][0]["targetPort"] == "webhook" and backends["ports"][0]["port"] == webhook_port
    assert args.peers == f"{FULLNAME}-webhook-backends.{NAMESPACE}.svc:{webhook_port}"
    assert args.exclude_address == ["10.244.1.7"]
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in relay["env"]

    # The webhook's own certificate, key and CA from the webhook Secret, read-only.
    secret = one(objects, "Secret")
    [mount] = relay["volumeMounts"]
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["secret"]["secretName"] == secret["metadata"]["name"] and mount["readOnly"] is True
    files = {f"{mount['mountPath']}/{key}" for key in secret["data"]}
    assert {args.cert, args.key, *args.backend_ca} <= files
    assert f"--webhook-cert={args.cert}" in operator["command"]

    # Timeouts: the next replica gets a review after backend-timeout; the relay gives up before the API server.
    webhook = one(objects, "ValidatingWebhookConfiguration")["webhooks"][0]
    assert args.backend_timeout < args.deadline < webhook["timeoutSeconds"]
    assert (args.backend_timeout, args.deadline) == (3.0, 9.0)

    # Probes: readiness asks the relay (ready while a replica answers), liveness the relay's own endpoint.
    ready, live = relay["readinessProbe"], relay["livenessProbe"]
    assert (ready["httpGet"]["path"], ready["httpGet"]["port"], ready["httpGet"]["scheme"]) == (
        "/readyz",
        "relay",
        "HTTPS",
    )
    assert ready["periodSeconds"] * ready["failureThreshold"] + ready["timeoutSeconds"] == 6
    assert (live["httpGet"]["path"], live["httpGet"]["port"]) == ("/healthz", "relay")
    sc = relay["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert relay["resources"]["limits"]["memory"]


def test_the_relay_gets_no_service_account_token(helm: str) -> None:
    """The pod mounts no token by default; the operator container alone mounts the volume the kubelet would
    have mounted into every container (the bound token, the cluster CA, the namespace)."""
    objects = render(helm)
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False
    operator, relay = container(objects), container(objects, "webhook-relay")
    path = "/var/run/secrets/kubernetes.io/serviceaccount"
    assert not [m for m in relay["volumeMounts"] if m["mountPath"].startswith("/var/run/secrets")]
    assert "envFrom" not in relay
    assert [e["name"] for e in relay["env"]] == ["POD_IP"]
    [token_mount] = [m for m in operator["volumeMounts"] if m["mountPath"] == path]
    volume = next(v for v in pod["volumes"] if v["name"] == token_mount["name"])
    sources = volume["projected"]["sources"]
    assert {"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}} in sources
    assert any(s.get("configMap", {}).get("name") == "kube-root-ca.crt" for s in sources)
    assert any(i["path"] == "namespace" for s in sources for i in s.get("downwardAPI", {}).get("items", []))


@pytest.mark.parametrize(
    ("sets", "relay"),
    [
        pytest.param(("webhook.relay.enabled=false",), False, id="relay-off"),
        pytest.param(("webhook.enabled=false",), False, id="no-webhook"),
        pytest.param(("webhook.url=https://127.0.0.1:9443",), False, id="dev-mode"),
        pytest.param(("webhook.timeoutSeconds=5",), True, id="short-timeout"),
    ],
)
def test_the_relay_only_with_the_webhook_in_the_cluster(
    helm: str, sets: tuple[str, ...], relay: bool
) -> None:
    objects = render(helm, *sets)
    pod = one(objects, "Deployment")["spec"]["template"]["spec"]
    names = [c["name"] for c in pod["containers"]]
    assert names == (["operator", "webhook-relay"] if relay else ["operator"])
    assert pod["automountServiceAccountToken"] is (not relay)
    assert (
        any(s["metadata"]["name"].endswith("-webhook-backends") for s in by_kind(objects, "Service")) is relay
    )
    if relay:
        args = _relay_args(container(objects, "webhook-relay")["command"])
        assert args.deadline == 4.0 and args.backend_timeout < args.deadline
    elif "webhook.relay.enabled=false" in sets:
        front = next(s for s in by_kind(objects, "Service") if s["metadata"]["name"] == f"{FULLNAME}-webhook")
        assert front["spec"]["ports"][0]["targetPort"] == "webhook"


@pytest.mark.parametrize(
    "sets",
    [
        pytest.param(("webhook.timeoutSeconds=4",), id="no-time-for-the-next-replica"),
        pytest.param(("webhook.relay.backendTimeoutSeconds=9.5",), id="backend-timeout-past-the-deadline"),
    ],
)
def test_a_relay_timeout_that_leaves_no_time_for_the_next_replica_is_refused(
    helm: str, sets: tuple[str, ...]
) -> None:
    proc = run_helm(
        helm, "template", RELEASE, str(CHART), "--kube-version", KUBE_VERSION, *(f"--set={s}" for s in sets)
    )
    assert proc.returncode != 0
    assert "backendTimeoutSeconds" in proc.stderr
