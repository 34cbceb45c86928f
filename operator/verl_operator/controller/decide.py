"""The reconciler's decisions, pure: what one pass observed in, a :class:`Transition` out.

:func:`decide` reads the job, its typed status, its pods and the cluster snapshot and returns what to do;
nothing here talks to the API server, logs or reads the wall clock (the planner's duration is measured for
the metrics). Order of the checks: a job being deleted is left alone; a finished job is only cleaned up;
an invalid spec is reported (keeping the pods of a placed job); a suspended job loses its pods; a job
without a placement for its attempt is planned and placed; a placed job's pods are assessed.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from pydantic import ValidationError

from verl_operator.api.errors import validation_violations
from verl_operator.api.spec import VerlJobSpec
from verl_operator.api.status import FINISHED_PHASES, StatusChange, StatusView, VerlJobStatus
from verl_operator.controller.assess import pod_phase
from verl_operator.controller.derived import overwritten, rederive
from verl_operator.controller.observed import Observed
from verl_operator.controller.pipeline import Planned, plan_and_place, status_plan
from verl_operator.controller.queue import ahead_of, rank
from verl_operator.controller.refused import (
    BLOCKED_REASONS,
    ChildBlocked,
    ChildRefused,
    gpu_limit,
    owner_uids,
)
from verl_operator.controller.running import run
from verl_operator.controller.status import condition, merge_conditions, parse_time
from verl_operator.controller.transition import Event, Transition, advance, on_change
from verl_operator.manifests.names import LABEL_ATTEMPT


def decide(seen: Observed) -> Transition:
    """The transition of one reconcile pass of an existing job (see the module docstring for the order)."""
    if seen.job["metadata"].get("deletionTimestamp"):
        return Transition()
    seen = own_pods(seen)
    if seen.status.phase in FINISHED_PHASES:
        live = live_pods(seen)
        if not live:
            return finished(seen)
        return unfinished(seen, live)
    derived, said = rederive(seen)
    return overwritten(_decide_unfinished(derived), derived, said)


def _decide_unfinished(seen: Observed) -> Transition:
    """:func:`decide` of a job whose phase is not a finished one."""
    try:
        spec = VerlJobSpec.model_validate(seen.job.get("spec") or {})
    except ValidationError as exc:
        return invalid_update(seen, exc) if seen.status.placement else invalid_spec(seen, exc)
    if spec.suspend:
        return suspend(seen)
    if not seen.status.placed:
        if refused_for_this_generation(seen):
            return Transition()  # the API server refused these pods: wait for a spec change
        due = blocked_until(seen.status, seen.generation)
        if due is not None and seen.now < due and not seen.retry_now:
            return Transition()  # the pods could not be created: wait for the retry (or a change)
        return place_job(seen, spec)
    return run(seen, spec)


def live_pods(seen: Observed) -> list[str]:
    """The pods of the current attempt that still run or wait to (not finished, not being deleted)."""
    attempt = str(seen.status.attempt)
    return [
        str(p["metadata"]["name"])
        for p in seen.pods
        if (p["metadata"].get("labels") or {}).get(LABEL_ATTEMPT) == attempt
        and pod_phase(p) not in ("Succeeded", "Failed")
        and not p["metadata"].get("deletionTimestamp")
    ]


def unfinished(seen: Observed, live: Sequence[str]) -> Transition:
    """A finished phase in status while pods of the current attempt still run: the operator never writes one
    without deleting them (its own write of a finished phase deletes them in the same pass), so the phase is
    not the operator's record (a status patched by hand) or its deletion did not happen. Status is derived
    from the world, never obeyed: the job is decided again from its pods as a placed job (the forged phase
    and completion time overwritten), with a Warning event naming the phase that was ignored. A job that did
    end is found ended again by the same evidence (the head's exit, a failed pod, a deadline)."""
    old = seen.status
    spec_doc = seen.job.get("spec") or {}
    try:
        spec = VerlJobSpec.model_validate(spec_doc)
    except ValidationError as exc:
        return invalid_update(seen, exc)
    believed = StatusChange(phase="Starting", completion_time=None).apply(old)
    decided = run(replace(seen, status=believed), spec)
    new = decided.status if decided.status is not None else believed
    text = (
        f"status.phase {old.phase} was not written by the operator: {len(live)} pods of attempt {old.attempt} "
        f"still run ({', '.join(live[:3])}); the status is derived from them ({new.phase})"
    )
    ended = new.phase in FINISHED_PHASES and decided.event is not None  # the pods show it ended after all
    event = decided.event if ended else Event("Warning", "StatusOverwritten", text)
    return replace(decided, status=new, event=event)


def own_pods(seen: Observed) -> Observed:
    """``seen`` with only the pods the job owns (by uid): a pod that merely carries the job's label is never
    counted, deleted or taken for one of the job's own."""
    uid = str(seen.job["metadata"].get("uid", ""))
    if all(uid in owner_uids(p) for p in seen.pods):
        return seen
    return replace(seen, pods=[p for p in seen.pods if uid in owner_uids(p)])


def next_attempt(old: VerlJobStatus, pods: Sequence[Mapping[str, Any]]) -> int:
    """The attempt after pods that could not all be created are deleted: the same one while none of them was
    bound to a node (gated, they never ran, and an unbound pod is gone at once, freeing its name), so the
    launcher of the attempt that runs still starts fresh (an attempt above 0 resumes from a checkpoint); the
    next one otherwise (a bound pod may still be terminating under its name)."""
    bound = any((p.get("spec") or {}).get("nodeName") for p in pods)
    return old.attempt + 1 if old.placement and bound else old.attempt


def refused_for_this_generation(seen: Observed) -> bool:
    """The API server refused this generation's pods (:func:`children_refused`): placing again cannot help."""
    status = seen.status
    return (
        status.phase == "Invalid"
        and status.reason == "PodsRefused"
        and status.observed_generation == seen.generation
    )


def children_refused(seen: Observed, exc: ChildRefused) -> Transition:
    """The API server refused a child for good (its schema, Pod Security, a quota): ``Invalid`` with the API
    server's message (``Valid=False``, ``Stalled``, a Warning event), every pod of the attempt deleted and the
    reservation released, so the job holds no GPUs; it is placed again once its spec changes."""
    seen = own_pods(seen)
    text = str(exc)
    old, gen, now = seen.status, seen.generation, seen.stamp
    new = advance(
        old,
        generation=gen,
        now=now,
        phase="Invalid",
        reason="PodsRefused",
        message=text,
        conditions=[
            condition("Valid", False, "PodsRefused", text, gen, now),
            condition("Placed", False, "PodsRefused", text, gen, now),
        ],
        changes=StatusChange(attempt=next_attempt(old, seen.pods)).unplaced(),
    )
    doomed = tuple(
        str(p["metadata"]["name"]) for p in seen.pods if not p["metadata"].get("deletionTimestamp")
    )
    event = on_change(old, new, Event("Warning", "PodsRefused", text))
    return Transition(status=new, event=event, delete=doomed, unreserve=True)


#: Seconds a job whose pods could not be created waits before it is placed and tried again the first time;
#: each later wait is as long as the job has been blocked so far (so it doubles), at most the maximum. A
#: PriorityClass change or a spec change tries it at once.
BLOCKED_RETRY_SECONDS = 10.0
BLOCKED_RETRY_MAX_SECONDS = 60.0
#: The condition that names what keeps a job's pods from being created (removed once they all exist).
CREATABLE = "PodsCreatable"


def retry_delay(first: float | None, last: float) -> float:
    """The wait after a block at ``last`` of a job blocked since ``first`` (the backoff of the module)."""
    blocked_for = last - first if first is not None else 0.0
    return min(BLOCKED_RETRY_MAX_SECONDS, max(BLOCKED_RETRY_SECONDS, blocked_for))


def blocked_until(status: VerlJobStatus, generation: int) -> float | None:
    """When a job whose pods could not be created (:func:`children_blocked`) is tried again: the time of its
    last block (its ``Placed`` condition's transition) plus :func:`retry_delay`; None when it is not waiting
    so (or its spec changed since: then it is tried at once)."""
    if status.phase != "Pending" or status.reason not in BLOCKED_REASONS:
        return None
    if status.observed_generation != generation:
        return None
    placed, creatable = status.condition("Placed"), status.condition(CREATABLE)
    last = (parse_time(placed.last_transition_time) if placed is not None else None) or 0.0
    first = parse_time(creatable.last_transition_time) if creatable is not None else None
    return last + retry_delay(first, last)


def blocked_retry_due(job: Mapping[str, Any]) -> float | None:
    """The epoch second at which the runtime should reconcile a blocked job again (None: not blocked)."""
    meta = job.get("metadata") or {}
    due = blocked_until(StatusView.of(job).parsed(), int(meta.get("generation", 1)))
    return None if due is None else due + 1.0


def children_blocked(seen: Observed, exc: ChildBlocked) -> Transition:
    """The cluster cannot take the job's children now (a missing ServiceAccount or PriorityClass, a quota, a
    name another object holds): ``Pending`` with the reason and a message naming the object and the cause,
    every pod of the attempt deleted and the placement and reservation released, so the job holds no GPUs.
    It is placed again after :func:`retry_delay`, at once when a PriorityClass or its spec changes; one
    Warning event per blocking object, not one per retry.
    """
    seen = own_pods(seen)
    old, gen, now = seen.status, seen.generation, seen.stamp
    before = old.condition(CREATABLE)
    first = parse_time(before.last_transition_time) if before is not None else None
    delay = retry_delay(first, seen.now)
    allowed = gpu_limit(exc.limited) if exc.reason == "QuotaExceeded" else None
    needed = old.plan.world_size if old.plan is not None else None
    short = (
        f" (the quota allows {allowed} GPUs in all, the job needs {needed}: raise the quota or lower "
        "spec.resources.gpus)"
        if allowed is not None and needed is not None and allowed < needed
        else ""
    )
    text = (
        f"{exc.summary()}{short}; the job holds no GPUs and is tried again in {delay:.0f}s, or at once when "
        f"its spec or a PriorityClass changes (the API server answered {exc.status}: {exc.api_message})"
    )
    new = advance(
        old,
        generation=gen,
        now=now,
        phase="Pending",
        reason=exc.reason,
        message=text,
        conditions=[
            condition("Placed", False, exc.reason, text, gen, now),
            condition(CREATABLE, False, exc.reason, text, gen, now),
        ],
        changes=StatusChange(attempt=next_attempt(old, seen.pods)).unplaced(),
    )
    doomed = tuple(
        str(p["metadata"]["name"]) for p in seen.pods if not p["metadata"].get("deletionTimestamp")
    )
    same = before is not None and before.reason == exc.reason and exc.blocker in before.message
    event = None if same else Event("Warning", exc.reason, text)
    return Transition(status=new, event=event, delete=doomed, unreserve=True)


def release_orphans(name: str, pods: Sequence[Mapping[str, Any]]) -> Transition:
    """The job ``name`` is gone: delete the pods it still owns, freeing their GPUs at once.

    The garbage collector would delete them too, but it learns a newly installed CRD's kind only at its
    next discovery refresh. Pods whose owner reference was removed (deleted with ``orphan`` propagation)
    are left alone.
    """
    doomed = []
    for pod in pods:
        owners = pod["metadata"].get("ownerReferences") or []
        owned = any(o.get("kind") == "VerlJob" and o.get("name") == name for o in owners)
        if owned and not pod["metadata"].get("deletionTimestamp"):
            doomed.append(str(pod["metadata"]["name"]))
    return Transition(delete=tuple(doomed))


def invalid_spec(seen: Observed, exc: ValidationError) -> Transition:
    """A spec the API models reject (no webhook in front): ``Invalid``, the errors as violations."""
    violations = validation_violations(exc)
    text = "; ".join(v.one_line() for v in violations)
    new = advance(
        seen.status,
        generation=seen.generation,
        now=seen.stamp,
        phase="Invalid",
        reason="InvalidSpec",
        message=text,
        conditions=[condition("Valid", False, "InvalidSpec", text, seen.generation, seen.stamp)],
        changes=StatusChange(violations=violations),
    )
    return Transition(status=new, event=on_change(seen.status, new, Event("Warning", "InvalidSpec", text)))


def invalid_update(seen: Observed, exc: ValidationError) -> Transition:
    """A placed job whose spec became invalid (no webhook): keep its pods and its phase, set ``Valid=False``.

    Only the ``Valid`` condition changes: the summary conditions keep describing the running attempt.
    """
    text = "; ".join(v.one_line() for v in validation_violations(exc))
    valid = condition(
        "Valid", False, "InvalidSpec", f"the new spec is invalid: {text}", seen.generation, seen.stamp
    )
    changes = StatusChange(
        observed_generation=seen.generation, conditions=merge_conditions(seen.status.conditions, [valid])
    )
    return Transition(status=changes.apply(seen.status))


def suspend(seen: Observed) -> Transition:
    """``spec.suspend``: delete every pod, keep the job; resuming starts a new attempt (new pod names)."""
    old = seen.status
    next_attempt = old.attempt + 1 if old.placement else old.attempt
    new = advance(
        old,
        generation=seen.generation,
        now=seen.stamp,
        phase="Suspended",
        reason="Suspended",
        message="spec.suspend is true: pods deleted, the job is kept",
        conditions=[condition("Placed", False, "Suspended", "suspended", seen.generation, seen.stamp)],
        changes=StatusChange(attempt=next_attempt).unplaced(),
    )
    return Transition(
        status=new,
        event=on_change(old, new, Event("Normal", "Suspended", "spec.suspend is true: Ray pods deleted")),
        delete=tuple(str(p["metadata"]["name"]) for p in seen.pods),
        unreserve=True,
    )


def finished(seen: Observed) -> Transition:
    """A Succeeded or Failed job: delete pods still running; delete the job once its TTL has passed."""
    doomed = tuple(
        str(p["metadata"]["name"])
        for p in seen.pods
        if pod_phase(p) not in ("Succeeded", "Failed") and not p["metadata"].get("deletionTimestamp")
    )
    ttl = (seen.job.get("spec") or {}).get("ttlSecondsAfterFinished")
    done = parse_time(seen.status.completion_time)
    if ttl is not None and done is not None and seen.now - done >= int(ttl):
        event = Event("Normal", "Deleted", f"ttlSecondsAfterFinished {ttl} passed")
        return Transition(event=event, delete=doomed, delete_job=True, unreserve=True)
    return Transition(delete=doomed, unreserve=True)


def place_job(seen: Observed, spec: VerlJobSpec) -> Transition:
    """Plan the job on the snapshot's nodes and place it (or hand it to Kueue/Volcano, or wait)."""
    meta = seen.job["metadata"]
    uid = str(meta["uid"])
    snap = seen.snapshot
    mine = rank(
        snap.priorities.of(spec.scheduling.priority_class_name),
        str(meta.get("creationTimestamp") or ""),
        f"{meta.get('namespace', '')}/{meta.get('name', '')}",
    )
    ahead = ahead_of(snap.queue, mine, uid, snap.priorities)
    started = time.perf_counter()
    outcome = plan_and_place(spec, snap, seen.reserved, attempt=seen.status.attempt, job_uid=uid, ahead=ahead)
    elapsed = time.perf_counter() - started
    old, gen, now = seen.status, seen.generation, seen.stamp
    new, placed = _placed_status(old, outcome, gen, now)
    event: Event | None = placed
    if new.plan is not None:  # bounded: the status never repeats user input of unbounded size
        new = StatusChange(plan=status_plan(new.plan, spec)).apply(new)
    if old.reason in BLOCKED_REASONS and new.phase == "Starting":
        event = None  # the retry of a job whose pods could not be created: its warning said enough
    reserve = None
    if outcome.placement is not None and outcome.placement.nodes:
        reserve = (tuple(outcome.placement.nodes), int(outcome.placement.gpus_per_node or 0))
    return Transition(
        status=new,
        event=on_change(old, new, event) if event is not None else None,
        reserve=reserve,
        planning_seconds=elapsed,
    )


def _infeasible_status(
    old: VerlJobStatus, outcome: Planned, gen: int, now: str
) -> tuple[VerlJobStatus, Event]:
    """No plan: ``Invalid`` with the planner's violations."""
    text = "; ".join(v.one_line() for v in outcome.violations)
    conds = [
        condition("Valid", False, "PlanInfeasible", text, gen, now),
        condition("Planned", False, "PlanInfeasible", text, gen, now),
    ]
    new = advance(
        old,
        generation=gen,
        now=now,
        phase="Invalid",
        reason="PlanInfeasible",
        message=text,
        conditions=conds,
        changes=StatusChange(violations=list(outcome.violations), plan=None, mesh=""),
    )
    return new, Event("Warning", "PlanInfeasible", text)


#: Violations about today's cluster, not the spec: the job waits (``Pending``) until nodes come back or join.
CAPACITY_RULES = frozenset({"not-enough-gpus", "no-eligible-nodes"})


def _capacity_status(old: VerlJobStatus, outcome: Planned, gen: int, now: str) -> tuple[VerlJobStatus, Event]:
    """No plan only because the cluster is too small or its nodes are gone today: ``Pending``, not Invalid."""
    text = "; ".join(v.one_line() for v in outcome.violations)
    conds = [
        condition(
            "Valid",
            True,
            "InsufficientCapacity",
            "the spec is valid; the cluster lacks capacity now",
            gen,
            now,
        ),
        condition("Planned", False, "InsufficientCapacity", text, gen, now),
        condition("Placed", False, "InsufficientCapacity", text, gen, now),
    ]
    new = advance(
        old,
        generation=gen,
        now=now,
        phase="Pending",
        reason="InsufficientCapacity",
        message=text,
        conditions=conds,
        changes=StatusChange(violations=list(outcome.violations), plan=None, mesh="").unplaced(),
    )
    return new, Event("Normal", "WaitingForCapacity", text)


def _placed_status(old: VerlJobStatus, outcome: Planned, gen: int, now: str) -> tuple[VerlJobStatus, Event]:
    """The status and event of a planning outcome: Invalid, Pending (no capacity), or Starting."""
    if outcome.plan is None:
        if outcome.violations and all(v.rule in CAPACITY_RULES for v in outcome.violations):
            return _capacity_status(old, outcome, gen, now)
        return _infeasible_status(old, outcome, gen, now)
    mesh = outcome.mesh
    conds = [
        condition("Valid", True, "Planned", "spec is valid for the cluster's GPUs", gen, now),
        condition("Planned", True, "Planned", mesh, gen, now),
    ]
    changes = StatusChange(plan=outcome.plan, mesh=mesh, violations=None)
    placement = outcome.placement
    if placement is None:
        why = "Queued" if outcome.queued else "InsufficientCapacity"
        conds.append(condition("Placed", False, why, outcome.message, gen, now))
        new = advance(
            old,
            generation=gen,
            now=now,
            phase="Pending",
            reason=why,
            message=outcome.message,
            conditions=conds,
            changes=changes.unplaced(),
        )
        return new, Event("Normal", "Queued" if outcome.queued else "WaitingForCapacity", outcome.message)
    changes |= StatusChange(placement=placement, start_time=old.start_time or now)
    if placement.handoff is not None:
        who = placement.handoff
        conds.append(condition("Placed", "Unknown", "HandedOff", f"placement by {who}", gen, now))
        new = advance(
            old,
            generation=gen,
            now=now,
            phase="Starting",
            reason="HandedOff",
            message=f"gang placement handed to {who}",
            conditions=conds,
            changes=changes,
        )
        return new, Event("Normal", "HandedOff", f"plan {mesh}; placement handed to {who}")
    conds.append(condition("Placed", True, "Placed", placement.message, gen, now))
    changes |= StatusChange(nodes=",".join(placement.nodes))
    new = advance(
        old,
        generation=gen,
        now=now,
        phase="Starting",
        reason="Placed",
        message=placement.message,
        conditions=conds,
        changes=changes,
    )
    return new, Event("Normal", "Placed", f"plan {mesh}; {placement.message}")


def scheduler_unavailable(seen: Observed, exc: Exception) -> Transition:
    """A kind the job needs is not served (Volcano's PodGroup without Volcano): ``Pending``, say so."""
    new = advance(
        seen.status,
        generation=seen.generation,
        now=seen.stamp,
        phase="Pending",
        reason="SchedulerUnavailable",
        message=str(exc),
    )
    return Transition(
        status=new, event=on_change(seen.status, new, Event("Warning", "SchedulerUnavailable", str(exc)))
    )
