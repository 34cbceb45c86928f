"""When a job needs a reconcile although nothing about it changes: its TTL, its active deadline or its start
deadline (pure).

The runtime schedules a wake-up at that time instead of polling every job.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from verl_operator.api.status import FINISHED_PHASES, StatusView
from verl_operator.controller.podstart import STARTABLE
from verl_operator.controller.status import parse_time

#: ``spec.startDeadlineSeconds``' default, for a job stored before the field existed.
START_DEADLINE_SECONDS = 600

#: Timestamps in status have whole seconds and the checks compare strictly (``elapsed > deadline``): wake a
#: second late rather than a moment early.
MARGIN_SECONDS = 1.0
#: spec.monitoring.statusIntervalSeconds when the spec does not say (api.spec.MonitoringSpec's default).
DEFAULT_STATUS_INTERVAL = 30


def next_due(job: Mapping[str, Any]) -> float | None:
    """The epoch second at which the job's TTL, active deadline or start deadline passes, or None when none
    applies.

    Args:
        job: The VerlJob object.

    Returns:
        ``completionTime + ttlSecondsAfterFinished`` for a finished job with a TTL;
        ``startTime + activeDeadlineSeconds`` for a started, unfinished, unsuspended job with a deadline,
        or :func:`start_due` when that is sooner; each plus :data:`MARGIN_SECONDS`. Example: started
        ``12:00:00Z`` with ``activeDeadlineSeconds: 60``
        -> ``12:01:01Z``.
    """
    spec = job.get("spec") or {}
    status = StatusView.of(job)
    phase = status.phase
    if phase in FINISHED_PHASES:
        ttl = spec.get("ttlSecondsAfterFinished")
        done = parse_time(status.completion_time)
        if ttl is None or done is None:
            return None
        return done + int(ttl) + MARGIN_SECONDS
    if phase == "Suspended" or spec.get("suspend"):
        return None
    due = [start_due(job)]
    deadline = spec.get("activeDeadlineSeconds")
    started = parse_time(status.start_time)
    if deadline is not None and started is not None:
        due.append(started + int(deadline) + MARGIN_SECONDS)
    known = [d for d in due if d is not None]
    return min(known) if known else None


def start_due(job: Mapping[str, Any]) -> float | None:
    """The epoch second at which a ``Starting`` job whose containers the kubelet cannot start
    (:data:`~verl_operator.controller.podstart.STARTABLE` false) passes ``spec.startDeadlineSeconds``, plus
    :data:`MARGIN_SECONDS`; None otherwise."""
    status = job.get("status") or {}
    if status.get("phase") != "Starting":
        return None
    for cond in status.get("conditions") or []:
        if cond.get("type") == STARTABLE and cond.get("status") == "False":
            since = parse_time(cond.get("lastTransitionTime"))
            limit = int((job.get("spec") or {}).get("startDeadlineSeconds") or START_DEADLINE_SECONDS)
            return None if since is None else since + limit + MARGIN_SECONDS
    return None


def progress_due(job: Mapping[str, Any], now: float) -> float | None:
    """When a Running job's progress is read next: every ``spec.monitoring.statusIntervalSeconds`` (30 by
    default) while it runs with monitoring on; None otherwise. Example: now 12:00:00Z -> 12:00:30Z."""
    spec = job.get("spec") or {}
    monitoring = spec.get("monitoring") or {}
    if StatusView.of(job).phase != "Running" or monitoring.get("enabled") is False:
        return None
    return now + float(monitoring.get("statusIntervalSeconds") or DEFAULT_STATUS_INTERVAL)
