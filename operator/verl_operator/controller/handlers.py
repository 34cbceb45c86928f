"""kopf registrations: indices, event triggers, admission, settings, the reconcile loop, the probe.

Importing this module registers the handlers in kopf's default registry (``verl-operator run`` does that).
No handler needs a finalizer: children carry owner references, so kopf adds none.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import kopf
from kubernetes import client, config

from verl_operator.api.spec import GROUP, PLURAL, VERSION
from verl_operator.controller import metrics
from verl_operator.controller.cache import CachedKube
from verl_operator.controller.config import current
from verl_operator.controller.dryrun import dry_run_children, dry_run_problems, job_pods
from verl_operator.controller.kopf_private import install as install_quiet_toggles
from verl_operator.controller.kopf_private import install_fast_json
from verl_operator.controller.kube import job_quota_problems, kueue_problems
from verl_operator.controller.leader import (
    ElectionTiming,
    FencedKube,
    KubeLeaseStore,
    LeaderElector,
    default_identity,
)
from verl_operator.controller.progress_client import ProgressClient
from verl_operator.controller.proofs import PROOFS, children_key, permission_key, quota_key
from verl_operator.controller.quota import job_totals
from verl_operator.controller.reconcile import JobReconciler
from verl_operator.controller.runtime import RUNTIME
from verl_operator.controller.webhook import (
    PolicySource,
    check_admission,
    pod_permission_problems,
    write_self_signed,
)
from verl_operator.controller.webhook_server import WebhookServer, admission_response
from verl_operator.manifests import LaunchPlan
from verl_operator.manifests.names import LABEL_JOB
from verl_operator.policy import PolicyError

install_quiet_toggles()  # before kopf builds its start-up barrier (controller/kopf_private.py)
install_fast_json()  # kopf's watch events decoded by orjson (controller/kopf_private.py)

log = logging.getLogger("verl_operator.handlers")
_TASKS: list[asyncio.Task[None]] = []  # the reconcile loop, or the leader election that starts it
_LOOP: list[asyncio.Task[None]] = []  # the reconcile loop while this replica leads (leader election)
_ELECTOR: list[LeaderElector] = []
_API: list[client.ApiClient] = []  # the operator's API client, for the webhook's SubjectAccessReviews
#: How long after this replica started an admission review waits for the cache's initial node listing (the API
#: server's webhook timeout is 10 s by default; the review itself takes about a second).
LOAD_WAIT_SECONDS = 5.0
_POLICY = PolicySource()
#: The permission checks, the dry runs and the quota check of the reviews in flight (up to about six requests
#: per review, none of which submits another).
_CALLS = ThreadPoolExecutor(max_workers=16, thread_name_prefix="admission")


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf's diff base for a registry without change handlers (``on.create``/``update``/``resume``/``field``):
    nothing to diff, so nothing is built or stored.

    kopf builds the essence of every watched object on every event (a deep copy of the whole body) to detect
    changes for those handlers; this operator has none (its watch handlers are indices and event handlers,
    ``tests/unit/test_controller_handlers.py`` checks that), and that copy was the largest single part of its
    event processing while a batch of jobs was created.
    """

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        return {}

    def fetch(self, *, body: kopf.Body) -> Any:
        return None

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: Any) -> None:
        return None


@kopf.index("v1", "nodes")
async def gpu_nodes(name: str, body: kopf.Body, **_: Any) -> dict[str, bool]:
    """Every Node event: keep its facts in the watch cache (derived once per change); wake waiting jobs.

    The kopf index itself holds only a flag: kopf calls the handlers below once every index (and so the cache)
    has seen the initial listing. This and the other watch handlers are coroutines: they only touch the cache
    and the queue, so kopf runs them in the event loop instead of handing each event to a thread.
    """
    if RUNTIME.cache.put_node(body):
        RUNTIME.capacity_changed()
        for key in RUNTIME.cache.jobs_on_node(name):  # NotReady, cordoned, relabelled: the job says so now
            RUNTIME.enqueue(key)
    return {name: True}


@kopf.index("v1", "pods")
async def gpu_pods(body: kopf.Body, **_: Any) -> dict[str, bool]:
    """Every pod event: its GPU usage (and the whole pod for a VerlJob's pod) into the watch cache."""
    if RUNTIME.cache.put_pod(body):
        RUNTIME.capacity_changed()
    return {"pods": True}


@kopf.index(GROUP, VERSION, PLURAL)  # type: ignore[arg-type]
async def verl_jobs(namespace: str, name: str, body: kopf.Body, **_: Any) -> dict[tuple[str, str], bool]:
    """Every VerlJob event: the object into the watch cache; a job that gave its GPUs back wakes waiting jobs."""
    RUNTIME.cache.put_job(body)
    if RUNTIME.cache.take_wake():  # also after the operator's own write of this job, stored before the event
        RUNTIME.capacity_changed()
    return {(namespace, name): True}


