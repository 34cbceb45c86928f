"""Decisions for a placed attempt: create and release its pods, then follow them to the end (pure).

:func:`run` carries out the :func:`~verl_operator.controller.assess.assess` verdict of the current attempt's
pods as a :class:`~verl_operator.controller.transition.Transition`; pods of earlier attempts are deleted in
every case.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from verl_operator.api.spec import VerlJobSpec
from verl_operator.api.status import Condition, Phase, StatusChange, VerlJobStatus
from verl_operator.controller.assess import Verdict, assess, pod_phase
from verl_operator.controller.kueue import kueue_transition
from verl_operator.controller.pipeline import children_of
from verl_operator.controller.status import condition, parse_time
from verl_operator.controller.transition import Event, Transition, advance, on_change
from verl_operator.manifests.names import GANG_GATE, LABEL_ATTEMPT

if TYPE_CHECKING:
    from verl_operator.controller.observed import Observed

Pods = Mapping[str, Mapping[str, Any]]


def _name(pod: Mapping[str, Any]) -> str:
    return str(pod["metadata"]["name"])


def run(seen: Observed, spec: VerlJobSpec) -> Transition:
    """The transition of a placed job, from the pods of its current attempt."""
    status = seen.status
    current = {
        _name(p): p
        for p in seen.pods
        if p["metadata"].get("labels", {}).get(LABEL_ATTEMPT) == str(status.attempt)
    }
    stale = tuple(
        _name(p) for p in seen.pods if _name(p) not in current and not p["metadata"].get("deletionTimestamp")
    )
    children = children_of(seen.job, spec, status, seen.launcher_image)
    wanted = [str(c["metadata"]["name"]) for c in children if c["kind"] == "Pod"]
    handed = kueue_transition(seen, wanted, current, stale)  # Kueue holds or evicted the pods
    if handed is not None:
        return handed
    started = parse_time(status.start_time)
    on_nodes = list(zip(wanted, status.placement.nodes if status.placement else [], strict=False))
    gone = tuple((node, pod) for pod, node in on_nodes if seen.node_states.get(node) == "deleted")
    verdict = assess(
        wanted,
        current,
        released=bool(status.placement and status.placement.ungated),
        restarts=status.restarts,
        backoff_limit=spec.backoff_limit,
        elapsed=None if started is None else seen.now - started,
        deadline=spec.active_deadline_seconds,
        nodes_gone=gone,
    )
    if verdict.action in ("fail", "restart", "succeed"):
        return _end_attempt(seen, verdict, current, stale)
    sick = [(node, pod) for pod, node in on_nodes if seen.node_states.get(node) == "NotReady"]
    if sick and verdict.action in ("running", "starting"):
        return _node_not_ready(seen, sick, stale)
    if verdict.action == "create":
        return _create(seen, tuple(children), wanted, current, stale)
    if verdict.action == "running":
        return _running(seen, verdict, wanted, current, stale)
    new = _advance(seen, "Starting", verdict.reason, verdict.message)
    return Transition(status=new, delete=stale)


def _advance(
    seen: Observed,
    phase: Phase,
    reason: str,
    message: str,
    conditions: Sequence[Condition] = (),
    changes: StatusChange | None = None,
) -> VerlJobStatus:
    return advance(
        seen.status,
        generation=seen.generation,
        now=seen.stamp,
        phase=phase,
        reason=reason,
        message=message,
        conditions=conditions,
        changes=changes,
    )


def _end_attempt(seen: Observed, verdict: Verdict, current: Pods, stale: tuple[str, ...]) -> Transition:
    """Fail, restart (a new attempt, the whole Ray cluster) or succeed; the attempt's pods go."""
    gen, now, status = seen.generation, seen.stamp, seen.status
    live = tuple(n for n, p in current.items() if pod_phase(p) not in ("Succeeded", "Failed"))
    if verdict.action == "restart":
        new = _advance(
            seen,
            "Pending",
            "Restarting",
            verdict.message,
            conditions=[condition("Placed", False, "Restarting", verdict.message, gen, now)],
            changes=StatusChange(attempt=status.attempt + 1, restarts=status.restarts + 1).unplaced(),
        )
        event = Event("Warning", "Restarting", verdict.message)
        return Transition(
            status=new, event=on_change(status, new, event), delete=stale + tuple(current), unreserve=True
        )
    if verdict.action == "succeed":
        new = _advance(
            seen,
            "Succeeded",
            "Succeeded",
            verdict.message,
            conditions=[condition("Complete", True, "Succeeded", "the head pod exited 0", gen, now)],
            changes=StatusChange(completion_time=now),
        )
        event = Event("Normal", "Succeeded", verdict.message)
    else:
        new = _advance(
            seen,
            "Failed",
            verdict.reason,
            verdict.message,
            conditions=[condition("Failed", True, verdict.reason, verdict.message, gen, now)],
            changes=StatusChange(completion_time=now),
        )
        event = Event("Warning", verdict.reason, verdict.message)
    return Transition(status=new, event=on_change(status, new, event), delete=stale + live, unreserve=True)


