"""Builders of the ConfigMap, headless Service, Ray pods and (Volcano) PodGroup of a VerlJob.

Every builder is pure and returns a whole manifest; the controller creates them as they are.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from verl_contract.launch_spec import (
    ATTEMPT_ENV,
    LAUNCH_DIR,
    LAUNCH_KEY,
    LAUNCH_PATH,
    LAUNCH_SPEC_ENV,
    RAY_DASHBOARD_PORT,
    RAY_GCS_PORT,
    ROLE_ENV,
)
from verl_operator.api.spec import API_VERSION, KIND, VerlJobSpec
from verl_operator.manifests.launchspec import (
    LAUNCHER_DIR,
    LAUNCHER_IN_OPERATOR_IMAGE,
    LAUNCHER_PYZ,
    RAY_CLIENT_PORT,
    LaunchPlan,
    build_launch_spec,
    job_identity,
)
from verl_operator.manifests.names import (
    ANNOTATION_NODE,
    GANG_GATE,
    LABEL_ATTEMPT,
    LABEL_ENGINE,
    LABEL_INDEX,
    LABEL_JOB,
    LABEL_POOL,
    LABEL_ROLE,
    MANAGED_BY,
    ChildNames,
)
from verl_operator.planner.cluster import TOLERATED_TAINT_KEYS
from verl_operator.planner.mesh import pod_memory

#: /dev/shm of every Ray pod (a memory-backed emptyDir): NCCL, Ray's object store and the rollout engines pass
#: tensors between a pod's processes through it. Above the 32g that verl's SGLang guide gives its containers
#: (``--shm-size 32g``, ``docs/sglang_multiturn/search_tool_example.rst`` line 23); spec.resources.shmSize sets it.
DEFAULT_SHM = "64Gi"
CONTAINER = "ray"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_GROUP_COUNT = "kueue.x-k8s.io/pod-group-total-count"
#: "false": Kueue finishes the pod group's Workload (freeing its quota and its finalizers on the pods) once
#: every pod ended, instead of waiting for replacement pods: the operator retries with a new group instead.
KUEUE_RETRIABLE = "kueue.x-k8s.io/retriable-in-group"
#: Kueue's Topology Aware Scheduling: every pod of the group in one domain of this node label (required) or
#: as few as Kueue can (preferred); the label must be a level of the ResourceFlavor's Topology.
KUEUE_TOPOLOGY = {
    "required": "kueue.x-k8s.io/podset-required-topology",
    "preferred": "kueue.x-k8s.io/podset-preferred-topology",
}
VOLCANO_GROUP_ANNOTATION = "scheduling.k8s.io/group-name"
#: Pod Security ``restricted`` controls that hold for any image (runAsNonRoot depends on the image's user:
#: ``spec.security.podSecurityContext``). https://kubernetes.io/docs/concepts/security/pod-security-standards/
POD_SECURITY_DEFAULTS: dict[str, Any] = {"seccompProfile": {"type": "RuntimeDefault"}}
CONTAINER_SECURITY_DEFAULTS: dict[str, Any] = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
}
LAUNCHER_VOLUME = "verl-launcher"
INSTALL_LAUNCHER = "install-launcher"


def kueue_group(job_name: str, attempt: int) -> str:
    """The Kueue pod group (and so Workload) name of a job's attempt: ``<job>-r<attempt>``."""
    return f"{job_name}-r{attempt}"


def injects_launcher(spec: VerlJobSpec, plan: LaunchPlan) -> bool:
    """Whether the Ray pods get the launcher from the operator's image (``spec.verl.launcher: inject``)."""
    return spec.verl.launcher == "inject" and bool(plan.launcher_image)


def _launcher_command(spec: VerlJobSpec, plan: LaunchPlan, role: str) -> list[str]:
    if injects_launcher(spec, plan):
        # The image's own Python runs the copied zipapp: it needs nothing of this project.
        return ["python3", LAUNCHER_PYZ, role]
    return ["verl-launcher", role]


def build_launcher_init_container(image: str) -> dict[str, Any]:
    """The init container that copies the self-contained launcher from the operator's image into the pod."""
    return {
        "name": INSTALL_LAUNCHER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["cp", LAUNCHER_IN_OPERATOR_IMAGE, LAUNCHER_PYZ],
        "volumeMounts": [{"name": LAUNCHER_VOLUME, "mountPath": LAUNCHER_DIR}],
        "resources": {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {"memory": "64Mi"}},
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }


