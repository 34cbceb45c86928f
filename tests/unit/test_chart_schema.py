"""``values.schema.json`` rejects bad values with a message naming the field (real ``helm template``)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "verl-operator"
#: The cluster version the renders below name explicitly, so they do not depend on the helm build.
KUBE_VERSION = "v1.34.0"


def template(helm: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [helm, "template", "vo", str(CHART), "--kube-version", KUBE_VERSION, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize(
    ("set_arg", "pointer", "reason"),
    [
        pytest.param("replicaCount=abc", "/replicaCount", "want integer", id="replicas-not-a-number"),
        pytest.param(
            "replicaCount=2,leaderElection.enabled=false",
            "/leaderElection/enabled",
            "must be true",
            id="replicas-without-leader-election",
        ),
        pytest.param("podAntiAffinity=sometimes", "/podAntiAffinity", "one of", id="anti-affinity-unknown"),
        pytest.param(
            "leaderElection.leaseDuration=0",
            "/leaderElection/leaseDuration",
            "exclusiveMinimum",
            id="lease-duration-zero",
        ),
        pytest.param("replicaCount=-1", "/replicaCount", "minimum", id="replicas-negative"),
        pytest.param("image.pullPolicy=Sometimes", "/image/pullPolicy", "one of", id="pull-policy"),
        pytest.param("image.repository=", "/image/repository", "minLength", id="empty-repository"),
        pytest.param("watchNamespaces={Team_A}", "/watchNamespaces/0", "pattern", id="namespace-not-dns"),
        pytest.param("watchNamespaces={a,a}", "/watchNamespaces", "are equal", id="namespace-twice"),
        pytest.param("rbac.dropVerbs={escalate}", "/rbac/dropVerbs/0", "one of", id="unknown-verb"),
        pytest.param("rbac.create=yes", "/rbac/create", "want boolean", id="rbac-create-string"),
        pytest.param("health.port=70000", "/health/port", "maximum", id="port-too-big"),
        pytest.param("health.path=healthz", "/health/path", "pattern", id="path-without-slash"),
        pytest.param("webhook.failurePolicy=Retry", "/webhook/failurePolicy", "one of", id="failure-policy"),
        pytest.param(
            "webhook.timeoutSeconds=31", "/webhook/timeoutSeconds", "maximum", id="timeout-above-30"
        ),
        pytest.param("webhook.url=http://127.0.0.1:9443", "/webhook/url", "pattern", id="url-not-https"),
        pytest.param("webhook.url=https://h:1/x", "/webhook/url", "pattern", id="url-with-path"),
        pytest.param(
            "webhook.certManager.issuerRef.kind=Vault",
            "/webhook/certManager/issuerRef/kind",
            "one of",
            id="issuer-kind",
        ),
        pytest.param(
            "webhook.tls.extraIPAddresses={not-an-ip}",
            "/webhook/tls/extraIPAddresses/0",
            "is not valid ipv4",
            id="san-not-an-ip",
        ),
        pytest.param(
            "resources.requests.cpu=lots",
            "/resources/requests/cpu",
            "does not match pattern",
            id="bad-quantity",
        ),
        pytest.param(
            "metrics.serviceMonitor.interval=often",
            "/metrics/serviceMonitor/interval",
            "pattern",
            id="bad-interval",
        ),
        pytest.param(
            "nodeSelector.zone=1", "/nodeSelector/zone", "want string", id="selector-value-not-string"
        ),
        pytest.param("replicas=1", "", "additional properties 'replicas'", id="unknown-top-level-key"),
        pytest.param(
            "webhook.caBundle=x", "/webhook", "additional properties 'caBundle'", id="misplaced-key"
        ),
    ],
)
def test_bad_values_are_rejected_naming_the_field(helm: str, set_arg: str, pointer: str, reason: str) -> None:
    proc = template(helm, "--set", set_arg)
    assert proc.returncode != 0, f"{set_arg} was accepted"
    assert "values don't meet the specifications of the schema" in proc.stderr
    assert f"at '{pointer}'" in proc.stderr, proc.stderr
    assert reason in proc.stderr, proc.stderr


@pytest.mark.parametrize(
    "set_arg",
    [
        pytest.param("replicaCount=0", id="parked"),
        pytest.param("replicaCount=1,leaderElection.enabled=false", id="one-replica-no-election"),
        pytest.param("replicaCount=3", id="three-replicas"),
        pytest.param("watchNamespaces={team-a,ml-jobs}", id="namespaces"),
        pytest.param("webhook.url=https://127.0.0.1:9443", id="dev-url"),
        pytest.param("webhook.url=https://[::1]:9443/", id="dev-url-ipv6"),
        pytest.param("webhook.tls.extraIPAddresses={10.0.0.1}", id="extra-ip"),
        pytest.param("resources.requests.cpu=0.5", id="fractional-cpu"),
        pytest.param("rbac.dropVerbs={watch,patch}", id="drop-verbs"),
    ],
)
def test_good_values_are_accepted(helm: str, set_arg: str) -> None:
    proc = template(helm, "--set", set_arg)
    assert proc.returncode == 0, proc.stderr


def test_every_default_value_is_described_by_the_schema() -> None:
    """The schema forbids unknown keys at every level, so each default must appear in it."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: dict[str, Any], props: dict[str, Any], prefix: str) -> list[str]:
        missing: list[str] = []
        for key, value in node.items():
            sub = props.get(key)
            if not isinstance(sub, dict):
                missing.append(prefix + key)
                continue
            if isinstance(value, dict) and "properties" in sub:
                missing += walk(value, sub["properties"], f"{prefix}{key}.")
        return missing

    assert walk(values, schema["properties"], "") == []
    assert schema["additionalProperties"] is False