@kopf.index("scheduling.k8s.io", "v1", "priorityclasses")
async def priority_classes(name: str, body: kopf.Body, **_: Any) -> dict[str, bool]:
    """Every PriorityClass event: its value into the watch cache (the queue's order); a change wakes the queue."""
    if RUNTIME.cache.put_priority_class(body):
        RUNTIME.capacity_changed()
        RUNTIME.retry_blocked()  # a job waiting for this class may be created now
    return {name: True}


@kopf.on.event("scheduling.k8s.io", "v1", "priorityclasses")
async def priority_class_event(type: str | None, name: str, **_: Any) -> None:
    """A deleted PriorityClass leaves the cache."""
    RUNTIME.mark_ready()
    if type == "DELETED":
        PROOFS.clear()  # a dry run that named it passed; a pod that names it is refused now
        if RUNTIME.cache.drop_priority_class(name):
            RUNTIME.capacity_changed()


@kopf.on.event("v1", "resourcequotas")
@kopf.on.event("v1", "limitranges")  # type: ignore[arg-type]
async def namespace_limits_event(namespace: str, **_: Any) -> None:
    """A ResourceQuota or LimitRange was created, changed or deleted: the namespace's passed admission checks
    are asked again (``controller/proofs.py``)."""
    PROOFS.forget(namespace)


@kopf.on.event("v1", "namespaces")
async def namespace_event(name: str, **_: Any) -> None:
    """A Namespace changed (its Pod Security labels among others): its passed admission checks are asked again."""
    PROOFS.forget(name)


@kopf.on.event(GROUP, VERSION, PLURAL)  # type: ignore[arg-type]
async def job_event(type: str | None, namespace: str, name: str, **_: Any) -> None:
    """Any change of a VerlJob: reconcile it (a deleted one: release its pods); a deleted job wakes the queue."""
    RUNTIME.mark_ready()
    deleted = type == "DELETED"
    if deleted:
        RUNTIME.cache.drop_job((namespace, name))
    RUNTIME.enqueue((namespace, name))
    if deleted:  # always: this process may hold a reservation for it that its status never showed
        RUNTIME.capacity_changed()


@kopf.on.event("v1", "pods")  # type: ignore[arg-type]
async def pod_event(type: str | None, namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any) -> None:
    """Any change of a Ray pod: reconcile its job; a deleted GPU pod frees capacity."""
    RUNTIME.mark_ready()
    if type == "DELETED" and RUNTIME.cache.drop_pod(body):
        RUNTIME.capacity_changed()
    job = labels.get(LABEL_JOB)
    if job:
        RUNTIME.enqueue((namespace, str(job)))


@kopf.on.event("v1", "nodes")
async def node_event(type: str | None, name: str, **_: Any) -> None:
    """A deleted Node leaves the cache (its other changes reach the cache through the index); the jobs placed
    on it are reconciled at once."""
    RUNTIME.mark_ready()
    if type == "DELETED" and RUNTIME.cache.drop_node(name):
        RUNTIME.capacity_changed()
        for key in RUNTIME.cache.jobs_on_node(name):  # its pods are lost now, not when they are collected
            RUNTIME.enqueue(key)


def validate_job(
    spec: kopf.Spec,
    old: kopf.Body | None,
    name: str | None = None,
    namespace: str | None = None,
    userinfo: Any = None,
    **_: Any,
) -> None:
    """Deny a VerlJob that the API models, the admission policy, the planner or a dry run of its pods reject;
    the message lists every violation."""
    old_spec = dict(old.get("spec") or {}) if old is not None else None
    try:
        policy = _POLICY.get(current().policy_file)
    except PolicyError as exc:
        raise kopf.AdmissionError(
            f"VerlJob rejected:\n- spec: the admission policy is unusable: {exc}", code=422
        ) from exc
    RUNTIME.await_loaded(LOAD_WAIT_SECONDS)
    checked = check_admission(dict(spec), old_spec, (), policy=policy, planner=RUNTIME.cache.plan)
    problems, ns = checked.problems, namespace or "default"
    changed = old_spec is None or old_spec != dict(spec)
    if not problems and _API:
        problems = _api_problems(checked, old_spec, changed, name or "dry-run", ns, userinfo, policy)
    if problems:
        metrics.ADMISSION_DENIALS.inc()
        raise kopf.AdmissionError("VerlJob rejected:\n" + "\n".join(f"- {p}" for p in problems), code=422)