def owner_reference(job: Mapping[str, Any]) -> dict[str, Any]:
    """The controller owner reference to the VerlJob (deletion cascades through the garbage collector)."""
    name, _, uid = job_identity(job)
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(job: Mapping[str, Any], name: str, labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    job_name, namespace, _ = job_identity(job)
    return {
        "name": name,
        "namespace": namespace,
        "labels": {**MANAGED_BY, LABEL_JOB: job_name, **(labels or {})},
        "ownerReferences": [owner_reference(job)],
    }


def build_launch_configmap(job: Mapping[str, Any], spec: VerlJobSpec, plan: LaunchPlan) -> dict[str, Any]:
    """ConfigMap ``<job>-launch`` with ``launch.json`` (the contract), mounted read-only in every Ray pod."""
    name, namespace, _ = job_identity(job)
    document = build_launch_spec(job, spec, plan)
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(job, ChildNames(name, namespace).configmap),
        "data": {LAUNCH_KEY: document.to_json()},
    }


def deep_merge(defaults: Mapping[str, Any], user: Mapping[str, Any]) -> dict[str, Any]:
    """``user`` merged over ``defaults``: mappings merged key by key at every depth, anything else (lists,
    scalars) replaced, so ``capabilities: {add: [IPC_LOCK]}`` keeps the default ``drop: [ALL]``. The admission
    policy judges what the user wrote (``drop`` without ALL is denied unless it allows that)."""
    out = copy.deepcopy(dict(defaults))
    for key, value in user.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def container_security_context(spec: VerlJobSpec) -> dict[str, Any]:
    """The Ray (and launcher init) container's securityContext: the user's merged deeply over the defaults."""
    return deep_merge(CONTAINER_SECURITY_DEFAULTS, spec.security.container_security_context.to_wire())


def pod_security_context(spec: VerlJobSpec) -> dict[str, Any]:
    """The Ray pods' securityContext: the user's merged deeply over the defaults."""
    return deep_merge(POD_SECURITY_DEFAULTS, spec.security.pod_security_context.to_wire())


def build_service_account(job: Mapping[str, Any]) -> dict[str, Any]:
    """ServiceAccount ``<job>-ray`` of the Ray pods: bound to no role, its token not mounted by default."""
    name, namespace, _ = job_identity(job)
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(job, ChildNames(name, namespace).service_account),
        "automountServiceAccountToken": False,
    }


def build_service(job: Mapping[str, Any]) -> dict[str, Any]:
    """Headless Service ``<job>-ray``: DNS names for the Ray pods, ready or not (Ray needs them early)."""
    name, namespace, _ = job_identity(job)
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, ChildNames(name, namespace).service),
        "spec": {
            "clusterIP": "None",
            "publishNotReadyAddresses": True,
            "selector": {LABEL_JOB: name},
            "ports": [
                {"name": "gcs", "port": RAY_GCS_PORT, "targetPort": RAY_GCS_PORT},
                {"name": "dashboard", "port": RAY_DASHBOARD_PORT, "targetPort": RAY_DASHBOARD_PORT},
                {"name": "client", "port": RAY_CLIENT_PORT, "targetPort": RAY_CLIENT_PORT},
            ],
        },
    }


def _resources(spec: VerlJobSpec, plan: LaunchPlan) -> dict[str, Any]:
    res = spec.resources
    gpus = plan.gpus_per_node
    requests: dict[str, Any] = {
        # The plan's: the CPUs its candidate nodes were chosen to offer (verl's placement group).
        "cpu": plan.cpu_request(spec),
        "memory": pod_memory(res.memory_per_node, gpus),
        "nvidia.com/gpu": str(gpus),
    }
    return {"requests": requests, "limits": {"nvidia.com/gpu": str(gpus)}}


def _env(role: str, attempt: int, spec: VerlJobSpec) -> list[dict[str, Any]]:
    ours: list[dict[str, Any]] = [
        {"name": LAUNCH_SPEC_ENV, "value": LAUNCH_PATH},
        {"name": ROLE_ENV, "value": role},
        {"name": ATTEMPT_ENV, "value": str(attempt)},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]
    reserved = {e["name"] for e in ours}
    return ours + [e.to_wire() for e in spec.env if e.name not in reserved]


