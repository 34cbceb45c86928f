"""A thin, synchronous shell over the Kubernetes API for the reconciler (run in a worker thread)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from verl_operator.api.spec import API_VERSION, GROUP, KIND, PLURAL, VERSION
from verl_operator.controller.kueue import WORKLOAD_GROUP, WORKLOAD_VERSIONS
from verl_operator.controller.quota import job_totals, quota_problems
from verl_operator.controller.rawapi import MERGE_PATCH, STRATEGIC_MERGE_PATCH, RawAPI, core_path, group_path
from verl_operator.controller.refused import name_taken, refusal
from verl_operator.manifests.children import KUEUE_QUEUE_LABEL
from verl_operator.manifests.names import LABEL_JOB

COMPONENT = "verl-operator"


def response_json(response: Any) -> dict[str, Any]:
    """The object of a call made with ``_preload_content=False`` (the raw HTTP response), as plain JSON.

    Cheaper than the client's models: it builds no ``V1Pod`` only to take it apart again. Reading the whole
    body also hands the connection back to the pool.
    """
    return cast(dict[str, Any], json.loads(response.data))


def now_iso() -> str:
    """The current UTC time as an RFC 3339 string (seconds)."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class MissingAPIError(RuntimeError):
    """A kind the job needs is not served by the API server (for example Volcano's PodGroup)."""


