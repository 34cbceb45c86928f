"""kopf registrations: indices, event triggers, admission, settings, the reconcile loop, the probe.

Importing this module registers the handlers in kopf's default registry (``verl-operator run`` does that).
No handler needs a finalizer: children carry owner references, so kopf adds none.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from typing import Any

import kopf
from kubernetes import client, config

from verl_operator.api.spec import GROUP, PLURAL, VERSION
from verl_operator.controller import metrics
from verl_operator.controller.config import current
from verl_operator.controller.kube import Kube
from verl_operator.controller.reconcile import JobReconciler
from verl_operator.controller.runtime import RUNTIME
from verl_operator.controller.snapshot import pod_usage_entry
from verl_operator.controller.webhook import admission_problems, write_self_signed
from verl_operator.controller.webhook_server import WebhookServer
from verl_operator.manifests.names import LABEL_JOB

log = logging.getLogger("verl_operator.handlers")
ACTIVE_PHASES = frozenset({"Starting", "Running"})
_TASKS: list[asyncio.Task[None]] = []


@kopf.index("v1", "nodes")
def gpu_nodes(name: str, body: kopf.Body, **_: Any) -> dict[str, dict[str, Any]]:
    """Every Node, as a plain dict (the planner reads labels, allocatable, taints, conditions)."""
    plain: dict[str, Any] = json.loads(json.dumps(dict(body)))
    return {name: plain}


@kopf.index("v1", "pods")
def gpu_pods(body: kopf.Body, **_: Any) -> dict[str, tuple[str, str, int, str | None]] | None:
    """Live pods holding GPUs, by node: ``node -> (node, uid, gpus, job label)``."""
    entry = pod_usage_entry(json.loads(json.dumps(dict(body))))
    return None if entry is None else {entry[0]: entry}


@kopf.index(GROUP, VERSION, PLURAL)  # type: ignore[arg-type]
def verl_jobs(
    namespace: str, name: str, uid: str, status: kopf.Status, **_: Any
) -> dict[tuple[str, str], tuple[str, str | None, tuple[str, tuple[str, ...], int] | None]]:
    """Every VerlJob: ``(namespace, name) -> (uid, phase, reservation)``; placed jobs reserve their nodes."""
    phase = status.get("phase")
    placement = status.get("placement") or {}
    reservation = None
    if phase in ACTIVE_PHASES and placement.get("nodes"):
        reservation = (uid, tuple(placement["nodes"]), int(placement.get("gpusPerNode") or 0))
    return {(namespace, name): (uid, phase, reservation)}


@kopf.on.event(GROUP, VERSION, PLURAL)  # type: ignore[arg-type]
def job_event(namespace: str, name: str, gpu_nodes: Any, gpu_pods: Any, verl_jobs: Any, **_: Any) -> None:
    """Any change of a VerlJob: reconcile it."""
    RUNTIME.bind(gpu_nodes, gpu_pods, verl_jobs)
    RUNTIME.enqueue((namespace, name))


@kopf.on.event("v1", "pods", labels={LABEL_JOB: kopf.PRESENT})  # type: ignore[arg-type]
def pod_event(
    namespace: str, labels: kopf.Labels, gpu_nodes: Any, gpu_pods: Any, verl_jobs: Any, **_: Any
) -> None:
    """Any change of a Ray pod: reconcile its job."""
    RUNTIME.bind(gpu_nodes, gpu_pods, verl_jobs)
    RUNTIME.enqueue((namespace, str(labels[LABEL_JOB])))


@kopf.on.event("v1", "nodes")  # type: ignore[arg-type]
def node_event(gpu_nodes: Any, gpu_pods: Any, verl_jobs: Any, **_: Any) -> None:
    """Nodes changing only refresh the bound indices; waiting jobs are retried at each resync."""
    RUNTIME.bind(gpu_nodes, gpu_pods, verl_jobs)


def validate_job(spec: kopf.Spec, old: kopf.Body | None, gpu_nodes: Any, **_: Any) -> None:
    """Deny a VerlJob that the API models or the planner reject; the message lists every violation."""
    nodes = [v for store in list(gpu_nodes.values()) for v in list(store)]
    old_spec = dict(old.get("spec") or {}) if old is not None else None
    problems = admission_problems(dict(spec), old_spec, nodes)
    if problems:
        metrics.ADMISSION_DENIALS.inc()
        raise kopf.AdmissionError("VerlJob rejected:\n" + "\n".join(f"- {p}" for p in problems), code=422)


if current().webhook_port:  # kopf refuses admission handlers without a webhook server
    kopf.on.validate(GROUP, VERSION, PLURAL, id="verljob", operations=["CREATE", "UPDATE"])(validate_job)  # type: ignore[arg-type]


@kopf.on.probe(id="jobs")
def probe_jobs(**_: Any) -> int:
    """Liveness detail: VerlJobs queued for a reconcile."""
    return len(RUNTIME.pending)


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """Credentials: the ``--kubeconfig`` file when given, else the pod's ServiceAccount, else ``$KUBECONFIG``."""
    cfg = current()
    if cfg.kubeconfig:
        os.environ["KUBECONFIG"] = cfg.kubeconfig
        return kopf.login_with_kubeconfig(**kwargs)
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
async def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """kopf settings (bookkeeping out of ``status``, no event posting of logs, webhook) and the loop."""
    cfg = current()
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="verl-operator.io")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="verl-operator.io", key="last-handled-configuration"
    )
    settings.persistence.finalizer = "verl-operator.io/kopf-finalizer"
    settings.posting.enabled = False
    settings.watching.server_timeout = 120
    if cfg.webhook_port:
        cert, key = cfg.webhook_cert, cfg.webhook_key
        if not (cert and key):
            cert_path, key_path = write_self_signed(
                Path(cfg.workdir) / "webhook", hosts=("127.0.0.1", "localhost")
            )
            cert, key = str(cert_path), str(key_path)
        settings.admission.server = WebhookServer(
            addr=cfg.webhook_listen, port=cfg.webhook_port, host=cfg.webhook_host, certfile=cert, pkeyfile=key
        )
        settings.admission.managed = cfg.webhook_managed
    api = _client_from(cfg.kubeconfig)
    reconciler = JobReconciler(Kube(api), RUNTIME.snapshot)
    _TASKS.append(asyncio.create_task(RUNTIME.run(reconciler, cfg.resync_seconds)))


def _client_from(kubeconfig: str | None) -> client.ApiClient:
    if kubeconfig:
        api: client.ApiClient = config.new_client_from_config(config_file=kubeconfig)  # type: ignore[no-untyped-call]
        return api
    try:
        config.load_incluster_config()  # type: ignore[no-untyped-call]
    except config.ConfigException:
        config.load_kube_config()  # type: ignore[no-untyped-call]
    return client.ApiClient()


@kopf.on.cleanup()
async def stop(**_: Any) -> None:
    """Stop the reconcile loop."""
    for task in _TASKS:
        task.cancel()
    await asyncio.gather(*_TASKS, return_exceptions=True)
    _TASKS.clear()
