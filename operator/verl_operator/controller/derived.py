"""The status fields of a placed job that its pods and its own metadata contradict, derived again (pure).

Status is the operator's record, not the user's instruction: a status patched by hand must not move the job.
:func:`rederive` checks the fields the decisions act on against the evidence the world holds and replaces a
contradicted one with what the world says:

- ``placement.nodes``: every pod of the attempt is bound, and the nodes they run on are not the placement's
  (the operator pins each pod to its planned node, so only a patch makes them differ): the pods' nodes,
  head first. Read as it was, a node that does not exist would fail the job with ``NodeLost``.
- ``startTime``: before the job's ``creationTimestamp`` or after now by more than :data:`CLOCK_SKEW_SECONDS`
  (the operator writes it when it first places the job): clamped into that range. Read as it was, an old start would end the job at once on
  ``activeDeadlineSeconds``.
- ``attempt``: not the placement's, while pods of the placement's attempt exist and none of the status's
  (the operator writes both together): the placement's. Read as it was, the running pods would be deleted
  as an earlier attempt's and the job started again.
- ``attempt`` and ``placement.attempt`` changed together, while every unfinished pod of the job that is not
  being deleted belongs to one other attempt (its ``verl-operator.io/attempt`` label and its name
  ``<job>-r<attempt>-...`` agree) and no pod belongs to the status's attempt: the pods' attempt. The operator
  deletes an attempt's unfinished pods before it writes a later attempt (a restart, a suspension, Kueue's
  eviction, pods that could not be created), and writes an attempt before it creates its pods, so no write
  of its own leaves that state. Judged only on pods listed from the API server between two reads of the
  unchanged job (:attr:`Observed.fresh`): a watch cache may still show pods the operator has just deleted,
  and another operator replica may be finishing its last pass. Read as it was, the running pods would be
  deleted and the job started again (from a checkpoint: an attempt above 0 resumes).
- ``restarts``: above ``attempt`` (every restart starts a new attempt): ``attempt``. Read as it was, the
  next failure would end the job instead of restarting it within ``backoffLimit``.
- ``completionTime`` on a job that has not finished: removed.

What the world does not contradict stays as written (the limits are in docs/operator.md).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from verl_operator.api.status import StatusChange, VerlJobStatus
from verl_operator.controller.assess import pod_phase
from verl_operator.controller.status import format_time, parse_time
from verl_operator.controller.transition import Event, Transition
from verl_operator.manifests.names import LABEL_ATTEMPT

if TYPE_CHECKING:
    from verl_operator.controller.observed import Observed

_WORKER = re.compile(r"-worker-(\d+)$")
#: What follows ``<job>-r<attempt>-`` in a Ray pod's name.
_POD = re.compile(r"head|worker-[1-9][0-9]*")
#: How far ``startTime`` may lie outside [creation, now] before it counts as contradicted: the operator writes
#: it by its own clock, the API server the creation time by its own, and two replicas' clocks may differ.
CLOCK_SKEW_SECONDS = 300.0


def _order(name: str) -> tuple[int, int]:
    """Head first, then the workers by index (the order of ``placement.nodes``)."""
    match = _WORKER.search(name)
    return (1, int(match.group(1))) if match else (0, 0)


def _bound_nodes(pods: Sequence[Mapping[str, Any]], attempt: int) -> list[str]:
    mine = [
        p
        for p in pods
        if (p["metadata"].get("labels") or {}).get(LABEL_ATTEMPT) == str(attempt)
        and not p["metadata"].get("deletionTimestamp")
    ]
    mine.sort(key=lambda p: _order(str(p["metadata"]["name"])))
    return [str((p.get("spec") or {}).get("nodeName") or "") for p in mine]


def pods_attempt(job: str, pods: Sequence[Mapping[str, Any]]) -> tuple[int, list[str]] | None:
    """The attempt the unfinished pods of job ``job`` that are not being deleted all belong to, and their
    names; None when there is none, or they belong to several attempts, or a pod's attempt label and name
    (``<job>-r<attempt>-head|worker-<i>``) disagree (a pod relabelled by hand is no evidence)."""
    attempts: set[int] = set()
    names: list[str] = []
    for pod in pods:
        meta = pod["metadata"]
        if meta.get("deletionTimestamp") or pod_phase(pod) in ("Succeeded", "Failed"):
            continue
        label = str((meta.get("labels") or {}).get(LABEL_ATTEMPT, ""))
        name = str(meta.get("name", ""))
        prefix = f"{job}-r{int(label)}-" if label.isdigit() else None
        if prefix is None or not name.startswith(prefix) or not _POD.fullmatch(name[len(prefix) :]):
            return None
        attempts.add(int(label))
        names.append(name)
    if len(attempts) != 1:
        return None
    names.sort(key=_order)
    return attempts.pop(), names


def contradicted_attempt(
    job: Mapping[str, Any], status: VerlJobStatus, pods: Sequence[Mapping[str, Any]]
) -> tuple[int, list[str]] | None:
    """The attempt (and its pods' names) that the job's pods show where ``status.attempt`` and
    ``status.placement.attempt`` agree on another one of which no pod exists (see the module); None when
    the pods do not contradict the status. Only pods listed after the status was read prove it."""
    placement = status.placement
    if placement is None or placement.attempt != status.attempt:
        return None
    shown = pods_attempt(str(job["metadata"].get("name", "")), pods)
    if shown is None or shown[0] == status.attempt:
        return None
    mine = str(status.attempt)
    if any((p["metadata"].get("labels") or {}).get(LABEL_ATTEMPT) == mine for p in pods):
        return None
    return shown


def rederive(seen: Observed) -> tuple[Observed, list[str]]:
    """``seen`` with the contradicted status fields replaced (see the module), and one line per field
    replaced for the ``StatusOverwritten`` event (empty: nothing was contradicted).

    Example: ``placement.nodes`` ``[gpu-9, gpu-8]`` while the attempt's pods run on ``gpu-0`` and ``gpu-1``
    -> placement nodes ``[gpu-0, gpu-1]`` and ``["status.placement.nodes gpu-9, gpu-8: the attempt's pods
    run on gpu-0, gpu-1"]``.
    """
    status = seen.status
    change = StatusChange()
    said: list[str] = []
    placement = status.placement
    shown = contradicted_attempt(seen.job, status, seen.pods) if seen.fresh else None
    if placement is not None and shown is not None:
        attempt, names = shown
        more = f" and {len(names) - 3} more" if len(names) > 3 else ""
        said.append(
            f"status.attempt and status.placement.attempt {status.attempt}: the job's running pods are attempt "
            f"{attempt} ({', '.join(names[:3])}{more}) and none is attempt {status.attempt}"
        )
        placement = placement.changed(attempt=attempt)
        change |= StatusChange(attempt=attempt, placement=placement)
        status = change.apply(status)
    if (
        placement is not None
        and placement.attempt != status.attempt
        and any(_bound_nodes(seen.pods, placement.attempt))
        and not _bound_nodes(seen.pods, status.attempt)
    ):
        said.append(
            f"status.attempt {status.attempt}: the placement and the running pods are attempt {placement.attempt}"
        )
        status = StatusChange(attempt=placement.attempt).apply(status)
        change |= StatusChange(attempt=placement.attempt)
    if placement is not None and placement.handoff is None and placement.nodes:
        nodes = _bound_nodes(seen.pods, status.attempt)
        if len(nodes) == len(placement.nodes) and all(nodes) and nodes != list(placement.nodes):
            change |= StatusChange(placement=placement.changed(nodes=nodes), nodes=",".join(nodes))
            said.append(
                f"status.placement.nodes {', '.join(placement.nodes)}: the attempt's pods run on {', '.join(nodes)}"
            )
    started = parse_time(status.start_time)
    created = parse_time(str((seen.job.get("metadata") or {}).get("creationTimestamp") or "")) or None
    if started is not None:
        lowest = created if created is not None else started
        clamped = min(max(started, lowest), seen.now)
        if abs(clamped - started) > CLOCK_SKEW_SECONDS:
            change |= StatusChange(start_time=format_time(clamped))
            said.append(
                f"status.startTime {status.start_time}: the job was created at "
                f"{format_time(lowest)} and it is {format_time(seen.now)} now"
            )
    if status.restarts > status.attempt:
        change |= StatusChange(restarts=status.attempt)
        said.append(f"status.restarts {status.restarts}: attempt {status.attempt} has had at most that many")
    if status.completion_time:
        change |= StatusChange(completion_time=None)
        said.append(f"status.completionTime {status.completion_time}: the job has not finished")
    if not said:
        return seen, []
    return replace(seen, status=change.apply(status)), said


def overwritten(decided: Transition, derived: Observed, said: list[str]) -> Transition:
    """``decided`` (made from ``derived``) with the derived fields written even when nothing else changes,
    and a ``StatusOverwritten`` Warning naming them (unless the decision posts an event of its own)."""
    if not said:
        return decided
    text = "status fields not written by the operator, derived again from the job's pods and metadata: "
    status = decided.status if decided.status is not None else derived.status
    event = decided.event or Event("Warning", "StatusOverwritten", text + "; ".join(said))
    return replace(decided, status=status, event=event)