def _build_pod(
    job: Mapping[str, Any], spec: VerlJobSpec, plan: LaunchPlan, index: int, attempt: int
) -> dict[str, Any]:
    name, namespace, _ = job_identity(job)
    names = ChildNames(name, namespace)
    role = "head" if index == 0 else "worker"
    labels = {
        LABEL_ROLE: role,
        LABEL_ATTEMPT: str(attempt),
        LABEL_INDEX: str(index),
        LABEL_ENGINE: plan.rollout_engine,
    }
    if index < len(plan.pools):
        labels[LABEL_POOL] = plan.pools[index]
    annotations: dict[str, str] = {}
    security = spec.security
    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": security.service_account_name or names.service_account,
        "automountServiceAccountToken": security.automount_service_account_token,
        "securityContext": pod_security_context(spec),
        "hostname": names.hostname(index),
        "subdomain": names.service,
        "enableServiceLinks": False,
        "containers": [
            {
                "name": CONTAINER,
                "image": spec.verl.image,
                "command": _launcher_command(spec, plan, role),
                "env": _env(role, attempt, spec),
                "ports": _ports(role),
                "resources": _resources(spec, plan),
                "volumeMounts": [
                    {"name": "launch-spec", "mountPath": LAUNCH_DIR, "readOnly": True},
                    {"name": "dshm", "mountPath": "/dev/shm"},
                    *[dict(m) for m in spec.volume_mounts],
                ],
                "securityContext": container_security_context(spec),
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }
        ],
        "volumes": [
            {"name": "launch-spec", "configMap": {"name": names.configmap}},
            {
                "name": "dshm",
                "emptyDir": {"medium": "Memory", "sizeLimit": spec.resources.shm_size or DEFAULT_SHM},
            },
            *[dict(v) for v in spec.volumes],
        ],
    }
    if spec.verl.image_pull_policy is not None:
        pod_spec["containers"][0]["imagePullPolicy"] = spec.verl.image_pull_policy
    if injects_launcher(spec, plan) and plan.launcher_image:
        _inject_launcher(pod_spec, spec, plan.launcher_image)
    # The planner counts nodes tainted with the GPU keys as eligible (GPU pools are commonly tainted
    # nvidia.com/gpu:NoSchedule), so every Ray pod tolerates them; the user's tolerations come after.
    pod_spec["tolerations"] = [
        *({"key": key, "operator": "Exists"} for key in sorted(TOLERATED_TAINT_KEYS)),
        *(dict(t) for t in spec.resources.tolerations),
    ]
    _schedule(pod_spec, labels, annotations, spec, plan, name, index, attempt)
    metadata = _metadata(job, names.pod(attempt, index), labels)
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def _inject_launcher(pod_spec: dict[str, Any], spec: VerlJobSpec, launcher_image: str) -> None:
    """An init container copies the operator image's launcher into a volume the Ray container mounts."""
    init = build_launcher_init_container(launcher_image)
    init["securityContext"] = container_security_context(spec)
    pod_spec["initContainers"] = [init]
    pod_spec["containers"][0]["volumeMounts"].append(
        {"name": LAUNCHER_VOLUME, "mountPath": LAUNCHER_DIR, "readOnly": True}
    )
    # The launcher is a zipapp of a few hundred KiB.
    pod_spec["volumes"].append({"name": LAUNCHER_VOLUME, "emptyDir": {"sizeLimit": "16Mi"}})


