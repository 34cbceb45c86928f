"""The cluster administrator's policy for the pass-through fields of a VerlJob (pure).

A VerlJob lets its author shape pods that the operator's ServiceAccount creates: volumes, tolerations, a
priority class, security contexts. Without a policy, anyone allowed to create VerlJobs could mount the node's
root file system, tolerate every taint or preempt system pods. The policy (chart values, rendered into a
ConfigMap the webhook reads; ``verl-operator run --policy-file``) says what is allowed; what it does not
allow is denied, with the field and the setting an administrator would change.

Defaults (``AdminPolicy()``) deny the dangerous cases: ``hostPath`` volumes, the ``system-node-critical`` and
``system-cluster-critical`` priority classes, a toleration without a key (it tolerates every taint) and the
keys of the node lifecycle and control-plane taints, privileged containers (and host-process or unmasked
/proc containers), added capabilities other than ``IPC_LOCK`` and ``NET_BIND_SERVICE``, a ``capabilities.drop``
without ``ALL``, seccomp and AppArmor ``Unconfined``, SELinux types outside the container types Pod Security
``baseline`` allows (``spc_t`` runs unconfined) and sysctls outside Kubernetes' safe set, whatever the
namespace's Pod Security labels say (verl jobs need none of them); and they require that the requesting user may create pods in the
namespace (a SubjectAccessReview, done by the webhook), so a VerlJob never grants more than its author has.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic.alias_generators import to_camel

from verl_operator.api.spec import VerlJobSpec

#: Priority classes that can preempt the cluster's own pods: allowed only when listed by name.
SYSTEM_PRIORITY_CLASSES = frozenset({"system-node-critical", "system-cluster-critical"})
#: Taint key prefixes of node lifecycle and control-plane taints: tolerated only when listed by key.
RESERVED_TAINT_PREFIXES = ("node.kubernetes.io/", "node-role.kubernetes.io/")
#: The volume source keys a core/v1 Volume may carry besides its name.
DEFAULT_VOLUME_TYPES = (
    "configMap",
    "secret",
    "emptyDir",
    "persistentVolumeClaim",
    "projected",
    "downwardAPI",
    "csi",
    "ephemeral",
    "nfs",
)

#: SELinux types Pod Security ``baseline`` allows (the container runtime's confined types).
DEFAULT_SELINUX_TYPES = ("container_t", "container_init_t", "container_kvm_t", "container_engine_t")
#: Kubernetes' safe sysctls (namespaced, isolated per pod; Pod Security ``baseline``'s list as of 1.32).
SAFE_SYSCTLS = (
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
)


class PolicyError(ValueError):
    """The policy file cannot be read or does not validate."""


class AdminPolicy(BaseModel):
    """What VerlJob authors may set in the pass-through fields (chart ``policy`` values)."""

    model_config = ConfigDict(frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True)

    allowed_volume_types: tuple[str, ...] = Field(
        default=DEFAULT_VOLUME_TYPES,
        description="Volume source types allowed in spec.volumes (hostPath is not, unless listed).",
    )
    allowed_priority_classes: tuple[str, ...] = Field(
        default=("*",),
        description='priorityClassName values allowed; "*" allows any but the system- classes, which must be '
        "listed by name.",
    )
    allowed_toleration_keys: tuple[str, ...] = Field(
        default=("*",),
        description='Taint keys a toleration may name; "*" allows any but the node.kubernetes.io/ and '
        "node-role.kubernetes.io/ keys, which must be listed by name.",
    )
    allow_wildcard_toleration: bool = Field(
        default=False, description="Allow a toleration without a key (operator Exists: every taint)."
    )
    allow_privileged: bool = Field(
        default=False, description="Allow privileged containers and allowPrivilegeEscalation: true."
    )
    allowed_capabilities: tuple[str, ...] = Field(
        default=("IPC_LOCK", "NET_BIND_SERVICE"),
        description="Linux capabilities spec.security.containerSecurityContext may add.",
    )
    allow_kept_capabilities: bool = Field(
        default=False,
        description="Allow a capabilities.drop without ALL (the container keeps the runtime's default set).",
    )
    allow_unconfined_seccomp: bool = Field(
        default=False, description="Allow seccompProfile type Unconfined (pod or container)."
    )
    allow_unconfined_app_armor: bool = Field(
        default=False, description="Allow appArmorProfile type Unconfined (pod or container)."
    )
    allowed_se_linux_types: tuple[str, ...] = Field(
        default=DEFAULT_SELINUX_TYPES,
        description='seLinuxOptions.type values allowed ("*": any, spc_t included).',
    )
    allowed_sysctls: tuple[str, ...] = Field(
        default=SAFE_SYSCTLS,
        description='podSecurityContext.sysctls names allowed (default: the safe set; "*": any).',
    )
    require_pod_create_permission: bool = Field(
        default=True,
        description="Deny a VerlJob whose author may not create pods in its namespace (SubjectAccessReview).",
    )
    reuse_verdict_seconds: float = Field(
        default=30.0,
        ge=0,
        le=3600,
        description="Seconds the webhook reuses an API check that passed (the author's pod-create permission, "
        "the dry run of the job's children, the job-wide GPU quota check) for a review that would send the "
        "same request but for the job's name; 0: every review asks the API server.",
    )


def load_policy(path: str | Path | None) -> AdminPolicy:
    """The policy in the YAML file ``path`` (the defaults when None).

    Raises:
        PolicyError: unreadable file, bad YAML, or unknown or mistyped settings.
    """
    if path is None:
        return AdminPolicy()
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise PolicyError(f"cannot read the policy {path}: {exc}") from exc
    if not isinstance(doc, dict):
        raise PolicyError(f"the policy {path} is not a mapping")
    try:
        return AdminPolicy.model_validate(doc)
    except ValidationError as exc:
        lines = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        raise PolicyError(f"the policy {path} is invalid: {lines}") from exc


def _volume_type(volume: Mapping[str, Any]) -> str:
    kinds = [k for k in volume if k != "name"]
    return kinds[0] if len(kinds) == 1 else "+".join(sorted(kinds)) or "(none)"


def _toleration_problem(tol: Mapping[str, Any], policy: AdminPolicy) -> str | None:
    key = str(tol.get("key") or "")
    if not key:
        if policy.allow_wildcard_toleration:
            return None
        return "a toleration without a key tolerates every taint (policy allowWildcardToleration is false)"
    if key in policy.allowed_toleration_keys:
        return None
    if "*" in policy.allowed_toleration_keys and not key.startswith(RESERVED_TAINT_PREFIXES):
        return None
    return f"tolerating taint key {key!r} is not allowed (policy allowedTolerationKeys)"


def policy_problems(spec: VerlJobSpec, policy: AdminPolicy) -> list[str]:
    """Why ``spec`` breaks ``policy``: one ``field: message`` line per problem (empty: allowed).

    The SubjectAccessReview (``require_pod_create_permission``) needs the requesting user and the API
    server; the webhook does it (``subject_access_review``).
    """
    out: list[str] = []
    for i, volume in enumerate(spec.volumes):
        kind = _volume_type(volume)
        if kind not in policy.allowed_volume_types:
            out.append(
                f"spec.volumes[{i}]: volume type {kind} is not allowed (policy allowedVolumeTypes: "
                f"{', '.join(policy.allowed_volume_types) or 'none'})"
            )
    priority = spec.scheduling.priority_class_name
    if priority:
        listed = priority in policy.allowed_priority_classes
        any_allowed = "*" in policy.allowed_priority_classes and priority not in SYSTEM_PRIORITY_CLASSES
        if not (listed or any_allowed):
            out.append(
                f"spec.scheduling.priorityClassName: priority class {priority!r} is not allowed "
                "(policy allowedPriorityClasses)"
            )
    for i, tol in enumerate(spec.resources.tolerations):
        problem = _toleration_problem(tol, policy)
        if problem:
            out.append(f"spec.resources.tolerations[{i}]: {problem}")
    out.extend(security_problems(spec, policy))
    return out


_CONTAINER = "spec.security.containerSecurityContext"
_POD = "spec.security.podSecurityContext"


def security_problems(spec: VerlJobSpec, policy: AdminPolicy) -> list[str]:
    """Why the security contexts of ``spec`` break ``policy`` (the part of :func:`policy_problems` that does
    not depend on the namespace's Pod Security labels)."""
    out: list[str] = []
    container = spec.security.container_security_context
    pod = spec.security.pod_security_context
    if not policy.allow_privileged:
        for key, value in (
            ("privileged", container.privileged),
            ("allowPrivilegeEscalation", container.allow_privilege_escalation),
        ):
            if value is True:
                out.append(f"{_CONTAINER}.{key}: true is not allowed (policy allowPrivileged)")
        windows = container.to_wire().get("windowsOptions")
        if isinstance(windows, Mapping) and windows.get("hostProcess") is True:
            out.append(
                f"{_CONTAINER}.windowsOptions.hostProcess: true is not allowed (policy allowPrivileged)"
            )
        if container.proc_mount not in (None, "Default"):
            out.append(
                f"{_CONTAINER}.procMount: {container.proc_mount} is not allowed (policy allowPrivileged)"
            )
    capabilities = container.capabilities
    for i, cap in enumerate(capabilities.add or [] if capabilities else []):
        if cap not in policy.allowed_capabilities:
            out.append(
                f"{_CONTAINER}.capabilities.add[{i}]: {cap} is not allowed (policy allowedCapabilities: "
                f"{', '.join(policy.allowed_capabilities) or 'none'})"
            )
    drop = capabilities.drop if capabilities else None
    if drop is not None and "ALL" not in drop and not policy.allow_kept_capabilities:
        out.append(
            f"{_CONTAINER}.capabilities.drop: must include ALL (the default), or the container keeps the "
            "runtime's default capabilities (policy allowKeptCapabilities); add the ones the job needs to "
            "capabilities.add"
        )
    for where, context in ((_POD, pod), (_CONTAINER, container)):
        for key, profile, allowed, switch in (
            (
                "seccompProfile",
                context.seccomp_profile,
                policy.allow_unconfined_seccomp,
                "allowUnconfinedSeccomp",
            ),
            (
                "appArmorProfile",
                context.app_armor_profile,
                policy.allow_unconfined_app_armor,
                "allowUnconfinedAppArmor",
            ),
        ):
            if profile is not None and profile.type == "Unconfined" and not allowed:
                out.append(f"{where}.{key}.type: Unconfined is not allowed (policy {switch})")
        selinux = context.se_linux_options.type if context.se_linux_options else None
        if (
            selinux
            and selinux not in policy.allowed_se_linux_types
            and "*" not in policy.allowed_se_linux_types
        ):
            out.append(
                f"{where}.seLinuxOptions.type: {selinux} is not allowed (policy allowedSeLinuxTypes: "
                f"{', '.join(policy.allowed_se_linux_types) or 'none'})"
            )
    for i, sysctl in enumerate(pod.sysctls or []):
        if sysctl.name not in policy.allowed_sysctls and "*" not in policy.allowed_sysctls:
            out.append(
                f"{_POD}.sysctls[{i}].name: {sysctl.name} is not a safe sysctl (policy allowedSysctls)"
            )
    return out


def access_review(user: Mapping[str, Any], namespace: str) -> dict[str, Any]:
    """The SubjectAccessReview asking whether ``user`` (an admission request's userInfo) may create pods."""
    spec: dict[str, Any] = {
        "user": user.get("username", ""),
        "groups": list(user.get("groups") or []),
        "resourceAttributes": {"namespace": namespace, "verb": "create", "resource": "pods"},
    }
    if user.get("uid"):
        spec["uid"] = user["uid"]
    if user.get("extra"):
        spec["extra"] = {k: list(v) for k, v in dict(user["extra"]).items()}
    return {"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "spec": spec}
