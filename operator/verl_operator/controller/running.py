"""Decisions for a placed attempt: create and release its pods, then follow them to the end (pure).

:func:`run` carries out the :func:`~verl_operator.controller.assess.assess` verdict of the current attempt's
pods as a :class:`~verl_operator.controller.transition.Transition`; pods of earlier attempts are deleted in
every case.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from verl_contract.progress import ProgressDocument
from verl_contract.verl_metrics import StepRecord
from verl_operator.advisor import advise, analyse
from verl_operator.api.spec import VerlJobSpec
from verl_operator.api.status import Condition, Phase, ProgressAdvice, StatusChange, VerlJobStatus
from verl_operator.controller.assess import Verdict, assess, pod_phase
from verl_operator.controller.kueue import kueue_transition
from verl_operator.controller.pipeline import children_of, pod_names
from verl_operator.controller.podstart import STARTABLE, Stuck, stuck
from verl_operator.controller.progress import STALL_REASONS, Followed, follow
from verl_operator.controller.status import bounded, condition, format_time, merge_conditions, parse_time
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
    wanted = pod_names(seen.job, status)  # the manifests themselves only when something is to be created
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
        children = children_of(seen.job, spec, status, seen.launcher_image)
        return _create(seen, tuple(children), wanted, current, stale)
    if verdict.action == "starting":
        blocked = stuck(wanted, current)
        if blocked is not None:
            return _cannot_start(seen, spec, blocked, current, stale)
    if verdict.action == "running":
        followed = _follow(seen, spec)
        if followed is not None and followed.stalled is not None and followed.action != "none":
            return _end_attempt(seen, _stall_verdict(seen, spec, followed), current, stale)
        return _running(seen, verdict, wanted, current, stale, followed)
    new = _started(_advance(seen, "Starting", verdict.reason, verdict.message))
    return Transition(status=new, delete=stale)


def progress_only(
    seen: Observed, spec: VerlJobSpec, verdict: Verdict, wanted: Sequence[str], current: Pods
) -> Transition | None:
    """A Running job's pass when nothing but its progress can have changed since a pass of :func:`run` found
    every pod running (``verdict``, ``wanted``, ``current``: that pass's): the progress, ``Progressing`` and
    ``Stalled`` as :func:`run` writes them, without planning names or assessing pods again.

    The caller guarantees the job (apart from the operator's own status writes), its pods and its nodes'
    states are those of that pass. What time alone can change is checked again: None (decide the whole
    pass) when ``activeDeadlineSeconds`` has passed or a stall asks to end the attempt.
    """
    started = parse_time(seen.status.start_time)
    deadline = spec.active_deadline_seconds
    if deadline is not None and (started is None or seen.now - started > deadline):
        return None
    if seen.status.phase != "Running" or seen.status.placement is None:
        return None
    followed = _follow(seen, spec)
    if followed is not None and followed.stalled is not None and followed.action != "none":
        return None
    return _running(seen, verdict, list(wanted), current, (), followed)


def _started(status: VerlJobStatus) -> VerlJobStatus:
    """``status`` without the :data:`STARTABLE` condition: no container waits to be started any more."""
    if status.condition(STARTABLE) is None:
        return status
    return StatusChange(conditions=[c for c in status.conditions if c.type != STARTABLE]).apply(status)


def _cannot_start(
    seen: Observed, spec: VerlJobSpec, blocked: Stuck, current: Pods, stale: tuple[str, ...]
) -> Transition:
    """A container of the attempt cannot be started: the GPUs go back at once for a permanent reason, after
    ``spec.startDeadlineSeconds`` for a transient one (counted from the pass that first saw it: the
    :data:`STARTABLE` condition's transition); meanwhile ``Starting`` with the reason and the time."""
    gen, now, old = seen.generation, seen.stamp, seen.status
    before = old.condition(STARTABLE)
    since = parse_time(before.last_transition_time) if before is not None else None
    since = seen.now if since is None else since
    limit = spec.start_deadline_seconds
    placement = old.placement
    gpus = len(placement.nodes) * int(placement.gpus_per_node or 0) if placement is not None else 0
    held = f"{gpus} GPUs" if gpus else "its GPUs"
    cond = condition(STARTABLE, False, blocked.reason, blocked.message, gen, now)
    if blocked.permanent or seen.now - since >= limit:
        reason = blocked.reason if blocked.permanent else "StartDeadlineExceeded"
        waited = "" if blocked.permanent else f"; not started within spec.startDeadlineSeconds {limit}"
        text = f"{blocked.message}{waited}; the Ray pods are deleted and {held} given back"
        verdict = Verdict("fail", reason, text)
        ended = _end_attempt(seen, verdict, current, stale)
        assert ended.status is not None  # _end_attempt always writes a status
        return replace(ended, status=StatusChange(conditions=_merged(ended.status, cond)).apply(ended.status))
    due = format_time(since + limit)
    text = (
        f"{blocked.message}; the job holds {held} and gives them back at {due} unless the pods start "
        f"(spec.startDeadlineSeconds {limit})"
    )
    new = _advance(seen, "Starting", blocked.reason, text, conditions=[cond])
    event = Event("Warning", blocked.reason, text)
    return Transition(status=new, event=on_change(old, new, event), delete=stale)


def _merged(status: VerlJobStatus, cond: Condition) -> list[Condition]:
    return merge_conditions(status.conditions, [cond])


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
        new = _started(new)  # the next attempt's containers are judged afresh
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


def _follow(seen: Observed, spec: VerlJobSpec) -> Followed | None:
    """The progress of a Running job from its head pod's reading (None: not read, or monitoring off).

    Only a ``status.progress`` the reconciling process wrote itself is kept between two writes (the rate
    limit, the advice of the step): another one (written by hand, or before this process started) is replaced
    by the reading at once, or removed while the head cannot be read. Nothing decides on it either way: a
    stall is judged on the reading alone (its ages come from the launcher's clock).
    """
    if seen.progress is None or not spec.monitoring.enabled:
        return None
    before = seen.status.condition("Stalled")
    stalled = (
        before
        if before is not None and before.status == "True" and before.reason in STALL_REASONS.values()
        else None
    )
    followed = follow(
        seen.status.progress if seen.progress_writer == "own" else None,
        seen.progress,
        spec.monitoring,
        stalled_before=stalled,
        now=seen.now,
        generation=seen.generation,
        advise=lambda doc: _advise(seen, spec, doc),
    )
    forged = seen.status.progress
    if seen.progress_writer != "other" or forged is None or followed.event is not None:
        return followed
    got = followed.progress
    instead = (
        f"the head pod's reading is written instead (step {got.step})"
        if got is not None
        else "removed: the head pod's progress endpoint cannot be read"
    )
    text = (
        f"status.progress (step {forged.step}, updated {forged.updated_at or 'never'}) was not written by the "
        f"operator: {instead}"
    )
    return replace(followed, event=Event("Warning", "StatusOverwritten", text))


def _advise(seen: Observed, spec: VerlJobSpec, doc: ProgressDocument) -> ProgressAdvice | None:
    """The advisor's first change for the run's recent steps, re-planned on the job's own nodes."""
    plan = seen.status.plan
    if plan is None or not seen.nodes:
        return None
    records = [
        StepRecord(s.step, {"timing_s/step": s.seconds, **{f"timing_s/{k}": v for k, v in s.phases.items()}})
        for s in doc.recent
    ]
    report = advise(analyse(records), spec=spec, plan=plan, nodes=seen.nodes)
    if not report.advice:
        return None
    first = report.advice[0]
    return ProgressAdvice(setting=first.setting, value=json.dumps(first.value), reason=bounded(first.reason))


def _stall_verdict(seen: Observed, spec: VerlJobSpec, followed: Followed) -> Verdict:
    """A stall whose action is restart (within backoffLimit) or fail ends the attempt."""
    assert followed.stalled is not None
    reason, message = followed.stalled
    restarts = seen.status.restarts
    if followed.action == "restart" and restarts < spec.backoff_limit:
        return Verdict(
            "restart", "Stalled", f"{message}; restart {restarts + 1} of backoffLimit {spec.backoff_limit}"
        )
    if followed.action == "restart":
        return Verdict("fail", reason, f"{message}; backoffLimit {spec.backoff_limit} reached")
    return Verdict("fail", reason, message)


def _running(
    seen: Observed,
    verdict: Verdict,
    wanted: list[str],
    current: Pods,
    stale: tuple[str, ...],
    followed: Followed | None = None,
) -> Transition:
    """Every pod runs: ``Running``, and ``Ready`` names each pod and its node; with a progress reading,
    ``status.progress``, ``Progressing`` (and ``Stalled`` while no step comes in time)."""
    where = ", ".join(f"{n}@{(current[n].get('spec') or {}).get('nodeName')}" for n in wanted)
    ready = condition("Ready", True, verdict.reason, where, seen.generation, seen.stamp)
    conditions = [ready, *(followed.conditions if followed is not None else ())]
    changes = StatusChange(progress=followed.progress) if followed is not None else None
    new = _started(
        _advance(seen, "Running", verdict.reason, verdict.message, conditions=conditions, changes=changes)
    )
    event = on_change(seen.status, new, Event("Normal", "Running", f"all Ray pods running: {where}"))
    if event is None and followed is not None:
        event = followed.event
    return Transition(status=new, event=event, delete=stale)
