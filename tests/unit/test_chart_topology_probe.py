"""The chart's optional topology-probe DaemonSet, rendered by the real ``helm`` binary (no cluster)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

CHART = Path(__file__).resolve().parents[2] / "charts" / "verl-operator"
KUBE_VERSION = "v1.34.0"
RELEASE = "vo"
NAMESPACE = "verl-system"
PROBE = "vo-verl-operator-topology-probe"
OPERATOR = "vo-verl-operator"
ENABLED = ("topologyProbe.enabled=true", "topologyProbe.image.repository=registry.example/verl")


def template(helm: str, *sets: str) -> subprocess.CompletedProcess[str]:
    argv = [helm, "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION]
    for item in sets:
        argv += ["--set", item]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def render(helm: str, *sets: str) -> list[dict[str, Any]]:
    proc = template(helm, *sets)
    assert proc.returncode == 0, proc.stderr
    return [doc for doc in yaml.safe_load_all(proc.stdout) if doc]


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, got {len(found)}"
    return found[0]


def node_grants(objects: list[dict[str, Any]]) -> dict[str, set[str]]:
    """Verbs on ``nodes`` per (Cluster)Role name."""
    grants: dict[str, set[str]] = {}
    for obj in objects:
        if obj["kind"] not in ("ClusterRole", "Role"):
            continue
        for rule in obj.get("rules") or []:
            if "nodes" in rule["resources"]:
                grants.setdefault(obj["metadata"]["name"], set()).update(rule["verbs"])
    return grants


@pytest.mark.parametrize(
    "sets",
    [
        pytest.param((), id="defaults"),
        pytest.param(("topologyProbe.image.repository=registry.example/verl",), id="image-without-enabled"),
    ],
)
def test_disabled_probe_renders_no_daemonset_and_no_node_patch(helm: str, sets: tuple[str, ...]) -> None:
    objects = render(helm, *sets)
    assert not [o for o in objects if o["kind"] == "DaemonSet"]
    assert not [o for o in objects if "topology-probe" in o["metadata"]["name"]]
    assert node_grants(objects) == {OPERATOR: {"get", "list", "watch"}}


def test_enabled_probe_daemonset_labels_the_node_it_runs_on(helm: str) -> None:
    objects = render(helm, *ENABLED)
    ds = named(objects, "DaemonSet", PROBE)
    assert ds["metadata"]["namespace"] == NAMESPACE
    pod = ds["spec"]["template"]["spec"]
    assert (
        ds["spec"]["selector"]["matchLabels"].items() <= ds["spec"]["template"]["metadata"]["labels"].items()
    )
    assert pod["serviceAccountName"] == PROBE
    assert pod["automountServiceAccountToken"] is True
    [probe] = pod["initContainers"]
    assert probe["image"] == "registry.example/verl"
    assert [*probe["command"], *probe["args"]] == [
        "verl-launcher",
        "probe",
        "--label-node",
        "--format=labels",
    ]
    env = {e["name"]: e for e in probe["env"]}
    assert env["NODE_NAME"]["valueFrom"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert env["NVIDIA_VISIBLE_DEVICES"]["value"] == "all"
    # No GPU is requested from the device plugin: the probe would take it from the jobs.
    [pause] = pod["containers"]
    for ctr in (probe, pause):
        assert not {k for part in ctr["resources"].values() for k in part if k.startswith("nvidia.com/")}
    assert pause["image"] == "registry.k8s.io/pause:3.10"
    assert "command" not in pause and "args" not in pause
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists"} in pod["tolerations"]
    assert "runtimeClassName" not in pod


def test_enabled_probe_pod_is_hardened(helm: str) -> None:
    pod = named(render(helm, *ENABLED), "DaemonSet", PROBE)["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    for ctr in (*pod["initContainers"], *pod["containers"]):
        sc = ctr["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False, ctr["name"]
        assert sc["readOnlyRootFilesystem"] is True, ctr["name"]
        assert sc["privileged"] is False, ctr["name"]
        assert sc["capabilities"] == {"drop": ["ALL"]}, ctr["name"]
    mounts = {m["mountPath"]: m["name"] for m in pod["initContainers"][0]["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/tmp"]]


def test_enabled_probe_gets_only_get_and_patch_on_nodes_bound_to_its_own_account(helm: str) -> None:
    objects = render(helm, *ENABLED)
    role = named(objects, "ClusterRole", PROBE)
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]}]
    binding = named(objects, "ClusterRoleBinding", PROBE)
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": PROBE,
    }
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": PROBE, "namespace": NAMESPACE}]
    assert named(objects, "ServiceAccount", PROBE)["metadata"]["namespace"] == NAMESPACE
    # The operator's grants are unchanged, and no other binding names the probe's account.
    assert node_grants(objects) == {OPERATOR: {"get", "list", "watch"}, PROBE: {"get", "patch"}}
    for obj in objects:
        if obj["kind"] in ("ClusterRoleBinding", "RoleBinding") and obj["metadata"]["name"] != PROBE:
            assert all(s["name"] != PROBE for s in obj["subjects"]), obj["metadata"]["name"]


def test_probe_pods_are_not_selected_by_the_operator_objects(helm: str) -> None:
    objects = render(helm, *ENABLED)
    labels = named(objects, "DaemonSet", PROBE)["spec"]["template"]["metadata"]["labels"]
    selectors = [named(objects, "Deployment", OPERATOR)["spec"]["selector"]["matchLabels"]]
    selectors += [o["spec"]["selector"] for o in objects if o["kind"] == "Service"]
    assert len(selectors) == 4  # the Deployment; the webhook, webhook backends and metrics Services
    for selector in selectors:
        assert not selector.items() <= labels.items(), selector


@pytest.mark.parametrize(
    ("sets", "check"),
    [
        pytest.param(
            ("topologyProbe.image.tag=v0.5", "topologyProbe.image.pullPolicy=Always"),
            lambda pod: (
                pod["initContainers"][0]["image"] == "registry.example/verl:v0.5"
                and pod["initContainers"][0]["imagePullPolicy"] == "Always"
            ),
            id="image-tag",
        ),
        pytest.param(
            ("topologyProbe.runtimeClassName=nvidia",),
            lambda pod: pod["runtimeClassName"] == "nvidia",
            id="runtime-class",
        ),
        pytest.param(
            ("topologyProbe.nodeSelector.gpu=yes",),
            lambda pod: pod["nodeSelector"] == {"nvidia.com/gpu.present": "true", "gpu": "yes"},
            id="node-selector",
        ),
        pytest.param(
            ("topologyProbe.nodeSelector=null",),
            lambda pod: "nodeSelector" not in pod,
            id="no-node-selector",
        ),
        pytest.param(
            ("topologyProbe.tolerations=null",),
            lambda pod: "tolerations" not in pod,
            id="no-tolerations",
        ),
        pytest.param(
            ("topologyProbe.resources.limits.memory=512Mi",),
            lambda pod: pod["initContainers"][0]["resources"]["limits"]["memory"] == "512Mi",
            id="resources",
        ),
    ],
)
def test_probe_values_reach_the_pod(helm: str, sets: tuple[str, ...], check: Any) -> None:
    pod = named(render(helm, *ENABLED, *sets), "DaemonSet", PROBE)["spec"]["template"]["spec"]
    assert check(pod), pod


def test_rbac_create_false_leaves_the_probe_role_to_the_user(helm: str) -> None:
    objects = render(helm, *ENABLED, "rbac.create=false")
    assert named(objects, "DaemonSet", PROBE)
    assert not [o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]


def test_enabled_probe_without_an_image_fails_naming_the_value(helm: str) -> None:
    proc = template(helm, "topologyProbe.enabled=true")
    assert proc.returncode != 0
    assert "topologyProbe.image.repository" in proc.stderr


@pytest.mark.parametrize(
    ("set_arg", "pointer", "reason"),
    [
        pytest.param(
            "topologyProbe.enabled=yes", "/topologyProbe/enabled", "want boolean", id="enabled-string"
        ),
        pytest.param(
            "topologyProbe.image.pullPolicy=Sometimes", "/topologyProbe/image/pullPolicy", "one of", id="pull"
        ),
        pytest.param(
            "topologyProbe.pauseImage.repository=",
            "/topologyProbe/pauseImage/repository",
            "minLength",
            id="pause",
        ),
        pytest.param(
            "topologyProbe.nodeSelector.gpu=1",
            "/topologyProbe/nodeSelector/gpu",
            "want string",
            id="selector",
        ),
        pytest.param(
            "topologyProbe.tolerations=x", "/topologyProbe/tolerations", "want array", id="tolerations"
        ),
        pytest.param(
            "topologyProbe.runtimeClassName=Nvidia_RT",
            "/topologyProbe/runtimeClassName",
            "anyOf",
            id="runtime",
        ),
        pytest.param(
            "topologyProbe.resources.requests.cpu=lots",
            "/topologyProbe/resources/requests/cpu",
            "pattern",
            id="quantity",
        ),
        pytest.param(
            "topologyProbe.intervalSeconds=60", "/topologyProbe", "additional properties", id="unknown-key"
        ),
    ],
)
def test_bad_probe_values_are_rejected_naming_the_field(
    helm: str, set_arg: str, pointer: str, reason: str
) -> None:
    proc = template(helm, *ENABLED, set_arg)
    assert proc.returncode != 0, f"{set_arg} was accepted"
    assert f"at '{pointer}'" in proc.stderr, proc.stderr
    assert reason in proc.stderr, proc.stderr


def test_enabled_probe_passes_strict_lint(helm: str, tmp_path: Path) -> None:
    path = tmp_path / "values.yaml"
    path.write_text(
        yaml.safe_dump({"topologyProbe": {"enabled": True, "image": {"repository": "registry.example/verl"}}})
    )
    proc = subprocess.run(
        [helm, "lint", "--strict", str(CHART), "--values", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