def _api_problems(
    checked: Any,
    old_spec: Mapping[str, Any] | None,
    changed: bool,
    name: str,
    ns: str,
    userinfo: Any,
    policy: Any,
) -> list[str]:
    """The API server's verdicts on a job the planner accepts: the author's permission, Kueue's queue, the
    children's dry runs and the job-wide quota (pods, CPU, memory, GPUs, extended resources); a check that passed for the same request less than
    ``policy.reuse_verdict_seconds`` ago is not asked again (``controller/proofs.py``)."""
    window = float(policy.reuse_verdict_seconds)
    # The permission check and the dry run are two independent API calls: made at once, the review waits for
    # the slower one only. A denied permission wins over the dry run's verdict.
    permission: Future[list[str]] | None = None
    user_key = permission_key(dict(userinfo)) if userinfo else None
    asks = changed and policy.require_pod_create_permission and user_key is not None
    if asks and not PROOFS.proved(ns, user_key, window):
        permission = _CALLS.submit(pod_permission_problems, _API[0], dict(userinfo), ns)
    dry_run: list[str] = []
    if checked.spec is not None and _queue_changed(checked.spec.scheduling.queue_name, old_spec):
        dry_run = kueue_problems(_API[0], checked.spec.scheduling.queue_name)
    # The children's dry runs and the job-wide quota check are independent requests too: all made at
    # once; the quota's verdict counts only when every child would be created (as if made after them).
    quota: Future[list[str]] | None = None
    totals_key = ""
    if not dry_run and changed and checked.spec is not None and checked.plan is not None:
        pods = job_pods(name, ns, checked.spec, checked.plan, current().launcher_image)
        priority = checked.spec.scheduling.priority_class_name
        totals_key = quota_key(job_totals(pods), priority)
        if not PROOFS.proved(ns, totals_key, window):
            quota = _CALLS.submit(job_quota_problems, _API[0], ns, pods, priority)
    if not dry_run and checked.spec is not None and checked.plan is not None:
        launcher = current().launcher_image
        launch = LaunchPlan.from_plan_json(checked.plan, checked.spec, launcher_image=launcher)
        key = children_key(name, checked.spec.model_dump(mode="json"), launch)
        if not PROOFS.proved(ns, key, window):
            children = dry_run_children(name, ns, checked.spec, checked.plan, launcher)
            dry_run = dry_run_problems(_API[0], children, _CALLS)
            if not dry_run:
                PROOFS.passed(ns, key, window)
    if quota is not None:
        quota_problems = quota.result()
        if not quota_problems:
            PROOFS.passed(ns, totals_key, window)
        dry_run = dry_run or quota_problems
    if permission is not None:
        denied = permission.result()
        if denied:
            return denied
        if user_key is not None:
            PROOFS.passed(ns, user_key, window)
    return dry_run


def _queue_changed(queue_name: str | None, old_spec: Mapping[str, Any] | None) -> bool:
    """A create, or an update that sets another ``scheduling.queueName`` (only then is Kueue looked up)."""
    if old_spec is None:
        return queue_name is not None
    before = (old_spec.get("scheduling") or {}) if isinstance(old_spec.get("scheduling"), Mapping) else {}
    return queue_name is not None and before.get("queueName") != queue_name


#: kopf's id of the validating handler: the last segment of the webhook's URL path.
WEBHOOK_ID = "verljob"


def review_job(review: Mapping[str, Any]) -> dict[str, Any]:
    """The AdmissionReview response for a VerlJob (the webhook server calls this on its own thread)."""
    started = time.perf_counter()
    request = review.get("request") or {}

    def check(body: Mapping[str, Any], old: Mapping[str, Any] | None, userinfo: Mapping[str, Any]) -> None:
        meta = body.get("metadata") or {}
        validate_job(
            spec=body.get("spec") or {},  # type: ignore[arg-type]
            old=old,  # type: ignore[arg-type]
            name=meta.get("name") or request.get("name"),
            namespace=meta.get("namespace") or request.get("namespace"),
            userinfo=userinfo,
        )

    try:
        return admission_response(review, check)
    finally:
        metrics.ADMISSION_SECONDS.observe(time.perf_counter() - started)


if current().webhook_port:  # kopf refuses admission handlers without a webhook server
    # Registered with kopf for the managed ValidatingWebhookConfiguration (its rules and URL); the reviews
    # themselves are answered by WebhookServer's own thread through review_job.
    kopf.on.validate(GROUP, VERSION, PLURAL, id=WEBHOOK_ID, operations=["CREATE", "UPDATE"])(validate_job)  # type: ignore[arg-type]


@kopf.on.probe(id="jobs")
def probe_jobs(**_: Any) -> int:
    """Liveness detail: VerlJobs queued for a reconcile."""
    return len(RUNTIME.pending)