def _schedule(
    pod_spec: dict[str, Any],
    labels: dict[str, str],
    annotations: dict[str, str],
    spec: VerlJobSpec,
    plan: LaunchPlan,
    name: str,
    index: int,
    attempt: int,
) -> None:
    """Who places the pod (``spec.scheduling.gang``) and where: fills the pod's spec, labels, annotations."""
    sched = spec.scheduling
    node = plan.nodes[index] if index < len(plan.nodes) else None
    if sched.priority_class_name:
        pod_spec["priorityClassName"] = sched.priority_class_name
    if sched.gang == "kueue" and sched.queue_name is not None:
        # Kueue's pod-group integration gates, admits and places the pods itself.
        labels[KUEUE_QUEUE_LABEL] = sched.queue_name
        labels[KUEUE_GROUP_LABEL] = kueue_group(name, attempt)
        annotations[KUEUE_GROUP_COUNT] = str(plan.nnodes)
        annotations[KUEUE_RETRIABLE] = "false"
        where = spec.placement
        if where.topology_key and where.topology_policy is not None:
            # The placement's topology rule, as Kueue's TAS reads it (the operator does not choose nodes here).
            annotations[KUEUE_TOPOLOGY[where.topology_policy]] = where.topology_key
    elif sched.gang == "volcano":
        pod_spec["schedulerName"] = "volcano"
        annotations[VOLCANO_GROUP_ANNOTATION] = f"{name}-r{attempt}"
    else:
        # Built-in gang: held by a scheduling gate until every pod exists, pinned to its chosen node.
        pod_spec["schedulingGates"] = [{"name": GANG_GATE}]
    if node is not None:
        annotations[ANNOTATION_NODE] = node
        pod_spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [node]}]}
                    ]
                }
            }
        }
    else:
        selector = dict(spec.resources.node_selector)
        # The product the plan (and the launcher's check, expect.gpuProduct) is for, as the pool's nodes carry
        # it (GFD's label, or a cloud's when GFD is absent), so a scheduler of its own keeps to that pool. A
        # plan of an earlier release has no selector: its pool's product under GFD's label.
        if plan.product_selector:
            selector.update(dict(plan.product_selector))
        elif product := plan.gpu_product or spec.resources.gpu_product:
            selector["nvidia.com/gpu.product"] = product
        if selector:
            pod_spec["nodeSelector"] = selector


def _ports(role: str) -> list[dict[str, Any]]:
    if role != "head":
        return []
    return [
        {"name": "gcs", "containerPort": RAY_GCS_PORT},
        {"name": "dashboard", "containerPort": RAY_DASHBOARD_PORT},
        {"name": "client", "containerPort": RAY_CLIENT_PORT},
    ]


def build_head_pod(
    job: Mapping[str, Any], spec: VerlJobSpec, plan: LaunchPlan, attempt: int
) -> dict[str, Any]:
    """The Ray head pod: node 0 of the job, holding that node's planned GPUs.

    Args:
        job: The VerlJob body.
        spec: The parsed spec.
        plan: Plan and placement (``plan.nodes[0]`` pins the pod when set).
        attempt: Ray cluster incarnation (0-based), part of the pod name and ``VERL_OPERATOR_ATTEMPT``.

    Returns:
        The Pod manifest.
    """
    return _build_pod(job, spec, plan, 0, attempt)


def build_worker_pod(
    job: Mapping[str, Any], spec: VerlJobSpec, plan: LaunchPlan, index: int, attempt: int
) -> dict[str, Any]:
    """The Ray worker pod of node ``index`` (1 .. nnodes-1), holding that node's planned GPUs.

    Raises:
        ValueError: ``index`` is not a worker index of the plan.
    """
    if not 1 <= index < plan.nnodes:
        raise ValueError(f"worker index {index} outside 1..{plan.nnodes - 1}")
    return _build_pod(job, spec, plan, index, attempt)


def build_podgroup(job: Mapping[str, Any], plan: LaunchPlan, attempt: int) -> dict[str, Any]:
    """Volcano PodGroup ``<job>-r<attempt>`` with ``minMember`` = every Ray pod (all or nothing)."""
    name, _, _ = job_identity(job)
    gpus = plan.nnodes * plan.gpus_per_node
    return {
        "apiVersion": "scheduling.volcano.sh/v1beta1",
        "kind": "PodGroup",
        "metadata": _metadata(job, f"{name}-r{attempt}"),
        "spec": {"minMember": plan.nnodes, "minResources": {"nvidia.com/gpu": str(gpus)}},
    }


def build_children(
    job: Mapping[str, Any], spec: VerlJobSpec, plan: LaunchPlan, attempt: int
) -> list[dict[str, Any]]:
    """Every child in creation order: (ServiceAccount), ConfigMap, Service, (PodGroup), head pod, worker pods."""
    children = [build_launch_configmap(job, spec, plan), build_service(job)]
    if spec.security.service_account_name is None:
        children.insert(0, build_service_account(job))
    if spec.scheduling.gang == "volcano":
        children.append(build_podgroup(job, plan, attempt))
    children.append(build_head_pod(job, spec, plan, attempt))
    children.extend(build_worker_pod(job, spec, plan, i, attempt) for i in range(1, plan.nnodes))
    return children
