"""The level-based reconciler of one VerlJob: read everything, decide, write status, create or delete children.

Restart safety: a placement is written to ``status.placement`` *before* any pod is created, children have
deterministic names (a create that finds the object is a no-op), and pods are released from their scheduling
gate only when every pod of the attempt exists. A reconciler killed at any point resumes from what it reads.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from verl_operator.api.spec import VerlJobSpec
from verl_operator.controller import metrics
from verl_operator.controller.kube import Kube, now_iso
from verl_operator.controller.snapshot import gpus_in_use, node_capacity
from verl_operator.controller.status import (
    FINISHED,
    condition,
    merge_conditions,
    mesh_string,
    pod_failure,
    summary_conditions,
)
from verl_operator.manifests import LaunchPlan, build_children
from verl_operator.manifests.launchspec import LAUNCH_KEY
from verl_operator.manifests.names import GANG_GATE, LABEL_ATTEMPT
from verl_operator.placement import PlacementRequest, place
from verl_operator.planner import plan_job
from verl_operator.planner.facts import node_facts

log = logging.getLogger("verl_operator.reconcile")

#: Test hook: seconds to sleep between creating two pods (lets a test kill the operator mid-creation).
CREATE_DELAY_ENV = "VERL_OPERATOR_CREATE_DELAY_SECONDS"


@dataclass
class Snapshot:
    """What the reconciler reads from the in-memory indices for one pass."""

    nodes: Sequence[Mapping[str, Any]]
    pod_entries: Sequence[tuple[str, str, int, str | None]]
    reservations: Sequence[tuple[str, tuple[str, ...], int]]
    live_uids: frozenset[str] = frozenset()
    live_jobs: frozenset[str] = frozenset()


@dataclass
class Reservations:
    """Placements decided by this process that the job index may not show yet (uid -> nodes, GPUs per node)."""

    decided: dict[str, tuple[tuple[str, ...], int]] = field(default_factory=dict)

    def merged(
        self, indexed: Sequence[tuple[str, tuple[str, ...], int]], live_uids: frozenset[str]
    ) -> list[tuple[str, tuple[str, ...], int]]:
        """Index reservations overridden by this process's newer decisions; deleted jobs reserve nothing."""
        for uid in [u for u in self.decided if u not in live_uids]:
            del self.decided[uid]
        out = {uid: (nodes, gpn) for uid, nodes, gpn in indexed}
        out.update(self.decided)
        return [(uid, nodes, gpn) for uid, (nodes, gpn) in sorted(out.items())]


def _parse_time(value: str | None) -> float | None:
    if not value:
        return None
    return dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()


def _pod_phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")


