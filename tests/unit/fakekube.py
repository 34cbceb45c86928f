"""An in-memory :class:`~verl_operator.controller.kube.KubeAPI` for the reconciler's table tests.

It keeps objects as the API server would return them (camelCase dicts), applies status merge patches by
RFC 7386, answers a create of an existing object with False, and records every write and event, so a test
reads what one pass did. It is a test double of the API server's storage, not of the reconciler's logic: the
cluster snapshot a pass plans on comes from the operator's own watch cache
(:class:`~verl_operator.controller.cache.WatchCache`) fed with these objects, so the GPUs in use, the
reservations of placed jobs and the queue are derived by the operator's code, not a copy of it here.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from verl_operator.controller.cache import WatchCache
from verl_operator.controller.kube import MissingAPIError
from verl_operator.controller.refused import classify, name_taken
from verl_operator.controller.snapshot import Snapshot
from verl_operator.manifests.names import LABEL_JOB


def apply_merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge member by member, ``null`` removes, anything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    out = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = apply_merge_patch(out.get(key), value)
    return out


def versioned(obj: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``obj`` with a ``resourceVersion`` that changes whenever its content does (the API server
    gives every change a new one; tests change the stored objects in place)."""
    out = copy.deepcopy(dict(obj))
    meta = out.setdefault("metadata", {})
    meta.pop("resourceVersion", None)
    digest = hashlib.sha256(json.dumps(out, sort_keys=True, default=str).encode()).hexdigest()[:16]
    meta["resourceVersion"] = str(int(digest, 16))
    return out


@dataclass
class FakeKube:
    """Jobs, pods, ConfigMaps and other children by ``(kind, namespace, name)``; writes and events logged."""

    objects: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    events: list[tuple[str, str, str]] = field(default_factory=list)
    writes: list[tuple[str, str]] = field(default_factory=list)
    #: Every request as the API server would see it, 409s and reads included: ``("create", "Kind/name")``,
    #: ``("read_configmap", name)``.
    requests: list[tuple[str, str]] = field(default_factory=list)
    served_kinds: frozenset[str] = frozenset({"Pod", "ConfigMap", "Service", "ServiceAccount"})
    #: PriorityClass name -> value (the queue's order).
    priority_classes: dict[str, int] = field(default_factory=dict)
    #: When set, every pod create is refused (403) with this message, as Pod Security admission does (or the
    #: ServiceAccount, Priority and ResourceQuota admission plugins, by the message).
    refuse_pods: str | None = None

    # ---- reads -------------------------------------------------------------------------------------
    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        job = self.objects.get(("VerlJob", namespace, name))
        return versioned(job) if job is not None else None

    def job_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        return [
            versioned(o)
            for (kind, ns, _), o in sorted(self.objects.items())
            if kind == "Pod" and ns == namespace and o["metadata"].get("labels", {}).get(LABEL_JOB) == job
        ]

    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.requests.append(("read_job", name))
        return self.get_job(namespace, name)

    def list_job_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        self.requests.append(("list_pods", job))
        return self.job_pods(namespace, job)

    def read_configmap_data(self, namespace: str, name: str) -> dict[str, str] | None:
        self.requests.append(("read_configmap", name))
        cm = self.objects.get(("ConfigMap", namespace, name))
        return dict(cm.get("data") or {}) if cm is not None else None

    def read_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        self.requests.append(("read_workload", name))
        workload = self.objects.get(("Workload", namespace, name))
        return copy.deepcopy(workload) if workload is not None else None

    # ---- writes ------------------------------------------------------------------------------------
    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> str | None:
        job = self.objects[("VerlJob", namespace, name)]
        job["status"] = apply_merge_patch(job.get("status") or {}, dict(status))
        self.writes.append(("patch_status", name))
        return str(versioned(job)["metadata"]["resourceVersion"])

    def create(self, manifest: Mapping[str, Any]) -> bool:
        kind = str(manifest["kind"])
        if kind not in self.served_kinds:
            raise MissingAPIError(f"{manifest['apiVersion']} {kind} is not served: is Volcano installed?")
        key = (kind, str(manifest["metadata"]["namespace"]), str(manifest["metadata"]["name"]))
        self.requests.append(("create", f"{kind}/{key[2]}"))
        if key in self.objects:
            taken = name_taken(self.objects[key], manifest)  # another object's name is never adopted
            if taken is not None:
                raise taken
            return False
        if kind == "Pod" and self.refuse_pods is not None:
            verdict = classify(403, self.refuse_pods, manifest)  # as the API server's 403 is read
            assert verdict is not None
            raise verdict
        body = copy.deepcopy(dict(manifest))
        if kind == "Pod":
            body["metadata"]["uid"] = f"uid-{key[2]}"
            body["status"] = {"phase": "Pending"}
        self.objects[key] = body
        self.writes.append(("create", f"{kind}/{key[2]}"))
        return True

    def patch_configmap_data(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        self.objects[("ConfigMap", namespace, name)]["data"] = dict(data)
        self.writes.append(("patch_configmap", name))

    def ungate(self, namespace: str, name: str) -> None:
        self.objects[("Pod", namespace, name)]["spec"].pop("schedulingGates", None)
        self.writes.append(("ungate", name))

    def delete_pod(self, namespace: str, name: str) -> None:
        if self.objects.pop(("Pod", namespace, name), None) is not None:
            self.writes.append(("delete_pod", name))

    def delete_job(self, namespace: str, name: str) -> None:
        if self.objects.pop(("VerlJob", namespace, name), None) is not None:
            self.writes.append(("delete_job", name))

    def event(self, job: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    # ---- helpers for tests -------------------------------------------------------------------------
    def add(self, obj: dict[str, Any]) -> None:
        """Store an object as it is (a VerlJob, a foreign pod); a pod without a uid gets one, as the API server
        gives every object."""
        meta = obj["metadata"]
        if obj["kind"] == "Pod":
            meta.setdefault("uid", f"uid-{meta['name']}")
        self.objects[(str(obj["kind"]), str(meta.get("namespace", "default")), str(meta["name"]))] = obj

    def pods(self) -> dict[str, dict[str, Any]]:
        """Every pod by name."""
        return {name: o for (kind, _, name), o in self.objects.items() if kind == "Pod"}

    def kinds(self) -> list[str]:
        """``Kind/name`` of every object but VerlJobs, sorted."""
        return sorted(f"{kind}/{name}" for kind, _, name in self.objects if kind != "VerlJob")

    def snapshot(self, nodes: list[dict[str, Any]]) -> Snapshot:
        """The cluster snapshot the runtime would build: the operator's watch cache fed with the nodes and
        every stored pod, VerlJob and PriorityClass, as its watches would show them (GPUs in use, the
        reservations of placed jobs, live jobs, the queue)."""
        cache = WatchCache()
        for node in nodes:
            cache.put_node(node)
        for (kind, _, _), obj in self.objects.items():
            if kind == "Pod":
                cache.put_pod(obj)
            elif kind == "VerlJob":
                cache.put_job(obj)
        for name, value in self.priority_classes.items():
            cache.put_priority_class({"metadata": {"name": name}, "value": value})
        return cache.snapshot()