@kopf.on.probe(id="leader")
def probe_leader(**_: Any) -> bool:
    """Liveness detail: whether this replica reconciles (a standby is healthy too: it serves the webhook)."""
    return not _ELECTOR or _ELECTOR[0].is_leader()


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
    RUNTIME.started_at = time.monotonic()
    # A thread waiting for the interpreter lock gets it after at most this long (CPython's default: 5 ms).
    # An admission review takes and gives back the lock at every API call and socket read; with the event
    # loop and the reconcile threads busy during a batch, each of those waits could last the whole interval.
    sys.setswitchinterval(GIL_SWITCH_SECONDS)
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="verl-operator.io")
    settings.persistence.diffbase_storage = NoDiffBase()
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
            reviews={WEBHOOK_ID: review_job},
            addr=cfg.webhook_listen,
            port=cfg.webhook_port,
            host=cfg.webhook_host,
            certfile=cert,
            pkeyfile=key,
        )
        settings.admission.managed = cfg.webhook_managed
    api = _client_from(cfg.kubeconfig)
    _API.append(api)
    cache = RUNTIME.cache
    calls = ThreadPoolExecutor(
        max_workers=4 * cfg.workers, thread_name_prefix="api"
    )  # pods of one pass at once
    kube: Any = CachedKube(api, cache)
    elector: LeaderElector | None = None
    if cfg.leader_elect:
        assert cfg.lease_namespace, "verl-operator run checks the Lease's namespace"
        timing = ElectionTiming(cfg.lease_duration, cfg.renew_deadline, cfg.retry_period)
        # A client of its own: a renew never waits for a connection behind the reconcile workers' calls.
        store = KubeLeaseStore(
            _client_from(cfg.kubeconfig),
            cfg.lease_namespace,
            cfg.lease_name,
            timeout=timing.renew_deadline / 2,
        )
        elector = LeaderElector(store, default_identity(), timing, clock=time.monotonic)
        _ELECTOR.append(elector)
        kube = FencedKube(kube, elector.may_write)  # a pass in flight when the lease is lost writes nothing
    reconciler = JobReconciler(
        kube,
        cache.snapshot,
        node_facts=cache.facts_of,
        calls=calls,
        retry_now=cache.take_retry,
        # --progress-port 0: no head pod is read (a simulated cluster's pod IPs are held by no pod)
        progress=ProgressClient(port=cfg.progress_port).read if cfg.progress_port else None,
    )
    if elector is None:
        metrics.LEADER.set(1)
        _TASKS.append(asyncio.create_task(RUNTIME.run(reconciler, cfg.resync_seconds, cfg.workers)))
        return

    async def started() -> None:
        metrics.LEADER.set(1)
        reconciler.lead()
        _LOOP.append(asyncio.create_task(RUNTIME.run(reconciler, cfg.resync_seconds, cfg.workers)))

    async def stopped() -> None:
        metrics.LEADER.set(0)
        await _cancel(_LOOP)

    metrics.LEADER.set(0)
    log.info("leader election on Lease %s/%s as %s", cfg.lease_namespace, cfg.lease_name, elector.identity)
    _TASKS.append(asyncio.create_task(elector.run(started, stopped)))


#: The interpreter's thread switch interval in the operator process (see ``configure``).
GIL_SWITCH_SECONDS = 0.001

#: Connections kept to the API server: the reconcile workers, their pod calls and the webhook's at once.
API_CONNECTIONS = 32


def _client_from(kubeconfig: str | None) -> client.ApiClient:
    configuration = client.Configuration()
    if kubeconfig:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)  # type: ignore[no-untyped-call]
    else:
        try:
            config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except config.ConfigException:
            config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    # The client's default pool (5 per CPU) is smaller than the calls made at once: a call over the pool's size
    # would open a connection (a TLS handshake) only to drop it afterwards.
    configuration.connection_pool_maxsize = API_CONNECTIONS
    return client.ApiClient(configuration)


async def _cancel(tasks: list[asyncio.Task[None]]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    tasks.clear()


@kopf.on.cleanup()
async def stop(**_: Any) -> None:
    """Stop the election and the reconcile loop; a leader then hands its Lease back, so a standby takes over
    at its next retry instead of after the lease's duration (a rollout, a drained node)."""
    for elector in _ELECTOR:
        elector.stop_leading()  # from now on the fence refuses every write
    await _cancel(_TASKS)
    await _cancel(_LOOP)
    for elector in _ELECTOR:
        # A pass in flight may be inside a write that passed the fence: hand the Lease back only after it.
        if not await RUNTIME.drain(timeout=elector.timing.renew_deadline):
            log.warning("reconciles still running at shutdown: the lease is left to expire")
        elif await asyncio.get_running_loop().run_in_executor(None, elector.release):
            log.info("%s released the lease", elector.identity)