class KubeAPI(Protocol):
    """Every API call the reconciler makes, and nothing more (the unit tests back it with an in-memory fake).

    Reads: :meth:`get_job`, :meth:`job_pods` and :meth:`read_configmap_data` (any of them may be served
    from a watch cache, as long as it shows the reconciler's own writes of the same pass: a pass lists
    the pods again after creating them and releases the gang only when every one is listed). Writes are
    idempotent: a create of an existing object returns False, a delete of a missing one does nothing.
    """

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The VerlJob, or None when it is gone."""

    def job_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        """Every pod labelled ``verl-operator.io/job=<job>``."""

    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The VerlJob read from the API server itself, never from a cache (None when it is gone)."""

    def list_job_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        """The job's pods listed from the API server itself, never from a cache."""

    def read_configmap_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """A ConfigMap's data, or None when it does not exist."""

    def read_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Kueue's Workload of a pod group, or None when it does not exist or cannot be read."""

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> str | None:
        """Merge-patch the job's ``status`` (a None value removes the key); the job's ``resourceVersion``
        after the write (None: not known)."""

    def create(self, manifest: Mapping[str, Any]) -> bool:
        """Create a child (Pod, ConfigMap, Service, PodGroup); False when the job's own object exists.

        Raises:
            MissingAPIError: The kind is not served (a PodGroup without Volcano).
            ChildRefused: The API server refuses the manifest for good.
            ChildBlocked: The cluster refuses it now (a missing ServiceAccount or PriorityClass, a quota), or
                an object the job does not own (by owner uid) has the name: it is never adopted.
        """

    def patch_configmap_data(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        """Replace a ConfigMap's data keys."""

    def ungate(self, namespace: str, name: str) -> None:
        """Remove a pod's scheduling gates."""

    def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod (gone already is fine)."""

    def delete_job(self, namespace: str, name: str) -> None:
        """Delete the VerlJob (gone already is fine)."""

    def event(self, job: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Record an Event on the VerlJob (best effort)."""


def written_version(result: object) -> str | None:
    """The ``resourceVersion`` of the object a write returned (None: not a JSON object or none in it)."""
    if not isinstance(result, Mapping):
        return None
    version = (result.get("metadata") or {}).get("resourceVersion")
    return str(version) if version else None


class Kube:
    """:class:`KubeAPI` over the API server; every create is idempotent (409 means it exists).

    The calls go through :class:`~verl_operator.controller.rawapi.RawAPI` (plain JSON over the kubernetes
    client's connections and credentials, without its per-call validation and response models).
    """

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.raw = RawAPI(api)

    def get_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The VerlJob, or None when it is gone."""
        try:
            return cast(dict[str, Any], self.raw.request("GET", _job_path(namespace, name)))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The VerlJob from the API server (a subclass's :meth:`get_job` may read a cache: this never does)."""
        return Kube.get_job(self, namespace, name)

    def list_job_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        """The job's pods from the API server (a subclass's :meth:`job_pods` may read a cache: this never
        does)."""
        return Kube.job_pods(self, namespace, job)

    def patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> str | None:
        """Merge-patch ``status`` (a None value removes the key); the job's ``resourceVersion`` after it."""
        return written_version(self._patch_status(namespace, name, status))

    def _patch_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> Any:
        return self.raw.request(
            "PATCH", _job_path(namespace, name, "status"), {"status": dict(status)}, content_type=MERGE_PATCH
        )

    def delete_job(self, namespace: str, name: str) -> None:
        """Delete the VerlJob (children follow by owner references, in the background)."""
        try:
            self.raw.request(
                "DELETE", _job_path(namespace, name), query={"propagationPolicy": "Background"}, decode=False
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def job_pods(self, namespace: str, job: str) -> list[dict[str, Any]]:
        """Every pod labelled with the job (fresh from the API server, not a cache)."""
        listed = self.raw.request(
            "GET", core_path(namespace, "pods"), query={"labelSelector": f"{LABEL_JOB}={job}"}
        )
        return list(listed.get("items") or [])

    def create(self, manifest: Mapping[str, Any]) -> bool:
        """Create one child; True when created, False when it already existed."""
        return self._create(manifest, decode=False) is not None

    def _create(self, manifest: Mapping[str, Any], decode: bool) -> Any:
        """Create one child: the created object (``decode``) or True; None when it already existed."""
        self.require_scheduler(manifest)
        ns = manifest["metadata"]["namespace"]
        kind = manifest["kind"]
        try:
            if kind in CORE_PLURALS:
                path = core_path(ns, CORE_PLURALS[kind])
            elif kind == "PodGroup":
                group, version = str(manifest["apiVersion"]).split("/")
                path = group_path(group, version, ns, "podgroups")
            else:
                raise ValueError(f"unsupported child kind {kind}")
            created = self.raw.request("POST", path, dict(manifest), decode=decode)
        except ApiException as exc:
            if exc.status == 409:
                self.exists_owned(manifest, exc)
                return None
            if exc.status == 404 and kind == "PodGroup":
                raise MissingAPIError(
                    f"{manifest['apiVersion']} PodGroup is not served: is Volcano installed?"
                ) from exc
            refused = refusal(exc, manifest)
            if refused is not None:
                raise refused from exc
            raise
        return created if decode else True

    def require_scheduler(self, manifest: Mapping[str, Any]) -> None:
        """A pod handed to Kueue is created only where Kueue's API is served: without Kueue nothing would
        gate it, and the default scheduler would bind it at once, ahead of the queue.

        Raises:
            MissingAPIError: The pod names a Kueue queue and the API server serves no Kueue API group.
        """
        labels = (manifest.get("metadata") or {}).get("labels") or {}
        handed = manifest["kind"] == "Pod" and KUEUE_QUEUE_LABEL in labels
        if handed and group_served(self.api, KUEUE_GROUP) is False:
            raise MissingAPIError(
                f"spec.scheduling.queueName hands the pods to Kueue, but the API server serves no "
                f"{KUEUE_GROUP} API group: is Kueue installed?"
            )

    def exists_owned(self, manifest: Mapping[str, Any], conflict: ApiException) -> bool:
        """After a 409: False (it exists, nothing to do) when the object is the job's own.

        Raises:
            ChildBlocked: The name is taken by an object the job does not own (it is left alone).
            ApiException: ``conflict`` again when the object is gone meanwhile (the next pass creates it).
        """
        existing = self.read_object(manifest)
        if existing is None:
            raise conflict
        taken = name_taken(existing, manifest)
        if taken is not None:
            raise taken
        return False

    def read_object(self, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
        """The object named like ``manifest`` (its metadata is enough), or None when it does not exist."""
        ns, name, kind = manifest["metadata"]["namespace"], manifest["metadata"]["name"], manifest["kind"]
        if kind in CORE_PLURALS:
            path = core_path(ns, CORE_PLURALS[kind], name)
        else:
            group, version = str(manifest["apiVersion"]).split("/")
            path = group_path(group, version, ns, "podgroups", name)
        try:
            return cast(dict[str, Any], self.raw.request("GET", path))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def read_configmap_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """The ConfigMap's data, or None when it does not exist."""
        try:
            cm = self.raw.request("GET", core_path(namespace, "configmaps", name))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(cm.get("data") or {})

    def patch_configmap_data(self, namespace: str, name: str, data: Mapping[str, str]) -> None:
        """Replace the ConfigMap's data keys."""
        self.raw.request(
            "PATCH",
            core_path(namespace, "configmaps", name),
            {"data": dict(data)},
            content_type=STRATEGIC_MERGE_PATCH,
            decode=False,
        )

    def read_workload(self, namespace: str, name: str) -> dict[str, Any] | None:
        """Kueue's Workload ``name`` (v1beta2, else v1beta1); None when it is missing or not readable (no
        Kueue, or no RBAC grant for workloads: the status then says Kueue's reason is unknown)."""
        for version in WORKLOAD_VERSIONS:
            try:
                found = self.raw.request(
                    "GET", group_path(WORKLOAD_GROUP, version, namespace, "workloads", name)
                )
                return cast(dict[str, Any], found)
            except ApiException as exc:
                if exc.status == 403:
                    return None
                if exc.status != 404:
                    raise
        return None

    def ungate(self, namespace: str, name: str) -> None:
        """Remove the pod's scheduling gates (the scheduler may bind it now)."""
        self._ungate(namespace, name, decode=False)

    def _ungate(self, namespace: str, name: str, decode: bool) -> Any:
        return self.raw.request(
            "PATCH",
            core_path(namespace, "pods", name),
            {"spec": {"schedulingGates": None}},
            content_type=STRATEGIC_MERGE_PATCH,
            decode=decode,
        )

    def delete_pod(self, namespace: str, name: str) -> None:
        """Delete a pod (gone already is fine)."""
        try:
            self.raw.request("DELETE", core_path(namespace, "pods", name), decode=False)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def event(self, job: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
        """Record a core/v1 Event on the VerlJob (what ``kubectl describe vj`` shows)."""
        meta = job["metadata"]
        stamp = now_iso()
        body: Any = {
            "metadata": {"name": f"{meta['name']}.{uuid.uuid4().hex[:12]}", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": API_VERSION,
                "kind": KIND,
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": COMPONENT,
            "reportingInstance": COMPONENT,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        with contextlib.suppress(ApiException):  # an event is best effort: never fail a reconcile for it
            self.raw.request("POST", core_path(meta["namespace"], "events"), body, decode=False)


#: The path segment of each core child kind the operator creates.
CORE_PLURALS = {
    "Pod": "pods",
    "ConfigMap": "configmaps",
    "Service": "services",
    "ServiceAccount": "serviceaccounts",
}


def _job_path(namespace: str, name: str, sub: str | None = None) -> str:
    return group_path(GROUP, VERSION, namespace, PLURAL, name, sub)


#: The API group Kueue serves its queues from (``spec.scheduling.queueName`` hands the job to it).
KUEUE_GROUP = "kueue.x-k8s.io"
#: Seconds a discovery answer is reused (admission asks on every review that sets a queue).
DISCOVERY_SECONDS = 30.0
_SERVED: dict[str, tuple[float, bool]] = {}


def group_served(api: client.ApiClient, group: str, now: float | None = None) -> bool | None:
    """Whether the API server serves the API group ``group`` (its CRDs are installed), from discovery.

    A served group is remembered :data:`DISCOVERY_SECONDS`; None when discovery itself failed (the caller
    decides: admission then does not deny).
    """
    stamp = time.monotonic() if now is None else now
    kept = _SERVED.get(group)
    if kept is not None and stamp - kept[0] < DISCOVERY_SECONDS:
        return kept[1]
    try:
        groups = client.ApisApi(api).get_api_versions()
    except (ApiException, OSError):
        return None
    served = any(g.name == group for g in groups.groups or [])
    if served:  # a group not served is asked again next time: it may be installed any moment
        _SERVED[group] = (stamp, served)
    return served


def kueue_problems(api: client.ApiClient, queue_name: str | None) -> list[str]:
    """The admission problem of a job handed to Kueue when Kueue is not installed (else none)."""
    if queue_name is None or group_served(api, KUEUE_GROUP) is not False:
        return []
    return [
        f"spec.scheduling.queueName: {queue_name!r} hands the job to Kueue, but Kueue is not installed "
        f"(the API server serves no {KUEUE_GROUP} API group); unset queueName to let the operator place it"
    ]


def job_quota_problems(
    api: client.ApiClient, namespace: str, pods: Sequence[Mapping[str, Any]], priority_class: str | None
) -> list[str]:
    """The admission problems of a job whose pods in all exceed a ResourceQuota of its namespace: pods,
    CPU, memory, GPUs and extended resources, requests and limits (:mod:`verl_operator.controller.quota`).

    The namespace's quotas are read (the operator's role lists them; its watch forgets proofs when they
    change); none when they cannot be read (the pods' own dry run still judges each pod).
    """
    try:
        items = RawAPI(api).request("GET", core_path(namespace, "resourcequotas")).get("items") or []
    except (ApiException, OSError, ValueError):
        return []
    return quota_problems(items, job_totals(pods), len(pods), priority_class)
