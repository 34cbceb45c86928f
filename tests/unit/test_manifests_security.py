"""Pod security by default: the Ray pods' ServiceAccount, token and security contexts (pure builders).

The defaults hold every Pod Security ``restricted`` control that does not depend on the image; the cluster
tier checks the pods against the API server's own Pod Security admission (``restricted`` and ``baseline``).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from verl_operator.api.spec import VerlJobSpec
from verl_operator.manifests import LaunchPlan, build_children
from verl_operator.manifests.children import deep_merge

JOB = {"metadata": {"name": "demo", "namespace": "team-a", "uid": "1111-2222"}}
PLAN = LaunchPlan(
    verl_version="0.9",
    nnodes=2,
    gpus_per_node=8,
    overrides=("trainer.nnodes=2", "trainer.n_gpus_per_node=8"),
    nvlink_group_size=2,
    require_nvlink=False,
    gpu_product="NVIDIA-H100-80GB-HBM3",
    gpu_memory_mib=81559,
    nodes=("dgx-0", "dgx-1"),
)


def spec(**security: Any) -> VerlJobSpec:
    return VerlJobSpec.model_validate(
        {
            "verl": {"image": "registry.example/verl:0.9.1", **security.pop("verl", {})},
            "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
            "resources": {"gpus": 16, "gpusPerNode": 8},
            "security": security,
        }
    )


def children(s: VerlJobSpec, plan: LaunchPlan = PLAN) -> list[dict[str, Any]]:
    return build_children(JOB, s, plan, attempt=0)


def pods(s: VerlJobSpec, plan: LaunchPlan = PLAN) -> list[dict[str, Any]]:
    return [c for c in children(s, plan) if c["kind"] == "Pod"]


def all_containers(pod: dict[str, Any]) -> list[dict[str, Any]]:
    return [*pod["spec"].get("initContainers", []), *pod["spec"]["containers"]]


def test_defaults_drop_everything_that_does_not_depend_on_the_image() -> None:
    for pod in pods(spec()):
        assert pod["spec"]["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
        assert pod["spec"]["automountServiceAccountToken"] is False
        assert pod["spec"]["serviceAccountName"] == "demo-ray"
        for c in all_containers(pod):
            assert c["securityContext"] == {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
            }


def test_a_dedicated_service_account_comes_first_and_mounts_no_token() -> None:
    first = children(spec())[0]
    assert first["kind"] == "ServiceAccount" and first["metadata"]["name"] == "demo-ray"
    assert first["automountServiceAccountToken"] is False
    assert first["metadata"]["ownerReferences"][0]["uid"] == "1111-2222"


def test_a_named_service_account_is_used_and_not_created() -> None:
    s = spec(serviceAccountName="trainer", automountServiceAccountToken=True)
    assert [c for c in children(s) if c["kind"] == "ServiceAccount"] == []
    for pod in pods(s):
        assert pod["spec"]["serviceAccountName"] == "trainer"
        assert pod["spec"]["automountServiceAccountToken"] is True


@pytest.mark.parametrize(
    ("security", "pod_context", "container_context"),
    [
        pytest.param(
            {"podSecurityContext": {"runAsNonRoot": True, "runAsUser": 1000, "fsGroup": 1000}},
            {
                "seccompProfile": {"type": "RuntimeDefault"},
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "fsGroup": 1000,
            },
            {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
            id="non-root-user",
        ),
        pytest.param(
            {
                "containerSecurityContext": {
                    "readOnlyRootFilesystem": True,
                    "capabilities": {"add": ["IPC_LOCK"]},
                }
            },
            {"seccompProfile": {"type": "RuntimeDefault"}},
            {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"], "add": ["IPC_LOCK"]},
                "readOnlyRootFilesystem": True,
            },
            id="added-capability-keeps-drop-all",
        ),
        pytest.param(
            {"containerSecurityContext": {"capabilities": {"drop": ["ALL", "NET_RAW"]}}},
            {"seccompProfile": {"type": "RuntimeDefault"}},
            {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL", "NET_RAW"]}},
            id="a-list-replaces-the-default-list",
        ),
        pytest.param(
            {
                "podSecurityContext": {
                    "seccompProfile": {"type": "Localhost", "localhostProfile": "verl.json"}
                },
                "containerSecurityContext": {"windowsOptions": {"runAsUserName": "x"}},
            },
            {"seccompProfile": {"type": "Localhost", "localhostProfile": "verl.json"}},
            {
                "allowPrivilegeEscalation": False,
                "capabilities": {"drop": ["ALL"]},
                "windowsOptions": {"runAsUserName": "x"},
            },
            id="nested-and-unknown-keys-merged",
        ),
    ],
)
def test_user_security_contexts_merge_over_the_defaults(
    security: dict[str, Any], pod_context: dict[str, Any], container_context: dict[str, Any]
) -> None:
    for pod in pods(spec(**security)):
        assert pod["spec"]["securityContext"] == pod_context
        assert pod["spec"]["containers"][0]["securityContext"] == container_context


def test_the_launcher_init_container_has_the_same_context() -> None:
    plan = replace(PLAN, launcher_image="registry.example/verl-operator:1")
    s = spec(verl={"launcher": "inject"}, podSecurityContext={"runAsNonRoot": True, "runAsUser": 1000})
    [head, _] = pods(s, plan)
    init, main = head["spec"]["initContainers"][0], head["spec"]["containers"][0]
    assert init["securityContext"] == main["securityContext"]
    assert init["securityContext"] is not main["securityContext"]  # no YAML anchors, no shared mutation


@pytest.mark.parametrize(
    ("defaults", "user", "merged"),
    [
        pytest.param({"a": {"b": [1]}}, {"a": {"c": 2}}, {"a": {"b": [1], "c": 2}}, id="mappings-merge"),
        pytest.param({"a": {"b": [1]}}, {"a": {"b": []}}, {"a": {"b": []}}, id="lists-replace"),
        pytest.param({"a": {"b": 1}}, {"a": 5}, {"a": 5}, id="scalar-over-mapping"),
        pytest.param({"a": 1}, {}, {"a": 1}, id="nothing-given"),
    ],
)
def test_deep_merge(defaults: dict[str, Any], user: dict[str, Any], merged: dict[str, Any]) -> None:
    before = repr(defaults)
    assert deep_merge(defaults, user) == merged
    assert repr(defaults) == before  # the defaults are never changed
