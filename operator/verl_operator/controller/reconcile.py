"""The level-based reconciler of one VerlJob: read everything, decide (pure), apply the transition.

Restart safety: a placement is written to ``status.placement`` *before* any pod is created, children have
deterministic names (a create that finds the object is a no-op), and pods are released from their scheduling
gate only when every pod of the attempt exists. A reconciler killed at any point resumes from what it reads.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace
from typing import Any

from verl_contract.launch_spec import LAUNCH_KEY
from verl_operator.api.spec import VerlJobSpec
from verl_operator.api.status import ProgressStatus, VerlJobStatus, parse_status
from verl_operator.controller import config, metrics
from verl_operator.controller.assess import Verdict
from verl_operator.controller.decide import (
    children_blocked,
    children_refused,
    decide,
    release_orphans,
    scheduler_unavailable,
)
from verl_operator.controller.derived import contradicted_attempt
from verl_operator.controller.kube import KubeAPI, MissingAPIError
from verl_operator.controller.kueue import wants_workload
from verl_operator.controller.observed import Observed
from verl_operator.controller.pipeline import pod_names
from verl_operator.controller.progress import ProgressReading, ProgressWriter
from verl_operator.controller.proofs import PROOFS
from verl_operator.controller.refused import ChildBlocked, ChildRefused
from verl_operator.controller.running import progress_only
from verl_operator.controller.snapshot import Reservations, Snapshot
from verl_operator.controller.status import merge_patch
from verl_operator.controller.transition import Transition
from verl_operator.manifests.children import kueue_group
from verl_operator.manifests.names import LABEL_ATTEMPT
from verl_operator.planner.facts import NodeFacts

log = logging.getLogger("verl_operator.reconcile")

#: The snapshot of a pass that places nothing (a placed job's pass reads no cluster state).
EMPTY = Snapshot(nodes=(), pod_entries=(), reservations=())

#: Reads a Running job's progress: (job, its pods, the current attempt) -> the reading (None: not read).
ProgressSource = Callable[[Mapping[str, Any], Sequence[Mapping[str, Any]], int], ProgressReading | None]

#: Test hook: seconds to sleep between creating two pods (lets a test kill the operator mid-creation).
CREATE_DELAY_ENV = "VERL_OPERATOR_CREATE_DELAY_SECONDS"


#: The pods of a job as (name, resourceVersion), sorted by name.
PodVersions = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Steady:
    """What the last whole pass of a Running job found, for the passes after it that only read progress.

    Attributes:
        job_version: The job's ``resourceVersion`` that pass read.
        generation: Its ``metadata.generation`` (a spec change moves it).
        labels: Its labels; annotations: its annotations (a status write of the operator's that raced
            another client's change carries that change: it must not pass for the operator's own).
        pods: Its pods' versions then.
        node_states: Its nodes that were not Ready then (sorted items).
        launcher_image: The operator's launcher image then.
        spec: The job's spec, parsed.
        verdict: The ``running`` verdict of its pods.
        wanted: The attempt's pod names, head first.
        current: The attempt's pods (read only).
    """

    job_version: str
    generation: Any
    labels: Mapping[str, str]
    annotations: Mapping[str, str]
    pods: PodVersions
    node_states: tuple[tuple[str, str], ...]
    launcher_image: str | None
    spec: VerlJobSpec
    verdict: Verdict
    wanted: tuple[str, ...]
    current: Mapping[str, Mapping[str, Any]]


def _versions(pods: Sequence[Mapping[str, Any]]) -> PodVersions:
    return tuple(
        sorted((str(p["metadata"]["name"]), str(p["metadata"].get("resourceVersion") or "")) for p in pods)
    )


class JobReconciler:
    """Reconciles VerlJobs; different jobs may be reconciled at once in worker threads.

    The caller never runs two passes of one job at the same time. A pass of a job that is not placed (plan,
    choose nodes, record the reservation and write ``status.placement``) holds :attr:`placement_lock` and
    takes its snapshot inside it, so two jobs never take the same GPUs; passes of placed jobs (reading pods,
    creating children, writing status) run concurrently and need no snapshot.

    Args:
        kube: The API calls (:class:`~verl_operator.controller.kube.KubeAPI`).
        snapshot: Nodes, GPU pods and reservations now (called under the placement lock).
        clock: Seconds since the epoch (deadlines, TTLs, condition times).
        node_facts: One node's facts from the node watch, None when it is gone (default: from a snapshot).
        calls: Threads for the pod creates and gate removals of one pass, made at once (each is its own API
            round trip); None makes them one after the other, in order.
        retry_now: True once for a job whose pods could not be created when something that may have been
            in their way changed (a PriorityClass): it is tried at once instead of at its retry time.
        progress: Reads a Running job's progress from its head pod
            (:class:`~verl_operator.controller.progress_client.ProgressClient`); None reads none.
    """

    def __init__(
        self,
        kube: KubeAPI,
        snapshot: Callable[[], Snapshot],
        clock: Callable[[], float] = time.time,
        node_facts: Callable[[str], NodeFacts | None] | None = None,
        calls: Executor | None = None,
        retry_now: Callable[[str, str], bool] | None = None,
        progress: ProgressSource | None = None,
    ) -> None:
        self.progress = progress
        self.calls = calls
        self.retry_now = retry_now or (lambda namespace, name: False)
        self.kube = kube
        self.snapshot = snapshot
        self.clock = clock
        self.node_facts = node_facts or (lambda name: self.snapshot().facts_of(name))
        self.reservations = Reservations()
        self.placement_lock = threading.Lock()
        #: Per Running job, its last whole pass (:class:`Steady`) and the ``resourceVersion`` of the
        #: operator's own latest status write since: a progress read that finds nothing else changed takes
        #: the fast path (:meth:`_progress_only`). One job's passes never overlap, so no lock is needed.
        self.steady: dict[tuple[str, str], Steady] = {}
        self.written: dict[tuple[str, str], str] = {}
        #: Per job, the ``status.progress`` this process last wrote (or found equal to what it would
        #: write): a different one in the status is not its own (:data:`ProgressWriter`).
        self.progress_written: dict[tuple[str, str], ProgressStatus | None] = {}

    def reconcile(self, namespace: str, name: str) -> None:
        """One reconcile pass of the job ``namespace/name``: decide, apply, and decide again after creates."""
        if self._progress_only(namespace, name):
            return
        job = self.kube.get_job(namespace, name)
        pods = self.kube.job_pods(namespace, name)
        if job is None:
            self.steady.pop((namespace, name), None)
            self.written.pop((namespace, name), None)
            self.progress_written.pop((namespace, name), None)
            metrics.forget_job(namespace, name)
            self.apply(namespace, None, VerlJobStatus(), release_orphans(name, pods))
            return
        status = parse_status(job.get("status"))
        fresh, running = False, status.attempt  # the attempt whose head reports the progress
        if status.placed and contradicted_attempt(job, status, pods) is not None:
            read = self._read_through(namespace, name)
            if read is None:
                return  # gone since the cache showed it: its DELETED event follows
            job, pods, fresh = read
            status = parse_status(job.get("status"))
            shown = contradicted_attempt(job, status, pods) if fresh else None
            running = shown[0] if shown is not None else status.attempt
        if status.placed:
            workload = None
            if wants_workload(status, pods):  # Kueue holds or evicted the pods: its Workload says why
                workload = self.kube.read_workload(namespace, kueue_group(name, status.attempt))
            reading: ProgressReading | None = None
            facts: list[NodeFacts] = []
            if self.progress is not None and status.phase == "Running":
                reading, facts = self._progress_and_facts(job, pods, status, running)
            states = self.node_states(status)
            writer = self.progress_writer(namespace, name, status)
            t = self._pass(
                namespace, job, status, pods, EMPTY, states, workload, reading, facts, fresh, writer
            )
            self._remember(namespace, job, status, pods, states, workload, t)
            return
        self.steady.pop((namespace, name), None)
        self._pass(namespace, job, status, pods, None)

    def _progress_and_facts(
        self, job: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], status: VerlJobStatus, attempt: int
    ) -> tuple[ProgressReading | None, list[NodeFacts]]:
        """A Running job's progress, read from the head pod of ``attempt``, and its placed nodes' facts (the
        advisor re-plans on them). Only with a progress reader (``self.progress``)."""
        assert self.progress is not None
        reading = self.progress(job, pods, attempt)
        placed = status.placement.nodes if status.placement else []
        return reading, [f for f in map(self.node_facts, placed) if f is not None]

    def lead(self) -> None:
        """A new term as the leader: another replica may have written every job's progress since this one
        last did, so none counts as someone else's (``unknown``: replaced at the first read, no event)."""
        self.progress_written.clear()

    def progress_writer(self, namespace: str, name: str, status: VerlJobStatus) -> ProgressWriter:
        """Who wrote ``status.progress``, as far as this process knows (:data:`ProgressWriter`)."""
        if status.progress is None:
            return "own"
        key = (namespace, name)
        if key not in self.progress_written:
            return "unknown"
        return "own" if self.progress_written[key] == status.progress else "other"

    def _read_through(
        self, namespace: str, name: str
    ) -> tuple[dict[str, Any], list[dict[str, Any]], bool] | None:
        """The job and its pods from the API server, not the watch cache, and whether the pods were listed
        between two reads of the job that found it unchanged (then they are at least as new as its status).
        Taken only where the cached pods contradict the status's attempt, which a write of the operator's
        own whose watch events have not arrived yet may also show. None: the job is gone."""
        before = self.kube.read_job(namespace, name)
        if before is None:
            return None
        pods = self.kube.list_job_pods(namespace, name)
        job = self.kube.read_job(namespace, name)
        if job is None:
            return None
        version = str(job["metadata"].get("resourceVersion") or "")
        return job, pods, bool(version) and version == str(before["metadata"].get("resourceVersion") or "")

    def _remember(
        self,
        namespace: str,
        job: Mapping[str, Any],
        status: VerlJobStatus,
        pods: Sequence[Mapping[str, Any]],
        states: Mapping[str, str],
        workload: Mapping[str, Any] | None,
        t: Transition | None,
    ) -> None:
        """Keep what a whole pass of a Running job found when it left the job Running with nothing else to
        do (no pod created, released or deleted, no event: every pod runs as before); forget it otherwise."""
        key = (namespace, str(job["metadata"]["name"]))
        self.steady.pop(key, None)
        quiet = (
            t is not None
            and t.status is not None
            and status.phase == "Running"
            and t.status.phase == "Running"
            and t.status.attempt == status.attempt
            and not (t.create or t.delete or t.ungate or t.delete_job or t.unreserve or t.recheck)
            and t.reserve is None
            and t.event is None
            and workload is None
            and self.progress is not None
        )
        version = str(job["metadata"].get("resourceVersion") or "")
        if not quiet or t is None or t.status is None or not version:
            return
        try:
            spec = VerlJobSpec.model_validate(job.get("spec") or {})
        except Exception:  # an invalid spec is decided by whole passes
            return
        attempt = str(status.attempt)
        current = {
            str(p["metadata"]["name"]): p
            for p in pods
            if (p["metadata"].get("labels") or {}).get(LABEL_ATTEMPT) == attempt
        }
        if len(current) != len(pods) or any(p["metadata"].get("deletionTimestamp") for p in pods):
            return
        wanted = tuple(pod_names(job, status))
        if set(wanted) != set(current):
            return
        meta = job["metadata"]
        self.steady[key] = Steady(
            job_version=version,
            generation=meta.get("generation"),
            labels=dict(meta.get("labels") or {}),
            annotations=dict(meta.get("annotations") or {}),
            pods=_versions(pods),
            node_states=tuple(sorted(states.items())),
            launcher_image=config.current().launcher_image,
            spec=spec,
            verdict=Verdict("running", t.status.reason or "", t.status.message or ""),
            wanted=wanted,
            current=current,
        )

    def _pod_versions(self, namespace: str, name: str) -> PodVersions:
        """The job's pods' versions, without copying the pods where the API layer can say (the watch cache)."""
        read = getattr(self.kube, "job_pod_versions", None)
        if read is not None:
            return tuple(read(namespace, name))
        return _versions(self.kube.job_pods(namespace, name))

    def _progress_only(self, namespace: str, name: str) -> bool:
        """The pass of a Running job whose spec, metadata, pods and nodes are those of its last whole pass
        (:class:`Steady`; the job's ``resourceVersion`` that pass's or the operator's own status write's since):
        read its progress and write the progress, ``Progressing`` and ``Stalled`` only. False: decide the
        whole pass (something changed, or time alone ends the attempt)."""
        key = (namespace, name)
        steady = self.steady.get(key)
        if steady is None or self.progress is None:
            return False
        peek = getattr(self.kube, "job_view", None)  # the watch cache's own object, read only: no copy
        job = peek(namespace, name) if peek is not None else self.kube.get_job(namespace, name)
        if job is None:
            return False
        version = str(job["metadata"].get("resourceVersion") or "")
        if not version or version not in (steady.job_version, self.written.get(key)):
            return False
        meta = job["metadata"]
        if (
            meta.get("deletionTimestamp")
            or meta.get("generation") != steady.generation
            or (meta.get("labels") or {}) != steady.labels
            or (meta.get("annotations") or {}) != steady.annotations
        ):
            return False
        status = parse_status(job.get("status"))
        if status.phase != "Running" or not status.placed:
            return False
        states = self.node_states(status)
        if (
            tuple(sorted(states.items())) != steady.node_states
            or config.current().launcher_image != steady.launcher_image
            or self._pod_versions(namespace, name) != steady.pods
        ):
            return False
        pods = list(steady.current.values())
        reading, facts = self._progress_and_facts(job, pods, status, status.attempt)
        seen = Observed(
            job,
            status,
            pods,
            EMPTY,
            (),
            self.clock(),
            steady.launcher_image,
            states,
            progress=reading,
            nodes=facts,
            progress_writer=self.progress_writer(namespace, name, status),
        )
        t = progress_only(seen, steady.spec, steady.verdict, steady.wanted, steady.current)
        if t is None:
            return False
        self.apply(namespace, job, status, t)
        return True

    def _pass(
        self,
        namespace: str,
        job: Mapping[str, Any],
        status: VerlJobStatus,
        pods: list[dict[str, Any]],
        snap: Snapshot | None,
        node_states: Mapping[str, str] | None = None,
        workload: Mapping[str, Any] | None = None,
        progress: ProgressReading | None = None,
        facts: Sequence[NodeFacts] = (),
        fresh: bool = False,
        writer: ProgressWriter = "own",
    ) -> Transition | None:
        """Decide and apply (twice when the first transition created pods); the last transition applied
        (None: the pass ended on a refusal or a missing API).

        ``snap`` None: the job is still to be placed. Each decision then takes a fresh snapshot under the
        placement lock, which covers the snapshot, the decision and the in-process reservation only, not the
        API writes that follow: the next placement already counts this job's GPUs through the reservation,
        so placements never overlap, and a slow status write does not hold up every other placement.
        """
        launcher_image = config.current().launcher_image
        uid = str(job["metadata"]["uid"])
        retry = snap is None and self.retry_now(namespace, str(job["metadata"]["name"]))
        ensured: set[tuple[str, str]] = set()  # children this pass created or found: not posted again
        for _ in range(2):  # the second decision sees the pods the first one created
            with self.placement_lock if snap is None else contextlib.nullcontext():
                view = self.snapshot() if snap is None else snap
                reserved = (
                    self.reservations.merged(view.reservations, view.live_uids) if view is not EMPTY else []
                )
                seen = Observed(
                    job,
                    status,
                    pods,
                    view,
                    reserved,
                    self.clock(),
                    launcher_image,
                    dict(node_states or {}),
                    retry_now=retry,
                    workload=workload,
                    progress=progress,
                    nodes=facts,
                    fresh=fresh,
                    progress_writer=writer,
                )
                transition = decide(seen)
                if snap is None and transition.reserve is not None:
                    self.reservations.decided[uid] = transition.reserve
            try:
                self.apply(namespace, job, status, transition, ensured)
            except MissingAPIError as exc:
                self.apply(namespace, job, status, scheduler_unavailable(seen, exc))
                return None
            except ChildRefused as exc:
                log.warning("%s/%s: %s", namespace, job["metadata"]["name"], exc)
                if exc.denies_admission:  # a review in that window may have reused a pass: ask again
                    PROOFS.forget(namespace)
                # the pods this pass created before the refusal are the attempt's too: list them again
                seen = replace(seen, pods=self.kube.job_pods(namespace, job["metadata"]["name"]))
                if isinstance(exc, ChildBlocked):
                    self.apply(namespace, job, status, children_blocked(seen, exc))
                else:
                    self.apply(namespace, job, status, children_refused(seen, exc))
                return None
            if not transition.recheck:
                return transition
            # After pods read through to the API server, so read again: a cache may still show pods deleted.
            again = self.kube.list_job_pods if fresh else self.kube.job_pods
            pods = again(namespace, job["metadata"]["name"])
        return None

    def node_states(self, status: VerlJobStatus) -> dict[str, str]:
        """``deleted`` or ``NotReady`` for each chosen node of a placed job that is not Ready (the node watch)."""
        states: dict[str, str] = {}
        for node in status.placement.nodes if status.placement else []:
            facts = self.node_facts(node)
            if facts is None:
                states[node] = "deleted"
            elif not facts.ready:
                states[node] = "NotReady"
        return states

    def apply(
        self,
        ns: str,
        job: Mapping[str, Any] | None,
        old: VerlJobStatus,
        t: Transition,
        ensured: set[tuple[str, str]] | None = None,
    ) -> None:
        """Carry out ``t``: reservation, deletes, creates, gates, status, event, and the job's deletion.

        Args:
            ns: The job's namespace.
            job: The VerlJob body; None when it is gone (only ``t.delete`` applies).
            old: The status the decision started from (the status patch is the difference).
            t: The transition.
            ensured: ``(kind, name)`` of the children already ensured earlier in the same pass; they are
                skipped, and the children ensured now are added.
        """
        for pod in t.delete:
            self.kube.delete_pod(ns, pod)
        if job is None:
            return
        meta = job["metadata"]
        name, uid = str(meta["name"]), str(meta["uid"])
        if t.planning_seconds is not None:
            metrics.PLANNING_SECONDS.observe(t.planning_seconds)
            metrics.PLAN_AND_PLACE_SECONDS.observe(t.planning_seconds)
        if t.unreserve:
            self.reservations.decided.pop(uid, None)
        if t.reserve is not None:
            self.reservations.decided[uid] = t.reserve
        self._ensure_children(ns, t.create, set() if ensured is None else ensured)
        self._each(lambda pod: self.kube.ungate(ns, pod), t.ungate)  # every pod exists: release them
        if t.status is not None:
            metrics.set_job_progress(ns, name, t.status)
            patch = merge_patch(old.to_wire(), t.status.to_wire())
            if patch:
                try:
                    written = self.kube.patch_status(ns, name, patch)
                    if written:  # the job's version after this write is the operator's own
                        self.written[(ns, name)] = str(written)
                    else:
                        self.written.pop((ns, name), None)
                except Exception:
                    if t.reserve is not None:  # the placement was not recorded: it reserves nothing
                        self.reservations.decided.pop(uid, None)
                    raise
            self.progress_written[(ns, name)] = t.status.progress
        if t.event is not None:
            self.kube.event(job, t.event.type, t.event.reason, t.event.message)
        if t.delete_job:
            log.info("deleting %s/%s: %s", ns, name, t.event.message if t.event else "its TTL passed")
            self.kube.delete_job(ns, name)

    def _ensure_children(
        self, ns: str, children: Sequence[Mapping[str, Any]], ensured: set[tuple[str, str]]
    ) -> None:
        """Create the children in order (one that exists is left alone); update a ConfigMap whose
        ``launch.json`` differs. A child in ``ensured`` (this pass created or checked it already) is skipped:
        the pass's second decision names the ServiceAccount, ConfigMap and Service again, and posting them
        again would only earn a 409 and a read of the ConfigMap."""
        delay = float(os.environ.get(CREATE_DELAY_ENV, "0") or 0)
        pods: list[Mapping[str, Any]] = []
        for child in children:
            kind, cname = child["kind"], str(child["metadata"]["name"])
            if (kind, cname) in ensured:
                continue
            ensured.add((kind, cname))
            if kind == "Pod":
                pods.append(child)  # after the others (the ServiceAccount, the PodGroup they name)
            elif kind == "ConfigMap":
                if self.kube.create(child):  # created: no read needed (the usual case)
                    continue
                data = self.kube.read_configmap_data(ns, cname)
                if data is not None and data.get(LAUNCH_KEY) != child["data"][LAUNCH_KEY]:
                    self.kube.patch_configmap_data(ns, cname, child["data"])
            else:
                self.kube.create(child)
        if delay:  # the test hook: one pod at a time, a pause after each created one
            for pod in pods:
                if self.kube.create(pod):
                    time.sleep(delay)
            return
        self._each(self.kube.create, pods)

    def _each(self, call: Callable[[Any], object], items: Sequence[Any]) -> None:
        """``call`` on every item: at once on :attr:`calls` (all are waited for; then the first item's error,
        in order, is raised), or one after the other without it."""
        if self.calls is None or len(items) < 2:
            for item in items:
                call(item)
            return
        futures = [self.calls.submit(call, item) for item in items]
        errors = [f.exception() for f in futures]
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
