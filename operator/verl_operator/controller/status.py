"""Pure helpers for ``status``: conditions in the metav1.Condition shape, phases, the mesh string."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

Phase = Literal["Invalid", "Pending", "Starting", "Running", "Succeeded", "Failed", "Suspended"]
ConditionStatus = Literal["True", "False", "Unknown"]

#: kstatus-style summary conditions derived from the phase: (Ready, Reconciling, Stalled).
PHASE_SUMMARY: dict[str, tuple[bool, bool, bool]] = {
    "Invalid": (False, False, True),
    "Pending": (False, True, False),
    "Starting": (False, True, False),
    "Running": (True, False, False),
    "Succeeded": (True, False, False),
    "Failed": (False, False, True),
    "Suspended": (False, False, False),
}
FINISHED: frozenset[str] = frozenset({"Succeeded", "Failed"})


def parse_time(value: str | None) -> float | None:
    """Seconds since the epoch of an RFC 3339 ``...Z`` timestamp written by the operator (None stays None)."""
    import datetime as dt

    if not value:
        return None
    return dt.datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=dt.UTC).timestamp()


def condition(
    type_: str, status: bool | ConditionStatus, reason: str, message: str, generation: int, now: str
) -> dict[str, Any]:
    """A condition dict in the ``metav1.Condition`` shape."""
    value = status if isinstance(status, str) else ("True" if status else "False")
    return {
        "type": type_,
        "status": value,
        "observedGeneration": generation,
        "lastTransitionTime": now,
        "reason": reason,
        "message": message,
    }


def merge_conditions(
    old: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Replace conditions by type; keep ``lastTransitionTime`` when the status did not change.

    Args:
        old: Current conditions.
        new: Conditions to set.

    Returns:
        All conditions, in a stable order (old order first, new types appended).
    """
    by_type = {str(c["type"]): dict(c) for c in old}
    order = [str(c["type"]) for c in old]
    for cond in new:
        t = str(cond["type"])
        prev = by_type.get(t)
        merged = dict(cond)
        if prev is not None and prev.get("status") == cond.get("status"):
            merged["lastTransitionTime"] = prev.get("lastTransitionTime", cond["lastTransitionTime"])
        if t not in by_type:
            order.append(t)
        by_type[t] = merged
    return [by_type[t] for t in order]


def summary_conditions(
    phase: str, reason: str, message: str, generation: int, now: str
) -> list[dict[str, Any]]:
    """``Ready``, ``Reconciling`` and ``Stalled`` for the phase (kstatus / Flux / Argo CD read these)."""
    ready, reconciling, stalled = PHASE_SUMMARY[phase]
    return [
        condition("Ready", ready, reason if not ready else phase, message, generation, now),
        condition("Reconciling", reconciling, reason if reconciling else phase, message, generation, now),
        condition("Stalled", stalled, reason if stalled else phase, message, generation, now),
    ]


def mesh_string(plan: Mapping[str, Any]) -> str:
    """``dp8 sp1 tp2`` from a plan dict (camelCase): data parallel, Ulysses SP, rollout tensor parallel."""
    rollout = plan.get("rollout") or {}
    return (
        f"dp{plan.get('dataParallelSize', '?')} sp{plan.get('sequenceParallelSize', '?')} "
        f"tp{rollout.get('tensorParallelSize', '?')}"
    )


#: Launcher exit codes (the launch contract) -> (reason, retryable).
EXIT_REASONS: dict[int, tuple[str, bool]] = {
    0: ("Succeeded", False),
    2: ("InvalidLaunchSpec", False),
    10: ("VerlFailed", True),
    11: ("WorkerLost", True),
    12: ("TopologyMismatch", False),
    13: ("ClusterNotReady", True),
    14: ("HeadUnreachable", True),
}

RETRYABLE: dict[str, bool] = {reason: retry for reason, retry in EXIT_REASONS.values()}


def pod_failure(pod: Mapping[str, Any]) -> tuple[str, str, bool]:
    """``(reason, message, retryable)`` of a failed Ray pod, from its container's termination state.

    A termination message that is the launcher's one-line JSON gives reason and message; otherwise the exit
    code is mapped by the contract; a pod failed without a container exit (evicted, lost) is retryable.
    """
    import json

    name = str((pod.get("metadata") or {}).get("name", "?"))
    statuses = ((pod.get("status") or {}).get("containerStatuses")) or []
    for cs in statuses:
        term = ((cs.get("state") or {}).get("terminated")) or ((cs.get("lastState") or {}).get("terminated"))
        if not term:
            continue
        code = int(term.get("exitCode", 1))
        reason, retryable = EXIT_REASONS.get(code, ("PodFailed", True))
        message = f"pod {name} exited with code {code}"
        text = term.get("message")
        if text:
            try:
                doc = json.loads(str(text).strip().splitlines()[-1])
                reason = str(doc.get("reason", reason))
                retryable = RETRYABLE.get(reason, retryable)
                message = f"pod {name}: {doc.get('message', text)}"
            except (ValueError, IndexError, AttributeError):
                message = f"pod {name} exited with code {code}: {str(text).strip()[:200]}"
        return reason, message, retryable
    status = pod.get("status") or {}
    detail = status.get("message") or status.get("reason") or "failed"
    return "PodFailed", f"pod {name} failed: {detail}", True