def _node_not_ready(seen: Observed, sick: list[tuple[str, str]], stale: tuple[str, ...]) -> Transition:
    """A chosen node is NotReady: keep the phase and the pods, say so (``Ready=False``, an event naming it).

    The pods stay: a kubelet that comes back finds them running. Should the node lifecycle controller evict
    them, or the node be deleted, the attempt ends as a failure and restarts per ``backoffLimit``.
    """
    node, pod = sick[0]
    more = f" (and {len(sick) - 1} more nodes)" if len(sick) > 1 else ""
    text = f"node {node} of pod {pod} is NotReady{more}; the pods are kept until it returns or is deleted"
    phase = seen.status.phase if seen.status.phase in ("Starting", "Running") else "Starting"
    ready = condition("Ready", False, "NodeNotReady", text, seen.generation, seen.stamp)
    new = _advance(seen, phase, "NodeNotReady", text, conditions=[ready])
    event = Event("Warning", "NodeNotReady", text)
    return Transition(status=new, event=on_change(seen.status, new, event), delete=stale)


def _create(
    seen: Observed,
    children: tuple[Mapping[str, Any], ...],
    wanted: list[str],
    current: Pods,
    stale: tuple[str, ...],
) -> Transition:
    """Create the missing children; once every pod exists, release the gang gates and record that."""
    missing = tuple(c for c in children if c["kind"] != "Pod" or c["metadata"]["name"] not in current)
    if not all(n in current for n in wanted):
        return Transition(create=missing, delete=stale, recheck=True)
    gated = tuple(
        n
        for n in wanted
        if any(
            g.get("name") == GANG_GATE for g in (current[n].get("spec") or {}).get("schedulingGates") or []
        )
    )
    assert seen.status.placement is not None  # run() is only called for a placed job
    text = f"{len(wanted)} Ray pods created and released together"
    placement = seen.status.placement.changed(ungated=True)
    new = _advance(seen, "Starting", "PodsCreated", text, changes=StatusChange(placement=placement))
    if new.condition("PodsCreatable") is not None:  # what kept the pods from being created has gone
        kept = [c for c in new.conditions if c.type != "PodsCreatable"]
        new = StatusChange(conditions=kept).apply(new)
    event = Event("Normal", "PodsCreated", text)
    return Transition(
        status=new, event=on_change(seen.status, new, event), create=missing, delete=stale, ungate=gated
    )


def _running(
    seen: Observed, verdict: Verdict, wanted: list[str], current: Pods, stale: tuple[str, ...]
) -> Transition:
    """Every pod runs: ``Running``, and ``Ready`` names each pod and its node."""
    where = ", ".join(f"{n}@{(current[n].get('spec') or {}).get('nodeName')}" for n in wanted)
    ready = condition("Ready", True, verdict.reason, where, seen.generation, seen.stamp)
    new = _advance(seen, "Running", verdict.reason, verdict.message, conditions=[ready])
    event = Event("Normal", "Running", f"all Ray pods running: {where}")
    return Transition(status=new, event=on_change(seen.status, new, event), delete=stale)
