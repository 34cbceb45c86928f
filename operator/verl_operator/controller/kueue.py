"""A placed job handed to Kueue (``spec.scheduling.queueName``): what Kueue did to its pods, as decisions (pure).

Kueue's pod-group integration admits the Ray pods of one attempt as one Workload (named after the
``kueue.x-k8s.io/pod-group-name`` label, ``<job>-r<attempt>``): its webhook puts the scheduling gate
``kueue.x-k8s.io/admission`` on each pod when it is created, and Kueue removes the gate from all of them once
the Workload is admitted (quota reserved in a ClusterQueue). To preempt, Kueue marks every pod of the group
with the condition ``TerminationTarget`` (reason ``WorkloadEvicted``, its message naming the preemptor) and
deletes them. :func:`kueue_transition` turns those into the job's status:

- pods gated by Kueue: ``Pending``, reason ``NotAdmitted``, with the message of the Workload's
  ``QuotaReserved`` (or ``Admitted``) condition; once Kueue removed every gate, ``Placed=True`` (``Admitted``);
- pods evicted by Kueue: ``Pending``, reason ``Preempted``, with Kueue's message; the next attempt is placed
  (a new pod group, which Kueue gates again until it has quota again). ``status.restarts`` is unchanged: a
  preemption is not a failure of the job, and never counts against ``spec.backoffLimit``. The condition
  ``Preempted`` (``True``, Kueue's message) stays until Kueue admits a later attempt (then ``False``).

The reconciler reads the Workload only for such a job (:func:`wants_workload`), and the runtime reconciles
a job waiting for Kueue's admission every :data:`POLL_SECONDS` (:func:`poll_due`): the Workload's message can
change while the pods do not. Admission and eviction reach the operator at once through the pods.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from verl_operator.api.status import FINISHED_PHASES, StatusChange, StatusView, VerlJobStatus
from verl_operator.controller.assess import pod_phase
from verl_operator.controller.status import condition
from verl_operator.controller.transition import Event, Transition, advance, on_change
from verl_operator.manifests.children import KUEUE_GROUP_LABEL
from verl_operator.manifests.names import LABEL_ATTEMPT

if TYPE_CHECKING:
    from verl_operator.controller.observed import Observed

#: The scheduling gate Kueue's pod webhook sets on a pod of a queue until its Workload is admitted.
ADMISSION_GATE = "kueue.x-k8s.io/admission"
#: The pod condition Kueue sets before it deletes the pods of a Workload it stops (``pod_controller.go``).
TERMINATION_TARGET = "TerminationTarget"
#: Kueue's API group and the versions of its Workload, newest first (v1beta2 since Kueue 0.15).
WORKLOAD_GROUP = "kueue.x-k8s.io"
WORKLOAD_VERSIONS = ("v1beta2", "v1beta1")
#: Seconds between two reads of the Workload of a job whose pods Kueue has not admitted yet.
POLL_SECONDS = 10.0
#: The job's status reasons set here.
NOT_ADMITTED = "NotAdmitted"
ADMITTED = "Admitted"
PREEMPTED = "Preempted"


def _conditions(obj: Mapping[str, Any] | None) -> list[Mapping[str, Any]]:
    return list(((obj or {}).get("status") or {}).get("conditions") or [])


def kueue_gated(pods: Iterable[Mapping[str, Any]]) -> list[str]:
    """Names of the pods that still carry Kueue's admission gate."""
    return sorted(
        str(p["metadata"]["name"])
        for p in pods
        if any(g.get("name") == ADMISSION_GATE for g in (p.get("spec") or {}).get("schedulingGates") or [])
    )


def eviction(pods: Iterable[Mapping[str, Any]]) -> tuple[str, str] | None:
    """``(reason, message)`` of Kueue's ``TerminationTarget`` condition on the first pod that has it (by name)."""
    for pod in sorted(pods, key=lambda p: str(p["metadata"]["name"])):
        for cond in _conditions(pod):
            if cond.get("type") == TERMINATION_TARGET and cond.get("status") == "True":
                return str(cond.get("reason") or "WorkloadEvicted"), str(cond.get("message") or "")
    return None


def workload_eviction(workload: Mapping[str, Any] | None) -> str | None:
    """The message of the Workload's ``Evicted=True`` condition (Kueue preempted or evicted it), else None."""
    for cond in _conditions(workload):
        if cond.get("type") == "Evicted" and cond.get("status") == "True":
            return str(cond.get("message") or cond.get("reason") or "evicted by Kueue")
    return None


def workload_wait(workload: Mapping[str, Any] | None) -> str:
    """Why Kueue has not admitted the Workload: the message of its ``QuotaReserved=False`` condition, else of
    ``Admitted=False``, else that Kueue has not looked at it yet."""
    by_type = {str(c.get("type")): c for c in _conditions(workload)}
    for kind in ("QuotaReserved", "Admitted"):
        cond = by_type.get(kind)
        if cond is not None and cond.get("status") != "True" and cond.get("message"):
            return str(cond["message"])
    if workload is None:
        return "Kueue has not created the pod group's Workload yet"
    return "Kueue has not evaluated the Workload yet"


def group_of(seen: Observed) -> str | None:
    """The pod group (and Workload) name of the job's current attempt, from its pods (None: no pod yet)."""
    attempt = str(seen.status.attempt)
    for pod in seen.pods:
        labels = pod["metadata"].get("labels") or {}
        if labels.get(LABEL_ATTEMPT) == attempt and labels.get(KUEUE_GROUP_LABEL):
            return str(labels[KUEUE_GROUP_LABEL])
    return None