class JobReconciler:
    """Reconciles VerlJobs one at a time (the caller serialises calls, so placements never race)."""

    def __init__(self, kube: Kube, snapshot: Callable[[], Snapshot], clock: Callable[[], float] = time.time):
        self.kube = kube
        self.snapshot = snapshot
        self.clock = clock
        self.reservations = Reservations()

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
        capacities = [node_capacity(n) for n in snap.nodes]
        request = PlacementRequest(
            nnodes=int(plan["nnodes"]),
            gpus_per_node=int(plan["gpusPerNode"]),
            candidates=tuple(plan.get("candidateNodes") or ()),
            gpu_product=spec.resources.gpu_product,
            node_selector=dict(spec.resources.node_selector),
            nvlink_required=spec.placement.nvlink == "required",
            nvlink_group_size=int(plan.get("nvlinkGroupSize") or 1),
            topology_key=spec.placement.topology_key,
            topology_policy=spec.placement.topology_policy,
        )
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
        by_name = {str(n["metadata"]["name"]): n for n in self.snapshot().nodes}
        if nodes and nodes[0] in by_name:
            facts = node_facts(by_name[nodes[0]])
            product, memory = facts.gpu_product or None, facts.gpu_memory_mib
        return LaunchPlan.from_plan_json(plan, spec, nodes=nodes, gpu_product=product, gpu_memory_mib=memory)

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
        for pod in pods:
            if pod["metadata"]["name"] not in current and not pod["metadata"].get("deletionTimestamp"):
                self.kube.delete_pod(ns, pod["metadata"]["name"])

        started = _parse_time(status.get("startTime"))
        deadline = spec.active_deadline_seconds
        if deadline is not None and started is not None and self.clock() - started > deadline:
            self._fail(
                job, current.values(), "DeadlineExceeded", f"ran longer than activeDeadlineSeconds {deadline}"
            )
            return

        launch = self._launch_plan(spec, status)
        children = build_children(job, spec, launch, attempt)
        wanted_pods = [c for c in children if c["kind"] == "Pod"]
        failed = [p for p in current.values() if _pod_phase(p) == "Failed"]
        lost = (
            []
            if not placement.get("ungated")
            else [p for p in wanted_pods if p["metadata"]["name"] not in current]
        )
        if failed or lost:
            if failed:
                reason, message, retryable = pod_failure(failed[0])
            else:
                reason, message, retryable = "PodLost", f"pod {lost[0]['metadata']['name']} disappeared", True
            if retryable and restarts < spec.backoff_limit:
                for pod in current.values():
                    self.kube.delete_pod(ns, pod["metadata"]["name"])
                self.reservations.decided.pop(uid, None)
                text = f"{message}; restarting the whole Ray cluster (restart {restarts + 1} of {spec.backoff_limit})"
                self._write(
                    job,
                    "Pending",
                    "Restarting",
                    text,
                    {"attempt": attempt + 1, "restarts": restarts + 1, "placement": None, "nodes": ""},
                    [condition("Placed", False, "Restarting", text, gen, now)],
                    ("Warning", "Restarting", text),
                )
                return
            if retryable and spec.backoff_limit:
                reason, message = (
                    "BackoffLimitExceeded",
                    f"{message}; backoffLimit {spec.backoff_limit} reached",
                )
            self._fail(job, current.values(), reason, message)
            return

        head = next(
            (p for p in wanted_pods if p["metadata"]["labels"].get("verl-operator.io/role") == "head"), None
        )
        if head is not None and _pod_phase(current.get(head["metadata"]["name"], {})) == "Succeeded":
            for pod in current.values():
                if _pod_phase(pod) not in ("Succeeded", "Failed"):
                    self.kube.delete_pod(ns, pod["metadata"]["name"])
            self.reservations.decided.pop(uid, None)
            self._write(
                job,
                "Succeeded",
                "Succeeded",
                "the verl run finished",
                {"completionTime": now},
                [condition("Complete", True, "Succeeded", "the head pod exited 0", gen, now)],
                ("Normal", "Succeeded", "the verl run finished"),
            )
            return

        self._ensure_children(ns, children, current)
        if not placement.get("ungated"):
            pods_now = {p["metadata"]["name"]: p for p in self.kube.job_pods(ns, name)}
            if all(p["metadata"]["name"] in pods_now for p in wanted_pods):
                for pod in wanted_pods:
                    gates = pods_now[pod["metadata"]["name"]]["spec"].get("schedulingGates") or []
                    if any(g.get("name") == GANG_GATE for g in gates):
                        self.kube.ungate(ns, pod["metadata"]["name"])
                placement["ungated"] = True
                self._write(
                    job,
                    "Starting",
                    "PodsCreated",
                    f"{len(wanted_pods)} Ray pods created and released together",
                    {"placement": placement},
                    event=(
                        "Normal",
                        "PodsCreated",
                        f"{len(wanted_pods)} Ray pods created and ungated together",
                    ),
                )
            return
        running = [p for p in wanted_pods if _pod_phase(current.get(p["metadata"]["name"], {})) == "Running"]
        if len(running) == len(wanted_pods):
            where = ", ".join(
                f"{p['metadata']['name']}@{(current[p['metadata']['name']].get('spec') or {}).get('nodeName')}"
                for p in wanted_pods
            )
            self._write(
                job,
                "Running",
                "AllPodsRunning",
                f"{len(wanted_pods)} Ray pods running",
                conditions=[condition("Ready", True, "AllPodsRunning", where, gen, now)],
                event=("Normal", "Running", f"all Ray pods running: {where}"),
            )
        else:
            message = f"{len(running)} of {len(wanted_pods)} Ray pods running"
            blocked = _unschedulable(current.values())
            if blocked:
                message += f"; {blocked}"
            self._write(job, "Starting", "PodsStarting", message)

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
            if _pod_phase(pod) not in ("Succeeded", "Failed"):
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
            if _pod_phase(pod) not in ("Succeeded", "Failed") and not pod["metadata"].get(
                "deletionTimestamp"
            ):
                self.kube.delete_pod(meta["namespace"], pod["metadata"]["name"])
        ttl = spec.get("ttlSecondsAfterFinished")
        done = _parse_time((job.get("status") or {}).get("completionTime"))
        if ttl is not None and done is not None and self.clock() - done >= int(ttl):
            log.info(
                "deleting %s/%s: ttlSecondsAfterFinished %s passed", meta["namespace"], meta["name"], ttl
            )
            self.kube.event(job, "Normal", "Deleted", f"ttlSecondsAfterFinished {ttl} passed")
            self.kube.delete_job(meta["namespace"], meta["name"])


def _unschedulable(pods: Any) -> str:
    """The scheduler's reason for the first pod it cannot place (``PodScheduled=False``), if any."""
    for pod in sorted(pods, key=lambda p: p["metadata"]["name"]):
        for cond in (pod.get("status") or {}).get("conditions") or []:
            if cond.get("type") == "PodScheduled" and cond.get("status") == "False" and cond.get("message"):
                return f"pod {pod['metadata']['name']} not scheduled: {cond['message']}"
    return ""


def launch_json(children: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The parsed ``launch.json`` among built children (for callers that show it)."""
    cm = next(c for c in children if c["kind"] == "ConfigMap")
    doc: dict[str, Any] = json.loads(cm["data"][LAUNCH_KEY])
    return doc
