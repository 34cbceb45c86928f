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
from dataclasses import replace
from typing import Any

from verl_contract.launch_spec import LAUNCH_KEY
from verl_operator.api.status import VerlJobStatus, parse_status
from verl_operator.controller import config, metrics
from verl_operator.controller.decide import (
    children_blocked,
    children_refused,
    decide,
    release_orphans,
    scheduler_unavailable,
)
from verl_operator.controller.kube import KubeAPI, MissingAPIError
from verl_operator.controller.kueue import wants_workload
from verl_operator.controller.observed import Observed
from verl_operator.controller.progress import ProgressReading
from verl_operator.controller.proofs import PROOFS
from verl_operator.controller.refused import ChildBlocked, ChildRefused
from verl_operator.controller.snapshot import Reservations, Snapshot
from verl_operator.controller.status import merge_patch
from verl_operator.controller.transition import Transition
from verl_operator.manifests.children import kueue_group
from verl_operator.planner.facts import NodeFacts

log = logging.getLogger("verl_operator.reconcile")

#: The snapshot of a pass that places nothing (a placed job's pass reads no cluster state).
EMPTY = Snapshot(nodes=(), pod_entries=(), reservations=())

#: Reads a Running job's progress: (job, its pods, the current attempt) -> the reading (None: not read).
ProgressSource = Callable[[Mapping[str, Any], Sequence[Mapping[str, Any]], int], ProgressReading | None]

#: Test hook: seconds to sleep between creating two pods (lets a test kill the operator mid-creation).
CREATE_DELAY_ENV = "VERL_OPERATOR_CREATE_DELAY_SECONDS"


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

    def reconcile(self, namespace: str, name: str) -> None:
        """One reconcile pass of the job ``namespace/name``: decide, apply, and decide again after creates."""
        job = self.kube.get_job(namespace, name)
        pods = self.kube.job_pods(namespace, name)
        if job is None:
            metrics.forget_job(namespace, name)
            self.apply(namespace, None, VerlJobStatus(), release_orphans(name, pods))
            return
        status = parse_status(job.get("status"))
        if status.placed:
            workload = None
            if wants_workload(status, pods):  # Kueue holds or evicted the pods: its Workload says why
                workload = self.kube.read_workload(namespace, kueue_group(name, status.attempt))
            reading, facts = None, []
            if self.progress is not None and status.phase == "Running":
                reading = self.progress(job, pods, status.attempt)
                placed = status.placement.nodes if status.placement else []
                facts = [f for f in map(self.node_facts, placed) if f is not None]
            self._pass(
                namespace, job, status, pods, EMPTY, self.node_states(status), workload, reading, facts
            )
            return
        self._pass(namespace, job, status, pods, None)

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
    ) -> None:
        """Decide and apply (twice when the first transition created pods).

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
                )
                transition = decide(seen)
                if snap is None and transition.reserve is not None:
                    self.reservations.decided[uid] = transition.reserve
            try:
                self.apply(namespace, job, status, transition, ensured)
            except MissingAPIError as exc:
                self.apply(namespace, job, status, scheduler_unavailable(seen, exc))
                return
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
                return
            if not transition.recheck:
                return
            pods = self.kube.job_pods(namespace, job["metadata"]["name"])

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
                    self.kube.patch_status(ns, name, patch)
                except Exception:
                    if t.reserve is not None:  # the placement was not recorded: it reserves nothing
                        self.reservations.decided.pop(uid, None)
                    raise
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