def wants_workload(status: VerlJobStatus, pods: Sequence[Mapping[str, Any]]) -> bool:
    """Whether a pass should read the Workload: a job handed to Kueue whose pods were all created and are
    gated by Kueue, or are being deleted, or are gone (Kueue may have evicted them)."""
    placement = status.placement
    if placement is None or placement.handoff != "Kueue" or not placement.ungated:
        return False
    attempt = str(status.attempt)
    mine = [p for p in pods if (p["metadata"].get("labels") or {}).get(LABEL_ATTEMPT) == attempt]
    return not mine or bool(kueue_gated(mine)) or any(p["metadata"].get("deletionTimestamp") for p in mine)


def kueue_transition(
    seen: Observed,
    wanted: Sequence[str],
    current: Mapping[str, Mapping[str, Any]],
    stale: tuple[str, ...],
) -> Transition | None:
    """The transition of a placed job handed to Kueue when Kueue holds or evicted its pods, else None.

    Args:
        seen: The pass's observations (``seen.workload``: the attempt's Workload, when it was read).
        wanted: Pod names of the attempt, head first.
        current: Existing pods of the attempt by name.
        stale: Pods of earlier attempts to delete.

    Returns:
        ``Preempted`` (the next attempt) when Kueue evicted the pods; ``NotAdmitted`` while every pod exists
        and Kueue's gate holds them; None otherwise (the usual decisions apply).
    """
    status = seen.status
    placement = status.placement
    if placement is None or placement.handoff != "Kueue":
        return None
    evicted = eviction(current.values())
    missing = [n for n in wanted if n not in current]
    if evicted is None and placement.ungated and missing:
        why = workload_eviction(seen.workload)
        evicted = ("WorkloadEvicted", why) if why is not None else None
    if evicted is not None:
        return preempted(seen, evicted[1], tuple(current), stale)
    gated = kueue_gated(current.values())
    if placement.ungated and not missing and gated:
        return not_admitted(seen, gated, stale)
    placed = status.condition("Placed")
    if placement.ungated and not missing and placed is not None and placed.reason == NOT_ADMITTED:
        return admitted(seen, stale)
    return None


def preempted(seen: Observed, message: str, current: tuple[str, ...], stale: tuple[str, ...]) -> Transition:
    """Kueue evicted the attempt's pods: ``Pending`` (``Preempted``), the next attempt, restarts unchanged."""
    old, gen, now = seen.status, seen.generation, seen.stamp
    text = (
        f"Kueue evicted the Ray pods of attempt {old.attempt}: {message or 'preempted'}; the job waits in "
        f"its queue for Kueue to admit attempt {old.attempt + 1} (not counted as a restart)"
    )
    new = advance(
        old,
        generation=gen,
        now=now,
        phase="Pending",
        reason=PREEMPTED,
        message=text,
        conditions=[
            condition("Placed", False, PREEMPTED, text, gen, now),
            # Kept while the next attempt is placed and waits: the phase's reason moves on, this stays.
            condition(PREEMPTED, True, "WorkloadEvicted", text, gen, now),
        ],
        changes=StatusChange(attempt=old.attempt + 1).unplaced(),
    )
    live = tuple(
        n
        for n in current
        if pod_phase(next(p for p in seen.pods if p["metadata"]["name"] == n)) not in ("Succeeded", "Failed")
    )
    event = on_change(old, new, Event("Warning", PREEMPTED, text))
    return Transition(status=new, event=event, delete=stale + live, unreserve=True)


def not_admitted(seen: Observed, gated: Sequence[str], stale: tuple[str, ...]) -> Transition:
    """Every pod exists and Kueue's gate holds them: ``Pending`` (``NotAdmitted``) with Kueue's reason."""
    old, gen, now = seen.status, seen.generation, seen.stamp
    group = group_of(seen) or "?"
    text = (
        f"Kueue has not admitted pod group {group} ({len(gated)} pods gated by {ADMISSION_GATE}, none on a "
        f"node): {workload_wait(seen.workload)}"
    )
    new = advance(
        old,
        generation=gen,
        now=now,
        phase="Pending",
        reason=NOT_ADMITTED,
        message=text,
        conditions=[condition("Placed", False, NOT_ADMITTED, text, gen, now)],
    )
    event = on_change(old, new, Event("Normal", NOT_ADMITTED, text))
    return Transition(status=new, event=event, delete=stale)


def admitted(seen: Observed, stale: tuple[str, ...]) -> Transition:
    """Kueue removed its gate from every pod of a job it held: ``Placed=True`` (``Admitted``), ``Starting``
    until the pods run (the next pass follows them as any other job's)."""
    old, gen, now = seen.status, seen.generation, seen.stamp
    text = f"Kueue admitted pod group {group_of(seen) or '?'}: the scheduler places its pods"
    new = advance(
        old,
        generation=gen,
        now=now,
        phase="Starting",
        reason=ADMITTED,
        message=text,
        conditions=[
            condition("Placed", True, ADMITTED, text, gen, now),
            *(
                [condition(PREEMPTED, False, ADMITTED, f"attempt {old.attempt} admitted", gen, now)]
                if (before := old.condition(PREEMPTED)) is not None and before.status == "True"
                else []
            ),
        ],
    )
    return Transition(status=new, event=on_change(old, new, Event("Normal", ADMITTED, text)), delete=stale)


def poll_due(job: Mapping[str, Any], now: float) -> float | None:
    """When the runtime should reconcile a job waiting for Kueue's admission again (None: it does not wait)."""
    status = StatusView.of(job)
    if status.phase in FINISHED_PHASES or status.reason != NOT_ADMITTED:
        return None
    return now + POLL_SECONDS
