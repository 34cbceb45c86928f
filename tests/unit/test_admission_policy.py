"""The administrator's admission policy for pass-through fields (pure), and its chart rendering."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from verl_operator.api.spec import VerlJobSpec
from verl_operator.policy import AdminPolicy, PolicyError, access_review, load_policy, policy_problems


def spec(**sections: Any) -> VerlJobSpec:
    doc: dict[str, Any] = {
        "verl": {"image": "example.com/verl:0.9.1"},
        "model": {"path": "Qwen/Qwen2.5-7B-Instruct"},
        "resources": {"gpus": 8},
    }
    for key, value in sections.items():
        doc[key] = {**doc[key], **value} if isinstance(doc.get(key), dict) else value
    return VerlJobSpec.model_validate(doc)


HOST_ROOT = {"name": "root", "hostPath": {"path": "/"}}
PVC = {"name": "data", "persistentVolumeClaim": {"claimName": "data"}}


@pytest.mark.parametrize(
    ("job", "policy", "fragments"),
    [
        # The dangerous cases of a user who may create VerlJobs: denied by default.
        pytest.param(
            spec(volumes=[HOST_ROOT]),
            AdminPolicy(),
            ["spec.volumes[0]: volume type hostPath is not allowed (policy allowedVolumeTypes"],
            id="hostpath-root",
        ),
        pytest.param(
            spec(scheduling={"priorityClassName": "system-node-critical"}),
            AdminPolicy(),
            ["spec.scheduling.priorityClassName: priority class 'system-node-critical' is not allowed"],
            id="system-node-critical",
        ),
        pytest.param(
            spec(resources={"gpus": 8, "tolerations": [{"operator": "Exists"}]}),
            AdminPolicy(),
            ["spec.resources.tolerations[0]: a toleration without a key tolerates every taint"],
            id="tolerate-everything",
        ),
        pytest.param(
            spec(
                resources={
                    "gpus": 8,
                    "tolerations": [{"key": "node.kubernetes.io/unreachable", "operator": "Exists"}],
                }
            ),
            AdminPolicy(),
            ["tolerating taint key 'node.kubernetes.io/unreachable' is not allowed"],
            id="node-lifecycle-taint",
        ),
        pytest.param(
            spec(
                security={
                    "containerSecurityContext": {"privileged": True, "capabilities": {"add": ["SYS_ADMIN"]}}
                }
            ),
            AdminPolicy(),
            [
                "spec.security.containerSecurityContext.privileged: true is not allowed",
                "capabilities.add[0]: SYS_ADMIN is not allowed",
            ],
            id="privileged-sys-admin",
        ),
        # Security settings denied whatever the namespace's Pod Security labels (verl needs none of them).
        pytest.param(
            spec(security={"containerSecurityContext": {"capabilities": {"drop": []}}}),
            AdminPolicy(),
            ["containerSecurityContext.capabilities.drop: must include ALL"],
            id="drop-nothing",
        ),
        pytest.param(
            spec(security={"podSecurityContext": {"seccompProfile": {"type": "Unconfined"}}}),
            AdminPolicy(),
            ["spec.security.podSecurityContext.seccompProfile.type: Unconfined is not allowed"],
            id="pod-seccomp-unconfined",
        ),
        pytest.param(
            spec(security={"containerSecurityContext": {"seccompProfile": {"type": "Unconfined"}}}),
            AdminPolicy(),
            ["spec.security.containerSecurityContext.seccompProfile.type: Unconfined is not allowed"],
            id="container-seccomp-unconfined",
        ),
        pytest.param(
            spec(security={"podSecurityContext": {"appArmorProfile": {"type": "Unconfined"}}}),
            AdminPolicy(),
            [
                "podSecurityContext.appArmorProfile.type: Unconfined is not allowed (policy allowUnconfinedAppArmor)"
            ],
            id="apparmor-unconfined",
        ),
        pytest.param(
            spec(security={"containerSecurityContext": {"seLinuxOptions": {"type": "spc_t"}}}),
            AdminPolicy(),
            [
                "containerSecurityContext.seLinuxOptions.type: spc_t is not allowed (policy allowedSeLinuxTypes"
            ],
            id="selinux-spc-t",
        ),
        pytest.param(
            spec(security={"podSecurityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]}}),
            AdminPolicy(),
            ["spec.security.podSecurityContext.sysctls[0].name: kernel.msgmax is not a safe sysctl"],
            id="unsafe-sysctl",
        ),
        pytest.param(
            spec(security={"containerSecurityContext": {"procMount": "Unmasked"}}),
            AdminPolicy(),
            ["containerSecurityContext.procMount: Unmasked is not allowed"],
            id="unmasked-proc",
        ),
        pytest.param(
            spec(
                security={
                    "podSecurityContext": {
                        "seccompProfile": {"type": "Localhost", "localhostProfile": "verl.json"},
                        "sysctls": [{"name": "net.ipv4.ip_local_port_range", "value": "1024 65000"}],
                        "seLinuxOptions": {"type": "container_t", "level": "s0:c1,c2"},
                    },
                    "containerSecurityContext": {
                        "capabilities": {"add": ["IPC_LOCK"], "drop": ["ALL"]},
                        "appArmorProfile": {"type": "RuntimeDefault"},
                    },
                }
            ),
            AdminPolicy(),
            [],
            id="confined-settings-allowed",
        ),
        pytest.param(
            spec(
                security={
                    "podSecurityContext": {
                        "seccompProfile": {"type": "Unconfined"},
                        "sysctls": [{"name": "kernel.msgmax", "value": "65536"}],
                    },
                    "containerSecurityContext": {
                        "capabilities": {"drop": []},
                        "appArmorProfile": {"type": "Unconfined"},
                        "seLinuxOptions": {"type": "spc_t"},
                    },
                }
            ),
            AdminPolicy(
                allow_kept_capabilities=True,
                allow_unconfined_seccomp=True,
                allow_unconfined_app_armor=True,
                allowed_se_linux_types=("spc_t",),
                allowed_sysctls=("*",),
            ),
            [],
            id="each-switch-allows-its-case",
        ),
        # What stays allowed by default.
        pytest.param(
            spec(
                volumes=[PVC],
                volumeMounts=[{"name": "data", "mountPath": "/data"}],
                scheduling={"priorityClassName": "research-high"},
                resources={"gpus": 8, "tolerations": [{"key": "team", "operator": "Equal", "value": "rl"}]},
                security={"containerSecurityContext": {"capabilities": {"add": ["IPC_LOCK"]}}},
            ),
            AdminPolicy(),
            [],
            id="ordinary-job",
        ),
        # An administrator's opt-ins.
        pytest.param(
            spec(volumes=[HOST_ROOT], scheduling={"priorityClassName": "system-node-critical"}),
            AdminPolicy(
                allowed_volume_types=("hostPath",), allowed_priority_classes=("system-node-critical",)
            ),
            [],
            id="opted-in",
        ),
        pytest.param(
            spec(volumes=[PVC], scheduling={"priorityClassName": "research-high"}),
            AdminPolicy(allowed_volume_types=("configMap",), allowed_priority_classes=("batch-low",)),
            [
                "volume type persistentVolumeClaim is not allowed",
                "priority class 'research-high' is not allowed",
            ],
            id="narrowed",
        ),
    ],
)
def test_policy_problems(job: VerlJobSpec, policy: AdminPolicy, fragments: list[str]) -> None:
    problems = policy_problems(job, policy)
    assert len(problems) == len(fragments), problems
    for fragment in fragments:
        assert any(fragment in p for p in problems), problems


def test_load_policy_reads_the_chart_keys(tmp_path: Path) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text("allowedVolumeTypes: [hostPath]\nrequirePodCreatePermission: false\n")
    policy = load_policy(path)
    assert policy.allowed_volume_types == ("hostPath",) and policy.require_pod_create_permission is False
    assert load_policy(None) == AdminPolicy()


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        pytest.param(
            "allowHostPath: true\n", "allowHostPath: Extra inputs are not permitted", id="unknown-key"
        ),
        pytest.param("- a\n", "is not a mapping", id="not-a-mapping"),
        pytest.param("a: [\n", "cannot read the policy", id="bad-yaml"),
    ],
)
def test_a_bad_policy_file_is_an_error(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "policy.yaml"
    path.write_text(text)
    with pytest.raises(PolicyError, match=fragment):
        load_policy(path)


def test_access_review_asks_for_pod_creation_as_the_requesting_user() -> None:
    review = access_review(
        {"username": "alice", "uid": "42", "groups": ["researchers"], "extra": {"scopes": ["a"]}}, "team-a"
    )
    assert review["spec"] == {
        "user": "alice",
        "uid": "42",
        "groups": ["researchers"],
        "extra": {"scopes": ["a"]},
        "resourceAttributes": {"namespace": "team-a", "verb": "create", "resource": "pods"},
    }
