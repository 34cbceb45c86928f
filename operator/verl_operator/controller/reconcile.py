"""The level-based reconciler of one VerlJob: read everything, decide, write status, create or delete children.

Restart safety: a placement is written to ``status.placement`` *before* any pod is created, children have
deterministic names (a create that finds the object is a no-op), and pods are released from their scheduling
gate only when every pod of the attempt exists. A reconciler killed at any point resumes from what it reads.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from verl_operator.api.spec import VerlJobSpec
from verl_operator.controller import config, metrics
from verl_operator.controller.assess import assess, pod_phase
from verl_operator.controller.kube import Kube, MissingAPIError, now_iso
from verl_operator.controller.snapshot import Reservations, Snapshot, gpus_in_use
from verl_operator.controller.status import (
    FINISHED,
    condition,
    merge_conditions,
    mesh_string,
    parse_time,
    summary_conditions,
)
from verl_operator.manifests import LaunchPlan, build_children
from verl_operator.manifests.launchspec import LAUNCH_KEY
from verl_operator.manifests.names import GANG_GATE, LABEL_ATTEMPT
from verl_operator.placement import place, request_from_plan
from verl_operator.planner import plan_job
from verl_operator.planner.facts import NodeFacts

log = logging.getLogger("verl_operator.reconcile")

#: Test hook: seconds to sleep between creating two pods (lets a test kill the operator mid-creation).
CREATE_DELAY_ENV = "VERL_OPERATOR_CREATE_DELAY_SECONDS"


class JobReconciler:
    """Reconciles VerlJobs; different jobs may be reconciled at once in worker threads.

    The caller never runs two passes of one job at the same time. Placement (plan, choose nodes, record the
    reservation and write ``status.placement``) holds :attr:`placement_lock`, so two jobs never take the same
    GPUs; everything else (reading pods, creating children, writing status) runs concurrently.

    Args:
        kube: The API calls.
        snapshot: Nodes, GPU pods and reservations now (called under the placement lock).
        clock: Seconds since the epoch.
        facts_of: The facts of one node by name (default: looked up in a fresh snapshot).
    """

    def __init__(
        self,
        kube: Kube,
        snapshot: Callable[[], Snapshot],
        clock: Callable[[], float] = time.time,
        facts_of: Callable[[str], NodeFacts | None] | None = None,
    ):
        self.kube = kube
        self.snapshot = snapshot
        self.clock = clock
        self.facts_of = facts_of or (lambda name: self.snapshot().facts_of(name))
        self.reservations = Reservations()
        self.placement_lock = threading.Lock()

    # ---- status writing -------------------------------------------------------------------------------
    def _write(
        self,
        job: Mapping[str, Any],
        phase: str,
        reason: str,
        message: str,
        extra: Mapping[str, Any] | None = None,
        conditions: Sequence[Mapping[str, Any]] = (),
        event: tuple[str, str, str] | None = None,
    ) -> None:
        old = job.get("status") or {}
        gen = int(job["metadata"].get("generation", 1))
        now = now_iso()
        conds = merge_conditions(
            old.get("conditions") or [],
            [*conditions, *summary_conditions(phase, reason, message, gen, now)],
        )
        status: dict[str, Any] = {
            "phase": phase,
            "reason": reason,
            "message": message,
            "observedGeneration": gen,
            "conditions": conds,
            **(extra or {}),
        }
        changed = any(old.get(k) != v for k, v in status.items() if k != "conditions") or [
            {k: v for k, v in c.items() if k != "lastTransitionTime"} for c in old.get("conditions") or []
        ] != [{k: v for k, v in c.items() if k != "lastTransitionTime"} for c in conds]
        if changed:
            meta = job["metadata"]
            self.kube.patch_status(meta["namespace"], meta["name"], status)
        if event is not None and (old.get("phase") != phase or old.get("reason") != reason):
            self.kube.event(job, *event)

    # ---- the pass --------------------------------------------------------------------------------------
    def reconcile(self, namespace: str, name: str) -> None:
        """One reconcile pass of the job ``namespace/name`` (no-op when it is gone or being deleted)."""
        job = self.kube.get_job(namespace, name)
        if job is None:
            self._release_orphans(namespace, name)
            return
        if job["metadata"].get("deletionTimestamp"):
            return
        uid = str(job["metadata"]["uid"])
        status = job.get("status") or {}
        phase = status.get("phase")
        if phase in FINISHED:
            self.reservations.decided.pop(uid, None)
            self._finish_cleanup(job)
            return
        try:
            spec = VerlJobSpec.model_validate(job.get("spec") or {})
        except ValidationError as exc:
            if status.get("placement"):
                self._invalid_update(job, exc)
            else:
                self._invalid_spec(job, exc)
            return
        if spec.suspend:
            self.reservations.decided.pop(uid, None)
            self._suspend(job)
            return
        placement = status.get("placement")
        if not placement or placement.get("attempt") != status.get("attempt", 0):
            with self.placement_lock:
                self._plan_and_place(job, spec)
            return
        self._run(job, spec)

    def _release_orphans(self, namespace: str, name: str) -> None:
        """Delete the pods of a deleted VerlJob now, freeing their GPUs at once.

        The garbage collector would delete them too, but it learns a newly installed CRD's kind only at its
        next discovery refresh. Pods whose owner reference was removed (deleted with ``orphan`` propagation)
        are left alone.
        """
        for pod in self.kube.job_pods(namespace, name):
            owners = pod["metadata"].get("ownerReferences") or []
            owned = any(o.get("kind") == "VerlJob" and o.get("name") == name for o in owners)
            if owned and not pod["metadata"].get("deletionTimestamp"):
                self.kube.delete_pod(namespace, pod["metadata"]["name"])

    # ---- phases ----------------------------------------------------------------------------------------
    def _invalid_spec(self, job: Mapping[str, Any], exc: ValidationError) -> None:
        errors = [
            {
                "field": "spec." + ".".join(str(p) for p in err["loc"]),
                "rule": "schema",
                "message": err["msg"],
                "suggestions": [],
            }
            for err in exc.errors()
        ]
        text = "; ".join(f"{e['field']}: {e['message']}" for e in errors)
        gen = int(job["metadata"].get("generation", 1))
        now = now_iso()
        self._write(
            job,
            "Invalid",
            "InvalidSpec",
            text,
            {"violations": errors},
            [condition("Valid", False, "InvalidSpec", text, gen, now)],
            ("Warning", "InvalidSpec", text),
        )

    def _invalid_update(self, job: Mapping[str, Any], exc: ValidationError) -> None:
        """A placed job whose spec became invalid (no webhook): keep its pods, report ``Valid=False``."""
        status = job.get("status") or {}
        text = "; ".join(f"spec.{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
        gen = int(job["metadata"].get("generation", 1))
        self._write(
            job,
            str(status.get("phase") or "Starting"),
            str(status.get("reason") or "InvalidUpdate"),
            str(status.get("message") or ""),
            conditions=[
                condition("Valid", False, "InvalidSpec", f"the new spec is invalid: {text}", gen, now_iso())
            ],
        )

    def _suspend(self, job: Mapping[str, Any]) -> None:
        meta = job["metadata"]
        for pod in self.kube.job_pods(meta["namespace"], meta["name"]):
            self.kube.delete_pod(meta["namespace"], pod["metadata"]["name"])
        status = job.get("status") or {}
        gen = int(meta.get("generation", 1))
        attempt = int(status.get("attempt", 0))
        # Resuming starts a new Ray cluster (new pod names); the launcher resumes from the checkpoint.
        next_attempt = attempt + 1 if status.get("placement") else attempt
        self._write(
            job,
            "Suspended",
            "Suspended",
            "spec.suspend is true: pods deleted, the job is kept",
            {"placement": None, "nodes": "", "attempt": next_attempt},
            [condition("Placed", False, "Suspended", "suspended", gen, now_iso())],
            ("Normal", "Suspended", "spec.suspend is true: Ray pods deleted"),
        )

    def _plan_and_place(self, job: Mapping[str, Any], spec: VerlJobSpec) -> None:
        meta = job["metadata"]
        uid = str(meta["uid"])
        gen = int(meta.get("generation", 1))
        now = now_iso()
        snap = self.snapshot()
        started = time.perf_counter()
        result = plan_job(spec, list(snap.nodes))
        metrics.PLANNING_SECONDS.observe(time.perf_counter() - started)
        if not result.feasible or result.plan is None:
            violations = [v.model_dump(mode="json") for v in result.violations]
            text = "; ".join(
                f"{v.field}: {v.message}" + (f" ({'; '.join(v.suggestions)})" if v.suggestions else "")
                for v in result.violations
            )
            self._write(
                job,
                "Invalid",
                "PlanInfeasible",
                text,
                {"violations": violations, "plan": None, "mesh": ""},
                [
                    condition("Valid", False, "PlanInfeasible", text, gen, now),
                    condition("Planned", False, "PlanInfeasible", text, gen, now),
                ],
                ("Warning", "PlanInfeasible", text),
            )
            return
        plan = result.to_json_dict()["plan"]
        valid = [
            condition("Valid", True, "Planned", "spec is valid for the cluster's GPUs", gen, now),
            condition("Planned", True, "Planned", mesh_string(plan), gen, now),
        ]
        base: dict[str, Any] = {"plan": plan, "mesh": mesh_string(plan), "violations": None}
        status = job.get("status") or {}
        attempt = int(status.get("attempt", 0))
        if spec.scheduling.queue_name is not None or spec.scheduling.scheduler == "volcano":
            who = "Kueue" if spec.scheduling.queue_name is not None else "Volcano"
            placement = {"attempt": attempt, "nodes": [], "handoff": who, "message": f"placement by {who}"}
            self._write(
                job,
                "Starting",
                "HandedOff",
                f"gang placement handed to {who}",
                {**base, "placement": placement, "startTime": status.get("startTime") or now},
                [*valid, condition("Placed", "Unknown", "HandedOff", f"placement by {who}", gen, now)],
                ("Normal", "HandedOff", f"plan {mesh_string(plan)}; placement handed to {who}"),
            )
            return
        capacities = snap.node_capacities()
        request = request_from_plan(plan, spec)
        used = gpus_in_use(
            snap.pod_entries,
            self.reservations.merged(snap.reservations, snap.live_uids),
            exclude_job_uid=uid,
            live_jobs=snap.live_jobs,
        )
        chosen = place(request, capacities, used)
        if not chosen.feasible:
            self._write(
                job,
                "Pending",
                "InsufficientCapacity",
                chosen.message,
                {**base, "placement": None, "nodes": ""},
                [*valid, condition("Placed", False, "InsufficientCapacity", chosen.message, gen, now)],
                ("Normal", "WaitingForCapacity", chosen.message),
            )
            return
        self.reservations.decided[uid] = (chosen.nodes, request.gpus_per_node)
        placement = {"attempt": attempt, "gpusPerNode": request.gpus_per_node, **chosen.to_status()}
        self._write(
            job,
            "Starting",
            "Placed",
            chosen.message,
            {
                **base,
                "placement": placement,
                "nodes": ",".join(chosen.nodes),
                "startTime": status.get("startTime") or now,
            },
            [*valid, condition("Placed", True, "Placed", chosen.message, gen, now)],
            ("Normal", "Placed", f"plan {mesh_string(plan)}; {chosen.message}"),
        )

    def _launch_plan(self, spec: VerlJobSpec, status: Mapping[str, Any]) -> LaunchPlan:
        plan = status["plan"]
        nodes = tuple(status["placement"].get("nodes") or ())
        product, memory = None, None
        facts = self.facts_of(nodes[0]) if nodes else None
        if facts is not None:
            product, memory = facts.gpu_product or None, facts.gpu_memory_mib
        return LaunchPlan.from_plan_json(
            plan,
            spec,
            nodes=nodes,
            gpu_product=product,
            gpu_memory_mib=memory,
            launcher_image=config.current().launcher_image,
        )

    def _run(self, job: Mapping[str, Any], spec: VerlJobSpec) -> None:
        meta = job["metadata"]
        ns, name, uid = meta["namespace"], meta["name"], str(meta["uid"])
        status = job.get("status") or {}
        gen = int(meta.get("generation", 1))
        attempt = int(status.get("attempt", 0))
        restarts = int(status.get("restarts", 0))
        placement = dict(status["placement"])
        now = now_iso()
        pods = self.kube.job_pods(ns, name)
        current = {
            p["metadata"]["name"]: p
            for p in pods
            if p["metadata"]["labels"].get(LABEL_ATTEMPT) == str(attempt)
        }
        for pod in pods:  # pods of an earlier attempt
            if pod["metadata"]["name"] not in current and not pod["metadata"].get("deletionTimestamp"):
                self.kube.delete_pod(ns, pod["metadata"]["name"])

        children = build_children(job, spec, self._launch_plan(spec, status), attempt)
        wanted = [c for c in children if c["kind"] == "Pod"]
        started = parse_time(status.get("startTime"))
        verdict = assess(
            [p["metadata"]["name"] for p in wanted],
            current,
            released=bool(placement.get("ungated")),
            restarts=restarts,
            backoff_limit=spec.backoff_limit,
            elapsed=None if started is None else self.clock() - started,
            deadline=spec.active_deadline_seconds,
        )
        if verdict.action == "fail":
            self._fail(job, current.values(), verdict.reason, verdict.message)
        elif verdict.action == "restart":
            for pod in current.values():
                self.kube.delete_pod(ns, pod["metadata"]["name"])
            self.reservations.decided.pop(uid, None)
            self._write(
                job,
                "Pending",
                "Restarting",
                verdict.message,
                {"attempt": attempt + 1, "restarts": restarts + 1, "placement": None, "nodes": ""},
                [condition("Placed", False, "Restarting", verdict.message, gen, now)],
                ("Warning", "Restarting", verdict.message),
            )
        elif verdict.action == "succeed":
            for pod in current.values():
                if pod_phase(pod) not in ("Succeeded", "Failed"):
                    self.kube.delete_pod(ns, pod["metadata"]["name"])
            self.reservations.decided.pop(uid, None)
            self._write(
                job,
                "Succeeded",
                "Succeeded",
                verdict.message,
                {"completionTime": now},
                [condition("Complete", True, "Succeeded", "the head pod exited 0", gen, now)],
                ("Normal", "Succeeded", verdict.message),
            )
        elif verdict.action == "create":
            try:
                self._create_and_release(job, children, current, placement)
            except MissingAPIError as exc:
                self._write(
                    job,
                    "Pending",
                    "SchedulerUnavailable",
                    str(exc),
                    event=("Warning", "SchedulerUnavailable", str(exc)),
                )
        elif verdict.action == "running":
            where = ", ".join(
                f"{p['metadata']['name']}@{(current[p['metadata']['name']].get('spec') or {}).get('nodeName')}"
                for p in wanted
            )
            self._write(
                job,
                "Running",
                verdict.reason,
                verdict.message,
                conditions=[condition("Ready", True, verdict.reason, where, gen, now)],
                event=("Normal", "Running", f"all Ray pods running: {where}"),
            )
        else:
            self._write(job, "Starting", verdict.reason, verdict.message)

    def _create_and_release(
        self,
        job: Mapping[str, Any],
        children: Sequence[Mapping[str, Any]],
        current: Mapping[str, Any],
        placement: dict[str, Any],
    ) -> None:
        """Create the missing children; when every pod exists, remove the gang gates and record that."""
        ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
        self._ensure_children(ns, children, current)
        wanted = [c["metadata"]["name"] for c in children if c["kind"] == "Pod"]
        pods_now = {p["metadata"]["name"]: p for p in self.kube.job_pods(ns, name)}
        if not all(n in pods_now for n in wanted):
            return
        for pod_name in wanted:
            gates = pods_now[pod_name]["spec"].get("schedulingGates") or []
            if any(g.get("name") == GANG_GATE for g in gates):
                self.kube.ungate(ns, pod_name)
        placement["ungated"] = True
        text = f"{len(wanted)} Ray pods created and released together"
        self._write(
            job,
            "Starting",
            "PodsCreated",
            text,
            {"placement": placement},
            event=("Normal", "PodsCreated", text),
        )

    def _ensure_children(
        self, ns: str, children: Sequence[Mapping[str, Any]], current: Mapping[str, Any]
    ) -> None:
        delay = float(os.environ.get(CREATE_DELAY_ENV, "0") or 0)
        for child in children:
            kind, cname = child["kind"], child["metadata"]["name"]
            if kind == "Pod":
                if cname in current:
                    continue
                if self.kube.create(child) and delay:
                    time.sleep(delay)
            elif kind == "ConfigMap":
                data = self.kube.read_configmap_data(ns, cname)
                if data is None:
                    self.kube.create(child)
                elif data.get(LAUNCH_KEY) != child["data"][LAUNCH_KEY]:
                    self.kube.patch_configmap_data(ns, cname, child["data"])
            else:
                self.kube.create(child)

    def _fail(self, job: Mapping[str, Any], pods: Any, reason: str, message: str) -> None:
        meta = job["metadata"]
        for pod in list(pods):
            if pod_phase(pod) not in ("Succeeded", "Failed"):
                self.kube.delete_pod(meta["namespace"], pod["metadata"]["name"])
        self.reservations.decided.pop(str(meta["uid"]), None)
        gen = int(meta.get("generation", 1))
        now = now_iso()
        self._write(
            job,
            "Failed",
            reason,
            message,
            {"completionTime": now},
            [condition("Failed", True, reason, message, gen, now)],
            ("Warning", reason, message),
        )

    def _finish_cleanup(self, job: Mapping[str, Any]) -> None:
        meta = job["metadata"]
        spec = job.get("spec") or {}
        for pod in self.kube.job_pods(meta["namespace"], meta["name"]):
            if pod_phase(pod) not in ("Succeeded", "Failed") and not pod["metadata"].get("deletionTimestamp"):
                self.kube.delete_pod(meta["namespace"], pod["metadata"]["name"])
        ttl = spec.get("ttlSecondsAfterFinished")
        done = parse_time((job.get("status") or {}).get("completionTime"))
        if ttl is not None and done is not None and self.clock() - done >= int(ttl):
            log.info(
                "deleting %s/%s: ttlSecondsAfterFinished %s passed", meta["namespace"], meta["name"], ttl
            )
            self.kube.event(job, "Normal", "Deleted", f"ttlSecondsAfterFinished {ttl} passed")
            self.kube.delete_job(meta["namespace"], meta["name"])
